package extproc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"slices"

	json "github.com/goccy/go-json"

	"github.com/kvselect/kvselect/selection"
)

// requestBody holds the only fields of a request body the picker reads, in
// every format it reads (formats.go). Decoding into it skips every other
// field without building a tree of the whole body.
type requestBody struct {
	Model    string                  `json:"model"`
	Prompt   json.RawMessage         `json:"prompt"`
	Messages []selection.ChatMessage `json:"messages"`
	Stream   *bool                   `json:"stream"`
	Nvext    *nvext                  `json:"nvext"`

	// The other formats' fields, raw: what they may hold depends on the
	// format, which they help detect.
	System          json.RawMessage `json:"system"`                // Anthropic
	MaxTokens       json.RawMessage `json:"max_tokens"`            // Anthropic, OpenAI
	MaxCompletion   json.RawMessage `json:"max_completion_tokens"` // OpenAI chat
	Input           json.RawMessage `json:"input"`                 // Responses
	Instructions    json.RawMessage `json:"instructions"`          // Responses
	MaxOutputTokens json.RawMessage `json:"max_output_tokens"`     // Responses
	InputIDs        json.RawMessage `json:"input_ids"`             // SGLang
	Text            json.RawMessage `json:"text"`                  // SGLang
	TokenIDs        json.RawMessage `json:"token_ids"`             // vLLM generate
	SamplingParams  json.RawMessage `json:"sampling_params"`       // SGLang, vLLM generate

	// lifted are the id arrays read in place (liftTokenIDs); their fields
	// above hold "[]" then.
	lifted liftedIDs
}

// nvext is the part of Dynamo's NVIDIA extension block
// (lib/llm/src/protocols/openai/nvext.rs) that identifies a request:
// pre-tokenized prompt, expected output length, session.
type nvext struct {
	TokenData  []uint32 `json:"token_data"`
	AgentHints *struct {
		OSL *uint32 `json:"osl"`
	} `json:"agent_hints"`
	SessionControl *struct {
		SessionID string `json:"session_id"`
	} `json:"session_control"`
}

// parsedBody is what a request body contributes to the request's identity.
type parsedBody struct {
	format   requestFormat
	model    string
	tokens   []uint32 // prompt token ids (completions prompt, input_ids, token_ids or nvext.token_data)
	text     string   // prompt text when there are no token ids
	textFrom textSource
	// messages are the chat messages text was rendered from, for a format
	// whose own messages are not chat's (textMessages): the engine's
	// /tokenize is sent these.
	messages []selection.ChatMessage
	stream   bool
	osl      *uint32
	// maxOutput is the request's output limit (Anthropic max_tokens,
	// Responses max_output_tokens, sampling_params' max_new_tokens or
	// max_tokens, OpenAI's max_completion_tokens or max_tokens); nil when
	// not given.
	maxOutput *uint32
	session   string
	hasField  bool // the body was a JSON object (possibly without a prompt)
}

// textSource says where parsedBody.text came from.
type textSource uint8

const (
	textNone        textSource = iota
	textPrompt                 // the completions prompt, a string
	textPromptBatch            // the first string of a completions prompt batch
	textChat                   // chat messages
	textMessages               // Anthropic or Responses messages, rendered as chat (parsedBody.messages)
	textGenerate               // SGLang's text (the first of a batch)
)

// errBadBody wraps every body error: the request gets a 400.
var errBadBody = errors.New("invalid request body")

// parseBody extracts the request's identity from a body sent to path: an
// OpenAI completions or chat-completions body, or a Dynamo one with nvext,
// or one of the formats of formats.go (detectFormat). Precedence inside an
// OpenAI body (the order): the completions prompt as token ids (an
// integer array, or the first of a list of them), then nvext.token_data,
// then the prompt text (chat messages, or the completions prompt as a
// string or the first of a list of strings); the other formats follow the
// same order with their own fields. An empty body identifies nothing and is
// fine.
func parseBody(b []byte, path string) (parsedBody, error) { return parseBodyEarly(b, path, nil) }

// parseBodyEarly is parseBody going on from the ids early read while the
// body arrived (nil: none).
func parseBodyEarly(b []byte, path string, early *earlyIDs) (parsedBody, error) {
	return parseBodyLifting(b, path, liftMin, early)
}

// parseBodyLifting is parseBodyEarly lifting id arrays out of bodies of at
// least liftFrom bytes (never when negative); tests compare the two ways.
func parseBodyLifting(b []byte, path string, liftFrom int, early *earlyIDs) (parsedBody, error) {
	var out parsedBody
	if len(bytes.TrimSpace(b)) == 0 {
		return out, nil
	}
	var rb requestBody
	if err := decodeBody(b, &rb, liftFrom, early); err != nil {
		return out, err
	}
	out.hasField = true
	out.model = rb.Model
	out.stream = rb.Stream != nil && *rb.Stream
	if n := rb.Nvext; n != nil {
		if n.AgentHints != nil {
			out.osl = n.AgentHints.OSL
		}
		if n.SessionControl != nil {
			out.session = n.SessionControl.SessionID
		}
	}
	if out.format = detectFormat(path, &rb); out.format != formatOpenAI {
		return out, parseOtherFormat(&rb, &out)
	}
	out.maxOutput = openAILimit(rb.MaxCompletion, rb.MaxTokens)
	tokens, text, err := parsePrompt(rb.Prompt)
	if rb.lifted.prompt != nil {
		tokens = rb.lifted.prompt
	}
	if err != nil {
		return out, err
	}
	switch {
	case tokens != nil:
		out.tokens = tokens
	case rb.Nvext != nil && len(rb.Nvext.TokenData) > 0:
		out.tokens = rb.Nvext.TokenData
	case text != "":
		out.text, out.textFrom = text, textPrompt
		if p := bytes.TrimSpace(rb.Prompt); len(p) > 0 && p[0] == '[' {
			out.textFrom = textPromptBatch
		}
	case len(rb.Messages) > 0:
		if out.text, err = selection.ChatText(rb.Messages); err != nil {
			err = fmt.Errorf("%w: %w", errBadBody, err)
		}
		out.textFrom = textChat
	}
	return out, err
}

// decodeBody decodes b into rb, its id arrays read in place
// (liftTokenIDs, going on from early) when it has any and is at least
// liftFrom bytes long.
func decodeBody(b []byte, rb *requestBody, liftFrom int, early *earlyIDs) error {
	if liftFrom >= 0 && len(b) >= liftFrom {
		if reduced, ids, ok := liftTokenIDs(b, early); ok {
			if json.Unmarshal(reduced, rb) == nil {
				rb.lifted = ids
				if ids.tokenData != nil && rb.Nvext != nil {
					rb.Nvext.TokenData = ids.tokenData
				}
				return nil
			}
			*rb = requestBody{}
		}
	}
	if err := json.Unmarshal(b, rb); err != nil {
		return fmt.Errorf("%w: %s", errBadBody, shortJSONError(err))
	}
	return nil
}

// parsePrompt reads the completions prompt: a string, an array of token ids,
// an array of strings or an array of token-id arrays (a batch: its first
// element identifies the request, all of a batch go to one worker).
func parsePrompt(raw json.RawMessage) (tokens []uint32, text string, err error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, "", nil
	}
	switch raw[0] {
	case '"':
		if err := json.Unmarshal(raw, &text); err != nil {
			return nil, "", fmt.Errorf("%w: prompt: %s", errBadBody, shortJSONError(err))
		}
		return nil, text, nil
	case '[':
	default:
		return nil, "", fmt.Errorf("%w: prompt must be a string, an array of strings, an array of token ids or an array of token-id arrays", errBadBody)
	}
	inner := bytes.TrimSpace(raw[1:])
	switch {
	case len(inner) > 0 && inner[0] == ']':
		return nil, "", nil
	case len(inner) > 0 && inner[0] == '"':
		var batch []string
		if err := json.Unmarshal(raw, &batch); err != nil {
			return nil, "", fmt.Errorf("%w: prompt: %s", errBadBody, shortJSONError(err))
		}
		return nil, batch[0], nil
	case len(inner) > 0 && inner[0] == '[':
		var batch [][]uint32
		if err := json.Unmarshal(raw, &batch); err != nil {
			return nil, "", fmt.Errorf("%w: prompt token ids must be integers from 0 to 4294967295: %s", errBadBody, shortJSONError(err))
		}
		if len(batch[0]) == 0 {
			return nil, "", nil
		}
		return batch[0], "", nil
	}
	if tokens, ok := scanTokenIDs(raw); ok {
		return tokens, "", nil
	}
	if err := json.Unmarshal(raw, &tokens); err != nil {
		return nil, "", fmt.Errorf("%w: prompt token ids must be integers from 0 to 4294967295: %s", errBadBody, shortJSONError(err))
	}
	return tokens, "", nil
}

// scanTokenIDs reads the common prompt — a JSON array of token ids — in one
// pass over the bytes, without the decoder's copy of its input: the prompt is
// most of a tokenized request body and the picker parses one per request.
// It accepts only the plain form (decimal integers in the uint32 range, no
// leading zeros, JSON whitespace); ok is false for anything else, which then
// goes through the JSON decoder and gets its error message.
// FuzzScanTokenIDs holds it to encoding/json's result.
func scanTokenIDs(raw []byte) (tokens []uint32, ok bool) {
	i := skipWS(raw, 0)
	tokens, end, ok := scanIDArray(raw, i)
	if !ok || skipWS(raw, end) != len(raw) {
		return nil, false
	}
	return tokens, true
}

// scanIDArray reads the plain id array that starts at b[i] (scanTokenIDs'
// form) and returns its ids and the index after its ']'.
func scanIDArray(b []byte, i int) (tokens []uint32, end int, ok bool) {
	return scanIDArrayFrom(b, i, nil)
}

// scanIDArrayFrom is scanIDArray going on from what early read of the
// array while the body arrived, when it read this one (earlyIDs).
func scanIDArrayFrom(b []byte, i int, early *earlyIDs) (tokens []uint32, end int, ok bool) {
	if i >= len(b) || b[i] != '[' {
		return nil, 0, false
	}
	// From is where the reading starts: the array's start, or where the
	// early read stopped (before it there are only ids, commas and
	// whitespace: no ']').
	read, from, resumed := early.resumes(i)
	if !resumed {
		from = i
	}
	// A plain array ends at its first ']': its commas size the slice
	// exactly (both searches are vectorized).
	close := bytes.IndexByte(b[from:], ']')
	if close < 0 {
		return nil, 0, false
	}
	n := from + close + 1
	more := bytes.Count(b[from:n], []byte{','}) + 1
	if resumed {
		// The early read stopped at an id or in the whitespace after a
		// comma, which may have gone on in the bytes that came after.
		tokens, i = slices.Grow(read, more), skipWS(b, from)
	} else {
		tokens = make([]uint32, 0, more)
		i = skipWS(b, i+1)
		if b[i] == ']' {
			return tokens, i + 1, true
		}
	}
	// wait counts the ids left to the loop below before scanPackedIDs is
	// tried again: an array it cannot read (a space before each comma)
	// would otherwise cost a refused 64-byte read per id.
	wait := 0
	for {
		if wait == 0 {
			var read int
			tokens, i, read = scanPackedIDs(b, i, tokens)
			if read == 0 {
				wait = packedRetry
			}
		} else {
			wait--
		}
		start := i
		var v, w uint64
		l := 8
		if i+8 <= len(b) {
			// Most ids are shorter than 8 digits: read them 8 bytes at
			// a time.
			w = binary.LittleEndian.Uint64(b[i:])
			l, v = digits8(w)
			i += l
		}
		if l < 8 && byte(w>>(8*l)) == ',' && l > 0 && v <= 1<<32-1 && (l == 1 || b[start] != '0') {
			// The comma is in the word just read: the next id's start
			// is known without loading it again, which shortens the
			// chain of dependent loads the scan is.
			tokens = append(tokens, uint32(v))
			i++
			if c := b[i]; c == ' ' || c == '\n' || c == '\t' || c == '\r' {
				i = skipWS(b, i)
			}
			continue
		}
		if l == 8 {
			i, v = start, 0
			for i < n {
				d := b[i] - '0'
				if d > 9 {
					break
				}
				v = v*10 + uint64(d)
				i++
			}
		}
		if l := i - start; l == 0 || l > 10 || v > 1<<32-1 || (b[start] == '0' && l > 1) {
			return nil, 0, false
		}
		tokens = append(tokens, uint32(v))
		for i < n && (b[i] == ' ' || b[i] == '\n' || b[i] == '\t' || b[i] == '\r') {
			i++
		}
		if i == n {
			return nil, 0, false
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case ']':
			return tokens, i + 1, true
		default:
			return nil, 0, false
		}
	}
}

// digits8 reads the run of decimal digits that w (eight bytes of input, the
// first in the low byte) starts with: its length, 8 when every byte is a
// digit, and for a shorter run its value. SWAR, as simdjson parses eight
// digits (Lemire, "Faster number parsing", the parse_eight_digits_unrolled
// step): a byte is a digit when its high nibble is 3 before and after adding
// 6; the lowest byte that is not is exact (a carry only moves upward, from a
// byte that is not a digit); the run is shifted to the top of the word,
// zeros below it reading as leading zeros, and combined pairwise.
func digits8(w uint64) (n int, v uint64) {
	const ones = 0x0101010101010101
	notDigit := ((w & (0xf0 * ones)) ^ (0x30 * ones)) | (((w + 0x06*ones) & (0xf0 * ones)) ^ (0x30 * ones))
	if notDigit == 0 {
		return 8, 0
	}
	n = bits.TrailingZeros64(notDigit) / 8
	if n == 0 {
		return 0, 0
	}
	d := (w - 0x30*ones) << (64 - 8*n)
	d = d*10 + d>>8
	d = ((d&0x000000ff000000ff)*(100+1000000<<32) + (d>>16&0x000000ff000000ff)*(1+10000<<32)) >> 32
	return n, d
}

// shortJSONError keeps decoder messages to one short line.
func shortJSONError(err error) string {
	s := err.Error()
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}
