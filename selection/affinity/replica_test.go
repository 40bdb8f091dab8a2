package affinity

import (
	"testing"
	"time"
)

func ev(sid string, target Target, seq, writer uint64) BindingEvent {
	return newBindingEvent(sid, target, Version{Sequence: seq, WriterID: writer})
}

func TestVersionOrderIsSequenceThenWriter(t *testing.T) {
	tests := []struct {
		a, b Version
		less bool
	}{
		{Version{1, 9}, Version{2, 1}, true},
		{Version{2, 1}, Version{2, 9}, true},
		{Version{2, 9}, Version{2, 9}, false},
		{Version{3, 0}, Version{2, 9}, false},
	}
	for _, tt := range tests {
		if got := tt.a.Less(tt.b); got != tt.less {
			t.Errorf("%v.Less(%v) = %v", tt.a, tt.b, got)
		}
	}
}

// The receiver rules for replicated bindings (ApplyRemote), one row per rule.
// Each case starts from a table in which session "s" is in the given state at
// t0 (local version seq 100, writer 7), then applies one event from writer 9
// at `now`.
func TestApplyRemoteRules(t *testing.T) {
	type setup func(t *testing.T, tb *Table)
	boundAt100 := func(target Target, leased bool) setup {
		return func(t *testing.T, tb *Table) {
			tb.nextSequence = 100
			l := commit(t, acquire(t, tb, t0, "s", nil), t0, target, nil)
			if !leased {
				l.Release(t0)
			}
		}
	}
	tests := []struct {
		name    string
		setup   setup
		now     time.Time
		event   BindingEvent
		want    ApplyOutcome
		bound   Target
		isBound bool
	}{
		{name: "vacant inserts", setup: func(*testing.T, *Table) {}, now: t0, event: ev("s", rt(2, 0), 5, 9), want: Inserted, bound: rt(2, 0), isBound: true},
		{name: "initializing ignores", setup: func(t *testing.T, tb *Table) { acquire(t, tb, t0, "s", nil) }, now: t0, event: ev("s", rt(2, 0), 500, 9), want: IgnoredInitializing},
		{name: "expired replaces even an older version", setup: boundAt100(rt(1, 0), false), now: at(ttl), event: ev("s", rt(2, 0), 5, 9), want: ReplacedExpired, bound: rt(2, 0), isBound: true},
		{name: "same target equal sequence higher writer refreshes", setup: boundAt100(rt(1, 0), false), now: t0, event: ev("s", rt(1, 0), 100, 9), want: Refreshed, bound: rt(1, 0), isBound: true},
		{name: "same target older version ignored", setup: boundAt100(rt(1, 0), false), now: t0, event: ev("s", rt(1, 0), 99, 9), want: IgnoredConflict, bound: rt(1, 0), isBound: true},
		{name: "other target strictly newer replaces", setup: boundAt100(rt(1, 0), true), now: t0, event: ev("s", rt(2, 0), 101, 9), want: ReplacedNewer, bound: rt(2, 0), isBound: true},
		{name: "other target older ignored", setup: boundAt100(rt(1, 0), false), now: t0, event: ev("s", rt(2, 0), 100, 6), want: IgnoredConflict, bound: rt(1, 0), isBound: true},
		{name: "worker-only target differs from ranked", setup: boundAt100(rt(1, 0), false), now: t0, event: ev("s", WorkerTarget(1), 101, 9), want: ReplacedNewer, bound: WorkerTarget(1), isBound: true},
		{name: "own writer ignored", setup: func(*testing.T, *Table) {}, now: t0, event: ev("s", rt(2, 0), 5, 7), want: IgnoredOwnWriter},
		{name: "unknown worker dropped", setup: func(*testing.T, *Table) {}, now: t0, event: ev("s", rt(5, 0), 5, 9), want: RejectedUnknownWorker},
		{name: "rank outside the DP range dropped", setup: func(*testing.T, *Table) {}, now: t0, event: ev("s", rt(2, 4), 5, 9), want: RejectedUnknownWorker},
	}
	liveness := liveSet{1: {0, 2}, 2: {0, 2}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := newTable(t, Hard)
			tt.setup(t, tb)
			tb.Events()
			if got := tb.ApplyRemote(tt.now, tt.event, liveness.schedulable); got != tt.want {
				t.Fatalf("ApplyRemote = %v, want %v", got, tt.want)
			}
			if tt.isBound {
				assertBound(t, tb, tt.now, "s", tt.bound)
			} else if _, ok := boundTo(t, tb, tt.now, "s"); ok {
				t.Fatal("event bound the session")
			}
			if evs := tb.Events(); len(evs) != 0 {
				t.Fatalf("applying published %+v", evs)
			}
		})
	}
}

func TestAppliedBindingIdlesFromArrival(t *testing.T) {
	tb := newTable(t, Hard)
	tb.ApplyRemote(t0, ev("s", rt(1, 0), 5, 9), nil)
	assertLeases(t, tb, "s", 0)
	tb.ApplyRemote(at(5*time.Second), ev("s", rt(1, 0), 6, 9), nil) // refresh
	assertBound(t, tb, at(5*time.Second+ttl-time.Nanosecond), "s", rt(1, 0))
	assertUnbound(t, tb, at(5*time.Second+ttl), "s")
}

func TestUnappliedEventStillAdvancesReplicaClock(t *testing.T) {
	tb := newTable(t, Hard)
	far := uint64(t0.UnixNano()) + 1_000_000
	if got := tb.ApplyRemote(t0, ev("s", rt(5, 0), far, 9), live(1).schedulable); got != RejectedUnknownWorker {
		t.Fatalf("ApplyRemote = %v", got)
	}
	bind(t, tb, t0, "x", rt(1, 0))
	if evs := tb.Events(); len(evs) == 0 || evs[0].Sequence <= far {
		t.Fatalf("local version %+v does not outrank observed %d", evs, far)
	}
}

// A replicated binding steers a new session's booking, and the lease is
// released with it (core test replicated_binding_steers_a_new_session_...).
func TestReplicatedBindingSteersNewSession(t *testing.T) {
	tb := newTable(t, Hard)
	sched := live(1, 2).schedulable
	if got := tb.ApplyRemote(t0, ev("chat-b", rt(2, 0), 1, 99), sched); got != Inserted {
		t.Fatalf("ApplyRemote = %v", got)
	}
	h := acquire(t, tb, t0, "chat-b", sched)
	if target, ok := h.Target(); !ok || target != rt(2, 0) {
		t.Fatalf("steered to %v, %v", target, ok)
	}
	l := commit(t, h, t0, rt(2, 0), sched)
	assertLeases(t, tb, "chat-b", 1)
	l.Release(t0)
	assertLeases(t, tb, "chat-b", 0)
}

func TestOutboxPublishesCommitsRefreshesAndRebinds(t *testing.T) {
	tb := newTable(t, Soft)
	base := uint64(t0.UnixNano())
	h := acquire(t, tb, t0, "s", nil)
	l := commit(t, h, t0, rt(1, 0), nil) // commit: new version
	l.Release(t0)                        // release: refresh, same version
	l2 := commit(t, acquire(t, tb, t0, "s", nil), t0, rt(2, 1), nil)
	l2.Release(t0)
	got := tb.Events()
	want := []BindingEvent{
		ev("s", rt(1, 0), base, 7),
		ev("s", rt(1, 0), base, 7),
		ev("s", rt(2, 1), base+1, 7), // soft rebind
		ev("s", rt(2, 1), base+1, 7),
	}
	if len(got) != len(want) {
		t.Fatalf("events = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].SessionID != want[i].SessionID || got[i].Target() != want[i].Target() || got[i].Version() != want[i].Version() {
			t.Fatalf("event %d = %+v (%v), want %+v (%v)", i, got[i], got[i].Target(), want[i], want[i].Target())
		}
	}
	if len(tb.Events()) != 0 {
		t.Fatal("Events did not drain")
	}
}

func TestOutboxOffWithoutWriterAndBounded(t *testing.T) {
	off, err := NewTable(Config{TTL: ttl}, t0)
	if err != nil {
		t.Fatal(err)
	}
	bind(t, off, t0, "s", rt(1, 0))
	if len(off.Events()) != 0 {
		t.Fatal("replication off still queued events")
	}

	tb := newTable(t, Hard)
	bind(t, tb, t0, "s", rt(1, 0)) // 2 events
	for range OutboxLimit {
		commit(t, acquire(t, tb, t0, "s", nil), t0, rt(1, 0), nil).Release(t0) // 2 each
	}
	if n := len(tb.Events()); n != OutboxLimit || tb.DroppedEvents() != uint64(OutboxLimit+2) {
		t.Fatalf("queued %d, dropped %d", n, tb.DroppedEvents())
	}
}

// Two replicas with different writer ids converge on one binding through
// the event schema, in both directions (replica module test
// replicas_converge_through_the_shared_schema).
func TestReplicasConverge(t *testing.T) {
	frontend, err := NewTable(Config{TTL: time.Minute, WriterID: 100}, t0)
	if err != nil {
		t.Fatal(err)
	}
	service, err := NewTable(Config{TTL: time.Minute, WriterID: 200}, t0)
	if err != nil {
		t.Fatal(err)
	}
	liveness := live(1, 2)
	ship := func(from, to *Table) {
		for _, e := range from.Events() {
			to.ApplyRemote(t0, e, liveness.schedulable)
		}
	}
	commit(t, acquire(t, frontend, t0, "s", liveness.schedulable), t0, rt(1, 0), liveness.schedulable).Release(t0)
	ship(frontend, service)
	assertBound(t, service, t0, "s", rt(1, 0))

	// The service's Hard table rejects a mismatch while 1 is live, then the
	// next request rebinds to 2; the frontend follows the newer version.
	if _, err := acquire(t, service, t0, "s", liveness.schedulable).Commit(t0, rt(2, 0), liveness.schedulable); err == nil {
		t.Fatal("hard mismatch accepted")
	}
	commit(t, acquire(t, service, t0, "s", liveness.schedulable), t0, rt(2, 0), liveness.schedulable).Release(t0)
	ship(service, frontend)
	assertBound(t, frontend, t0, "s", rt(2, 0))
	ship(frontend, service) // nothing new: no echo loop
	assertBound(t, service, t0, "s", rt(2, 0))
}
