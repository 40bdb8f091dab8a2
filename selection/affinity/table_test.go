package affinity

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection/index"
)

const ttl = 10 * time.Second

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

func rt(worker uint64, rank uint32) Target {
	return RankTarget(index.WorkerKey{WorkerID: worker, DPRank: rank})
}

func newTable(t testing.TB, mode Mode) *Table {
	t.Helper()
	tb, err := NewTable(Config{TTL: ttl, Mode: mode, WriterID: 7}, t0)
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

// liveSet is a mutable liveness source: live workers, each with a DP range
// [start, start+size); size 0 means any rank.
type liveSet map[uint64][2]uint32

func live(ids ...uint64) liveSet {
	s := liveSet{}
	for _, id := range ids {
		s[id] = [2]uint32{0, 0}
	}
	return s
}

// schedulable is the predicate the service passes: the worker is schedulable
// in the partition and a ranked target's rank is in its current DP range.
func (s liveSet) schedulable(t Target) bool {
	r, ok := s[t.WorkerID]
	if !ok {
		return false
	}
	return !t.HasDPRank || r[1] == 0 || (t.DPRank >= r[0] && t.DPRank < r[0]+r[1])
}

func acquire(t *testing.T, tb *Table, now time.Time, sid string, sched func(Target) bool) *Hold {
	t.Helper()
	h, wait, err := tb.Acquire(now, sid, sched)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", sid, err)
	}
	if h == nil || wait != nil {
		t.Fatalf("Acquire(%q) = wait, want a hold", sid)
	}
	return h
}

func mustKind(t *testing.T, h *Hold, want HoldKind) {
	t.Helper()
	if h.Kind() != want {
		t.Fatalf("hold kind = %v, want %v", h.Kind(), want)
	}
}

func commit(t *testing.T, h *Hold, now time.Time, dispatched Target, sched func(Target) bool) *Lease {
	t.Helper()
	l, err := h.Commit(now, dispatched, sched)
	if err != nil {
		t.Fatalf("Commit(%v): %v", dispatched, err)
	}
	return l
}

// bind binds a fresh session and releases the lease, like a finished booking.
func bind(t *testing.T, tb *Table, now time.Time, sid string, target Target) {
	t.Helper()
	h := acquire(t, tb, now, sid, nil)
	mustKind(t, h, HoldInitialize)
	commit(t, h, now, target, nil).Release(now)
}

func boundTo(t *testing.T, tb *Table, now time.Time, sid string) (Target, bool) {
	t.Helper()
	target, ok, err := tb.Query(now, sid)
	if err != nil {
		t.Fatal(err)
	}
	return target, ok
}

func assertBound(t *testing.T, tb *Table, now time.Time, sid string, want Target) {
	t.Helper()
	if got, ok := boundTo(t, tb, now, sid); !ok || got != want {
		t.Fatalf("binding of %q = (%v, %v), want %v", sid, got, ok, want)
	}
}

func assertUnbound(t *testing.T, tb *Table, now time.Time, sid string) {
	t.Helper()
	if got, ok := boundTo(t, tb, now, sid); ok {
		t.Fatalf("binding of %q = %v, want none", sid, got)
	}
}

func assertLeases(t *testing.T, tb *Table, sid string, want int) {
	t.Helper()
	if got, ok := tb.LeaseCount(sid); !ok || got != want {
		t.Fatalf("LeaseCount(%q) = (%d, %v), want %d", sid, got, ok, want)
	}
}

// join drives the failover path directly, as affinity.rs's tests call
// join_initializing: a booking whose bound worker departed binds an
// in-flight initialization to where it landed.
func join(t *testing.T, tb *Table, now time.Time, sid string, target Target) *Lease {
	t.Helper()
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if e := tb.entries[sid]; e == nil || e.state != initializing {
		t.Fatalf("join: %q is not initializing", sid)
	}
	l, err := tb.failover(now, new(Lease), sid, target)
	if err != nil || l == nil {
		t.Fatalf("join: (%v, %v)", l, err)
	}
	return l
}

func TestNewTableValidatesConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want error
	}{
		{name: "zero ttl fails", cfg: Config{}, want: ErrInvalidTTL},
		{name: "sub-second ttl fails", cfg: Config{TTL: 999 * time.Millisecond}, want: ErrInvalidTTL},
		{name: "ttl over a year fails", cfg: Config{TTL: MaxTTL + time.Second}, want: ErrInvalidTTL},
		{name: "one second is the minimum", cfg: Config{TTL: time.Second}},
		{name: "a year is the maximum", cfg: Config{TTL: MaxTTL}},
		{name: "negative max entries fails", cfg: Config{TTL: ttl, MaxEntries: -1}, want: ErrInvalidConfig},
		{name: "negative id limit fails", cfg: Config{TTL: ttl, MaxSessionIDBytes: -1}, want: ErrInvalidConfig},
		{name: "unknown mode fails", cfg: Config{TTL: ttl, Mode: 9}, want: ErrInvalidConfig},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb, err := NewTable(tt.cfg, t0)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if tt.want == nil && (tb.maxEntries != 65536 || tb.maxIDBytes != 256 || tb.Mode() != Hard) {
				t.Fatalf("defaults = %d, %d, %v", tb.maxEntries, tb.maxIDBytes, tb.Mode())
			}
		})
	}
	if got := ErrInvalidTTL.Error(); got != "session affinity TTL must be between 1 and 31536000 seconds" {
		t.Fatalf("ErrInvalidTTL text %q", got)
	}
}

func TestSequenceStartsAtCreationUnixNanos(t *testing.T) {
	tb := newTable(t, Hard)
	bind(t, tb, t0, "s", rt(1, 0))
	evs := tb.Events()
	if len(evs) == 0 || evs[0].Sequence != uint64(t0.UnixNano()) || evs[0].WriterID != 7 {
		t.Fatalf("events = %+v, want first sequence %d writer 7", evs, t0.UnixNano())
	}
}

func TestSessionIDOverLimitIsBadRequest(t *testing.T) {
	tb := newTable(t, Hard)
	ok := strings.Repeat("x", 256)
	long := ok + "x"
	if _, _, err := tb.Acquire(t0, ok, nil); err != nil {
		t.Fatalf("256-byte id: %v", err)
	}
	for name, call := range map[string]func() error{
		"Query":   func() error { _, _, err := tb.Query(t0, long); return err },
		"Acquire": func() error { _, _, err := tb.Acquire(t0, long, nil); return err },
	} {
		err := call()
		if !errors.Is(err, ErrSessionIDTooLong) || err.Error() != "session affinity ID must not exceed 256 bytes" {
			t.Fatalf("%s: err = %v", name, err)
		}
	}
	if got := tb.ApplyRemote(t0, BindingEvent{SessionID: long, WorkerID: 1, Sequence: 1, WriterID: 9}, nil); got != RejectedSessionID {
		t.Fatalf("ApplyRemote = %v", got)
	}
}

func TestConflictMessages(t *testing.T) {
	tests := []struct {
		name              string
		boundTo, dispatch Target
		want              string
	}{
		{name: "other worker", boundTo: rt(1, 0), dispatch: rt(2, 0), want: "session s is bound to worker 1, not 2"},
		{name: "other rank", boundTo: rt(1, 0), dispatch: rt(1, 3), want: "session s is bound to DP rank 0, not 3"},
		{name: "no rank dispatched", boundTo: rt(1, 2), dispatch: WorkerTarget(1), want: "session s is bound to DP rank 2, but dispatch did not select a DP rank"},
		{name: "worker-only binding on other worker", boundTo: WorkerTarget(1), dispatch: rt(2, 0), want: "session s is bound to worker 1, not 2"},
		{name: "worker-only binding accepts any rank", boundTo: WorkerTarget(1), dispatch: rt(1, 5)},
		{name: "exact match", boundTo: rt(1, 1), dispatch: rt(1, 1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkDispatch("s", tt.boundTo, tt.dispatch)
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrSessionConflict) || err.Error() != tt.want {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

// --- ports of the unit tests in Dynamo's
// lib/kv-router/src/services/selection/affinity.rs (commit 0a2aa918) ---

func TestJoinedLeaseReleasedBeforeCommitIsNotCounted(t *testing.T) {
	tb := newTable(t, Hard)
	target := rt(2, 0)
	init := acquire(t, tb, t0, "s", nil)
	joined := join(t, tb, t0, "s", target)
	assertLeases(t, tb, "s", 2)

	joined.Release(t0) // the joiner finishes while the initializer is queued
	assertLeases(t, tb, "s", 1)
	assertBound(t, tb, at(ttl+time.Second), "s", target) // the initializer's use keeps it

	lease := commit(t, init, at(ttl+time.Second), target, nil)
	assertLeases(t, tb, "s", 1)
	lease.Release(at(ttl + time.Second))
	assertLeases(t, tb, "s", 0)
	assertUnbound(t, tb, at(2*ttl+2*time.Second), "s")
}

func TestJoinedLeaseCountsOnceCompetingInitializationCommits(t *testing.T) {
	tb := newTable(t, Hard)
	target := rt(2, 0)
	init := acquire(t, tb, t0, "s", nil)
	_, wait, _ := tb.Acquire(t0, "s", nil)
	if wait == nil {
		t.Fatal("second request must wait on the initialization")
	}
	joined := join(t, tb, t0, "s", target)
	select {
	case <-wait:
	default:
		t.Fatal("joining must wake existing waiters")
	}
	assertLeases(t, tb, "s", 2)

	lease := commit(t, init, t0, target, nil)
	assertLeases(t, tb, "s", 2)
	assertBound(t, tb, t0, "s", target)
	lease.Release(t0)
	assertLeases(t, tb, "s", 1)

	// The joiner's release is a use: it restarts the idle deadline.
	joined.Release(at(ttl - time.Second))
	assertLeases(t, tb, "s", 0)
	assertBound(t, tb, at(ttl+time.Second), "s", target)
	assertUnbound(t, tb, at(2*ttl), "s")
	mustKind(t, acquire(t, tb, at(2*ttl), "s", nil), HoldInitialize)
}

func TestJoinedBindingSurvivesInitializerAborting(t *testing.T) {
	tb := newTable(t, Hard)
	target := rt(2, 0)
	init := acquire(t, tb, t0, "s", nil)
	joined := join(t, tb, t0, "s", target)
	if tb.Len() != 1 {
		t.Fatalf("Len = %d", tb.Len())
	}
	init.Abort(t0)
	if tb.Len() != 1 {
		t.Fatalf("Len after abort = %d", tb.Len())
	}
	assertBound(t, tb, t0, "s", target)
	assertLeases(t, tb, "s", 1)
	joined.Release(t0)
	assertLeases(t, tb, "s", 0)
	assertUnbound(t, tb, at(ttl+time.Second), "s")

	// Once the completed booking's TTL expires, another target can bind.
	h := acquire(t, tb, at(ttl+time.Second), "s", nil)
	mustKind(t, h, HoldInitialize)
	l := commit(t, h, at(ttl+time.Second), rt(3, 0), nil)
	assertLeases(t, tb, "s", 1)
	l.Release(at(ttl + time.Second))
	assertLeases(t, tb, "s", 0)
}

func TestInitializerCannotChangeJoinedRankInHardMode(t *testing.T) {
	tb := newTable(t, Hard)
	target := rt(2, 0)
	init := acquire(t, tb, t0, "s", nil)
	joined := join(t, tb, t0, "s", target)
	_, err := init.Commit(t0, rt(2, 1), nil)
	if !errors.Is(err, ErrSessionConflict) || err.Error() != "session s is bound to DP rank 0, not 1" {
		t.Fatalf("err = %v", err)
	}
	assertBound(t, tb, t0, "s", target)
	assertLeases(t, tb, "s", 1)
	joined.Release(t0)
	assertLeases(t, tb, "s", 0)
}

func TestSoftInitializerFollowsDispatchAndKeepsWorkerOnlyAffinity(t *testing.T) {
	tb := newTable(t, Soft)
	init := acquire(t, tb, t0, "s", nil)
	joined := join(t, tb, t0, "s", WorkerTarget(2))
	lease := commit(t, init, t0, rt(3, 0), nil)
	assertBound(t, tb, t0, "s", WorkerTarget(3))
	assertLeases(t, tb, "s", 2)
	lease.Release(t0)
	joined.Release(t0)
	assertLeases(t, tb, "s", 0)
}

// --- ports of the resolver's tests (the acquire/commit layer hosts share) ---

func TestAcquire(t *testing.T) {
	for _, mode := range []Mode{Hard, Soft} {
		t.Run("new session initializes/"+mode.String(), func(t *testing.T) {
			tb := newTable(t, mode)
			h := acquire(t, tb, t0, "s", live(1).schedulable)
			mustKind(t, h, HoldInitialize)
			if _, ok := h.Target(); ok || h.SessionID() != "s" {
				t.Fatal("an initializing hold has no target")
			}
		})
		t.Run("bound live session steers to its target/"+mode.String(), func(t *testing.T) {
			tb := newTable(t, mode)
			bind(t, tb, t0, "s", rt(1, 0))
			h := acquire(t, tb, t0, "s", live(1, 2).schedulable)
			mustKind(t, h, HoldBound)
			if got, ok := h.Target(); !ok || got != rt(1, 0) {
				t.Fatalf("target = %v, %v", got, ok)
			}
			assertLeases(t, tb, "s", 1)
		})
	}
}

func TestUnschedulableBindingIsDroppedAndReinitialized(t *testing.T) {
	tb := newTable(t, Hard)
	bind(t, tb, t0, "s", rt(1, 0))
	h := acquire(t, tb, t0, "s", live(2).schedulable)
	mustKind(t, h, HoldInitialize)
	assertUnbound(t, tb, t0, "s")
	l := commit(t, h, t0, rt(2, 0), live(2).schedulable)
	assertBound(t, tb, t0, "s", rt(2, 0))
	l.Release(t0)
}

func TestFullTableRoutesUnpinned(t *testing.T) {
	tb, err := NewTable(Config{TTL: ttl, MaxEntries: 1}, t0)
	if err != nil {
		t.Fatal(err)
	}
	acquire(t, tb, t0, "a", nil)
	h := acquire(t, tb, t0, "b", nil)
	mustKind(t, h, HoldUnpinned)
	if _, ok := h.Target(); ok {
		t.Fatal("unpinned hold has a target")
	}
	if l, err := h.Commit(t0, rt(1, 0), nil); l != nil || err != nil {
		t.Fatalf("Commit = (%v, %v), want (nil, nil)", l, err)
	}
	var nilLease *Lease
	nilLease.Release(t0) // the unpinned request's reservation releases nothing
	if tb.FullTableFallbacks() != 1 || tb.Len() != 1 {
		t.Fatalf("fallbacks, Len = %d, %d", tb.FullTableFallbacks(), tb.Len())
	}
	// A replicated binding does not overflow the table either.
	if got := tb.ApplyRemote(t0, BindingEvent{SessionID: "c", WorkerID: 1, Sequence: 1, WriterID: 9}, nil); got != RejectedCapacity {
		t.Fatalf("ApplyRemote = %v", got)
	}
}

func TestHardCommitAwayFromLiveBindingRejectsAndDropsIt(t *testing.T) {
	tb := newTable(t, Hard)
	sched := live(1, 2).schedulable
	bind(t, tb, t0, "s", rt(1, 0))
	h := acquire(t, tb, t0, "s", sched)
	l, err := h.Commit(t0, rt(2, 0), sched)
	if l != nil || !errors.Is(err, ErrSessionConflict) || err.Error() != "session s is bound to worker 1, not 2" {
		t.Fatalf("Commit = (%v, %v)", l, err)
	}
	assertUnbound(t, tb, t0, "s")
	if _, ok := tb.LeaseCount("s"); ok {
		t.Fatal("dropped binding still has an entry")
	}
	// The session's next request re-initializes.
	h = acquire(t, tb, t0, "s", sched)
	mustKind(t, h, HoldInitialize)
	commit(t, h, t0, rt(2, 0), sched).Release(t0)
	assertBound(t, tb, t0, "s", rt(2, 0))
}

func TestDepartedBindingFailsOverToDispatchedWorker(t *testing.T) {
	tb := newTable(t, Hard)
	liveness := live(1, 2)
	bind(t, tb, t0, "s", rt(1, 0))
	h := acquire(t, tb, t0, "s", liveness.schedulable)
	delete(liveness, 1) // worker 1 departs between hold and commit
	l := commit(t, h, t0, rt(2, 0), liveness.schedulable)
	assertBound(t, tb, t0, "s", rt(2, 0))
	assertLeases(t, tb, "s", 1)
	l.Release(t0)
	assertLeases(t, tb, "s", 0)
}

func TestDepartedBindingJoinsPendingInitialization(t *testing.T) {
	tb := newTable(t, Hard)
	liveness := live(1, 2)
	bind(t, tb, t0, "s", rt(1, 0))
	stale := acquire(t, tb, t0, "s", liveness.schedulable)
	delete(liveness, 1)
	initializing := acquire(t, tb, t0, "s", liveness.schedulable) // sees the departure
	mustKind(t, initializing, HoldInitialize)

	joined := commit(t, stale, t0, rt(2, 0), liveness.schedulable)
	assertBound(t, tb, t0, "s", rt(2, 0))
	assertLeases(t, tb, "s", 2)

	lease := commit(t, initializing, t0, rt(2, 0), liveness.schedulable)
	assertLeases(t, tb, "s", 2)
	joined.Release(t0)
	lease.Release(t0)
	assertLeases(t, tb, "s", 0)
}

func TestJoinedFailoverPreservesSuccessfulBookingsBinding(t *testing.T) {
	for _, initializerCommitsElsewhere := range []bool{false, true} {
		tb := newTable(t, Hard)
		liveness := live(1, 2, 3)
		bind(t, tb, t0, "s", rt(1, 0))
		r2 := acquire(t, tb, t0, "s", liveness.schedulable)
		delete(liveness, 1)
		r3 := acquire(t, tb, t0, "s", liveness.schedulable)
		assertUnbound(t, tb, t0, "s")

		lease := commit(t, r2, t0, rt(2, 0), liveness.schedulable)
		if initializerCommitsElsewhere {
			if _, err := r3.Commit(t0, rt(3, 0), liveness.schedulable); !errors.Is(err, ErrSessionConflict) {
				t.Fatalf("conflicting initializer: err = %v", err)
			}
		} else {
			r3.Abort(t0)
		}
		assertBound(t, tb, t0, "s", rt(2, 0))
		assertLeases(t, tb, "s", 1)
		lease.Release(t0)
		assertLeases(t, tb, "s", 0)
	}
}

func TestLateFailoverMismatchPreservesCommittedReplacement(t *testing.T) {
	tb := newTable(t, Hard)
	liveness := live(1, 2, 3)
	bind(t, tb, t0, "s", rt(1, 0))
	oldHold := acquire(t, tb, t0, "s", liveness.schedulable)
	delete(liveness, 1)
	newHold := acquire(t, tb, t0, "s", liveness.schedulable)
	lease := commit(t, newHold, t0, rt(2, 0), liveness.schedulable)

	_, err := oldHold.Commit(t0, rt(3, 0), liveness.schedulable)
	if !errors.Is(err, ErrSessionConflict) || err.Error() != "session s is bound to worker 2, not 3" {
		t.Fatalf("err = %v", err)
	}
	assertBound(t, tb, t0, "s", rt(2, 0))
	assertLeases(t, tb, "s", 1)
	lease.Release(t0)
	assertLeases(t, tb, "s", 0)
}

func TestSoftCommitFollowsDispatch(t *testing.T) {
	tests := []struct {
		name              string
		boundTo, dispatch Target
		want              Target
	}{
		{name: "ranked binding follows worker and rank", boundTo: rt(1, 0), dispatch: rt(2, 1), want: rt(2, 1)},
		{name: "worker-only binding stays worker-only", boundTo: WorkerTarget(1), dispatch: rt(2, 1), want: WorkerTarget(2)},
		{name: "ranked binding keeps its rank on a rankless dispatch", boundTo: rt(1, 3), dispatch: WorkerTarget(2), want: rt(1, 3)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := newTable(t, Soft)
			bind(t, tb, t0, "s", tt.boundTo)
			tb.Events()
			l := commit(t, acquire(t, tb, t0, "s", nil), t0, tt.dispatch, nil)
			assertBound(t, tb, t0, "s", tt.want)
			evs := tb.Events()
			if len(evs) != 1 || evs[0].Target() != tt.want {
				t.Fatalf("published %+v, want one event for %v", evs, tt.want)
			}
			l.Release(t0)
			assertLeases(t, tb, "s", 0)
		})
	}
}

func TestQueryReturnsTargetWithoutLease(t *testing.T) {
	tb := newTable(t, Soft)
	assertUnbound(t, tb, t0, "s")
	acquire(t, tb, t0, "init", nil)
	assertUnbound(t, tb, t0, "init") // initializing reads as unbound, never waits
	bind(t, tb, t0, "s", WorkerTarget(1))
	assertBound(t, tb, t0, "s", WorkerTarget(1))
	assertLeases(t, tb, "s", 0)
	if tb.Len() != 2 {
		t.Fatalf("Query created entries: Len = %d", tb.Len())
	}
}

func TestFilteredHardBindingIsDroppedAndSoftKept(t *testing.T) {
	for _, tt := range []struct {
		mode Mode
		kept bool
	}{{Hard, false}, {Soft, true}} {
		tb := newTable(t, tt.mode)
		bind(t, tb, t0, "s", WorkerTarget(1))
		acquire(t, tb, t0, "s", nil).AbortFiltered(t0)
		if _, ok := boundTo(t, tb, t0, "s"); ok != tt.kept {
			t.Fatalf("%v: bound = %v, want %v", tt.mode, ok, tt.kept)
		}
	}
}

// --- session behaviours from Dynamo's selection core tests
// (lib/kv-router/src/services/selection/core/tests.rs, commit 0049ca39) ---

func TestSessionStaysOnFirstWorkerAcrossBookings(t *testing.T) {
	tb := newTable(t, Hard)
	sched := live(1, 2).schedulable
	h := acquire(t, tb, t0, "s", sched)
	first := commit(t, h, t0, rt(2, 0), sched)
	for i := range 3 {
		now := at(time.Duration(i) * time.Second)
		h := acquire(t, tb, now, "s", sched)
		target, ok := h.Target()
		if !ok || target != rt(2, 0) {
			t.Fatalf("booking %d steered to %v, %v", i, target, ok)
		}
		commit(t, h, now, target, sched).Release(now)
	}
	first.Release(t0)
	assertBound(t, tb, t0, "s", rt(2, 0)) // /select sees the binding
}

func TestDepartedWorkerReinitializesSession(t *testing.T) {
	tb := newTable(t, Hard)
	bind(t, tb, t0, "s", rt(1, 0))
	h := acquire(t, tb, t0, "s", live(2).schedulable) // worker 1 deleted
	mustKind(t, h, HoldInitialize)
	commit(t, h, t0, rt(2, 0), live(2).schedulable).Release(t0)
	assertBound(t, tb, t0, "s", rt(2, 0))
}

// core test session_dp_rank_shrink_rebinds_only_removed_targets: worker 1
// shrinks from DP size 2 to 1; only a binding on the removed rank re-binds,
// whether the shrink lands before the hold or between hold and commit.
func TestDPShrinkRebindsOnlyRemovedRanks(t *testing.T) {
	tests := []struct {
		name    string
		boundTo Target
		want    Target
	}{
		{name: "removed rank", boundTo: rt(1, 1), want: rt(1, 0)},
		{name: "retained rank", boundTo: rt(1, 0), want: rt(1, 0)},
		{name: "worker only", boundTo: WorkerTarget(1), want: WorkerTarget(1)},
	}
	for _, tt := range tests {
		for _, afterHold := range []bool{false, true} {
			name := tt.name + "/before hold"
			if afterHold {
				name = tt.name + "/after hold"
			}
			t.Run(name, func(t *testing.T) {
				tb := newTable(t, Hard)
				liveness := liveSet{1: {0, 2}}
				bind(t, tb, t0, "s", tt.boundTo)
				shrink := func() { liveness[1] = [2]uint32{0, 1} }
				if !afterHold {
					shrink()
				}
				h := acquire(t, tb, t0, "s", liveness.schedulable)
				if !afterHold {
					if tt.boundTo == rt(1, 1) {
						mustKind(t, h, HoldInitialize)
						assertUnbound(t, tb, t0, "s")
					} else {
						assertBound(t, tb, t0, "s", tt.boundTo)
					}
				} else {
					mustKind(t, h, HoldBound)
					shrink()
				}
				// The scheduler can only book rank 0 now.
				l := commit(t, h, t0, rt(1, 0), liveness.schedulable)
				assertBound(t, tb, t0, "s", tt.want)
				l.Release(t0)
				assertLeases(t, tb, "s", 0)
			})
		}
	}
}

func TestConcurrentHoldsOnDepartedWorkerBothLandOnReplacement(t *testing.T) {
	tb := newTable(t, Hard)
	liveness := live(1, 2)
	bind(t, tb, t0, "s", rt(1, 0))
	first := acquire(t, tb, t0, "s", liveness.schedulable)
	second := acquire(t, tb, t0, "s", liveness.schedulable)
	delete(liveness, 1)
	l1 := commit(t, first, t0, rt(2, 0), liveness.schedulable)
	l2 := commit(t, second, t0, rt(2, 0), liveness.schedulable)
	assertBound(t, tb, t0, "s", rt(2, 0))
	assertLeases(t, tb, "s", 2)
	l1.Release(t0)
	l2.Release(t0)
	assertLeases(t, tb, "s", 0)
}

func TestTwoPhaseReplayBindsSessionAndRejectsMovedSession(t *testing.T) {
	tb := newTable(t, Hard)
	sched := live(1, 2).schedulable
	// /select caches worker 1 for session s; select alone binds nothing.
	if _, ok := boundTo(t, tb, t0, "s"); ok {
		t.Fatal("select bound the session")
	}
	// The replay holds and commits the cached worker.
	commit(t, acquire(t, tb, t0, "s", sched), t0, rt(1, 0), sched).Release(t0)
	assertBound(t, tb, t0, "s", rt(1, 0))

	// A second cached selection for worker 2 replays after s moved to 1: 400.
	h := acquire(t, tb, t0, "s", sched)
	_, err := h.Commit(t0, rt(2, 0), sched)
	if !errors.Is(err, ErrSessionConflict) || err.Error() != "session s is bound to worker 1, not 2" {
		t.Fatalf("replay of a moved session: %v", err)
	}
}

func TestPartitionsKeepIndependentBindings(t *testing.T) {
	a, b := newTable(t, Hard), newTable(t, Hard)
	bind(t, a, t0, "shared", rt(1, 0))
	bind(t, b, t0, "shared", rt(3, 0))
	assertBound(t, a, t0, "shared", rt(1, 0))
	assertBound(t, b, t0, "shared", rt(3, 0))
}

// --- leases and expiry ---

func TestIdleTTLCountsFromLastLeaseRelease(t *testing.T) {
	tb := newTable(t, Hard)
	h := acquire(t, tb, t0, "s", nil)
	l1 := commit(t, h, t0, rt(1, 0), nil)
	l2 := commit(t, acquire(t, tb, t0, "s", nil), t0, rt(1, 0), nil)
	assertLeases(t, tb, "s", 2)

	assertBound(t, tb, at(time.Hour), "s", rt(1, 0)) // leased bindings never idle out
	l1.Release(at(5 * time.Second))
	l2.Release(at(9 * time.Second))
	l2.Release(at(20 * time.Second)) // idempotent: no second refresh or decrement
	assertLeases(t, tb, "s", 0)
	assertBound(t, tb, at(9*time.Second+ttl-time.Nanosecond), "s", rt(1, 0))
	assertUnbound(t, tb, at(9*time.Second+ttl), "s") // deadline reached = expired
}

func TestExpiredBookingReleasesLease(t *testing.T) {
	tb := newTable(t, Hard)
	l := commit(t, acquire(t, tb, t0, "session", nil), t0, rt(1, 0), nil)
	l.Release(at(time.Second)) // the reservation expired or was freed
	assertUnbound(t, tb, at(time.Second+ttl+time.Second), "session")
}

func TestHoldIsUsedOnce(t *testing.T) {
	tb := newTable(t, Hard)
	h := acquire(t, tb, t0, "s", nil)
	l := commit(t, h, t0, rt(1, 0), nil)
	h.Abort(t0) // deferred abort after a commit is a no-op
	assertLeases(t, tb, "s", 1)
	if _, err := h.Commit(t0, rt(1, 0), nil); !errors.Is(err, ErrHoldDone) {
		t.Fatalf("second Commit err = %v", err)
	}
	l.Release(t0)

	b := acquire(t, tb, t0, "s", nil)
	assertLeases(t, tb, "s", 1)
	b.Abort(at(3 * time.Second)) // an aborted bound hold is a use: TTL restarts
	b.Abort(at(4 * time.Second))
	assertLeases(t, tb, "s", 0)
	assertBound(t, tb, at(3*time.Second+ttl-time.Nanosecond), "s", rt(1, 0))
}

func TestWaitersResumeWhenInitializationResolves(t *testing.T) {
	tests := []struct {
		name    string
		resolve func(t *testing.T, h *Hold)
		want    HoldKind
	}{
		{name: "commit binds", resolve: func(t *testing.T, h *Hold) { commit(t, h, t0, rt(1, 0), nil) }, want: HoldBound},
		{name: "abort frees the session", resolve: func(t *testing.T, h *Hold) { h.Abort(t0) }, want: HoldInitialize},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := newTable(t, Hard)
			init := acquire(t, tb, t0, "s", nil)
			h, wait, err := tb.Acquire(t0, "s", nil)
			if h != nil || wait == nil || err != nil {
				t.Fatalf("Acquire = (%v, %v, %v), want a wait channel", h, wait, err)
			}
			select {
			case <-wait:
				t.Fatal("wait closed before the initialization resolved")
			default:
			}
			tt.resolve(t, init)
			<-wait
			mustKind(t, acquire(t, tb, t0, "s", nil), tt.want)
		})
	}
}

func TestReapDropsOnlyIdleExpiredBindings(t *testing.T) {
	tb := newTable(t, Hard)
	bind(t, tb, t0, "idle", rt(1, 0))
	commit(t, acquire(t, tb, t0, "leased", nil), t0, rt(1, 0), nil)
	acquire(t, tb, t0, "initializing", nil)
	bind(t, tb, at(5*time.Second), "fresh", rt(1, 0))

	if n := tb.Reap(at(ttl - time.Second)); n != 0 {
		t.Fatalf("early Reap = %d", n)
	}
	if n := tb.Reap(at(ttl)); n != 1 || tb.Len() != 3 {
		t.Fatalf("Reap = %d, Len = %d; want 1, 3", n, tb.Len())
	}
	if _, ok := tb.LeaseCount("idle"); ok {
		t.Fatal("idle binding survived the reaper")
	}
}

// TestFinalLeaseEndsBindingOnRelease: a final request routes by the binding,
// a request of the session arriving meanwhile still joins it, and the final
// request's release drops the binding — the concurrent lease then releases
// as a no-op and the session's next request initializes afresh. Nothing is
// published for the drop (the topic carries bindings only).
func TestFinalLeaseEndsBindingOnRelease(t *testing.T) {
	tb := newTable(t, Hard)
	first := commit(t, acquire(t, tb, at(0), "s", nil), at(0), rt(1, 0), nil)
	first.Release(at(time.Second))

	h := acquire(t, tb, at(2*time.Second), "s", nil)
	mustKind(t, h, HoldBound)
	if got, _ := h.Target(); got != rt(1, 0) {
		t.Fatalf("final request's target = %v, want the binding 1/0", got)
	}
	final := commit(t, h, at(2*time.Second), rt(1, 0), nil)
	final.EndOnRelease()
	other := commit(t, acquire(t, tb, at(3*time.Second), "s", nil), at(3*time.Second), rt(1, 0), nil)
	tb.Events() // drain the commits' publications

	final.Release(at(4 * time.Second))
	if _, ok := tb.LeaseCount("s"); ok {
		t.Fatal("binding still present after the final lease's release")
	}
	if _, bound, _ := tb.Query(at(4*time.Second), "s"); bound {
		t.Fatal("Query still finds the ended binding")
	}
	other.Release(at(5 * time.Second)) // no-op on the dropped revision
	if evs := tb.Events(); len(evs) != 0 {
		t.Fatalf("ending published %v", evs)
	}
	if n := tb.EndedBindings(); n != 1 {
		t.Fatalf("EndedBindings = %d, want 1", n)
	}
	mustKind(t, acquire(t, tb, at(6*time.Second), "s", nil), HoldInitialize)
}

// TestFinalLeaseLeavesANewerBindingAlone: a final lease of an old revision
// (the binding was dropped and re-made meanwhile) ends nothing.
func TestFinalLeaseLeavesANewerBindingAlone(t *testing.T) {
	tb := newTable(t, Hard)
	old := commit(t, acquire(t, tb, at(0), "s", nil), at(0), rt(1, 0), nil)
	old.EndOnRelease()
	// The worker departs: the next request re-initializes on worker 2.
	h := acquire(t, tb, at(time.Second), "s", live(2).schedulable)
	mustKind(t, h, HoldInitialize)
	commit(t, h, at(time.Second), rt(2, 0), nil)
	old.Release(at(2 * time.Second))
	if got, bound, _ := tb.Query(at(2*time.Second), "s"); !bound || got != rt(2, 0) {
		t.Fatalf("Query = %v, %v; want the newer binding 2/0", got, bound)
	}
	if n := tb.EndedBindings(); n != 0 {
		t.Fatalf("EndedBindings = %d, want 0", n)
	}
	var nilLease *Lease
	nilLease.EndOnRelease() // an unpinned request's lease: no-op
}
