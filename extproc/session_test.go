package extproc_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/extproc"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/flow"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

// sessionHarness is a picker with session affinity on (one minute) over four
// workers.
func sessionHarness(t *testing.T, opts extproc.Options) *harness {
	t.Helper()
	return start(t, setup{opts: opts, router: func(c *routerconfig.Config) { c.SessionAffinityTTL = routerconfig.Some(time.Minute) }})
}

// load books n long prompts pinned to worker w through the service, so that
// a request the binding does not steer avoids w; the returned func frees
// them.
func (h *harness) load(t *testing.T, w uint64, n int) func() {
	t.Helper()
	tokens := make([]uint32, 4096)
	for i := range tokens {
		tokens[i] = uint32(50_000 + i)
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("load-%d-%d", w, i)
		_, err := h.svc.SelectAndReserve(context.Background(), &selection.SelectRequest{
			PartitionKey: selection.PartitionKey{ModelName: model}, SelectionID: &ids[i],
			PromptRequest: selection.PromptRequest{TokenIDs: tokens}, PinnedWorker: &selection.WorkerRank{WorkerID: w}})
		if err != nil {
			t.Fatal(err)
		}
	}
	return func() {
		for _, id := range ids {
			_ = h.svc.Free(context.Background(), id)
		}
	}
}

// turn starts one request of a session with the given headers and returns
// its exchange and chosen worker id.
func (h *harness) turn(t *testing.T, text string, hs ...envoysim.Header) (*envoysim.Exchange, uint64) {
	t.Helper()
	x, d := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: chatBody(text, false), Headers: hs})
	if d.Immediate != nil {
		t.Fatalf("%q answered %d: %s", text, d.Immediate.Status, d.Immediate.Body)
	}
	w, err := strconv.ParseUint(workerIDOf(d), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return x, w
}

// bound is where the service's query-only select sends session sid now.
func (h *harness) bound(t *testing.T, sid string) uint64 {
	t.Helper()
	r, err := h.svc.Select(context.Background(), &selection.SelectRequest{PartitionKey: selection.PartitionKey{ModelName: model},
		PromptRequest: selection.PromptRequest{TokenIDs: []uint32{1, 2, 3, 4}}, SessionID: &sid})
	if err != nil {
		t.Fatal(err)
	}
	return r.WorkerID
}

// TestAgentSessionsOverThePicker: two agent sessions, one named by Dynamo's
// header and one by kvselect's, interleaved with requests in flight at once;
// a subagent (x-dynamo-parent-session-id) starts on its parent's worker even
// though that worker is the most loaded, and keeps its own binding; the
// parent's final request (x-dynamo-session-final) routes by the binding, and
// the binding ends when that request's response does — the session's next
// request then avoids the loaded worker.
func TestAgentSessionsOverThePicker(t *testing.T) {
	h := sessionHarness(t, extproc.Options{})
	dyn := func(sid string) envoysim.Header { return header(extproc.HeaderDynamoSessionID, sid) }
	kvs := func(sid string) envoysim.Header { return header(extproc.HeaderSessionID, sid) }

	xa, wa := h.turn(t, "agent A turn 0", dyn("agent-a"))
	xb, wb := h.turn(t, "agent B turn 0", kvs("agent-b"))
	// Later turns interleave, some in flight together.
	for i := 1; i <= 3; i++ {
		ya, w := h.turn(t, fmt.Sprint("agent A turn ", i), dyn("agent-a"))
		if w != wa {
			t.Fatalf("A's turn %d went to %d, bound to %d", i, w, wa)
		}
		yb, w := h.turn(t, fmt.Sprint("agent B turn ", i), kvs("agent-b"), dyn("not-b"))
		if w != wb {
			t.Fatalf("B's turn %d went to %d, bound to %d (kvselect's header wins)", i, w, wb)
		}
		ya.Close()
		yb.Close()
	}
	xa.Close()
	xb.Close()
	h.idle(t)

	unload := h.load(t, wa, 8)
	// A subagent of A: its parent's worker, loaded as it is.
	xc, wc := h.turn(t, "subagent of A", dyn("agent-a/sub-1"), header(extproc.HeaderDynamoParentSessionID, "agent-a"))
	if wc != wa {
		t.Fatalf("the subagent went to %d, its parent is bound to %d", wc, wa)
	}
	// A session with no parent avoids the loaded worker.
	xs, ws := h.turn(t, "a stranger", dyn("stranger"))
	if ws == wa {
		t.Fatalf("an unrelated session went to the loaded worker %d", wa)
	}
	// A child of an unknown parent routes normally too.
	xo, wo := h.turn(t, "an orphan", dyn("orphan"), header(extproc.HeaderDynamoParentSessionID, "nobody"))
	if wo == wa {
		t.Fatalf("a child of an unknown parent went to the loaded worker %d", wa)
	}
	// The subagent's next turn: its own binding.
	yc, w := h.turn(t, "subagent of A, turn 2", dyn("agent-a/sub-1"))
	if w != wa {
		t.Fatalf("the subagent's second turn went to %d, bound to %d", w, wa)
	}
	for _, x := range []*envoysim.Exchange{xc, xs, xo, yc} {
		x.Close()
	}

	// A's final request, and another A request while it is in flight.
	xf, w := h.turn(t, "agent A, last turn", dyn("agent-a"), header(extproc.HeaderDynamoSessionFinal, "true"))
	if w != wa {
		t.Fatalf("A's final request went to %d, bound to %d", w, wa)
	}
	xm, w := h.turn(t, "agent A, racing the last turn", dyn("agent-a"))
	if w != wa {
		t.Fatalf("A's request beside the final one went to %d, bound to %d", w, wa)
	}
	xm.Close()
	if got := h.bound(t, "agent-a"); got != wa {
		t.Fatalf("before the final response ended, A's binding is %d, want %d", got, wa)
	}
	finish(t, xf, fmt.Sprintf("10.0.0.%d:8000", wa), sseChunks(2))
	eventually(t, "the final request's booking freed", func() bool { return h.loads()[wa].ActiveRequests == 8 })
	if got := h.bound(t, "agent-a"); got == wa {
		t.Fatalf("A's binding to the loaded worker %d outlived its final request", wa)
	}
	xn, w := h.turn(t, "agent A, after the end", dyn("agent-a"))
	if w == wa {
		t.Fatalf("A's request after the final one kept the ended binding to %d", wa)
	}
	xn.Close()
	unload()
	h.idle(t)
}

// TestSessionHeadersOption: a configured list replaces the defaults —
// x-correlation-id as aiperf keeps it across a conversation — and an empty
// list leaves the body's session alone.
func TestSessionHeadersOption(t *testing.T) {
	h := sessionHarness(t, extproc.Options{SessionHeaders: []string{extproc.HeaderCorrelationID}})
	x, first := h.turn(t, "conversation turn 0", header(extproc.HeaderCorrelationID, "conv-1"))
	x.Close()
	unload := h.load(t, first, 8)
	x, w := h.turn(t, "conversation turn 1", header(extproc.HeaderCorrelationID, "conv-1"))
	if w != first {
		t.Fatalf("turn 1 went to %d, the conversation is bound to %d", w, first)
	}
	x.Close()
	// kvselect's own header is not on the list: not a session.
	x, w = h.turn(t, "not a session", header(extproc.HeaderSessionID, "conv-1"))
	if w == first {
		t.Fatalf("a request with an unlisted session header went to the bound, loaded worker %d", first)
	}
	x.Close()
	unload()
	h.idle(t)
}

// TestSessionAsFairnessIDOverThePicker: with SessionAsFairnessID a waiting
// request without a fairness id queues as its session's tenant; one with a
// fairness id keeps it.
func TestSessionAsFairnessIDOverThePicker(t *testing.T) {
	w := worker(1, "10.0.0.1:8000")
	w.MaxNumBatchedTokens = ptr(uint64(8))
	h := start(t, setup{
		opts:    extproc.Options{DefaultModel: model, SessionAsFairnessID: true},
		router:  func(c *routerconfig.Config) { c.QueueThreshold = routerconfig.Some(0.5) },
		workers: []catalog.Record{w}, flow: &flow.Config{},
	})
	blocker, _ := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: prompt(1000, 8)})
	waiting := make(chan *envoysim.Exchange, 2)
	send := func(base int, hs ...envoysim.Header) {
		go func() {
			x, d, err := h.client.Start(t.Context(), &envoysim.Request{Modes: envoysim.GIE, Body: prompt(base, 8), Headers: hs})
			if err != nil || d.Immediate != nil {
				t.Errorf("%v %+v", err, d)
			}
			waiting <- x
		}()
	}
	send(2000, header(extproc.HeaderDynamoSessionID, "agent-1"))
	eventually(t, "the session queued as its own tenant", func() bool { return queued(h)["0/agent-1"] == 1 })
	send(3000, header(extproc.HeaderDynamoSessionID, "agent-2"), header(extproc.HeaderFairnessID, "team"))
	eventually(t, "the fairness id kept", func() bool { return queued(h)["0/team"] == 1 })
	blocker.Close()
	for range 2 {
		(<-waiting).Close()
	}
	h.idle(t)
}
