package extproc

import (
	"bytes"
	"fmt"
	"strings"

	json "github.com/goccy/go-json"

	"github.com/kvselect/kvselect/selection"
)

// Request formats other than OpenAI's completions and chat. Clients send
// them to the same gateway; read as chat or not at all, their prompt was
// routed blind (a one-token request) or without its system prompt, and a
// repeated request found no cached prefix. Each is read into the identity a
// completions or chat body gives: token ids when the body carries them,
// else a text prompt rendered exactly as chat messages are
// (selection.ChatText: per message its role, a newline, its text, a
// newline), so the same conversation gives the same text — and shares its
// prefix with its next turn — whichever format carried it.

// requestFormat is the API a request body follows.
type requestFormat uint8

const (
	// formatOpenAI: OpenAI completions or chat completions (with Dynamo's
	// nvext), and any body no other format claims.
	formatOpenAI requestFormat = iota
	// formatAnthropic: Anthropic's Messages API, POST /v1/messages
	// (https://docs.anthropic.com/en/api/messages).
	formatAnthropic
	// formatResponses: OpenAI's Responses API, POST /v1/responses
	// (https://platform.openai.com/docs/api-reference/responses/create).
	formatResponses
	// formatSGLang: SGLang's native POST /generate, whose body is
	// GenerateReqInput (python/sglang/srt/managers/io_struct.py in
	// sgl-project/sglang).
	formatSGLang
	// formatVLLMGenerate: vLLM's tokens-in generate API, POST
	// /inference/v1/generate, whose body is GenerateRequest
	// (vllm/entrypoints/serve/disagg/protocol.py in vllm-project/vllm).
	formatVLLMGenerate
)

func (f requestFormat) String() string {
	switch f {
	case formatAnthropic:
		return "anthropic_messages"
	case formatResponses:
		return "openai_responses"
	case formatSGLang:
		return "sglang_generate"
	case formatVLLMGenerate:
		return "vllm_generate"
	}
	return "openai"
}

// detectFormat names the API of a body: by the request path when it is one
// of the formats' own (gateways usually keep it), else by the body's shape,
// cautiously — a field only one format has — so that a body of an API the
// picker does not read (embeddings' "input", say) is not mistaken for one it
// does and refused: it keeps the fallback of a body without a prompt.
func detectFormat(path string, rb *requestBody) requestFormat {
	p, _, _ := strings.Cut(path, "?")
	p = strings.TrimRight(p, "/")
	switch {
	case strings.HasSuffix(p, "/v1/chat/completions"), strings.HasSuffix(p, "/v1/completions"):
		return formatOpenAI
	case strings.HasSuffix(p, "/v1/messages"):
		return formatAnthropic
	case strings.HasSuffix(p, "/v1/responses"):
		return formatResponses
	case strings.HasSuffix(p, "/inference/v1/generate"):
		return formatVLLMGenerate
	case strings.HasSuffix(p, "/generate"):
		return formatSGLang
	}
	switch {
	case present(rb.Prompt):
		return formatOpenAI
	case present(rb.InputIDs):
		return formatSGLang
	case present(rb.TokenIDs) && present(rb.SamplingParams):
		return formatVLLMGenerate
	case len(rb.Messages) > 0 && present(rb.System):
		// Chat has no top-level system; Anthropic has nothing else.
		return formatAnthropic
	case present(rb.Input) && (present(rb.Instructions) || present(rb.MaxOutputTokens)):
		return formatResponses
	case present(rb.Text) && present(rb.SamplingParams):
		return formatSGLang
	}
	return formatOpenAI
}

// present: the field was sent with a value other than null.
func present(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && !bytes.Equal(raw, []byte("null"))
}

// parseOtherFormat fills out from a body of one of the formats above
// (not OpenAI's): the prompt's token ids, else Dynamo's nvext.token_data,
// else its text; the output limit; the stream flag was read by the caller.
func parseOtherFormat(rb *requestBody, out *parsedBody) error {
	var (
		tokens []uint32
		err    error
	)
	switch out.format {
	case formatAnthropic:
		out.maxOutput, err = optionalCount("max_tokens", rb.MaxTokens)
	case formatResponses:
		out.maxOutput, err = optionalCount("max_output_tokens", rb.MaxOutputTokens)
	case formatSGLang:
		if out.maxOutput, err = samplingMax("max_new_tokens", rb.SamplingParams); err == nil {
			tokens, err = tokenIDs("input_ids", rb.InputIDs, true)
			if rb.lifted.inputIDs != nil {
				tokens = rb.lifted.inputIDs
			}
		}
	case formatVLLMGenerate:
		if out.maxOutput, err = samplingMax("max_tokens", rb.SamplingParams); err == nil {
			tokens, err = tokenIDs("token_ids", rb.TokenIDs, false)
			if rb.lifted.tokenIDs != nil {
				tokens = rb.lifted.tokenIDs
			}
		}
	}
	if err != nil {
		return err
	}
	if tokens == nil && rb.Nvext != nil && len(rb.Nvext.TokenData) > 0 {
		tokens = rb.Nvext.TokenData
	}
	if tokens != nil {
		out.tokens = tokens
		return nil
	}
	switch out.format {
	case formatAnthropic:
		out.messages, err = anthropicMessages(rb.System, rb.Messages)
	case formatResponses:
		out.messages, err = responsesMessages(rb.Instructions, rb.Input)
	case formatSGLang:
		out.text, err = firstString("text", rb.Text)
		out.textFrom = textGenerate
		return err
	}
	if err != nil || len(out.messages) == 0 {
		out.messages = nil
		return err
	}
	out.textFrom = textMessages
	out.text, err = selection.ChatText(out.messages)
	if err != nil {
		return fmt.Errorf("%w: %w", errBadBody, err)
	}
	return nil
}

// anthropicMessages renders a Messages API body as chat messages: the
// system prompt (a string or an array of text blocks) as a first "system"
// message, then each message with its text: string content, or the text of
// its blocks in order — text blocks and the text inside tool_result blocks.
// Other blocks (images, documents, tool_use, thinking) add no text and are
// no error: the API defines more block types than the text index needs
// (https://docs.anthropic.com/en/api/messages, "content").
func anthropicMessages(system json.RawMessage, msgs []selection.ChatMessage) ([]selection.ChatMessage, error) {
	out := make([]selection.ChatMessage, 0, len(msgs)+1)
	if present(system) {
		s, err := anthropicText(system, 0)
		if err != nil {
			return nil, fmt.Errorf("%w: system %w", errBadBody, err)
		}
		if s != "" {
			out = append(out, textMessage("system", s))
		}
	}
	for i, m := range msgs {
		s, err := anthropicText(m.Content, 0)
		if err != nil {
			return nil, fmt.Errorf("%w: messages[%d].content %w", errBadBody, i, err)
		}
		out = append(out, textMessage(m.Role, s))
	}
	return out, nil
}

// anthropicBlock is the part of a content block the text reads; text and
// content stay raw so that a block type the picker does not read is never
// refused for the type of a field it does not use.
type anthropicBlock struct {
	Type    string          `json:"type"`
	Text    json.RawMessage `json:"text"`
	Content json.RawMessage `json:"content"` // tool_result: a string or blocks
}

// anthropicText is the text of Anthropic content: a string, or an array of
// blocks. depth > 0 reads a tool_result's own content (one level deep, as
// the API nests it).
func anthropicText(raw json.RawMessage, depth int) (string, error) {
	raw = bytes.TrimSpace(raw)
	switch {
	case !present(raw):
		return "", nil
	case raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", fmt.Errorf("is not a valid string: %s", shortJSONError(err))
		}
		return s, nil
	case raw[0] != '[':
		return "", fmt.Errorf("must be a string or an array of content blocks")
	}
	var blocks []anthropicBlock
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return "", fmt.Errorf("must be a string or an array of content blocks: %s", shortJSONError(err))
	}
	var sb strings.Builder
	for i, b := range blocks {
		switch {
		case b.Type == "text":
			s, err := textField(b.Text)
			if err != nil {
				return "", fmt.Errorf("[%d].text %w", i, err)
			}
			sb.WriteString(s)
		case b.Type == "tool_result" && depth == 0:
			s, err := anthropicText(b.Content, depth+1)
			if err != nil {
				return "", fmt.Errorf("[%d].content %w", i, err)
			}
			sb.WriteString(s)
		}
	}
	return sb.String(), nil
}

// responsesMessages renders a Responses API body as chat messages: the
// instructions as a first "system" message (the API inserts them as a
// system or developer message ahead of the input), then the input — a
// string is one user message; an array holds input items: messages (a role,
// and content that is a string or input_text / output_text parts) and
// function_call_output items (the tool's output, rendered as a "tool"
// message, as chat renders a tool message). Other items (function calls,
// reasoning, item references) and parts (images, files, refusals) add no
// text and are no error
// (https://platform.openai.com/docs/api-reference/responses/create, "input").
func responsesMessages(instructions, input json.RawMessage) ([]selection.ChatMessage, error) {
	var out []selection.ChatMessage
	if present(instructions) {
		s, err := textField(instructions)
		if err != nil {
			return nil, fmt.Errorf("%w: instructions %w", errBadBody, err)
		}
		if s != "" {
			out = append(out, textMessage("system", s))
		}
	}
	input = bytes.TrimSpace(input)
	switch {
	case !present(input):
		return out, nil
	case input[0] == '"':
		s, err := textField(input)
		if err != nil {
			return nil, fmt.Errorf("%w: input %w", errBadBody, err)
		}
		return append(out, textMessage("user", s)), nil
	case input[0] != '[':
		return nil, fmt.Errorf("%w: input must be a string or an array of input items", errBadBody)
	}
	var items []struct {
		Type    string          `json:"type"`
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
		Output  json.RawMessage `json:"output"`
	}
	if err := json.Unmarshal(input, &items); err != nil {
		return nil, fmt.Errorf("%w: input must be a string or an array of input items: %s", errBadBody, shortJSONError(err))
	}
	for i, it := range items {
		var (
			role, s string
			err     error
		)
		switch {
		case (it.Type == "" || it.Type == "message") && it.Role != "":
			role = it.Role
			s, err = responsesText(it.Content)
			if err != nil {
				return nil, fmt.Errorf("%w: input[%d].content %w", errBadBody, i, err)
			}
		case it.Type == "function_call_output":
			role = "tool"
			s, err = responsesText(it.Output)
			if err != nil {
				return nil, fmt.Errorf("%w: input[%d].output %w", errBadBody, i, err)
			}
		default:
			continue
		}
		out = append(out, textMessage(role, s))
	}
	return out, nil
}

// responsesText is the text of a Responses message's content (or a tool
// output): a string, or parts whose text types are read in order.
func responsesText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	switch {
	case !present(raw):
		return "", nil
	case raw[0] == '"':
		return textField(raw)
	case raw[0] != '[':
		return "", fmt.Errorf("must be a string or an array of content parts")
	}
	var parts []struct {
		Type string          `json:"type"`
		Text json.RawMessage `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fmt.Errorf("must be a string or an array of content parts: %s", shortJSONError(err))
	}
	var sb strings.Builder
	for i, p := range parts {
		switch p.Type {
		case "input_text", "output_text", "text":
			s, err := textField(p.Text)
			if err != nil {
				return "", fmt.Errorf("[%d].text %w", i, err)
			}
			sb.WriteString(s)
		}
	}
	return sb.String(), nil
}

// textField decodes a JSON string; null or absent is "".
func textField(raw json.RawMessage) (string, error) {
	if !present(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("must be a string: %s", shortJSONError(err))
	}
	return s, nil
}

// textMessage is a chat message of role with string content s, the form
// selection.ChatText renders and an engine's /tokenize accepts.
func textMessage(role, s string) selection.ChatMessage {
	c, _ := json.Marshal(s) // a Go string always marshals
	return selection.ChatMessage{Role: role, Content: c}
}

// tokenIDs reads a token-id field: an array of ids or, when batch, also an
// array of id arrays (SGLang's input_ids), of which the first identifies
// the request — a batch goes to one worker, as a completions batch does.
// Absent, null or empty is nil.
func tokenIDs(name string, raw json.RawMessage, batch bool) ([]uint32, error) {
	raw = bytes.TrimSpace(raw)
	if !present(raw) {
		return nil, nil
	}
	if raw[0] != '[' {
		return nil, fmt.Errorf("%w: %s must be an array of token ids", errBadBody, name)
	}
	if inner := bytes.TrimSpace(raw[1:]); batch && len(inner) > 0 && inner[0] == '[' {
		var ids [][]uint32
		if err := json.Unmarshal(raw, &ids); err != nil {
			return nil, fmt.Errorf("%w: %s token ids must be integers from 0 to 4294967295: %s", errBadBody, name, shortJSONError(err))
		}
		if len(ids[0]) == 0 {
			return nil, nil
		}
		return ids[0], nil
	}
	ids, ok := scanTokenIDs(raw)
	if !ok {
		if err := json.Unmarshal(raw, &ids); err != nil {
			return nil, fmt.Errorf("%w: %s token ids must be integers from 0 to 4294967295: %s", errBadBody, name, shortJSONError(err))
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	return ids, nil
}

// firstString reads a string, or the first of an array of strings (a batch).
func firstString(name string, raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if !present(raw) {
		return "", nil
	}
	if raw[0] == '[' {
		var batch []string
		if err := json.Unmarshal(raw, &batch); err != nil {
			return "", fmt.Errorf("%w: %s must be a string or an array of strings: %s", errBadBody, name, shortJSONError(err))
		}
		if len(batch) == 0 {
			return "", nil
		}
		return batch[0], nil
	}
	s, err := textField(raw)
	if err != nil {
		return "", fmt.Errorf("%w: %s %w", errBadBody, name, err)
	}
	return s, nil
}

// optionalCount reads a token count: absent or null is nil.
func optionalCount(name string, raw json.RawMessage) (*uint32, error) {
	if !present(raw) {
		return nil, nil
	}
	var n uint32
	if err := json.Unmarshal(raw, &n); err != nil {
		return nil, fmt.Errorf("%w: %s must be an integer from 0 to 4294967295: %s", errBadBody, name, shortJSONError(err))
	}
	return &n, nil
}

// openAILimit is an OpenAI body's output limit: max_completion_tokens,
// which supersedes max_tokens in chat completions as vLLM reads them
// (vllm/entrypoints/openai/protocol.py, ChatCompletionRequest), else
// max_tokens; nil when neither is a count. Unlike the other formats' limits
// a malformed one is not the picker's 400: the limit only bounds an
// estimated end, and the engine judges its own request fields.
func openAILimit(maxCompletion, maxTokens json.RawMessage) *uint32 {
	for _, raw := range []json.RawMessage{maxCompletion, maxTokens} {
		if n, err := optionalCount("", raw); err == nil && n != nil {
			return n
		}
	}
	return nil
}

// samplingMax reads the output limit named name from sampling_params: an
// object, or (SGLang's batch) an array of them whose first applies.
func samplingMax(name string, raw json.RawMessage) (*uint32, error) {
	raw = bytes.TrimSpace(raw)
	if !present(raw) {
		return nil, nil
	}
	var one map[string]json.RawMessage
	if raw[0] == '[' {
		var batch []map[string]json.RawMessage
		if err := json.Unmarshal(raw, &batch); err != nil {
			return nil, fmt.Errorf("%w: sampling_params must be an object or an array of objects: %s", errBadBody, shortJSONError(err))
		}
		if len(batch) == 0 {
			return nil, nil
		}
		one = batch[0]
	} else if err := json.Unmarshal(raw, &one); err != nil {
		return nil, fmt.Errorf("%w: sampling_params must be an object: %s", errBadBody, shortJSONError(err))
	}
	return optionalCount("sampling_params."+name, one[name])
}
