package extproc

import (
	"bytes"
	stdjson "encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kvselect/kvselect/selection"
)

// formatCase is one body of a request format and what the picker reads
// from it. The bodies follow the examples of each API's public reference
// (Anthropic's Messages API, OpenAI's Responses API, SGLang's
// GenerateReqInput, vLLM's tokens-in GenerateRequest).
type formatCase struct {
	name, path, body string
	format           requestFormat
	tokens           []uint32
	text             string
	textFrom         textSource
	model            string
	stream           bool
	maxOutput        uint32 // 0: none
	err              string
}

func runFormatCases(t *testing.T, cases []formatCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseBody([]byte(tc.body), tc.path)
			if tc.err != "" {
				if err == nil || !errors.Is(err, errBadBody) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want errBadBody containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.format != tc.format {
				t.Fatalf("format %v, want %v", got.format, tc.format)
			}
			if !slices.Equal(got.tokens, tc.tokens) || got.text != tc.text || got.model != tc.model || got.stream != tc.stream {
				t.Fatalf("tokens %v text %q model %q stream %v; want %v %q %q %v", got.tokens, got.text, got.model, got.stream,
					tc.tokens, tc.text, tc.model, tc.stream)
			}
			if tc.text != "" && got.textFrom != tc.textFrom {
				t.Fatalf("text from %d, want %d", got.textFrom, tc.textFrom)
			}
			if (got.maxOutput == nil) != (tc.maxOutput == 0) || (got.maxOutput != nil && *got.maxOutput != tc.maxOutput) {
				t.Fatalf("max output %v, want %d", got.maxOutput, tc.maxOutput)
			}
		})
	}
}

func TestParseAnthropicMessages(t *testing.T) {
	const path = "/v1/messages"
	runFormatCases(t, []formatCase{
		{name: "string content", path: path, format: formatAnthropic, model: "claude-sonnet-4-5", maxOutput: 1024,
			body: `{"model":"claude-sonnet-4-5","max_tokens":1024,"messages":[{"role":"user","content":"Hello, world"}]}`,
			text: "user\nHello, world\n", textFrom: textMessages},
		{name: "system string", path: path, format: formatAnthropic, maxOutput: 1024, stream: true,
			body: `{"max_tokens":1024,"stream":true,"system":"Be terse.","messages":[{"role":"user","content":"Hi"}]}`,
			text: "system\nBe terse.\nuser\nHi\n", textFrom: textMessages},
		{name: "system text blocks", path: path, format: formatAnthropic,
			body: `{"system":[{"type":"text","text":"Be "},{"type":"text","text":"terse.","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"Hi"}]}`,
			text: "system\nBe terse.\nuser\nHi\n", textFrom: textMessages},
		{name: "block content and a multi-turn conversation", path: path, format: formatAnthropic,
			body: `{"messages":[{"role":"user","content":[{"type":"text","text":"Hello"}]},{"role":"assistant","content":"Hi, I'm Claude."},{"role":"user","content":[{"type":"text","text":"Explain "},{"type":"text","text":"LLMs."}]}]}`,
			text: "user\nHello\nassistant\nHi, I'm Claude.\nuser\nExplain LLMs.\n", textFrom: textMessages},
		{name: "images, tool use and tool results", path: path, format: formatAnthropic,
			body: `{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/jpeg","data":"/9j/4AAQ"}},{"type":"text","text":"What is this?"}]},` +
				`{"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"x"},{"type":"tool_use","id":"toolu_01","name":"get_weather","input":{"location":"SF"}}]},` +
				`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_01","content":"15 degrees"},{"type":"tool_result","tool_use_id":"toolu_02","content":[{"type":"text","text":" and sunny"},{"type":"image","source":{"type":"url","url":"https://x/i.png"}}]}]}]}`,
			text: "user\nWhat is this?\nassistant\n\nuser\n15 degrees and sunny\n", textFrom: textMessages},
		{name: "nvext token data wins over the text", path: path, format: formatAnthropic, tokens: []uint32{7, 8},
			body: `{"messages":[{"role":"user","content":"x"}],"nvext":{"token_data":[7,8]}}`},
		{name: "query string on the path", path: path + "?beta=true", format: formatAnthropic,
			body: `{"messages":[{"role":"user","content":"q"}]}`, text: "user\nq\n", textFrom: textMessages},
		{name: "by shape: top-level system", format: formatAnthropic,
			body: `{"system":"S","messages":[{"role":"user","content":"q"}]}`, text: "system\nS\nuser\nq\n", textFrom: textMessages},
		{name: "no messages: nothing identified", path: path, format: formatAnthropic, body: `{"model":"c","max_tokens":5}`, model: "c", maxOutput: 5},
		{name: "system number", path: path, body: `{"system":5,"messages":[]}`, err: "system must be a string or an array of content blocks"},
		{name: "system block text number", path: path, body: `{"system":[{"type":"text","text":5}]}`, err: "system [0].text must be a string"},
		{name: "content number", path: path, body: `{"messages":[{"role":"user","content":5}]}`, err: "messages[0].content must be"},
		{name: "block not an object", path: path, body: `{"messages":[{"role":"user","content":["hi"]}]}`, err: "messages[0].content must be"},
		{name: "tool result content number", path: path, body: `{"messages":[{"role":"user","content":[{"type":"tool_result","content":1}]}]}`,
			err: "messages[0].content [0].content must be"},
		{name: "max_tokens a string", path: path, body: `{"max_tokens":"10","messages":[]}`, err: "max_tokens must be an integer"},
		{name: "max_tokens negative", path: path, body: `{"max_tokens":-1}`, err: "max_tokens must be an integer"},
		{name: "stream a string", path: path, body: `{"stream":"yes"}`, err: "invalid request body"},
	})
}

func TestParseResponses(t *testing.T) {
	const path = "/v1/responses"
	runFormatCases(t, []formatCase{
		{name: "string input", path: path, format: formatResponses, model: "gpt-4.1",
			body: `{"model":"gpt-4.1","input":"Tell me a three sentence bedtime story about a unicorn."}`,
			text: "user\nTell me a three sentence bedtime story about a unicorn.\n", textFrom: textMessages},
		{name: "instructions", path: path, format: formatResponses, stream: true, maxOutput: 500,
			body: `{"instructions":"Talk like a pirate.","input":"Are semicolons optional in JavaScript?","stream":true,"max_output_tokens":500}`,
			text: "system\nTalk like a pirate.\nuser\nAre semicolons optional in JavaScript?\n", textFrom: textMessages},
		{name: "input_text parts and an image", path: path, format: formatResponses,
			body: `{"input":[{"role":"user","content":[{"type":"input_text","text":"what is in "},{"type":"input_image","image_url":"https://x/i.jpg"},{"type":"input_text","text":"this image?"}]}]}`,
			text: "user\nwhat is in this image?\n", textFrom: textMessages},
		{name: "messages, function calls and their outputs", path: path, format: formatResponses,
			body: `{"input":[{"type":"message","role":"developer","content":"Use tools."},{"role":"user","content":"Weather in Paris?"},` +
				`{"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},` +
				`{"type":"function_call_output","call_id":"c1","output":"18C"},{"type":"reasoning","id":"r1","summary":[]},` +
				`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"It is 18C."},{"type":"refusal","refusal":"no"}]}]}`,
			text: "developer\nUse tools.\nuser\nWeather in Paris?\ntool\n18C\nassistant\nIt is 18C.\n", textFrom: textMessages},
		{name: "by shape: input and instructions", format: formatResponses,
			body: `{"instructions":"I","input":"q"}`, text: "system\nI\nuser\nq\n", textFrom: textMessages},
		{name: "by shape: embeddings input is not read", format: formatOpenAI, model: "e",
			body: `{"model":"e","input":["a","b"]}`},
		{name: "input number", path: path, body: `{"input":5}`, err: "input must be a string or an array of input items"},
		{name: "input item not an object", path: path, body: `{"input":["hi"]}`, err: "input must be a string or an array of input items"},
		{name: "content number", path: path, body: `{"input":[{"role":"user","content":5}]}`, err: "input[0].content must be"},
		{name: "part text number", path: path, body: `{"input":[{"role":"user","content":[{"type":"input_text","text":1}]}]}`, err: "input[0].content [0].text must be a string"},
		{name: "instructions object", path: path, body: `{"instructions":{},"input":"x"}`, err: "instructions must be a string"},
		{name: "max_output_tokens float", path: path, body: `{"input":"x","max_output_tokens":1.5}`, err: "max_output_tokens must be an integer"},
	})
}

func TestParseGenerate(t *testing.T) {
	runFormatCases(t, []formatCase{
		{name: "sglang text", path: "/generate", format: formatSGLang, maxOutput: 32,
			body: `{"text":"The capital of France is","sampling_params":{"temperature":0,"max_new_tokens":32}}`,
			text: "The capital of France is", textFrom: textGenerate},
		{name: "sglang input_ids streamed", path: "/generate", format: formatSGLang, tokens: []uint32{1, 2, 3}, stream: true, maxOutput: 8,
			body: `{"input_ids":[1,2,3],"sampling_params":{"max_new_tokens":8},"stream":true}`},
		{name: "sglang input_ids win over text", path: "/generate", format: formatSGLang, tokens: []uint32{4},
			body: `{"text":"t","input_ids":[4]}`},
		{name: "sglang batch", path: "/generate", format: formatSGLang, tokens: []uint32{1, 2}, maxOutput: 4,
			body: `{"input_ids":[[1,2],[3]],"sampling_params":[{"max_new_tokens":4},{"max_new_tokens":9}]}`},
		{name: "sglang text batch", path: "/generate", format: formatSGLang, text: "a", textFrom: textGenerate, body: `{"text":["a","b"]}`},
		{name: "sglang by shape", format: formatSGLang, tokens: []uint32{5, 6}, body: `{"input_ids":[5,6]}`},
		{name: "sglang text by shape", format: formatSGLang, text: "p", textFrom: textGenerate, body: `{"text":"p","sampling_params":{}}`},
		{name: "sglang null max_new_tokens", path: "/generate", format: formatSGLang, body: `{"sampling_params":{"max_new_tokens":null}}`},
		{name: "vllm token_ids", path: "/inference/v1/generate", format: formatVLLMGenerate, tokens: []uint32{9, 8, 7}, model: "m", stream: true, maxOutput: 10,
			body: `{"model":"m","token_ids":[9,8,7],"sampling_params":{"max_tokens":10,"temperature":0},"stream":true}`},
		{name: "vllm by shape", format: formatVLLMGenerate, tokens: []uint32{1}, body: `{"token_ids":[1],"sampling_params":{}}`},
		{name: "vllm empty ids: nothing identified", path: "/inference/v1/generate", format: formatVLLMGenerate, body: `{"token_ids":[]}`},
		{name: "input_ids a string", path: "/generate", body: `{"input_ids":"1,2"}`, err: "input_ids must be an array of token ids"},
		{name: "input_ids strings", path: "/generate", body: `{"input_ids":["a"]}`, err: "input_ids token ids must be integers"},
		{name: "input_ids batch negative", path: "/generate", body: `{"input_ids":[[-1]]}`, err: "input_ids token ids must be integers"},
		{name: "text number", path: "/generate", body: `{"text":5}`, err: "text must be a string"},
		{name: "sampling_params a string", path: "/generate", body: `{"sampling_params":"x"}`, err: "sampling_params must be an object"},
		{name: "max_new_tokens float", path: "/generate", body: `{"sampling_params":{"max_new_tokens":1.5}}`, err: "sampling_params.max_new_tokens must be an integer"},
		{name: "vllm token_ids too large", path: "/inference/v1/generate", body: `{"token_ids":[4294967296]}`, err: "token_ids token ids must be integers"},
		{name: "vllm token_ids batch", path: "/inference/v1/generate", body: `{"token_ids":[[1]]}`, err: "token_ids token ids must be integers"},
	})
}

// OpenAI's output limits bound an estimated end; a malformed one is the
// engine's to refuse, not the picker's.
func TestParseOpenAILimits(t *testing.T) {
	const c, chat = "/v1/completions", "/v1/chat/completions"
	msgs := `"messages":[{"role":"user","content":"q"}]`
	runFormatCases(t, []formatCase{
		{name: "completions max_tokens", path: c, format: formatOpenAI, tokens: []uint32{1, 2}, maxOutput: 16,
			body: `{"prompt":[1,2],"max_tokens":16}`},
		{name: "chat max_completion_tokens wins", path: chat, format: formatOpenAI, text: "user\nq\n", textFrom: textChat, maxOutput: 7,
			body: `{` + msgs + `,"max_tokens":100,"max_completion_tokens":7}`},
		{name: "chat max_tokens", path: chat, format: formatOpenAI, text: "user\nq\n", textFrom: textChat, maxOutput: 100,
			body: `{` + msgs + `,"max_tokens":100}`},
		{name: "null", path: c, format: formatOpenAI, tokens: []uint32{1}, body: `{"prompt":[1],"max_tokens":null}`},
		{name: "malformed: no limit, no error", path: c, format: formatOpenAI, tokens: []uint32{1}, body: `{"prompt":[1],"max_tokens":"many"}`},
		{name: "negative: no limit", path: c, format: formatOpenAI, tokens: []uint32{1}, body: `{"prompt":[1],"max_tokens":-1}`},
		{name: "malformed completion limit falls back", path: chat, format: formatOpenAI, text: "user\nq\n", textFrom: textChat, maxOutput: 3,
			body: `{` + msgs + `,"max_completion_tokens":1.5,"max_tokens":3}`},
	})
}

// The same conversation renders the same text in every format that can
// carry it, so a conversation keeps its cached prefix whichever API its
// client speaks, and each turn extends the text of the turn before.
func TestFormatsRenderConversationsAlike(t *testing.T) {
	bodies := map[string][2]string{
		"chat":                {"", `{"messages":[{"role":"system","content":"S"},{"role":"user","content":"Q"}]}`},
		"chat parts":          {"", `{"messages":[{"role":"system","content":[{"type":"text","text":"S"}]},{"role":"user","content":[{"type":"text","text":"Q"}]}]}`},
		"anthropic string":    {"/v1/messages", `{"system":"S","messages":[{"role":"user","content":"Q"}]}`},
		"anthropic blocks":    {"/v1/messages", `{"system":[{"type":"text","text":"S"}],"messages":[{"role":"user","content":[{"type":"text","text":"Q"}]}]}`},
		"responses string":    {"/v1/responses", `{"instructions":"S","input":"Q"}`},
		"responses items":     {"/v1/responses", `{"input":[{"role":"system","content":"S"},{"role":"user","content":[{"type":"input_text","text":"Q"}]}]}`},
		"responses no system": {"/v1/responses", `{"instructions":"S","input":[{"type":"message","role":"user","content":"Q"}]}`},
	}
	for name, b := range bodies {
		got, err := parseBody([]byte(b[1]), b[0])
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got.text != "system\nS\nuser\nQ\n" {
			t.Errorf("%s: text %q", name, got.text)
		}
	}
	turn1, _ := parseBody([]byte(`{"system":"S","messages":[{"role":"user","content":"Q"}]}`), "/v1/messages")
	turn2, _ := parseBody([]byte(`{"system":"S","messages":[{"role":"user","content":"Q"},{"role":"assistant","content":[{"type":"text","text":"A"}]},{"role":"user","content":"Q2"}]}`), "/v1/messages")
	if !strings.HasPrefix(turn2.text, turn1.text) {
		t.Fatalf("turn 2 %q does not extend turn 1 %q", turn2.text, turn1.text)
	}
}

// The engine's /tokenize gets a Messages or Responses prompt as the chat
// messages its text was rendered from, without the format's own fields.
func TestTokenizeRequestOfOtherFormats(t *testing.T) {
	body := []byte(`{"system":[{"type":"text","text":"S"}],"tools":[{"name":"f","input_schema":{}}],"messages":[{"role":"user","content":[{"type":"text","text":"Q"}]}]}`)
	pb, err := parseBody(body, "/v1/messages")
	if err != nil {
		t.Fatal(err)
	}
	req, err := tokenizeRequest(body, &pb, selection.PartitionKey{ModelName: "m"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range req.Messages {
		got = append(got, string(m))
	}
	want := []string{`{"role":"system","content":"S"}`, `{"role":"user","content":"Q"}`}
	if !slices.Equal(got, want) || req.Prompt != "" || req.Options != nil {
		t.Fatalf("messages %q prompt %q options %v; want %q", got, req.Prompt, req.Options, want)
	}
	gen := []byte(`{"text":"hello","sampling_params":{"max_new_tokens":4}}`)
	pb, err = parseBody(gen, "/generate")
	if err != nil {
		t.Fatal(err)
	}
	if req, err = tokenizeRequest(gen, &pb, selection.PartitionKey{}); err != nil || req.Prompt != "hello" || req.Messages != nil {
		t.Fatalf("generate text: %+v, %v", req, err)
	}
}

// The limit on a request's output caps the expected output, and sets none
// by itself.
func TestMaxOutputCapsExpectedOutput(t *testing.T) {
	for _, tc := range []struct {
		body   string
		header string
		want   uint32 // 0: none
	}{
		{body: `{"max_tokens":100,"messages":[{"role":"user","content":"x"}]}`},
		{body: `{"max_tokens":100,"messages":[{"role":"user","content":"x"}]}`, header: "500", want: 100},
		{body: `{"max_tokens":100,"messages":[{"role":"user","content":"x"}]}`, header: "50", want: 50},
		{body: `{"max_tokens":100,"messages":[{"role":"user","content":"x"}],"nvext":{"agent_hints":{"osl":300}}}`, want: 100},
	} {
		id := identity{path: "/v1/messages", expected: nil}
		if tc.header != "" {
			var n uint32
			for _, c := range tc.header {
				n = n*10 + uint32(c-'0')
			}
			id.expected = &n
		}
		in, err := readSelectInput(&id, []byte(tc.body), &Options{})
		if err != nil {
			t.Fatal(err)
		}
		got := in.req.ExpectedOutputTokens
		if (got == nil) != (tc.want == 0) || (got != nil && *got != tc.want) {
			t.Errorf("%s with header %q: expected output %v, want %d", tc.body, tc.header, got, tc.want)
		}
	}
}

func TestTokenCounterAnthropicStream(t *testing.T) {
	// The event sequence of Anthropic's streaming reference: framing events,
	// two text deltas, and usage in message_start and message_delta.
	stream := "event: message_start\n" +
		`data: {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "claude", "stop_reason": null, "usage": {"input_tokens": 25, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 5, "output_tokens": 1}}}` + "\n\n" +
		"event: content_block_start\n" + `data: {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}` + "\n\n" +
		"event: ping\n" + `data: {"type": "ping"}` + "\n\n" +
		"event: content_block_delta\n" + `data: {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello"}}` + "\n\n" +
		"event: content_block_delta\n" + `data: {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "!"}}` + "\n\n" +
		"event: content_block_stop\n" + `data: {"type": "content_block_stop", "index": 0}` + "\n\n"
	c := tokenCounter{format: formatAnthropic}
	c.feed([]byte(stream[:100]))
	c.feed([]byte(stream[100:]))
	if c.tokens() != 2 || c.events != 2 {
		t.Fatalf("%d tokens (%d events), want the 2 deltas", c.tokens(), c.events)
	}
	if c.eng != (engineUsage{seen: true, promptTokens: 130, cachedTokens: 100}) {
		t.Fatalf("engine usage %+v, want 130 prompt tokens (25 + 100 read + 5 written), 100 cached", c.eng)
	}
	c.feed([]byte("event: message_delta\n" + `data: {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 15}}` + "\n\n" +
		"event: message_stop\n" + `data: {"type": "message_stop"}` + "\n\n"))
	if c.tokens() != 15 || c.eng.promptTokens != 130 {
		t.Fatalf("%d tokens, engine %+v; want message_delta's 15 and message_start's prompt", c.tokens(), c.eng)
	}
}

func TestTokenCounterResponsesStream(t *testing.T) {
	c := tokenCounter{format: formatResponses}
	c.feed([]byte("event: response.created\n" + `data: {"type":"response.created","response":{"id":"resp_1","status":"in_progress","usage":null}}` + "\n\n" +
		"event: response.output_item.added\n" + `data: {"type":"response.output_item.added","output_index":0,"item":{"type":"message","content":[]}}` + "\n\n" +
		"event: response.output_text.delta\n" + `data: {"type":"response.output_text.delta","item_id":"m","output_index":0,"content_index":0,"delta":"Hi"}` + "\n\n" +
		"event: response.output_text.delta\n" + `data: {"type":"response.output_text.delta","item_id":"m","output_index":0,"content_index":0,"delta":" there"}` + "\n\n" +
		"event: response.output_text.done\n" + `data: {"type":"response.output_text.done","text":"Hi there"}` + "\n\n"))
	if c.tokens() != 2 || c.eng.seen {
		t.Fatalf("%d tokens, engine %+v; want the 2 deltas and no usage yet", c.tokens(), c.eng)
	}
	c.feed([]byte("event: response.completed\n" + `data: {"type":"response.completed","response":{"id":"resp_1","status":"completed","usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":32},"output_tokens":87,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":123}}}` + "\n\n"))
	if c.tokens() != 87 || c.eng != (engineUsage{seen: true, promptTokens: 36, cachedTokens: 32}) {
		t.Fatalf("%d tokens, engine %+v; want response.usage's 87, 36 prompt, 32 cached", c.tokens(), c.eng)
	}
	// A server that does not write the type first is still read.
	c = tokenCounter{format: formatResponses}
	c.feed([]byte(`data: {"delta":"x","type":"response.output_text.delta"}` + "\n\n"))
	if c.tokens() != 1 {
		t.Fatalf("%d tokens, want 1", c.tokens())
	}
}

func TestTokenCounterSGLangStream(t *testing.T) {
	c := tokenCounter{format: formatSGLang}
	c.feed([]byte(`data: {"text":" Paris","meta_info":{"id":"r","finish_reason":null,"prompt_tokens":7,"completion_tokens":1,"cached_tokens":4}}` + "\n\n" +
		`data: {"text":" Paris is \"meta_info\"","meta_info":{"id":"r","prompt_tokens":7,"completion_tokens":5,"cached_tokens":4}}` + "\n\ndata: [DONE]\n\n"))
	if c.tokens() != 5 || c.eng != (engineUsage{seen: true, promptTokens: 7, cachedTokens: 4}) {
		t.Fatalf("%d tokens, engine %+v; want meta_info's 5, 7 prompt, 4 cached", c.tokens(), c.eng)
	}
}

func TestUsageFromTailFormats(t *testing.T) {
	for _, tc := range []struct {
		name              string
		format            requestFormat
		body              string
		completion, p, ca int
	}{
		{"openai", formatOpenAI, `{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":8}}}`, 3, 9, 8},
		{"anthropic", formatAnthropic, `{"id":"msg_01","type":"message","role":"assistant","content":[{"type":"text","text":"Hi \"usage\""}],"stop_reason":"end_turn","usage":{"input_tokens":2095,"output_tokens":503,"cache_read_input_tokens":1000}}`, 503, 3095, 1000},
		{"responses", formatResponses, `{"id":"resp_1","object":"response","output":[],"usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":0},"output_tokens":87,"total_tokens":123},"user":null}`, 87, 36, 0},
		{"sglang", formatSGLang, `{"text":"Paris.","meta_info":{"id":"r","finish_reason":{"type":"length","length":32},"prompt_tokens":7,"completion_tokens":32,"cached_tokens":6,"e2e_latency":0.4}}`, 32, 7, 6},
	} {
		completion, eng := usageFromTail([]byte(tc.body), tc.format)
		if completion != tc.completion || eng != (engineUsage{seen: true, promptTokens: tc.p, cachedTokens: tc.ca}) {
			t.Errorf("%s: completion %d, engine %+v; want %d, %d, %d", tc.name, completion, eng, tc.completion, tc.p, tc.ca)
		}
	}
}

// fuzzOtherFormat checks a parse of any bytes as a body of one format: a
// body error, or one identity — token ids or text — never both, and text
// rendered from its messages exactly as chat renders them.
func fuzzOtherFormat(t *testing.T, b []byte, path string) {
	got, err := parseBody(b, path)
	if err != nil {
		if !errors.Is(err, errBadBody) {
			t.Fatalf("error without errBadBody: %v", err)
		}
		if !utf8.ValidString(err.Error()) && utf8.Valid(b) {
			t.Fatalf("error message is not UTF-8: %q", err.Error())
		}
		return
	}
	if got.tokens != nil && (got.text != "" || got.messages != nil) {
		t.Fatalf("both tokens and text: %+v", got)
	}
	if got.messages != nil {
		text, err := selection.ChatText(got.messages)
		if err != nil || text != got.text || got.textFrom != textMessages {
			t.Fatalf("text %q is not its messages' %q (%v)", got.text, text, err)
		}
	}
}

func FuzzParseAnthropicBody(f *testing.F) {
	for _, s := range []string{`{}`, `{"system":"s","messages":[{"role":"user","content":"x"}]}`,
		`{"system":[{"type":"text","text":"s"}],"max_tokens":9,"stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"t"},{"type":"image","source":{}}]}]}`,
		`{"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"text","text":"r"}]}]}]}`,
		`{"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"tool_result","content":"deep"}]}]}]}`,
		`{"system":5}`, `{"messages":[{"content":"\ud800"}]}`, `{"nvext":{"token_data":[1]},"messages":[{"content":[]}]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) { fuzzOtherFormat(t, b, "/v1/messages") })
}

func FuzzParseResponsesBody(f *testing.F) {
	for _, s := range []string{`{}`, `{"input":"q"}`, `{"instructions":"i","input":"q","max_output_tokens":5,"stream":true}`,
		`{"input":[{"role":"user","content":[{"type":"input_text","text":"t"},{"type":"input_image","image_url":"u"}]}]}`,
		`{"input":[{"type":"function_call_output","call_id":"c","output":"o"},{"type":"reasoning"}]}`,
		`{"input":5}`, `{"input":[1]}`, `{"instructions":null,"input":null}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) { fuzzOtherFormat(t, b, "/v1/responses") })
}

// FuzzParseGenerateBody fuzzes both token-in generate formats: the first
// byte chooses SGLang's path or vLLM's.
func FuzzParseGenerateBody(f *testing.F) {
	for _, s := range []string{`{}`, `{"input_ids":[1,2]}`, `{"input_ids":[[1],[2]],"sampling_params":[{"max_new_tokens":3}]}`,
		`{"text":["a"],"stream":true}`, `{"token_ids":[1,2,3],"sampling_params":{"max_tokens":4}}`, `{"input_ids":[[]]}`,
		`{"sampling_params":[]}`, `{"text":[]}`} {
		f.Add(byte(0), []byte(s))
		f.Add(byte(1), []byte(s))
	}
	f.Fuzz(func(t *testing.T, which byte, b []byte) {
		path := "/generate"
		if which&1 == 1 {
			path = "/inference/v1/generate"
		}
		fuzzOtherFormat(t, b, path)
	})
}

// FuzzTypedStreamEvents: any response bytes in any format count tokens
// without a panic, never fewer than their token events, and the fast read
// of an event's type agrees with the decoder wherever it answers.
func FuzzTypedStreamEvents(f *testing.F) {
	for _, s := range []string{`{"type":"content_block_delta","delta":{"text":"x"}}`, `{"type": "message_start", "message": {"usage": {"input_tokens": 3}}}`,
		`{"type":"response.completed","response":{"usage":{"output_tokens":2}}}`, `{"type":"a\"b"}`, `{"text":"x","meta_info":{"completion_tokens":4}}`,
		` {"type" : "response.output_text.delta"}`} {
		for fm := range 4 {
			f.Add(byte(fm), []byte("data: "+s+"\n\n"))
		}
	}
	f.Fuzz(func(t *testing.T, fm byte, b []byte) {
		c := tokenCounter{format: [...]requestFormat{formatOpenAI, formatAnthropic, formatResponses, formatSGLang}[fm%4]}
		c.feed(b)
		if c.tokens() < c.events || c.tokens() < 0 {
			t.Fatalf("%d tokens for %d events", c.tokens(), c.events)
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			payload := []byte(strings.TrimSpace(strings.TrimPrefix(line, "data:")))
			typ := eventType(payload)
			if typ == "" || !utf8.ValidString(typ) || strings.ContainsFunc(typ, func(r rune) bool { return r < 0x20 }) {
				continue
			}
			if first, ok := firstStringMember(payload); !ok || first != typ {
				t.Fatalf("eventType %q, decoder %q (%v) for %q", typ, first, ok, payload)
			}
		}
	})
}

// firstStringMember is the value of an object's first member when its key
// is "type" and its value a string, read by encoding/json's tokenizer.
func firstStringMember(b []byte) (string, bool) {
	d := stdjson.NewDecoder(bytes.NewReader(b))
	if tok, err := d.Token(); err != nil || tok != stdjson.Delim('{') {
		return "", false
	}
	if tok, err := d.Token(); err != nil || tok != "type" {
		return "", false
	}
	tok, err := d.Token()
	s, ok := tok.(string)
	return s, err == nil && ok
}
