package selection

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection/affinity"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

// recorder is a ReplicaObserver that keeps what a service published, so a test
// can deliver it to another real service by hand (the transport is
// replicas/mesh's job and tested there).
type recorder struct {
	mu       sync.Mutex
	bookings []BookingEvent
	bindings []SessionBinding
}

func (r *recorder) BookingChanged(ev BookingEvent) {
	r.mu.Lock()
	r.bookings = append(r.bookings, ev)
	r.mu.Unlock()
}

func (r *recorder) SessionBound(b SessionBinding) {
	r.mu.Lock()
	r.bindings = append(r.bindings, b)
	r.mu.Unlock()
}

// take drains what was recorded.
func (r *recorder) take() ([]BookingEvent, []SessionBinding) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, s := r.bookings, r.bindings
	r.bookings, r.bindings = nil, nil
	return b, s
}

// replicaPair builds two services with distinct replica ids sharing one clock
// and the same catalog (workers 1 and 2, block size 4), each with a recorder.
func replicaPair(t *testing.T, edit func(*routerconfig.Config)) (a, b *Service, ra, rb *recorder, clock *fakeClock) {
	t.Helper()
	rc := routerconfig.Default()
	rc.UseKVEvents = false
	if edit != nil {
		edit(&rc)
	}
	clock = &fakeClock{t: time.Unix(1_700_000_000, 0)}
	build := func(seed uint64) (*Service, *recorder) {
		s, err := New(Config{Router: rc, Clock: clock.Now, Rand: rand.New(rand.NewPCG(seed, seed+1))})
		if err != nil {
			t.Fatal(err)
		}
		mustUpsert(t, s, workerRec(1))
		mustUpsert(t, s, workerRec(2))
		r := &recorder{}
		s.Replica().ObserveReplicas(r)
		return s, r
	}
	a, ra = build(1)
	b, rb = build(7)
	if a.Replica().ReplicaID() == b.Replica().ReplicaID() || a.Replica().ReplicaID() == 0 {
		t.Fatalf("replica ids %d, %d", a.Replica().ReplicaID(), b.Replica().ReplicaID())
	}
	return a, b, ra, rb, clock
}

// deliver applies every recorded booking event to dst and checks the outcomes.
func deliver(t *testing.T, dst *Service, evs []BookingEvent, want RemoteOutcome) {
	t.Helper()
	for _, ev := range evs {
		if got := dst.Replica().ApplyRemoteBooking(ev); got != want {
			t.Fatalf("apply %v %s: %v, want %v", ev.Kind, ev.RequestID, got, want)
		}
	}
}

func loadOn(t *testing.T, s *Service, worker uint64) PotentialLoad {
	t.Helper()
	for _, l := range s.Inspect().Loads(nil, nil)[0].Loads {
		if l.WorkerID == worker {
			return l
		}
	}
	t.Fatalf("no load row for worker %d", worker)
	return PotentialLoad{}
}

// Port of selector_replica_sync_propagates_request_lifecycle (Dynamo's
// lib/kv-router/src/services/selection/tests.rs): a booking on A shows on B
// as (1 request, 1 block, 4 prefill tokens), then (1, 1, 0) after prefill
// complete, then nothing after free.
func TestReplicaLifecyclePropagates(t *testing.T) {
	a, b, ra, _, _ := replicaPair(t, nil)
	resp, err := a.SelectAndReserve(bg, selReq("replicated", 1, 2, 3, 4))
	if err != nil {
		t.Fatal(err)
	}
	evs, _ := ra.take()
	if len(evs) != 1 || evs[0].Kind != BookingAdded || evs[0].RequestID != "replicated" || evs[0].Origin != a.Replica().ReplicaID() ||
		evs[0].BlockSize != 4 || len(evs[0].TrackingHashes) != 1 || evs[0].PrefillTokens == nil || *evs[0].PrefillTokens != 4 {
		t.Fatalf("published %+v", evs)
	}
	deliver(t, b, evs, RemoteApplied)
	w := resp.WorkerID
	if l := loadOn(t, b, w); l.ActiveRequests != 1 || l.PotentialDecodeBlocks != 1 || l.PotentialPrefillTokens != 4 {
		t.Fatalf("B after add: %+v", l)
	}
	if err := a.PrefillComplete(bg, "replicated"); err != nil {
		t.Fatal(err)
	}
	evs, _ = ra.take()
	deliver(t, b, evs, RemoteApplied)
	if l := loadOn(t, b, w); l.ActiveRequests != 1 || l.PotentialDecodeBlocks != 1 || l.PotentialPrefillTokens != 0 {
		t.Fatalf("B after prefill complete: %+v", l)
	}
	// Output blocks stay local.
	if err := a.OutputBlock(bg, "replicated", nil); err != nil {
		t.Fatal(err)
	}
	if evs, _ = ra.take(); len(evs) != 0 {
		t.Fatalf("output block published %+v", evs)
	}
	if err := a.Free(bg, "replicated"); err != nil {
		t.Fatal(err)
	}
	evs, _ = ra.take()
	if len(evs) != 1 || evs[0].Kind != BookingFreed {
		t.Fatalf("free published %+v", evs)
	}
	deliver(t, b, evs, RemoteApplied)
	if l := loadOn(t, b, w); l != (PotentialLoad{WorkerID: w}) {
		t.Fatalf("B after free: %+v", l)
	}
	// A second delivery finds nothing to free.
	deliver(t, b, evs, RemoteUnknownRequest)
}

// Every booking form publishes AddRequest: select_and_reserve (above), the
// explicit reservation and the cached replay.
func TestEveryBookingFormPublishes(t *testing.T) {
	a, b, ra, _, _ := replicaPair(t, nil)
	if _, err := a.Reserve(bg, &ReservationRequest{PartitionKey: PartitionKey{ModelName: "model"}, SelectionID: ptr("explicit"),
		WorkerID: ptr(uint64(2)), PromptRequest: PromptRequest{SequenceHashes: []int64{9}, ISLTokens: ptr(uint64(4))},
		TrackPrefillTokens: ptr(false), ExpectedOutputTokens: ptr(uint32(16))}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Select(bg, selReq("cached", 5, 6, 7, 8)); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Reserve(bg, &ReservationRequest{PartitionKey: PartitionKey{ModelName: "model"}, SelectionID: ptr("cached")}); err != nil {
		t.Fatal(err)
	}
	evs, _ := ra.take()
	if len(evs) != 2 || evs[0].RequestID != "explicit" || evs[1].RequestID != "cached" {
		t.Fatalf("published %+v", evs)
	}
	if e := evs[0]; e.TrackPrefill || e.PrefillTokens != nil || e.ExpectedOutputTokens == nil || *e.ExpectedOutputTokens != 16 ||
		e.Worker != (index.WorkerKey{WorkerID: 2}) || len(e.TrackingHashes) != 1 || e.TrackingHashes[0] != 9 {
		t.Fatalf("explicit form published %+v", e)
	}
	deliver(t, b, evs, RemoteApplied)
	// The explicit booking tracks no prefill; the replay books its 4 tokens.
	l1, l2 := loadOn(t, b, 1), loadOn(t, b, 2)
	if l1.ActiveRequests+l2.ActiveRequests != 2 || l2.ActiveRequests < 1 || l1.PotentialPrefillTokens+l2.PotentialPrefillTokens != 4 {
		t.Fatalf("B loads: %+v %+v", l1, l2)
	}
}

// A mirrored booking is a reservation row here: a local booking of its id
// conflicts, and a local free publishes Free, which frees the origin's booking.
func TestMirroredBookingIsAReservationRow(t *testing.T) {
	a, b, ra, rb, _ := replicaPair(t, nil)
	if _, err := a.SelectAndReserve(bg, selReq("r1", 1, 2, 3, 4)); err != nil {
		t.Fatal(err)
	}
	evs, _ := ra.take()
	deliver(t, b, evs, RemoteApplied)
	_, err := b.SelectAndReserve(bg, selReq("r1", 1, 2, 3, 4))
	wantKind(t, err, KindConflict, "r1")
	if err := b.Free(bg, "r1"); err != nil {
		t.Fatal(err)
	}
	evs, _ = rb.take()
	if len(evs) != 1 || evs[0].Kind != BookingFreed || evs[0].Origin != b.Replica().ReplicaID() {
		t.Fatalf("B published %+v", evs)
	}
	deliver(t, a, evs, RemoteApplied)
	for _, l := range a.Inspect().Loads(nil, nil)[0].Loads {
		if l.ActiveRequests != 0 {
			t.Fatalf("A still loaded: %+v", l)
		}
	}
	wantKind(t, a.Free(bg, "r1"), KindNotFound, "r1")
}

// Unknown worker, model, routing group, rank and block size events are
// dropped, as are our own echoes, duplicates and strangers' lifecycle calls:
// replica traffic never creates workers or bookings it cannot place.
func TestRemoteBookingDrops(t *testing.T) {
	a, b, ra, _, _ := replicaPair(t, nil)
	if _, err := a.SelectAndReserve(bg, selReq("r1", 1, 2, 3, 4)); err != nil {
		t.Fatal(err)
	}
	evs, _ := ra.take()
	add := evs[0]
	mut := func(f func(*BookingEvent)) BookingEvent { ev := add; f(&ev); return ev }
	for _, c := range []struct {
		name string
		ev   BookingEvent
		want RemoteOutcome
	}{
		{"own echo on the origin", add, RemoteOwn},
		{"unknown model", mut(func(e *BookingEvent) { e.Partition.Model = "other" }), RemoteUnknownPartition},
		{"unknown routing group", mut(func(e *BookingEvent) { e.Partition.RoutingGroup = "g" }), RemoteUnknownPartition},
		{"block size", mut(func(e *BookingEvent) { e.BlockSize = 16 }), RemoteBlockSizeMismatch},
		{"unknown worker", mut(func(e *BookingEvent) { e.Worker.WorkerID = 99 }), RemoteUnknownWorker},
		{"unknown rank", mut(func(e *BookingEvent) { e.Worker.DPRank = 3 }), RemoteUnknownRank},
		{"empty id", mut(func(e *BookingEvent) { e.RequestID = "" }), RemoteInvalid},
		{"unknown kind", mut(func(e *BookingEvent) { e.Kind = 9 }), RemoteInvalid},
		{"absurd prefill", mut(func(e *BookingEvent) { e.PrefillTokens = ptr(uint64(1) << 40) }), RemoteInvalid},
		{"free of a stranger", mut(func(e *BookingEvent) { e.Kind, e.RequestID = BookingFreed, "nobody" }), RemoteUnknownRequest},
		{"prefill of a stranger", mut(func(e *BookingEvent) { e.Kind, e.RequestID = BookingPrefillCompleted, "nobody" }), RemoteUnknownRequest},
	} {
		dst := b
		if c.name == "own echo on the origin" {
			dst = a
		}
		if got := dst.Replica().ApplyRemoteBooking(c.ev); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	if got := b.Replica().ApplyRemoteBooking(add); got != RemoteApplied {
		t.Fatalf("add: %v", got)
	}
	if got := b.Replica().ApplyRemoteBooking(add); got != RemoteDuplicate {
		t.Fatalf("second add: %v", got)
	}
	if l := loadOn(t, b, add.Worker.WorkerID); l.ActiveRequests != 1 {
		t.Fatalf("drops changed B: %+v", l)
	}
	// Ids are global: a free naming another rank (the origin moved the
	// booking) still frees the mirror.
	moved := add
	moved.Kind = BookingFreed
	moved.Worker.WorkerID = 3 - add.Worker.WorkerID // the other schedulable worker
	if got := b.Replica().ApplyRemoteBooking(moved); got != RemoteApplied {
		t.Fatalf("free naming another rank: %v", got)
	}
	if l := loadOn(t, b, add.Worker.WorkerID); l.ActiveRequests != 0 {
		t.Fatalf("free left %+v", l)
	}
}

// Mirrored bookings expire like local ones, without publishing: a peer that
// died without freeing leaves no load after DYN_ROUTER_ACTIVE_REQUEST_EXPIRY_SECS.
func TestMirroredBookingsExpire(t *testing.T) {
	a, b, ra, rb, clock := replicaPair(t, func(c *routerconfig.Config) { c.ActiveRequestExpiry = 10 * time.Second })
	for _, id := range []string{"r1", "r2", "r3"} {
		if _, err := a.SelectAndReserve(bg, selReq(id, 1, 2, 3, 4)); err != nil {
			t.Fatal(err)
		}
	}
	evs, _ := ra.take()
	deliver(t, b, evs, RemoteApplied)
	clock.Add(5 * time.Second)
	b.Maintain(bg)
	if n := loadOn(t, b, 1).ActiveRequests + loadOn(t, b, 2).ActiveRequests; n != 3 {
		t.Fatalf("before expiry: %d requests", n)
	}
	clock.Add(6 * time.Second)
	b.Maintain(bg)
	for _, w := range []uint64{1, 2} {
		if l := loadOn(t, b, w); l != (PotentialLoad{WorkerID: w}) {
			t.Fatalf("after expiry: %+v", l)
		}
	}
	if evs, _ := rb.take(); len(evs) != 0 {
		t.Fatalf("expiry published %+v", evs)
	}
	wantKind(t, b.Free(bg, "r1"), KindNotFound, "r1")
}

// Session bindings replicate: a session bound on A steers B's selections, and
// a binding naming a worker B does not have is dropped.
func TestSessionBindingsReplicate(t *testing.T) {
	a, b, ra, _, _ := replicaPair(t, func(c *routerconfig.Config) { c.SessionAffinityTTL = routerconfig.Some(time.Minute) })
	req := selReq("s-1", 1, 2, 3, 4)
	req.SessionID = ptr("sess")
	resp, err := a.SelectAndReserve(bg, req)
	if err != nil {
		t.Fatal(err)
	}
	_, binds := ra.take()
	if len(binds) != 1 || binds[0].SessionID != "sess" || binds[0].WorkerID != resp.WorkerID || binds[0].WriterID != a.Replica().ReplicaID() ||
		binds[0].Partition != (index.Partition{Model: "model", RoutingGroup: "default"}) {
		t.Fatalf("bindings %+v", binds)
	}
	if got, out := b.Replica().ApplyRemoteBinding(binds[0]); got != RemoteApplied || out != affinity.Inserted {
		t.Fatalf("apply: %v %v", got, out)
	}
	if got, _ := a.Replica().ApplyRemoteBinding(binds[0]); got != RemoteOwn {
		t.Fatalf("own binding: %v", got)
	}
	// Load the bound worker on B so the cost alone would pick the other one.
	other := 3 - resp.WorkerID
	for i := range 3 {
		id := "load-" + string(rune('a'+i))
		if _, err := b.Reserve(bg, &ReservationRequest{PartitionKey: PartitionKey{ModelName: "model"}, SelectionID: &id,
			WorkerID: ptr(resp.WorkerID), PromptRequest: PromptRequest{SequenceHashes: []int64{int64(100 + i)}, ISLTokens: ptr(uint64(64))}}); err != nil {
			t.Fatal(err)
		}
	}
	q := selReq("", 9, 9, 9, 9)
	q.SessionID = ptr("sess")
	got, err := b.Select(bg, q)
	if err != nil {
		t.Fatal(err)
	}
	if got.WorkerID != resp.WorkerID {
		t.Fatalf("B routed the session to %d, bound to %d (other %d)", got.WorkerID, resp.WorkerID, other)
	}
	stranger := binds[0]
	stranger.SessionID, stranger.WorkerID = "s2", 42
	if got, _ := b.Replica().ApplyRemoteBinding(stranger); got != RemoteUnknownWorker {
		t.Fatalf("unknown worker binding: %v", got)
	}
	unknown := binds[0]
	unknown.Partition.Model = "other"
	if got, _ := b.Replica().ApplyRemoteBinding(unknown); got != RemoteUnknownPartition {
		t.Fatalf("unknown partition binding: %v", got)
	}
	// Freeing the booking releases the lease: the refreshed binding is published.
	if err := a.Free(bg, "s-1"); err != nil {
		t.Fatal(err)
	}
	if _, binds := ra.take(); len(binds) != 1 || binds[0].SessionID != "sess" {
		t.Fatalf("after free: %+v", binds)
	}
}

func TestBindingWithoutAffinityIsDropped(t *testing.T) {
	_, b, _, _, _ := replicaPair(t, nil)
	got, _ := b.Replica().ApplyRemoteBinding(SessionBinding{Partition: index.Partition{Model: "model", RoutingGroup: "default"},
		BindingEvent: affinity.BindingEvent{SessionID: "s", WorkerID: 1, Sequence: 1, WriterID: 5}})
	if got != RemoteAffinityDisabled {
		t.Fatalf("got %v", got)
	}
}

// Readiness waits for startup recovery, whatever its outcome.
func TestReadinessWaitsForIndexRecovery(t *testing.T) {
	s, _ := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	if st := s.Ready(); !st.Ready || st.IndexRecovery != "" {
		t.Fatalf("no recovery configured: %+v", st)
	}
	for _, c := range []struct {
		state IndexRecovery
		ready bool
		text  string
	}{
		{RecoveryPending, false, "pending"},
		{RecoveryRecovered, true, "recovered"},
		{RecoveryFailed, true, "failed"},
	} {
		s.Replica().SetIndexRecovery(c.state)
		if st := s.Ready(); st.Ready != c.ready || st.IndexRecovery != c.text || s.gate.Recovery() != c.state {
			t.Errorf("%v: %+v", c.state, st)
		}
	}
}

// TestSessionFinalIsNotReplicated: the replica-sync topic carries bindings,
// not their removal — like an idle expiry or a dropped conflicting binding,
// a final request's end is local. The peer keeps its copy until its own idle
// TTL runs out, and the session's next binding (a newer version) replaces it.
func TestSessionFinalIsNotReplicated(t *testing.T) {
	a, b, ra, _, clock := replicaPair(t, func(c *routerconfig.Config) { c.SessionAffinityTTL = routerconfig.Some(time.Minute) })
	if _, err := a.SelectAndReserve(bg, sessionCtxReq("s-1", "sess", "", true, 1, 2, 3, 4)); err != nil {
		t.Fatal(err)
	}
	_, binds := ra.take()
	if len(binds) != 1 {
		t.Fatalf("bindings %+v", binds)
	}
	if got, out := b.Replica().ApplyRemoteBinding(binds[0]); got != RemoteApplied || out != affinity.Inserted {
		t.Fatalf("apply: %v %v", got, out)
	}
	if err := a.Free(bg, "s-1"); err != nil {
		t.Fatal(err)
	}
	if _, binds := ra.take(); len(binds) != 0 {
		t.Fatalf("ending the binding published %+v", binds)
	}
	_, onA := bindingOf(t, a, "sess")
	_, onB := bindingOf(t, b, "sess")
	if onA || !onB {
		t.Fatalf("after the final free: bound on A %v (want false), on B %v (want true)", onA, onB)
	}
	// The session starts again on A: its new binding outranks B's copy.
	if _, err := a.SelectAndReserve(bg, sessionCtxReq("s-2", "sess", "", false, 1, 2, 3, 4)); err != nil {
		t.Fatal(err)
	}
	_, binds = ra.take()
	if len(binds) != 1 {
		t.Fatalf("bindings %+v", binds)
	}
	if got, out := b.Replica().ApplyRemoteBinding(binds[0]); got != RemoteApplied || !out.Applied() {
		t.Fatalf("the new binding on B: %v %v", got, out)
	}
	if got, ok := bindingOf(t, b, "sess"); !ok || got.WorkerID != binds[0].WorkerID {
		t.Fatalf("B's copy = %v %v, want worker %d", got, ok, binds[0].WorkerID)
	}
	if err := a.Free(bg, "s-2"); err != nil {
		t.Fatal(err)
	}
	// Unrefreshed, B's copy lasts its idle TTL.
	clock.Add(2 * time.Minute)
	if _, ok := bindingOf(t, b, "sess"); ok {
		t.Fatal("B's copy outlived its idle TTL")
	}
}
