package extproc

import (
	"bytes"
	"strings"

	json "github.com/goccy/go-json"
)

// maxSSELine bounds the partial line carried between response chunks; a
// longer line is skipped (and counted as one event if it was a data line).
const maxSSELine = 256 << 10

// tokenCounter counts a streamed (SSE) completion's output tokens: one per
// data event (an OpenAI chunk carries one token delta per choice), replaced
// by usage.completion_tokens whenever an event carries usage (clients that set
// stream_options.include_usage get it in the last event, and some servers in
// every event). Events split across response chunks are reassembled. The
// request's format says which events carry tokens and where usage is
// (typedEvent, and meta_info for SGLang).
type tokenCounter struct {
	format   requestFormat
	carry    []byte
	skipping bool // inside an over-long line
	events   int
	usage    int
	// The engine's usage report, when an event carried one: prompt tokens
	// and the part of them it served from its prefix cache
	// (usage.prompt_tokens_details.cached_tokens; vLLM sends it with
	// --enable-prompt-tokens-details).
	eng engineUsage
}

// engineUsage is what an OpenAI-style usage object says of the prompt.
type engineUsage struct {
	seen                       bool // a usage object with prompt_tokens was read
	promptTokens, cachedTokens int
}

// tokens is the best count so far.
func (c *tokenCounter) tokens() int { return max(c.events, c.usage) }

// feed consumes one response chunk.
func (c *tokenCounter) feed(b []byte) {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			if c.skipping {
				return
			}
			if len(c.carry)+len(b) > maxSSELine {
				c.skipLine(b)
				return
			}
			c.carry = append(c.carry, b...)
			return
		}
		line := b[:i]
		b = b[i+1:]
		if c.skipping {
			c.skipping = false
			continue
		}
		if len(c.carry) > 0 {
			if len(c.carry)+len(line) > maxSSELine {
				if bytes.HasPrefix(c.carry, dataPrefix) {
					c.events++ // over-long data line: still one event
				}
				c.carry = c.carry[:0]
				continue
			}
			c.carry = append(c.carry, line...)
			line = c.carry
		}
		c.line(line)
		c.carry = c.carry[:0]
	}
}

// skipLine drops an over-long line whose start is in carry (or, with an
// empty carry, in rest); a data line still counts as one event.
func (c *tokenCounter) skipLine(rest []byte) {
	start := c.carry
	if len(start) == 0 {
		start = rest
	}
	if bytes.HasPrefix(start, dataPrefix) {
		c.events++
	}
	c.carry = c.carry[:0]
	c.skipping = true
}

var (
	dataPrefix = []byte("data:")
	doneEvent  = []byte("[DONE]")
	usageKey   = []byte(`"usage"`)
)

type usageOnly struct {
	Usage *usageObject `json:"usage"`
}

// usageObject is a usage report in any format the picker reads: OpenAI's
// (completion_tokens, prompt_tokens, prompt_tokens_details.cached_tokens);
// Anthropic's (output_tokens, input_tokens — the input not read from or
// written to its cache — cache_read_input_tokens and
// cache_creation_input_tokens,
// https://docs.anthropic.com/en/api/messages, "usage"); the Responses API's
// (output_tokens, input_tokens, input_tokens_details.cached_tokens,
// https://platform.openai.com/docs/api-reference/responses/object); and
// SGLang's meta_info (completion_tokens, prompt_tokens, cached_tokens;
// TokenizerManager in python/sglang/srt/managers/tokenizer_manager.py).
type usageObject struct {
	CompletionTokens         *int           `json:"completion_tokens"`
	PromptTokens             *int           `json:"prompt_tokens"`
	PromptTokensDetails      *cachedDetails `json:"prompt_tokens_details"`
	CachedTokens             *int           `json:"cached_tokens"` // SGLang
	OutputTokens             *int           `json:"output_tokens"`
	InputTokens              *int           `json:"input_tokens"`
	InputTokensDetails       *cachedDetails `json:"input_tokens_details"`        // Responses
	CacheReadInputTokens     *int           `json:"cache_read_input_tokens"`     // Anthropic
	CacheCreationInputTokens *int           `json:"cache_creation_input_tokens"` // Anthropic
}

type cachedDetails struct {
	CachedTokens *int `json:"cached_tokens"`
}

// completion is the output token count, nil when the report has none.
func (u *usageObject) completion() *int {
	if u == nil {
		return nil
	}
	if u.CompletionTokens != nil {
		return u.CompletionTokens
	}
	return u.OutputTokens
}

// engine is the prompt side of the usage object.
func (u *usageObject) engine() engineUsage {
	switch {
	case u == nil:
		return engineUsage{}
	case u.PromptTokens != nil:
		e := engineUsage{seen: true, promptTokens: *u.PromptTokens}
		if d := u.PromptTokensDetails; d != nil && d.CachedTokens != nil {
			e.cachedTokens = *d.CachedTokens
		} else if u.CachedTokens != nil {
			e.cachedTokens = *u.CachedTokens
		}
		return e
	case u.InputTokens != nil:
		e := engineUsage{seen: true, promptTokens: *u.InputTokens}
		if d := u.InputTokensDetails; d != nil && d.CachedTokens != nil {
			e.cachedTokens = *d.CachedTokens
		}
		// Anthropic counts cache reads and writes apart from input_tokens.
		if n := u.CacheReadInputTokens; n != nil {
			e.promptTokens += *n
			e.cachedTokens += *n
		}
		if n := u.CacheCreationInputTokens; n != nil {
			e.promptTokens += *n
		}
		return e
	}
	return engineUsage{}
}

// apply takes a usage report: its output count (cumulative in every format)
// and its prompt side.
func (c *tokenCounter) apply(u *usageObject) {
	if n := u.completion(); n != nil {
		c.usage = max(c.usage, *n)
	}
	if e := u.engine(); e.seen {
		c.eng = e
	}
}

// typedEvent is the part of an Anthropic or Responses stream event the
// counter reads: its type, and the usage wherever the event carries it —
// Anthropic's message_start in message.usage and message_delta in usage
// (https://docs.anthropic.com/en/docs/build-with-claude/streaming), the
// Responses API's response.completed (and .incomplete, .failed) in
// response.usage
// (https://platform.openai.com/docs/api-reference/responses-streaming).
type typedEvent struct {
	Type     string       `json:"type"`
	Usage    *usageObject `json:"usage"`
	Message  *usageOnly   `json:"message"`
	Response *usageOnly   `json:"response"`
}

// tokenEvent says whether an event of type typ carries output tokens:
// Anthropic's content_block_delta (text, tool input or thinking), any of
// the Responses API's *.delta events. The others frame the stream.
func tokenEvent(f requestFormat, typ string) bool {
	if f == formatAnthropic {
		return typ == "content_block_delta"
	}
	return strings.HasSuffix(typ, ".delta")
}

// eventType reads a typed event's "type": where it is the first key, as
// both APIs write it, without decoding the event; else nothing.
func eventType(payload []byte) string {
	const key = `"type"`
	p := bytes.TrimLeft(payload, " \t")
	if len(p) == 0 || p[0] != '{' {
		return ""
	}
	p = bytes.TrimLeft(p[1:], " \t")
	if !bytes.HasPrefix(p, []byte(key)) {
		return ""
	}
	p = bytes.TrimLeft(p[len(key):], " \t")
	if len(p) == 0 || p[0] != ':' {
		return ""
	}
	p = bytes.TrimLeft(p[1:], " \t")
	if len(p) == 0 || p[0] != '"' {
		return ""
	}
	end := bytes.IndexByte(p[1:], '"')
	if end < 0 || bytes.IndexByte(p[1:1+end], '\\') >= 0 {
		return ""
	}
	return string(p[1 : 1+end])
}

// typed counts one Anthropic or Responses data event.
func (c *tokenCounter) typed(payload []byte) {
	typ := eventType(payload)
	if typ != "" && tokenEvent(c.format, typ) {
		c.events++
		return
	}
	if typ != "" && !bytes.Contains(payload, usageKey) {
		return
	}
	var ev typedEvent
	if json.Unmarshal(payload, &ev) != nil {
		return
	}
	if tokenEvent(c.format, ev.Type) {
		c.events++
		return
	}
	switch {
	case ev.Message != nil && ev.Message.Usage != nil:
		c.apply(ev.Message.Usage)
	case ev.Response != nil && ev.Response.Usage != nil:
		c.apply(ev.Response.Usage)
	case ev.Usage != nil:
		c.apply(ev.Usage)
	}
}

// metaInfoKey is the key of SGLang's usage report, meta_info, in every
// streamed chunk and the non-streamed answer (its completion_tokens is
// cumulative).
var metaInfoKey = []byte(`"meta_info"`)

// objectAfterKey decodes the usage object that is the value of the last
// occurrence of key in b; nil when there is none or it does not decode. A
// key inside a JSON string is escaped (\"usage\") and never matches.
func objectAfterKey(b, key []byte) *usageObject {
	i := bytes.LastIndex(b, key)
	if i < 0 {
		return nil
	}
	rest := bytes.TrimLeft(b[i+len(key):], " \t\r\n")
	if len(rest) == 0 || rest[0] != ':' {
		return nil
	}
	var u usageObject
	if err := json.NewDecoder(bytes.NewReader(rest[1:])).Decode(&u); err != nil {
		return nil
	}
	return &u
}

func (c *tokenCounter) line(line []byte) {
	line = bytes.TrimRight(line, "\r")
	if !bytes.HasPrefix(line, dataPrefix) {
		return
	}
	payload := bytes.TrimSpace(line[len(dataPrefix):])
	if len(payload) == 0 || bytes.Equal(payload, doneEvent) {
		return
	}
	switch c.format {
	case formatAnthropic, formatResponses:
		c.typed(payload)
		return
	case formatSGLang:
		// Every chunk carries meta_info, after the text (cumulative unless
		// the server streams increments): only the object is decoded.
		if u := objectAfterKey(payload, metaInfoKey); u != nil {
			c.apply(u)
		}
		c.events++
		return
	}
	if bytes.Contains(payload, usageKey) {
		var u usageOnly
		if json.Unmarshal(payload, &u) == nil && u.Usage != nil && u.Usage.CompletionTokens != nil {
			c.usage = max(c.usage, *u.Usage.CompletionTokens)
			if e := u.Usage.engine(); e.seen {
				c.eng = e
			}
			// A usage-only event (choices: []) carries no token.
			if bytes.Contains(payload, []byte(`"choices":[]`)) {
				return
			}
		}
	}
	c.events++
}
