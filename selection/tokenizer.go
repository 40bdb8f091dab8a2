package selection

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
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
	size := 0
	for _, m := range msgs {
		size += len(m.Role) + len(m.Content) + 2
	}
	// The rendering is about as long as the raw messages (escapes shrink,
	// only invalid UTF-8 grows): one buffer, as a rule.
	buf := make([]byte, 0, size)
	for i, m := range msgs {
		buf = append(buf, m.Role...)
		buf = append(buf, '\n')
		c := bytes.TrimSpace(m.Content)
		switch {
		case len(c) == 0 || bytes.Equal(c, []byte("null")):
		case c[0] == '"':
			if out, ok := appendJSONString(buf, c); ok {
				buf = out
				break
			}
			var s string
			if err := json.Unmarshal(c, &s); err != nil {
				return "", fmt.Errorf("messages[%d].content: %s", i, shortError(err))
			}
			buf = append(buf, s...)
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
				buf = append(buf, p.Text...)
				if p.ImageURL != nil {
					buf = append(buf, p.ImageURL.URL...)
				}
			}
		default:
			return "", fmt.Errorf("messages[%d].content must be a string or an array of parts", i)
		}
		buf = append(buf, '\n')
	}
	return string(buf), nil
}

// appendJSONString appends to sb what the JSON string literal raw decodes
// to, exactly as encoding/json decodes it (invalid UTF-8 and unpaired
// surrogates become U+FFFD), in one pass and without the decoder's
// validation pass and copy: a long-context chat message is hundreds of
// kilobytes of text with escapes (newlines, quotes) all through it. It
// reports false, and dst unchanged, for anything that is not one valid
// string literal; the caller then leaves it to encoding/json, for its
// error. FuzzAppendJSONString holds it to encoding/json.
func appendJSONString(dst, raw []byte) ([]byte, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return dst, false
	}
	orig := len(dst)
	s := raw[1 : len(raw)-1]
	for len(s) > 0 {
		i := 0
		for i < len(s) {
			if c := s[i]; c == '\\' || c == '"' || c < 0x20 || c >= utf8.RuneSelf {
				break
			}
			i++
		}
		dst = append(dst, s[:i]...)
		if s = s[i:]; len(s) == 0 {
			break
		}
		switch c := s[0]; {
		case c == '"' || c < 0x20:
			return dst[:orig], false
		case c >= utf8.RuneSelf:
			r, size := utf8.DecodeRune(s)
			if r == utf8.RuneError && size == 1 {
				dst = utf8.AppendRune(dst, utf8.RuneError)
			} else {
				dst = append(dst, s[:size]...)
			}
			s = s[size:]
		default: // a backslash
			if len(s) < 2 {
				return dst[:orig], false
			}
			if e := jsonEscapes[s[1]]; e != 0 {
				dst = append(dst, e)
				s = s[2:]
				continue
			}
			if s[1] != 'u' {
				return dst[:orig], false
			}
			r, ok := hex4(s[2:])
			if !ok {
				return dst[:orig], false
			}
			s = s[6:]
			if utf16.IsSurrogate(r) {
				// A pair decodes to one rune; anything else leaves the
				// first half as U+FFFD and the rest to be read on.
				if len(s) >= 2 && s[0] == '\\' && s[1] == 'u' {
					if r2, ok := hex4(s[2:]); ok {
						if d := utf16.DecodeRune(r, r2); d != unicode.ReplacementChar {
							dst = utf8.AppendRune(dst, d)
							s = s[6:]
							continue
						}
					}
				}
				r = unicode.ReplacementChar
			}
			dst = utf8.AppendRune(dst, r)
		}
	}
	return dst, true
}

// jsonEscapes are the one-character escapes of JSON strings and what they
// stand for; 0 for any other character.
var jsonEscapes = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// hex4 reads the four hex digits of a \u escape.
func hex4(s []byte) (rune, bool) {
	if len(s) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range s[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// shortError keeps a decoder's message to one short line.
func shortError(err error) string {
	s := err.Error()
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}
