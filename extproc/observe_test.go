package extproc_test

import (
	"fmt"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/extproc"
	"github.com/kvselect/kvselect/internal/metricstest"
	"github.com/kvselect/kvselect/internal/tracing"
)

// Client's trace: the gateway forwards this traceparent.
const (
	clientTrace  = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientParent = "00f067aa0ba902b7"
)

func tracedHarness(t *testing.T) (*harness, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	return start(t, setup{opts: extproc.Options{Tracing: tracing.New(tp)}}), exp
}

func spansByName(spans tracetest.SpanStubs) map[string]tracetest.SpanStub {
	out := make(map[string]tracetest.SpanStub, len(spans))
	for _, s := range spans {
		out[s.Name] = s
	}
	return out
}

// TestTraceContinuesTheGatewaysTrace: the request span is a child of the
// forwarded traceparent; parse and select are its children, the selection
// span carries the decision, the booking's lifecycle is on the request span
// as events, and the worker receives the request span as its parent.
func TestTraceContinuesTheGatewaysTrace(t *testing.T) {
	h, exp := tracedHarness(t)
	body := fmt.Appendf(nil, `{"model":%q,"stream":true,"prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`, model)
	x, d := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: body, Headers: []envoysim.Header{
		{Key: "traceparent", Value: "00-" + clientTrace + "-" + clientParent + "-01"},
		{Key: "tracestate", Value: "vendor=1"},
	}})
	finish(t, x, d.Endpoint, sseChunks(9))
	h.idle(t)

	spans := spansByName(exp.GetSpans())
	req, ok := spans[tracing.SpanRequest]
	if !ok {
		t.Fatalf("no request span among %v", exp.GetSpans())
	}
	if req.SpanContext.TraceID().String() != clientTrace || req.Parent.SpanID().String() != clientParent || !req.Parent.IsRemote() {
		t.Errorf("request span in trace %s under %s, want the client's %s under %s", req.SpanContext.TraceID(), req.Parent.SpanID(), clientTrace, clientParent)
	}
	if req.SpanKind != trace.SpanKindServer {
		t.Errorf("request span kind %v, want server", req.SpanKind)
	}
	for _, name := range []string{tracing.SpanParse, tracing.SpanSelect} {
		s, ok := spans[name]
		if !ok || s.Parent.SpanID() != req.SpanContext.SpanID() {
			t.Errorf("%s span missing or not a child of the request span: %+v", name, s.Parent)
		}
	}
	attrs := map[string]string{}
	for _, a := range spans[tracing.SpanSelect].Attributes {
		attrs[string(a.Key)] = a.Value.String()
	}
	for k, want := range map[string]string{
		"kvselect.model": model, "kvselect.candidates": "4", "kvselect.worker_id": workerIDOf(d),
		"kvselect.isl_tokens": "17", "kvselect.selection_id": d.SetHeaders[extproc.HeaderSelectionID],
	} {
		if attrs[k] != want {
			t.Errorf("select span %s = %q, want %q", k, attrs[k], want)
		}
	}
	for _, k := range []string{"kvselect.cost", "kvselect.runner_up.cost", "kvselect.overlap.gpu_blocks", "kvselect.effective_prefill_tokens", "kvselect.queue_wait_ms",
		"kvselect.best_cached_tokens"} {
		if _, ok := attrs[k]; !ok {
			t.Errorf("select span lacks %s: %v", k, attrs)
		}
	}
	var events []string
	for _, e := range req.Events {
		events = append(events, e.Name)
	}
	want := []string{"kvselect.prefill_complete", "kvselect.first_byte", "kvselect.freed"}
	if strings.Join(events, " ") != strings.Join(want, " ") {
		t.Errorf("request span events %v, want %v", events, want)
	}
	// 9 streamed tokens in blocks of 4: two output blocks, on the free.
	if freed := req.Events[len(req.Events)-1]; len(freed.Attributes) != 2 || freed.Attributes[1].Value.AsInt64() != 2 {
		t.Errorf("freed event attributes %v, want at=response_end and output_blocks=2", freed.Attributes)
	}

	// The worker's request carries the request span as parent, and the
	// vendor's tracestate.
	wantParent := "00-" + clientTrace + "-" + req.SpanContext.SpanID().String() + "-01"
	if got := d.SetHeaders["traceparent"]; got != wantParent {
		t.Errorf("traceparent to the worker %q, want %q", got, wantParent)
	}
	if got := d.SetHeaders["tracestate"]; got != "vendor=1" {
		t.Errorf("tracestate to the worker %q, want vendor=1", got)
	}
}

// TestTraceOfARefusedRequest: a request the picker answers itself (503) is
// one request span with the status and the error on the select span.
func TestTraceOfARefusedRequest(t *testing.T) {
	h, exp := tracedHarness(t)
	body := fmt.Appendf(nil, `{"model":%q,"prompt":[1,2,3]}`, model)
	if _, d := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: body, SubsetHint: []string{"192.0.2.1:8000"}}); d.Immediate == nil || d.Immediate.Status != 503 {
		t.Fatalf("decision %+v, want a 503", d)
	}
	h.idle(t)
	eventually(t, "the request span ends", func() bool { _, ok := spansByName(exp.GetSpans())[tracing.SpanRequest]; return ok })
	req := spansByName(exp.GetSpans())[tracing.SpanRequest]
	found := false
	for _, a := range req.Attributes {
		if a.Key == "http.response.status_code" && a.Value.AsInt64() == 503 {
			found = true
		}
	}
	if !found || req.Status.Code.String() != "Error" {
		t.Errorf("refused request span: status %v, attributes %v", req.Status, req.Attributes)
	}
	if !req.SpanContext.TraceID().IsValid() || req.Parent.IsValid() {
		t.Errorf("a request without traceparent should start a new trace: %v under %v", req.SpanContext.TraceID(), req.Parent)
	}
}

// TestNoTracingLeavesTraceparentAlone: with tracing off the picker neither
// records nor rewrites the client's trace context.
func TestNoTracingLeavesTraceparentAlone(t *testing.T) {
	h := start(t, setup{})
	body := fmt.Appendf(nil, `{"model":%q,"prompt":[1,2,3]}`, model)
	_, d := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: body, Headers: []envoysim.Header{
		{Key: "traceparent", Value: "00-" + clientTrace + "-" + clientParent + "-01"}}})
	if v, ok := d.SetHeaders["traceparent"]; ok {
		t.Errorf("traceparent rewritten to %q with tracing off", v)
	}
}

// TestRequestMetrics: TTFT, inter-token latency, duration, tokens and the
// engine's cached tokens per model, from a streamed and a non-streamed
// response, and the status of each.
func TestRequestMetrics(t *testing.T) {
	h := start(t, setup{})
	stream := fmt.Appendf(nil, `{"model":%q,"stream":true,"stream_options":{"include_usage":true},"prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`, model)
	x, d := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: stream})
	chunks := sseChunks(5)
	usage := []byte(`data: {"id":"c","choices":[],"usage":{"prompt_tokens":17,"completion_tokens":5,"total_tokens":22,"prompt_tokens_details":{"cached_tokens":8}}}` + "\n\n")
	chunks = append(chunks[:5:5], usage, chunks[5])
	finish(t, x, d.Endpoint, chunks)

	plain := fmt.Appendf(nil, `{"model":%q,"prompt":[1,2,3,4,5,6,7,8]}`, model)
	x, d = h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: plain})
	if _, err := x.ResponseHeaders(envoysim.Response{Served: d.Endpoint, Headers: []envoysim.Header{{Key: "content-type", Value: "application/json"}}}, false); err != nil {
		t.Fatal(err)
	}
	resp := `{"id":"x","choices":[{"text":"hello"}],"model":"m","usage":{"prompt_tokens":8,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":4}}}`
	if _, err := x.ResponseBody([]byte(resp[:40]), false); err != nil {
		t.Fatal(err)
	}
	if _, err := x.ResponseBody([]byte(resp[40:]), true); err != nil {
		t.Fatal(err)
	}
	x.Close()

	// A stream reset after the decision: no response status.
	x, _ = h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: plain})
	x.Abort()
	h.idle(t)

	got := metricstest.Series(t, h.srv)
	m := fmt.Sprintf("{model=%s}", model)
	for k, want := range map[string]float64{
		"kvselect_request_ttft_seconds_count" + m:                                  2,
		"kvselect_request_inter_token_latency_seconds_count" + m:                   4, // 5 token chunks: 4 gaps
		"kvselect_request_duration_seconds_count" + m:                              3,
		"kvselect_request_prompt_tokens_total" + m:                                 17 + 8 + 8,
		"kvselect_request_completion_tokens_total" + m:                             5 + 3,
		"kvselect_request_engine_prompt_tokens_total" + m:                          17 + 8,
		"kvselect_request_engine_cached_tokens_total" + m:                          8 + 4,
		fmt.Sprintf("kvselect_request_responses_total{code=200,model=%s}", model):  2,
		fmt.Sprintf("kvselect_request_responses_total{code=none,model=%s}", model): 1,
	} {
		if got[k] != want {
			t.Errorf("%s = %v, want %v", k, got[k], want)
		}
	}
	if t.Failed() {
		t.Logf("all series: %v", got)
	}
}
