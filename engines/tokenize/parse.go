package tokenize

import (
	"bytes"
	"errors"
	"fmt"

	json "github.com/goccy/go-json"
)

// errBadResponse wraps every answer that is not a usable token list.
var errBadResponse = errors.New("bad /tokenize response")

// errTooLarge is a response over the byte or token cap.
var errTooLarge = errors.New("/tokenize response too large")

// response is the part of vLLM's TokenizeResponse kvselect reads
// (vllm/entrypoints/openai/protocol.py: count, max_model_len, tokens,
// token_strs); SGLang's and llm-d-inference-sim's answers have the same
// fields.
type response struct {
	Count  *int64           `json:"count"`
	Tokens *json.RawMessage `json:"tokens"`
}

// ParseResponse reads a /tokenize answer body: a JSON object whose "tokens"
// is an array of at most maxTokens ids in the uint32 range and whose "count",
// when present, equals their number. An empty list is an error: a prompt with
// text always has tokens, so an engine answering none is not tokenizing it.
func ParseResponse(body []byte, maxTokens int) ([]uint32, error) {
	var r response
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("%w: %s", errBadResponse, short(err.Error()))
	}
	if r.Tokens == nil {
		return nil, fmt.Errorf("%w: no tokens", errBadResponse)
	}
	raw := bytes.TrimSpace(*r.Tokens)
	if len(raw) == 0 || raw[0] != '[' {
		return nil, fmt.Errorf("%w: tokens is not an array", errBadResponse)
	}
	// Every id takes at least two bytes ("0,"): a list longer than the cap
	// is refused before it is decoded.
	if n := bytes.Count(raw, []byte{','}) + 1; n > maxTokens && len(raw) > 2 {
		return nil, fmt.Errorf("%w: about %d tokens, the limit is %d", errTooLarge, n, maxTokens)
	}
	var ids []uint32
	if err := json.Unmarshal(raw, &ids); err != nil {
		return nil, fmt.Errorf("%w: tokens: %s", errBadResponse, short(err.Error()))
	}
	switch {
	case len(ids) == 0:
		return nil, fmt.Errorf("%w: empty token list", errBadResponse)
	case len(ids) > maxTokens:
		return nil, fmt.Errorf("%w: %d tokens, the limit is %d", errTooLarge, len(ids), maxTokens)
	case r.Count != nil && *r.Count != int64(len(ids)):
		return nil, fmt.Errorf("%w: count %d for %d tokens", errBadResponse, *r.Count, len(ids))
	}
	return ids, nil
}

func short(s string) string {
	if len(s) > 160 {
		return s[:160] + "..."
	}
	return s
}
