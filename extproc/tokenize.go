package extproc

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"

	json "github.com/goccy/go-json"

	"github.com/kvselect/kvselect/selection"
)

// Text prompts with a Tokenizer (engines/tokenize, wired by server): the
// picker asks for the ids the engine will prefill and routes on them through
// the KV-event index, exactly as if the client had sent them; the text goes
// along, so the booking also teaches the text index (selection.PromptRequest
// .PromptText). Any failure — timeout, engine error, bad answer — routes on
// the text alone, as without a tokenizer; it never fails the request.

// tokenizing is the picker's text tokenization, swapped whole.
type tokenizing struct {
	tk selection.Tokenizer
	// forwardIDs rewrites a completions prompt string to the ids in the
	// body sent upstream, so the engine does not tokenize it again.
	forwardIDs bool
}

// SetTokenizer makes the picker tokenize text prompts with tk (nil: route
// text on the text index, the default); with forwardIDs a completions
// prompt that is one string is replaced by its ids in the forwarded body
// (FULL_DUPLEX_STREAMED only, the mode in which the picker re-sends the
// body). Safe while serving: streams that already read it keep the old one.
func (s *Server) SetTokenizer(tk selection.Tokenizer, forwardIDs bool) {
	if tk == nil {
		s.tokenizing.Store(nil)
		return
	}
	s.tokenizing.Store(&tokenizing{tk: tk, forwardIDs: forwardIDs})
}

// tokenizeFields are the body fields tokenizeRequest reads: the messages
// one by one, and the fields that change the ids.
type tokenizeFields struct {
	Messages []json.RawMessage `json:"messages"`
	selection.TokenizeFields
}

// tokenizeRequest is the /tokenize request of the body's text prompt: the
// prompt string (the first of a batch), or the messages verbatim with the
// fields that change the ids.
func tokenizeRequest(body []byte, pb *parsedBody, part selection.PartitionKey) (*selection.TokenizeRequest, error) {
	req := &selection.TokenizeRequest{PartitionKey: part}
	if pb.textFrom == textMessages {
		// Anthropic or Responses messages go as the chat messages their
		// text was rendered from: the engine's chat template then frames
		// them as its Messages and Responses servers do, near enough that
		// the prefix it caches is the prefix the ids name. The format's own
		// fields (its tools, say) are not chat's and are not sent.
		req.Messages = make([][]byte, len(pb.messages))
		for i, m := range pb.messages {
			b, err := json.Marshal(m)
			if err != nil {
				return nil, fmt.Errorf("%w: %s", errBadBody, shortJSONError(err))
			}
			req.Messages[i] = b
		}
		return req, nil
	}
	chat := pb.textFrom == textChat
	if !chat {
		req.Prompt = pb.text
	}
	var f tokenizeFields
	if err := json.Unmarshal(body, &f); err != nil {
		return nil, fmt.Errorf("%w: %s", errBadBody, shortJSONError(err))
	}
	if chat {
		req.Messages = make([][]byte, len(f.Messages))
		for i, m := range f.Messages {
			req.Messages[i] = m
		}
	}
	req.Options = f.Options(chat)
	return req, nil
}

// tokenize turns the stream's text prompt into the engine's ids within the
// tokenizer's budget; nil routes on the text. withBody: the body may be
// rewritten (the mode re-sends it).
func (st *stream) tokenize(pb *parsedBody, req *selection.SelectRequest, rewrite bool) {
	tz := st.s.tokenizing.Load()
	if tz == nil {
		return
	}
	treq, err := tokenizeRequest(st.body, pb, req.PartitionKey)
	if err != nil || treq == nil {
		return
	}
	ids, err := tz.tk.Tokenize(st.ctx, treq)
	if err != nil {
		st.s.log.Debug("extproc: routing on text", "err", err)
		return
	}
	req.TokenIDs = ids
	if tz.forwardIDs && rewrite && pb.textFrom == textPrompt {
		if b, err := withPromptIDs(st.body, ids); err == nil {
			st.body, req.RequestBytes = b, len(b)
			st.s.metrics.forwardedIDs.Add(1)
		}
	}
}

// withPromptIDs returns body with its "prompt" replaced by ids; every other
// field is kept verbatim, the keys in sorted order.
func withPromptIDs(body []byte, ids []uint32) ([]byte, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return nil, err
	}
	b := make([]byte, 0, 11*len(ids)+2)
	b = append(b, '[')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(id), 10)
	}
	fields["prompt"] = append(b, ']')
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var out bytes.Buffer
	out.Grow(len(body) + len(b))
	out.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			out.WriteByte(',')
		}
		kb, err := json.Marshal(k)
		if err != nil {
			return nil, err
		}
		out.Write(kb)
		out.WriteByte(':')
		out.Write(fields[k])
	}
	out.WriteByte('}')
	return out.Bytes(), nil
}
