package selection

import "context"

// Tokenizer turns a text prompt into the token ids the engine will prefill
// for it. selection never calls one: the fronts do, before Select, when they
// hold a prompt known only as text (engines/tokenize asks the engines'
// /tokenize; server wires it into the fronts). On any error the front routes
// the text on the partition's text index instead (textprompt.go), so an
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
	// tokenizes, verbatim JSON values sorted by name: add_generation_prompt,
	// continue_final_message, chat_template, chat_template_kwargs, tools,
	// documents, add_special_tokens.
	Options []TokenizeOption
}

// TokenizeOption is one request field passed to the engine's /tokenize.
type TokenizeOption struct {
	Name  string
	Value []byte // JSON
}

// IsTokenizeField reports whether a request field is one a front copies
// into TokenizeRequest.Options: vLLM's /tokenize accepts each of them and each
// can change the ids (vllm/entrypoints/openai/serving_tokenization.py).
func IsTokenizeField(name string) bool {
	switch name {
	case "add_generation_prompt", "add_special_tokens", "chat_template", "chat_template_kwargs",
		"continue_final_message", "documents", "tools":
		return true
	}
	return false
}
