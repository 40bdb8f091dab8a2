package extproc_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/extproc"
)

// shimModes are the messages of NGINX Gateway Fabric's endpoint picker shim:
// headers and the whole body, no protocol_config (the picker assumes
// FULL_DUPLEX_STREAMED).
var shimModes = envoysim.Modes{Request: envoysim.FullDuplexStreamed, Response: envoysim.FullDuplexStreamed, OmitProtocolConfig: true}

// testClock is a clock the test moves.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *testClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// Behind a gateway that hangs up after the decision, the bookings stay
// until their estimated end, which the upkeep acts on.
func TestBookingsOutliveAStreamWithoutResponsePhase(t *testing.T) {
	clock := &testClock{t: time.Unix(1_700_000_000, 0)}
	h := start(t, setup{opts: extproc.Options{DefaultModel: model}, clock: clock.now})
	const n = 4
	for i := range n {
		x, d := h.start(t, &envoysim.Request{Modes: shimModes, Body: fmt.Appendf(nil, `{"model":%q,"prompt":"p%d","max_tokens":200}`, model, i)})
		if d.Destination == "" {
			t.Fatalf("no destination: %+v", d)
		}
		if err := x.Hangup(); err != nil {
			t.Fatal(err)
		}
	}
	if got := h.activeRequests(); got != n || h.svc.Inspect().EstimatedEnds() != n {
		t.Fatalf("after %d hung-up streams: %d active, %d estimated ends; want %d", n, got, h.svc.Inspect().EstimatedEnds(), n)
	}
	// The upkeep before the estimated end changes nothing.
	h.svc.Maintain(t.Context())
	if got := h.activeRequests(); got != n {
		t.Fatalf("active = %d right after the decisions, want %d", got, n)
	}
	// The default cap (300 s) bounds every estimate.
	clock.add(300 * time.Second)
	h.svc.Maintain(t.Context())
	if got := h.activeRequests(); got != 0 || h.svc.Inspect().EstimatedEnds() != 0 {
		t.Fatalf("after the estimated ends: %d active, %d estimated ends; want none", got, h.svc.Inspect().EstimatedEnds())
	}
	h.idle(t)
}

// What ends a booking, by mode and by how the stream ended: only a clean
// hang-up without protocol_config or response phase is kept in auto mode.
func TestBookingEndModes(t *testing.T) {
	envoyNoResponse := envoysim.Modes{Request: envoysim.FullDuplexStreamed, Response: envoysim.None}
	for _, tc := range []struct {
		name    string
		mode    extproc.BookingEnd
		modes   envoysim.Modes
		end     func(*envoysim.Exchange) error
		kept    bool
		assumed bool // the operator declared an Envoy without protocol_config
	}{
		{"auto, the shim's hang-up", extproc.BookingEndAuto, shimModes, (*envoysim.Exchange).Hangup, true, false},
		{"auto, aborted after the decision", extproc.BookingEndAuto, shimModes, abort, false, false},
		// Envoy with nothing of the response to process closes the stream
		// after the decision (its stream close optimization).
		{"auto, Envoy without response body processing", extproc.BookingEndAuto, envoyNoResponse, (*envoysim.Exchange).Hangup, true, false},
		{"auto, Envoy without response body processing, response headers seen", extproc.BookingEndAuto, envoyNoResponse, headersThenClose, false, false},
		// With a response body to process Envoy holds the stream for the
		// response: a clean end before it is a client gone.
		{"auto, Envoy closing before the response (GIE modes)", extproc.BookingEndAuto, envoysim.GIE, closeX, false, false},
		{"auto, an older Envoy declared with a response body mode", extproc.BookingEndAuto, shimModes, (*envoysim.Exchange).Hangup, false, true},
		{"response, the shim's hang-up", extproc.BookingEndResponse, shimModes, (*envoysim.Exchange).Hangup, false, false},
		{"response, Envoy without response body processing", extproc.BookingEndResponse, envoyNoResponse, (*envoysim.Exchange).Hangup, false, false},
		{"estimate, Envoy closing", extproc.BookingEndEstimate, envoysim.GIE, closeX, true, false},
		{"estimate, aborted", extproc.BookingEndEstimate, envoysim.GIE, abort, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := extproc.Options{DefaultModel: model, BookingEnd: tc.mode}
			if tc.assumed {
				opts.AssumedModes = &extproc.BodyModes{Request: envoysim.FullDuplexStreamed, Response: envoysim.FullDuplexStreamed}
			}
			h := start(t, setup{opts: opts})
			x, _ := h.start(t, &envoysim.Request{Modes: tc.modes, Body: chatBody("hello", true)})
			if err := tc.end(x); err != nil {
				t.Fatal(err)
			}
			if !tc.kept {
				h.idle(t)
				return
			}
			eventually(t, "the stream to end", func() bool { return h.srv.Active() == 0 })
			if got := h.activeRequests(); got != 1 || h.svc.Inspect().EstimatedEnds() != 1 {
				t.Fatalf("%d active, %d estimated ends after the stream; want the booking kept", got, h.svc.Inspect().EstimatedEnds())
			}
		})
	}
}

func abort(x *envoysim.Exchange) error  { x.Abort(); return nil }
func closeX(x *envoysim.Exchange) error { x.Close(); return nil }

// headersThenClose passes the worker's response headers, then ends the
// exchange as Envoy does (response body mode NONE: nothing more to send).
func headersThenClose(x *envoysim.Exchange) error {
	if _, err := x.ResponseHeaders(envoysim.Response{Headers: []envoysim.Header{{Key: ":status", Value: "200"}}}, false); err != nil {
		return err
	}
	x.Close()
	return nil
}

// A response phase that ends frees the booking at its end in every mode.
func TestResponseEndFreesInEstimateMode(t *testing.T) {
	h := start(t, setup{opts: extproc.Options{DefaultModel: model, BookingEnd: extproc.BookingEndEstimate}})
	x, d := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: chatBody("hello", true)})
	finish(t, x, d.Endpoint, sseChunks(3))
	h.idle(t)
	if h.svc.Inspect().EstimatedEnds() != 0 {
		t.Fatal("a booking whose response ended was kept to an estimate")
	}
}

func TestParseBookingEnd(t *testing.T) {
	for _, s := range []string{"auto", "response", "estimate"} {
		b, err := extproc.ParseBookingEnd(s)
		if err != nil || b.String() != s {
			t.Errorf("%q: %v, %v", s, b, err)
		}
	}
	if _, err := extproc.ParseBookingEnd("never"); err == nil {
		t.Error("an unknown mode was accepted")
	}
}
