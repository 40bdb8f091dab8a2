package extproc_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/extproc"
	"github.com/kvselect/kvselect/selection/scheduler"
)

// TestLatencyObjectivesThroughThePicker drives the picker as Envoy does:
// the objective headers are read and stripped, a sheddable request no
// worker can serve in time is refused with 429 and Retry-After, and a
// streamed response's first byte fits the latency model.
func TestLatencyObjectivesThroughThePicker(t *testing.T) {
	h := start(t, setup{opts: extproc.Options{DefaultModel: model}})
	pol, err := scheduler.New(scheduler.PredictedLatencyPolicyName, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.svc.SetPolicy(pol); err != nil {
		t.Fatal(err)
	}

	// Met: routed, the headers gone before the worker.
	x, d := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: prompt(1, 8),
		Headers: []envoysim.Header{header(extproc.HeaderSLOTTFT, "60000"), header(extproc.HeaderSLOTPOTLegacy, "1000")}})
	if d.Immediate != nil {
		t.Fatalf("a request whose objectives are easily met was refused: %+v", d.Immediate)
	}
	for _, k := range []string{extproc.HeaderSLOTTFT, extproc.HeaderSLOTPOT, extproc.HeaderSLOTTFTLegacy, extproc.HeaderSLOTPOTLegacy} {
		if !slices.Contains(d.RemovedHeaders, k) {
			t.Errorf("%s is not removed from the request (removed %v)", k, d.RemovedHeaders)
		}
	}
	if _, err := x.ResponseHeaders(envoysim.Response{Headers: []envoysim.Header{{Key: "content-type", Value: "text/event-stream"}}}, false); err != nil {
		t.Fatal(err)
	}
	if _, err := x.ResponseBody([]byte("data: {\"choices\":[{\"text\":\"a\"}]}\n\n"), false); err != nil {
		t.Fatal(err)
	}
	if _, err := x.ResponseBody([]byte("data: [DONE]\n\n"), true); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the first token fitted", func() bool { return h.svc.Inspect().LatencyModel().Errors.Observed == 1 })

	// Missed everywhere, sheddable: 429 with Retry-After, nothing booked.
	_, d = h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: prompt(100, 4000),
		Headers: []envoysim.Header{header(extproc.HeaderSLOTTFT, "0.5"), header(extproc.HeaderPriority, "-1")}})
	if d.Immediate == nil || d.Immediate.Status != 429 || d.Immediate.Headers["retry-after"] == "" ||
		!strings.Contains(string(d.Immediate.Body), "predicted to meet") {
		t.Fatalf("sheddable request missing its objective: %+v, want 429 with retry-after", d.Immediate)
	}
	// Invalid: 400.
	_, d = h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: prompt(1, 8),
		Headers: []envoysim.Header{header(extproc.HeaderSLOTTFT, "soon")}})
	if d.Immediate == nil || d.Immediate.Status != 400 {
		t.Fatalf("invalid objective: %+v, want 400", d.Immediate)
	}
}
