package selection

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
)

// Tokenizer turns a text prompt into the token ids the engine will prefill
// for it. selection never calls one: the fronts do, before Select, when they
// hold a prompt known only as text (engines/tokenize asks the engines'
// /tokenize; server wires it into the fronts). On any error the front routes
// the text on the partition's text index instead (package textindex), so an
// implementation may fail fast.
type Tokenizer interface {
	Tokenize(ctx context.Context, req *TokenizeRequest) ([]uint32, error)
}

// TokenizeRequest is a text prompt as the client sent it: a completions
// prompt, or chat messages with the request's own template fields, so that the
// engine applies its own chat template exactly as it will for the request.
type TokenizeRequest struct {
	PartitionKey
	// Prompt is the completions prompt text; empty for chat.
	Prompt string
	// Messages are the chat messages, each the client's JSON object verbatim
	// (role, content and any field a template reads: name, tool_calls, ...).
	Messages [][]byte
	// Options are the request's fields that change what the engine
	// tokenizes, verbatim JSON values sorted by name (TokenizeFields).
	Options []TokenizeOption
}

// TokenizeOption is one request field passed to the engine's /tokenize.
type TokenizeOption struct {
	Name  string
	Value []byte // JSON
}

// TokenizeFields are the fields of an OpenAI request body that change the
// ids an engine's /tokenize answers with; vLLM's /tokenize accepts each of them
// (vllm/entrypoints/openai/serving_tokenization.py). Both fronts decode them
// with the body and pass Options on.
type TokenizeFields struct {
	AddGenerationPrompt  json.RawMessage `json:"add_generation_prompt"`
	AddSpecialTokens     json.RawMessage `json:"add_special_tokens"`
	ChatTemplate         json.RawMessage `json:"chat_template"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
	ContinueFinalMessage json.RawMessage `json:"continue_final_message"`
	Documents            json.RawMessage `json:"documents"`
	Tools                json.RawMessage `json:"tools"`
}

// Options returns the fields present and not null, sorted by name. A
// completions prompt has no chat template, so only add_special_tokens applies
// to it.
func (f *TokenizeFields) Options(chat bool) []TokenizeOption {
	var out []TokenizeOption
	for _, o := range [...]struct {
		name string
		v    json.RawMessage
	}{
		{"add_generation_prompt", f.AddGenerationPrompt}, {"add_special_tokens", f.AddSpecialTokens},
		{"chat_template", f.ChatTemplate}, {"chat_template_kwargs", f.ChatTemplateKwargs},
		{"continue_final_message", f.ContinueFinalMessage}, {"documents", f.Documents}, {"tools", f.Tools},
	} {
		v := bytes.TrimSpace(o.v)
		if len(v) == 0 || bytes.Equal(v, []byte("null")) || (!chat && o.name != "add_special_tokens") {
			continue
		}
		out = append(out, TokenizeOption{Name: o.name, Value: v})
	}
	return out
}

// ChatMessage is the part of an OpenAI chat message the text index reads.
type ChatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// ChatText flattens chat messages into the text prompt that is hashed into
// the text index: per message its role, a newline, its text content (string
// content, or the text parts and image URLs of a parts array), a newline.
// Later turns of a conversation extend earlier ones, so they share a prefix
// whatever the client's JSON spacing. Both fronts use it, so a conversation
// seen by either teaches the same text chain.
func ChatText(msgs []ChatMessage) (string, error) {
	var sb strings.Builder
	for i, m := range msgs {
		sb.WriteString(m.Role)
		sb.WriteByte('\n')
		c := bytes.TrimSpace(m.Content)
		switch {
		case len(c) == 0 || bytes.Equal(c, []byte("null")):
		case c[0] == '"':
			var s string
			if err := json.Unmarshal(c, &s); err != nil {
				return "", fmt.Errorf("messages[%d].content: %s", i, shortError(err))
			}
			sb.WriteString(s)
		case c[0] == '[':
			var parts []struct {
				Text     string `json:"text"`
				ImageURL *struct {
					URL string `json:"url"`
				} `json:"image_url"`
			}
			if err := json.Unmarshal(c, &parts); err != nil {
				return "", fmt.Errorf("messages[%d].content: %s", i, shortError(err))
			}
			for _, p := range parts {
				sb.WriteString(p.Text)
				if p.ImageURL != nil {
					sb.WriteString(p.ImageURL.URL)
				}
			}
		default:
			return "", fmt.Errorf("messages[%d].content must be a string or an array of parts", i)
		}
		sb.WriteByte('\n')
	}
	return sb.String(), nil
}

// shortError keeps a decoder's message to one short line.
func shortError(err error) string {
	s := err.Error()
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}
