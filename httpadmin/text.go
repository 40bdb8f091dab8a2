package httpadmin

import (
	"bytes"
	"encoding/json"
	"strings"

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
	Prompt               json.RawMessage   `json:"prompt"`
	Messages             []json.RawMessage `json:"messages"`
	AddGenerationPrompt  json.RawMessage   `json:"add_generation_prompt"`
	AddSpecialTokens     json.RawMessage   `json:"add_special_tokens"`
	ChatTemplate         json.RawMessage   `json:"chat_template"`
	ChatTemplateKwargs   json.RawMessage   `json:"chat_template_kwargs"`
	ContinueFinalMessage json.RawMessage   `json:"continue_final_message"`
	Tools                json.RawMessage   `json:"tools"`
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
		text, err := flattenChat(f.Messages)
		if err != nil {
			return nil, err
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
	for _, o := range []struct {
		name string
		v    json.RawMessage
	}{
		{"add_generation_prompt", f.AddGenerationPrompt}, {"add_special_tokens", f.AddSpecialTokens},
		{"chat_template", f.ChatTemplate}, {"chat_template_kwargs", f.ChatTemplateKwargs},
		{"continue_final_message", f.ContinueFinalMessage}, {"tools", f.Tools},
	} {
		v := bytes.TrimSpace(o.v)
		if len(v) == 0 || bytes.Equal(v, []byte("null")) || (!chat && o.name != "add_special_tokens") {
			continue
		}
		treq.Options = append(treq.Options, selection.TokenizeOption{Name: o.name, Value: v})
	}
	return treq, nil
}

// flattenChat is the text the ext_proc picker hashes for chat messages
// (extproc's chatText; TestRESTAndExtProcShareTheTextIndex holds them
// equal): per message its role, a newline, its text content (a string, or
// the text parts and image URLs of a parts array), a newline.
func flattenChat(msgs []json.RawMessage) (string, error) {
	var sb strings.Builder
	for _, raw := range msgs {
		var m struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if err := gojson.Unmarshal(raw, &m); err != nil {
			return "", shapef("messages: %s", err.Error())
		}
		sb.WriteString(m.Role)
		sb.WriteByte('\n')
		c := bytes.TrimSpace(m.Content)
		switch {
		case len(c) == 0 || bytes.Equal(c, []byte("null")):
		case c[0] == '"':
			var s string
			if err := json.Unmarshal(c, &s); err != nil {
				return "", shapef("messages: content: %s", err.Error())
			}
			sb.WriteString(s)
		case c[0] == '[':
			var parts []struct {
				Text     string `json:"text"`
				ImageURL *struct {
					URL string `json:"url"`
				} `json:"image_url"`
			}
			if err := gojson.Unmarshal(c, &parts); err != nil {
				return "", shapef("messages: content: %s", err.Error())
			}
			for _, p := range parts {
				sb.WriteString(p.Text)
				if p.ImageURL != nil {
					sb.WriteString(p.ImageURL.URL)
				}
			}
		default:
			return "", shapef("messages: content must be a string or an array of parts")
		}
		sb.WriteByte('\n')
	}
	return sb.String(), nil
}
