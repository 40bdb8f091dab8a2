package extproc

import (
	"bytes"

	json "github.com/goccy/go-json"
)

// maxSSELine bounds the partial line carried between response chunks; a
// longer line is skipped (and counted as one event if it was a data line).
const maxSSELine = 256 << 10

// tokenCounter counts a streamed (SSE) completion's output tokens: one per
// data event (an OpenAI chunk carries one token delta per choice), replaced
// by usage.completion_tokens whenever an event carries usage (clients that set
// stream_options.include_usage get it in the last event, and some servers in
// every event). Events split across response chunks are reassembled.
type tokenCounter struct {
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

type usageObject struct {
	CompletionTokens    *int `json:"completion_tokens"`
	PromptTokens        *int `json:"prompt_tokens"`
	PromptTokensDetails *struct {
		CachedTokens *int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// engine is the prompt side of the usage object.
func (u *usageObject) engine() engineUsage {
	if u == nil || u.PromptTokens == nil {
		return engineUsage{}
	}
	e := engineUsage{seen: true, promptTokens: *u.PromptTokens}
	if d := u.PromptTokensDetails; d != nil && d.CachedTokens != nil {
		e.cachedTokens = *d.CachedTokens
	}
	return e
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
