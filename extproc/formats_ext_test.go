package extproc_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/extproc"
	"github.com/kvselect/kvselect/selection"
)

// lastDecision is the service's latest routing decision.
func (h *harness) lastDecision(t *testing.T) selection.DecisionRecord {
	t.Helper()
	d := h.svc.Inspect().RecentDecisions(1)
	if len(d) != 1 {
		t.Fatal("no decision recorded")
	}
	return d[0]
}

// pickOn sends body to path and returns the decision; an immediate
// response fails the test.
func (h *harness) pickOn(t *testing.T, path string, body []byte) (*envoysim.Exchange, *envoysim.Decision) {
	t.Helper()
	x, d := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Path: path, Body: body})
	if d.Immediate != nil {
		t.Fatalf("POST %s: immediate %d %s", path, d.Immediate.Status, d.Immediate.Body)
	}
	return x, d
}

func data(event string, payload string) []byte {
	if event == "" {
		return []byte("data: " + payload + "\n\n")
	}
	return []byte("event: " + event + "\ndata: " + payload + "\n\n")
}

// anthropicStream is a Messages API stream of n text deltas, as Anthropic's
// streaming reference shows it: message_start with the input usage,
// framing events, message_delta with the output count.
func anthropicStream(inputTokens, n int) [][]byte {
	out := [][]byte{
		data("message_start", fmt.Sprintf(`{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"usage":{"input_tokens":%d,"output_tokens":1}}}`, inputTokens)),
		data("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`),
		data("ping", `{"type":"ping"}`),
	}
	for i := range n {
		out = append(out, data("content_block_delta", fmt.Sprintf(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"t%d"}}`, i)))
	}
	return append(out, data("content_block_stop", `{"type":"content_block_stop","index":0}`),
		data("message_delta", fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":%d}}`, n)),
		data("message_stop", `{"type":"message_stop"}`))
}

// The measured bug: an Anthropic Messages request whose system prompt is
// content blocks was read without it (a few tokens) and found nothing cached
// when repeated. Its prompt is the system prompt and the messages, so the
// repeat goes to the worker that served it, with its whole prefix cached,
// and the same conversation sent as chat is the same prompt.
func TestAnthropicBlockSystemRepeatHitsCache(t *testing.T) {
	h := start(t, setup{})
	system := strings.Repeat("You are a careful assistant who answers in plain words. ", 30) // 300 words
	sys, _ := json.Marshal(system)
	body := fmt.Appendf(nil, `{"model":%q,"max_tokens":256,"stream":true,"system":[{"type":"text","text":%s,"cache_control":{"type":"ephemeral"}}],`+
		`"messages":[{"role":"user","content":[{"type":"text","text":"Summarize the plan."}]}]}`, model, sys)
	text := "system\n" + system + "\nuser\nSummarize the plan.\n"
	isl := (len(text) + 3) / 4

	x, first := h.pickOn(t, "/v1/messages", body)
	if d := h.lastDecision(t); d.ISLTokens != isl || d.CachedTokens != 0 {
		t.Fatalf("first request: %d prompt tokens, %d cached; want the system prompt and message's %d, none cached", d.ISLTokens, d.CachedTokens, isl)
	}
	finish(t, x, first.Endpoint, anthropicStream(isl, 3))
	h.idle(t)

	x, again := h.pickOn(t, "/v1/messages", body)
	d := h.lastDecision(t)
	if workerIDOf(again) != workerIDOf(first) || d.ISLTokens != isl || d.CachedTokens < isl-2*blockSize {
		t.Fatalf("repeat: worker %s (first %s), %d prompt tokens, %d cached; want the same worker, %d tokens, all but the tail cached",
			workerIDOf(again), workerIDOf(first), d.ISLTokens, d.CachedTokens, isl)
	}
	finish(t, x, again.Endpoint, anthropicStream(isl, 4))
	h.idle(t)

	chat := fmt.Appendf(nil, `{"model":%q,"stream":true,"messages":[{"role":"system","content":%s},{"role":"user","content":"Summarize the plan."}]}`, model, sys)
	x, asChat := h.pickOn(t, "/v1/chat/completions", chat)
	if d := h.lastDecision(t); workerIDOf(asChat) != workerIDOf(first) || d.ISLTokens != isl || d.CachedTokens < isl-2*blockSize {
		t.Fatalf("as chat: worker %s, %d prompt tokens, %d cached; want worker %s, %d tokens cached", workerIDOf(asChat), d.ISLTokens, d.CachedTokens, workerIDOf(first), isl)
	}
	finish(t, x, asChat.Endpoint, sseChunks(2))
	h.idle(t)

	// Output tokens from message_delta's usage (3 and 4), then chat's events.
	m := fmt.Sprintf("{model=%s}", model)
	wantSeries(t, h.srv, map[string]float64{
		"kvselect_request_completion_tokens_total" + m:    3 + 4 + 2,
		"kvselect_request_engine_prompt_tokens_total" + m: 2 * float64(isl),
	})

	// A system prompt of the wrong type is the client's 400, as any bad body.
	_, bad := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Path: "/v1/messages", Body: []byte(`{"system":5,"messages":[]}`)})
	if bad.Immediate == nil || bad.Immediate.Status != 400 || !strings.Contains(string(bad.Immediate.Body), "system must be") {
		t.Fatalf("bad system: %+v, want a 400 naming it", bad.Immediate)
	}
}

// A Responses body and the token-in generate bodies route on their real
// prompt — the Responses text, SGLang's input_ids, vLLM's token_ids — and
// their usage is read on the way back.
func TestResponsesAndGenerateBodiesRouteOnTheirPrompt(t *testing.T) {
	h := start(t, setup{})
	m := fmt.Sprintf("{model=%s}", model)

	instructions := strings.Repeat("Answer like a ship's captain. ", 10)
	resp := fmt.Appendf(nil, `{"model":%q,"instructions":%q,"stream":true,"max_output_tokens":64,`+
		`"input":[{"role":"user","content":[{"type":"input_text","text":"Where are we headed?"}]}]}`, model, instructions)
	isl := (len("system\n"+instructions+"\nuser\nWhere are we headed?\n") + 3) / 4
	x, d := h.pickOn(t, "/v1/responses", resp)
	if got := h.lastDecision(t).ISLTokens; got != isl {
		t.Fatalf("responses: %d prompt tokens, want %d", got, isl)
	}
	finish(t, x, d.Endpoint, [][]byte{
		data("response.created", `{"type":"response.created","response":{"id":"resp_1","status":"in_progress","usage":null}}`),
		data("response.output_text.delta", `{"type":"response.output_text.delta","item_id":"m","output_index":0,"content_index":0,"delta":"North"}`),
		data("response.output_text.delta", `{"type":"response.output_text.delta","item_id":"m","output_index":0,"content_index":0,"delta":"."}`),
		data("response.completed", fmt.Sprintf(`{"type":"response.completed","response":{"id":"resp_1","status":"completed","usage":{"input_tokens":%d,"input_tokens_details":{"cached_tokens":0},"output_tokens":6,"total_tokens":%d}}}`, isl, isl+6)),
	})
	h.idle(t)
	wantSeries(t, h.srv, map[string]float64{"kvselect_request_completion_tokens_total" + m: 6})

	ids := make([]string, 40)
	for i := range ids {
		ids[i] = fmt.Sprint(5000 + i)
	}
	sglang := fmt.Appendf(nil, `{"input_ids":[%s],"sampling_params":{"max_new_tokens":16},"stream":true}`, strings.Join(ids, ","))
	hdr := []envoysim.Header{{Key: extproc.HeaderModelName, Value: model}}
	x, first := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Path: "/generate", Headers: hdr, Body: sglang})
	if got := h.lastDecision(t); got.ISLTokens != 40 || got.CachedTokens != 0 {
		t.Fatalf("sglang: %d prompt tokens, %d cached; want the 40 ids", got.ISLTokens, got.CachedTokens)
	}
	finish(t, x, first.Endpoint, [][]byte{
		data("", `{"text":" Aye","meta_info":{"id":"r","finish_reason":null,"prompt_tokens":40,"completion_tokens":1,"cached_tokens":0}}`),
		data("", `{"text":" Aye aye","meta_info":{"id":"r","finish_reason":{"type":"stop"},"prompt_tokens":40,"completion_tokens":3,"cached_tokens":0}}`),
		data("", "[DONE]"),
	})
	h.idle(t)
	x, again := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Path: "/generate", Headers: hdr, Body: sglang})
	if got := h.lastDecision(t); workerIDOf(again) != workerIDOf(first) || got.CachedTokens != 40 {
		t.Fatalf("sglang repeat: worker %s (first %s), %d cached; want all 40 on the same worker", workerIDOf(again), workerIDOf(first), got.CachedTokens)
	}
	x.Close()
	h.idle(t)
	wantSeries(t, h.srv, map[string]float64{"kvselect_request_completion_tokens_total" + m: 6 + 3})

	vllm := fmt.Appendf(nil, `{"model":%q,"token_ids":[%s],"sampling_params":{"max_tokens":8}}`, model, strings.Join(ids[:32], ","))
	x, d = h.pickOn(t, "/inference/v1/generate", vllm)
	if got := h.lastDecision(t); got.ISLTokens != 32 || workerIDOf(d) != workerIDOf(first) || got.CachedTokens != 32 {
		t.Fatalf("vllm generate: %d prompt tokens, %d cached on worker %s; want the 32 ids, cached on %s", got.ISLTokens, got.CachedTokens, workerIDOf(d), workerIDOf(first))
	}
	x.Close()
	h.idle(t)
}
