package httpadmin

import (
	"bytes"
	"encoding/json"

	gojson "github.com/goccy/go-json"

	"github.com/kvselect/kvselect/selection"
)

// Text prompts on /select and /select_and_reserve (kvselect's, not Dynamo's):
// with a Tokenizer configured (--tokenize), a body without token_ids,
// mm_routing_info or hashes may carry the prompt as text, as an OpenAI body
// does — "prompt" (a string) or "messages" (chat messages) with the fields
// that change the ids (add_generation_prompt, chat_template, ...). The text
// is tokenized by the engine and routed on its ids, as the ext_proc picker
// does; when tokenizing fails it routes on the approximate text index, with
// the same character-block hashing as the picker, so both fronts share what
// the text index learned. Without a Tokenizer these fields are ignored, as
// Dynamo ignores unknown fields, and the body needs ids or hashes as before.

// textFields are the text prompt fields of a /select body.
type textFields struct {
	Prompt   json.RawMessage   `json:"prompt"`
	Messages []json.RawMessage `json:"messages"`
	selection.TokenizeFields
}

// readText fills req.PromptText from a body that identifies its prompt only
// by text and returns the /tokenize request for it; nil when the body has
// ids or hashes, or no text. A text field of the wrong shape is a 422.
func readText(req *selection.SelectRequest, body []byte) (*selection.TokenizeRequest, error) {
	p := &req.PromptRequest
	if p.TokenIDs != nil || p.MMRoutingInfo != nil || p.BlockHashes != nil || p.SequenceHashes != nil || p.ISLTokens != nil {
		return nil, nil
	}
	var f textFields
	if err := gojson.Unmarshal(body, &f); err != nil {
		return nil, shapef("prompt / messages: %s", err.Error())
	}
	treq := &selection.TokenizeRequest{PartitionKey: req.PartitionKey}
	chat := false
	switch prompt := bytes.TrimSpace(f.Prompt); {
	case len(prompt) > 0 && !bytes.Equal(prompt, []byte("null")):
		var s string
		if err := json.Unmarshal(prompt, &s); err != nil {
			return nil, shapef("prompt: invalid type, expected a string")
		}
		treq.Prompt, p.PromptText = s, s
	case len(f.Messages) > 0:
		msgs := make([]selection.ChatMessage, len(f.Messages))
		for i, raw := range f.Messages {
			if err := gojson.Unmarshal(raw, &msgs[i]); err != nil {
				return nil, shapef("messages: %s", err.Error())
			}
		}
		text, err := selection.ChatText(msgs)
		if err != nil {
			return nil, shapef("%s", err.Error())
		}
		chat, p.PromptText = true, text
		treq.Messages = make([][]byte, len(f.Messages))
		for i, m := range f.Messages {
			treq.Messages[i] = m
		}
	}
	if p.PromptText == "" {
		return nil, nil
	}
	treq.Options = f.Options(chat)
	return treq, nil
}
