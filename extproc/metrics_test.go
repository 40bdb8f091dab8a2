package extproc_test

import (
	"fmt"
	"testing"

	"github.com/kvselect/kvselect/envoysim"
)

// TestMetrics: each way a request goes through the picker moves its
// counters: routed and freed at the response end, routed and freed when the
// stream is reset, a 400 and a 503 immediate response.
func TestMetrics(t *testing.T) {
	h := start(t, setup{workers: fourWorkers()})
	body := fmt.Appendf(nil, `{"model":%q,"stream":true,"prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`, model)

	// 1: the whole response, served by another worker than the one picked
	// (the booking moves); 19 tokens make 19/blockSize output blocks.
	x, d := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: body})
	other := "10.0.0.1:8000"
	if d.Endpoint == other {
		other = "10.0.0.2:8000"
	}
	finish(t, x, other, sseChunks(19))
	// 2: reset after the decision.
	x, _ = h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: body})
	x.Abort()
	// 3: a body that is not JSON.
	if _, d := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: []byte("{nope")}); d.Immediate == nil || d.Immediate.Status != 400 {
		t.Fatalf("bad body: %+v, want a 400 immediate response", d)
	}
	// 4: a subset hint that matches no worker.
	if _, d := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: body, SubsetHint: []string{"192.0.2.1:8000"}}); d.Immediate == nil || d.Immediate.Status != 503 {
		t.Fatalf("subset excluding all: %+v, want a 503 immediate response", d)
	}
	h.idle(t)

	wantSeries(t, h.srv, map[string]float64{
		"kvselect_extproc_streams_total":                         4,
		"kvselect_extproc_streams_active":                        0,
		"kvselect_extproc_stream_errors_total":                   0,
		"kvselect_extproc_routed_total":                          2,
		"kvselect_extproc_immediate_responses_total{code=400}":   1,
		"kvselect_extproc_immediate_responses_total{code=503}":   1,
		"kvselect_extproc_immediate_responses_total{code=429}":   0,
		"kvselect_extproc_immediate_responses_total{code=other}": 0,
		"kvselect_extproc_bookings_freed_total{at=response_end}": 1,
		"kvselect_extproc_bookings_freed_total{at=stream_end}":   1,
		"kvselect_extproc_bookings_lost_total":                   0,
		"kvselect_extproc_output_blocks_total":                   19 / blockSize,
		"kvselect_extproc_rebooked_total":                        1,
		"kvselect_extproc_pick_duration_seconds_count":           4, // every pick attempt, answered or refused
	})
}
