package extproc_test

import (
	"slices"
	"testing"

	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/extproc"
)

// A remote prefill decision routes to the decode worker and names the
// prefill worker in llm-d's sidecar header and kvselect's own; the prefill
// booking goes at the first response byte, the decode booking at the end.
func TestDisaggregatedPickNamesThePrefillWorker(t *testing.T) {
	for _, tc := range []struct {
		name, header string
	}{{"llm-d's header", ""}, {"renamed header", "x-my-prefiller"}} {
		t.Run(tc.name, func(t *testing.T) {
			workers := append(fourWorkers(), prefillWorker(11, "10.0.1.1:8000"))
			h := start(t, setup{opts: extproc.Options{Disaggregate: true, PrefillHeader: tc.header, DefaultModel: model}, workers: workers})
			want := tc.header
			if want == "" {
				want = extproc.HeaderPrefiller
			}
			x, d := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: chatBody("a long prompt to prefill elsewhere", true),
				Headers: []envoysim.Header{{Key: want, Value: "10.9.9.9:1"}}}) // a client's own value is overwritten
			if d.Immediate != nil {
				t.Fatalf("immediate %d %s", d.Immediate.Status, d.Immediate.Body)
			}
			if got := d.SetHeaders[want]; got != "10.0.1.1:8000" {
				t.Fatalf("%s = %q, want the prefill worker; headers %v", want, got, d.SetHeaders)
			}
			if len(d.RejectedHeaders) > 0 {
				t.Fatalf("Envoy's mutation rules reject %v", d.RejectedHeaders)
			}
			if got := d.SetHeaders[extproc.HeaderPrefillEndpoint]; got != "10.0.1.1:8000" {
				t.Fatalf("%s = %q", extproc.HeaderPrefillEndpoint, got)
			}
			if slices.Contains([]string{"11"}, workerIDOf(d)) || d.Endpoint == "10.0.1.1:8000" {
				t.Fatalf("routed to the prefill worker: %v", d.Endpoint)
			}
			loads := h.loads()
			if loads[11].ActiveRequests != 1 || loads[11].PotentialPrefillTokens == 0 {
				t.Fatalf("prefill worker load = %+v", loads[11])
			}
			if _, err := x.ResponseHeaders(envoysim.Response{Served: d.Endpoint, Headers: sseHeaders()}, false); err != nil {
				t.Fatal(err)
			}
			if _, err := x.ResponseBody(sseChunks(1)[0], false); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the prefill booking to go at the first byte", func() bool { return h.loads()[11].ActiveRequests == 0 })
			if h.activeRequests() != 1 {
				t.Fatalf("%d bookings, want the decode one", h.activeRequests())
			}
			if _, err := x.ResponseBody([]byte("data: [DONE]\n\n"), true); err != nil {
				t.Fatal(err)
			}
			x.Close()
			h.idle(t)
		})
	}
}

// Without a prefill pool (or with disaggregation off) nothing changes, but a
// client's own prefiller headers never reach the worker: they would tell the
// decode pod's sidecar where to send the prompt.
func TestClientPrefillerHeadersAreRemoved(t *testing.T) {
	for _, disagg := range []bool{false, true} {
		// Freed at the stream's end: the exchange ends without a response,
		// which --booking-end auto would keep to its estimate.
		h := start(t, setup{opts: extproc.Options{Disaggregate: disagg, DefaultModel: model, BookingEnd: extproc.BookingEndResponse}})
		x, d := h.start(t, &envoysim.Request{Body: chatBody("hello", false), Headers: []envoysim.Header{
			{Key: extproc.HeaderPrefiller, Value: "169.254.169.254:80"}, {Key: extproc.HeaderPrefillEndpoint, Value: "x:1"}}})
		for _, k := range []string{extproc.HeaderPrefiller, extproc.HeaderPrefillEndpoint} {
			if !slices.Contains(d.RemovedHeaders, k) {
				t.Errorf("disaggregate=%v: %s not removed (removed %v)", disagg, k, d.RemovedHeaders)
			}
			if _, set := d.SetHeaders[k]; set {
				t.Errorf("disaggregate=%v: %s set without a prefill pool", disagg, k)
			}
		}
		x.Close()
		h.idle(t)
	}
}
