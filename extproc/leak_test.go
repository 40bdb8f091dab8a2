package extproc_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/extproc"
	"github.com/kvselect/kvselect/selection"
)

// stage is where a leak-test stream ends.
type stage int

const (
	abortBeforeBody    stage = iota // reset after the headers went out (start cancelled mid-request)
	abortAfterPick                  // reset right after the decision
	closeAfterPick                  // normal close without any response (upstream failed)
	abortAfterRespHdrs              // reset after response headers
	abortMidStream                  // reset in the middle of the streamed body
	closeMidStream                  // close in the middle of the body
	complete                        // the whole response
	numStages
)

// Thousands of concurrent streams end at every stage, by half-close+reset or
// by reset alone, in every mode; afterwards no load and no reservation is left.
// Disaggregated, every stream also books a remote prefill on one of two
// prefill workers: it too is freed exactly once, at the first response byte
// or with the decode booking.
func TestNoBookingOutlivesItsStream(t *testing.T) {
	for _, tc := range []struct {
		name   string
		disagg bool
	}{{"aggregated", false}, {"disaggregated", true}} {
		t.Run(tc.name, func(t *testing.T) { testNoBookingOutlivesItsStream(t, tc.disagg) })
	}
}

func testNoBookingOutlivesItsStream(t *testing.T, disagg bool) {
	n := 2000
	if testing.Short() {
		n = 300
	}
	// Streams that end cleanly after the decision in a mode without
	// response body processing keep their booking to its estimated end
	// (--booking-end auto): the test moves the service's clock past the
	// estimates' cap, one minute, still well within the active-request
	// expiry that would reclaim a leaked booking and hide it.
	clock := &testClock{t: time.Unix(1_700_000_000, 0)}
	s := setup{opts: extproc.Options{Fallbacks: 1, DefaultModel: model, Disaggregate: disagg}, clock: clock.now, maxEstimate: time.Minute}
	if disagg {
		s.workers = append(fourWorkers(), prefillWorker(11, "10.0.1.1:8000"), prefillWorker(12, "10.0.1.2:8000"))
	}
	h := start(t, s)
	modes := []envoysim.Modes{envoysim.GIE, {Request: envoysim.Buffered, Response: envoysim.Streamed},
		{Request: envoysim.Streamed, Response: envoysim.Buffered}, {Request: envoysim.FullDuplexStreamed, Response: envoysim.None}}
	ids := make([]string, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 256) // concurrent streams
	errs := make(chan error, n)
	for i := range n {
		ids[i] = fmt.Sprintf("leak-%d", i)
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			rnd := rand.New(rand.NewPCG(uint64(i), 99))
			if err := leakOne(h, ids[i], modes[i%len(modes)], stage(rnd.IntN(int(numStages))), rnd); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	eventually(t, "every stream to end", func() bool { return h.srv.Active() == 0 })
	clock.add(time.Minute)
	h.svc.Maintain(context.Background())
	h.idle(t)
	for _, id := range ids {
		for _, id := range []string{id, id + selection.PrefillBookingSuffix} {
			if err := h.svc.Free(context.Background(), id); selection.KindOf(err) != selection.KindNotFound {
				t.Fatalf("reservation %s survived its stream (free: %v)", id, err)
			}
		}
	}
	if disagg {
		// Every stream that got its decision prefilled remotely; those
		// aborted while sending the request may or may not have got one.
		remote := h.svc.Inspect().DisaggStats()["conditional_disagg_disabled"]
		if least := uint64(n) - countStage(n, abortBeforeBody); remote < least || remote > uint64(n) {
			t.Fatalf("%d remote prefills, want %d to %d", remote, least, n)
		}
	}
}

// countStage is how many of n leak-test streams end at st.
func countStage(n int, st stage) uint64 {
	c := uint64(0)
	for i := range n {
		if stage(rand.New(rand.NewPCG(uint64(i), 99)).IntN(int(numStages))) == st {
			c++
		}
	}
	return c
}

func leakOne(h *harness, id string, modes envoysim.Modes, st stage, rnd *rand.Rand) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req := &envoysim.Request{Modes: modes, Body: chatBody(fmt.Sprintf("leak %s %d", id, rnd.IntN(8)), true), ChunkSize: 16,
		Headers: []envoysim.Header{{Key: extproc.HeaderSelectionID, Value: id}}}
	if st == abortBeforeBody {
		// Cancel while the request is being sent: the stream dies before or
		// right after the pick.
		sctx, scancel := context.WithCancel(ctx)
		go func() { time.Sleep(time.Duration(rnd.IntN(200)) * time.Microsecond); scancel() }()
		x, _, err := h.client.Start(sctx, req)
		if err == nil {
			x.Abort()
		}
		scancel()
		return nil
	}
	x, d, err := h.client.Start(ctx, req)
	if err != nil {
		return fmt.Errorf("%s: %w", id, err)
	}
	if d.Immediate != nil {
		return fmt.Errorf("%s: immediate %d %s", id, d.Immediate.Status, d.Immediate.Body)
	}
	switch st {
	case abortAfterPick:
		x.Abort()
		return nil
	case closeAfterPick:
		x.Close()
		return nil
	}
	served := d.Endpoint
	if len(d.Fallbacks) > 0 && rnd.IntN(2) == 0 {
		served = d.Fallbacks[0]
	}
	if _, err := x.ResponseHeaders(envoysim.Response{Served: served, Headers: sseHeaders()}, false); err != nil {
		return fmt.Errorf("%s: %w", id, err)
	}
	if st == abortAfterRespHdrs {
		x.Abort()
		return nil
	}
	chunks := sseChunks(12)
	for i, c := range chunks {
		if i == 6 && st == abortMidStream {
			x.Abort()
			return nil
		}
		if i == 6 && st == closeMidStream {
			x.Close()
			return nil
		}
		if _, err := x.ResponseBody(c, i == len(chunks)-1); err != nil {
			return fmt.Errorf("%s: %w", id, err)
		}
	}
	x.Close()
	return nil
}
