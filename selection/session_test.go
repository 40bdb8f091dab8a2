package selection

import (
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection/affinity"
)

// sessionCtxReq is a select_and_reserve of session sid with its
// session_context: parent ("" for none) and the final marker.
func sessionCtxReq(id, sid, parent string, final bool, tokens ...uint32) *SelectRequest {
	r := selReq(id, tokens...)
	r.SessionContext = &SessionContext{SessionID: sid}
	if parent != "" {
		r.SessionContext.ParentSessionID = &parent
	}
	if final {
		r.SessionContext.SessionFinal = &final
	}
	return r
}

// bindingOf is the live binding of sid in the test partition.
func bindingOf(t *testing.T, s *Service, sid string) (affinity.Target, bool) {
	t.Helper()
	got, ok, err := s.parts.Get(partitionOf(PartitionKey{ModelName: "model"})).Affinity().Query(s.clock(), sid)
	if err != nil {
		t.Fatal(err)
	}
	return got, ok
}

// loadWorker books n long requests pinned to worker w, so that an unsteered
// request prefers the other worker.
func loadWorker(t *testing.T, s *Service, w uint64, n int) {
	t.Helper()
	tokens := make([]uint32, 256)
	for i := range tokens {
		tokens[i] = uint32(1000 + i)
	}
	for i := range n {
		r := selReq("load-"+itoa(int(w))+"-"+itoa(i), tokens...)
		r.PinnedWorker = &WorkerRank{WorkerID: w}
		if _, err := s.SelectAndReserve(bg, r); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSessionFinalEndsBindingWithItsBooking: the final request routes by the
// binding, a request of the session interleaved with it too, and the binding
// ends when the final request's booking is freed — not when the other one's
// is, and not at routing time.
func TestSessionFinalEndsBindingWithItsBooking(t *testing.T) {
	s, _ := sessionService(t)
	first, err := s.SelectAndReserve(bg, sessionCtxReq("a", "sess", "", false, 1, 2, 3, 4))
	if err != nil {
		t.Fatal(err)
	}
	w := first.WorkerID
	loadWorker(t, s, w, 4) // the binding, not the load, must decide below
	fin, err := s.SelectAndReserve(bg, sessionCtxReq("final", "sess", "", true, 1, 2, 3, 4, 5, 6, 7, 8))
	if err != nil || fin.WorkerID != w {
		t.Fatalf("final request went to %d, binding %d (%v)", fin.WorkerID, w, err)
	}
	if _, ok := bindingOf(t, s, "sess"); !ok {
		t.Fatal("the binding ended at routing time, before the final request's booking")
	}
	mid, err := s.SelectAndReserve(bg, sessionCtxReq("mid", "sess", "", false, 9, 9, 9, 9))
	if err != nil || mid.WorkerID != w {
		t.Fatalf("request interleaved with the final one went to %d, binding %d (%v)", mid.WorkerID, w, err)
	}
	for _, id := range []string{"a", "mid"} {
		if err := s.Free(bg, id); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := bindingOf(t, s, "sess"); !ok {
		t.Fatal("the binding ended with a non-final request's booking")
	}
	if err := s.Free(bg, "final"); err != nil {
		t.Fatal(err)
	}
	if got, ok := bindingOf(t, s, "sess"); ok {
		t.Fatalf("binding %v outlived the final request's booking", got)
	}
	// The session's next request selects afresh: away from the loaded worker.
	next, err := s.SelectAndReserve(bg, sessionCtxReq("next", "sess", "", false, 1, 2, 3, 4))
	if err != nil || next.WorkerID == w {
		t.Fatalf("after the end the session went to %d, the loaded old binding (%v)", next.WorkerID, err)
	}
}

// TestSessionFinalOnReservationReplay: /select with session_final and a
// selection_id, then the cached /reservations replay: the replay's booking
// ends the binding when it is freed.
func TestSessionFinalOnReservationReplay(t *testing.T) {
	s, _ := sessionService(t)
	if _, err := s.SelectAndReserve(bg, sessionCtxReq("a", "sess", "", false, 1, 2, 3, 4)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Select(bg, sessionCtxReq("two-phase", "sess", "", true, 1, 2, 3, 4)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reserve(bg, replay("two-phase", "model")); err != nil {
		t.Fatal(err)
	}
	s.Free(bg, "a")
	if _, ok := bindingOf(t, s, "sess"); !ok {
		t.Fatal("binding ended before the replayed final booking")
	}
	s.Free(bg, "two-phase")
	if _, ok := bindingOf(t, s, "sess"); ok {
		t.Fatal("binding outlived the replayed final booking")
	}
}

// TestChildSessionStartsOnParentWorker: a child session without a binding of
// its own starts where its parent is bound, then keeps its own binding; a
// child whose parent has no live binding (unknown, expired, its worker gone)
// routes normally; a parent equal to the session is no parent.
func TestChildSessionStartsOnParentWorker(t *testing.T) {
	s, clock := sessionService(t)
	parent, err := s.SelectAndReserve(bg, sessionCtxReq("p1", "parent", "", false, 1, 2, 3, 4))
	if err != nil {
		t.Fatal(err)
	}
	w := parent.WorkerID
	other := 3 - w
	loadWorker(t, s, w, 4)

	// Interleaved: a parent turn, a child, an unrelated session, the child again.
	if r, _ := s.SelectAndReserve(bg, sessionCtxReq("p2", "parent", "", false, 1, 2, 3, 4, 5)); r.WorkerID != w {
		t.Fatalf("parent's second turn went to %d, not %d", r.WorkerID, w)
	}
	child, err := s.SelectAndReserve(bg, sessionCtxReq("c1", "child", "parent", false, 7, 7, 7, 7))
	if err != nil || child.WorkerID != w {
		t.Fatalf("child went to %d, parent bound to %d (%v)", child.WorkerID, w, err)
	}
	stranger, err := s.SelectAndReserve(bg, sessionCtxReq("x1", "stranger", "", false, 7, 7, 7, 7))
	if err != nil || stranger.WorkerID != other {
		t.Fatalf("an unrelated session went to %d, want the unloaded %d (%v)", stranger.WorkerID, other, err)
	}
	if got, ok := bindingOf(t, s, "child"); !ok || got.WorkerID != w {
		t.Fatalf("child's own binding = %v %v, want worker %d", got, ok, w)
	}
	// The query-only /select follows the parent too.
	q, err := s.Select(bg, sessionCtxReq("", "child-2", "parent", false, 8, 8, 8, 8))
	if err != nil || q.WorkerID != w {
		t.Fatalf("query-only select of a child went to %d, parent on %d (%v)", q.WorkerID, w, err)
	}

	// An unknown parent, and a parent equal to the session, route normally.
	for i, parentID := range []string{"nobody", "orphan"} {
		r, err := s.SelectAndReserve(bg, sessionCtxReq("o"+itoa(i), "orphan", parentID, false, 6, 6, 6, 6))
		if err != nil || r.WorkerID != other {
			t.Fatalf("child of %q went to %d, want the unloaded %d (%v)", parentID, r.WorkerID, other, err)
		}
		s.Free(bg, "o"+itoa(i))
		clock.Add(2 * time.Minute) // the orphan's binding expires
	}

	// The parent's binding expires (its leases released, TTL past): a new
	// child routes normally.
	for _, id := range []string{"p1", "p2", "c1"} {
		s.Free(bg, id)
	}
	clock.Add(2 * time.Minute)
	late, err := s.SelectAndReserve(bg, sessionCtxReq("c2", "late-child", "parent", false, 5, 5, 5, 5))
	if err != nil || late.WorkerID != other {
		t.Fatalf("child of an expired parent went to %d, want the unloaded %d (%v)", late.WorkerID, other, err)
	}
}

// TestChildOfDepartedParentWorkerRoutesNormally: the parent's worker left
// the catalog; its child is routed among the workers left.
func TestChildOfDepartedParentWorkerRoutesNormally(t *testing.T) {
	s, _ := sessionService(t)
	mustUpsert(t, s, workerRec(3))
	parent, err := s.SelectAndReserve(bg, sessionCtxReq("p1", "parent", "", false, 1, 2, 3, 4))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteWorker(bg, parent.WorkerID); err != nil {
		t.Fatal(err)
	}
	child, err := s.SelectAndReserve(bg, sessionCtxReq("c1", "child", "parent", false, 1, 2, 3, 4))
	if err != nil || child.WorkerID == parent.WorkerID {
		t.Fatalf("child went to %d, the departed parent worker (%v)", child.WorkerID, err)
	}
}

func TestParentSessionIDTooLong(t *testing.T) {
	s, _ := sessionService(t)
	long := make([]byte, 257)
	for i := range long {
		long[i] = 'p'
	}
	_, err := s.SelectAndReserve(bg, sessionCtxReq("c", "child", string(long), false, 1, 2, 3, 4))
	wantKind(t, err, KindBadRequest, "parent session ID must not exceed 256 bytes")
}
