package affinity

import (
	"fmt"
	"time"
)

// BindingEvent is one replicated binding: the payload Dynamo's replica sync
// publishes on topic dynamo.session-affinity.v1 ({model_name, routing_group,
// session_id, worker_id, dp_rank, sequence, writer_id}) without model_name and
// routing_group, which the replica-sync adapter adds from the table's
// partition (and routes on when receiving). DPRank is nil for a worker-only
// binding, as on the wire.
type BindingEvent struct {
	SessionID string
	WorkerID  uint64
	DPRank    *uint32
	Sequence  uint64
	WriterID  uint64
}

func newBindingEvent(sessionID string, target Target, v Version) BindingEvent {
	ev := BindingEvent{SessionID: sessionID, WorkerID: target.WorkerID, Sequence: v.Sequence, WriterID: v.WriterID}
	if target.HasDPRank {
		r := target.DPRank
		ev.DPRank = &r
	}
	return ev
}

// Target is the bound target the event carries.
func (ev BindingEvent) Target() Target {
	if ev.DPRank == nil {
		return WorkerTarget(ev.WorkerID)
	}
	return Target{WorkerID: ev.WorkerID, DPRank: *ev.DPRank, HasDPRank: true}
}

// Version is the event's (sequence, writer_id).
func (ev BindingEvent) Version() Version {
	return Version{Sequence: ev.Sequence, WriterID: ev.WriterID}
}

// Events drains the replication outbox: every binding committed, refreshed
// (lease release) or rebound since the last call, oldest first. The outbox is
// filled only when Config.WriterID is non-zero and holds at most OutboxLimit
// events; later ones are dropped and counted (replica sync is best effort: it
// has no acknowledgement, replay or resynchronization).
func (t *Table) Events() []BindingEvent {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := t.outbox
	t.outbox = nil
	return out
}

// DroppedEvents counts bindings not queued because the outbox was full.
func (t *Table) DroppedEvents() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.dropped
}

// ApplyOutcome says what ApplyRemote did with a peer's binding.
type ApplyOutcome uint8

// Apply outcomes (affinity.rs ReplicaApplyOutcome plus the applier's
// dispositions in its replica module).
const (
	Inserted ApplyOutcome = iota
	Refreshed
	ReplacedExpired
	ReplacedNewer
	IgnoredInitializing
	IgnoredConflict
	IgnoredOwnWriter
	RejectedUnknownWorker
	RejectedSessionID
	RejectedCapacity
)

var applyOutcomeNames = [...]string{
	Inserted:              "inserted",
	Refreshed:             "refreshed",
	ReplacedExpired:       "replaced_expired",
	ReplacedNewer:         "replaced_newer",
	IgnoredInitializing:   "ignored_initializing",
	IgnoredConflict:       "ignored_conflict",
	IgnoredOwnWriter:      "ignored_own_writer",
	RejectedUnknownWorker: "rejected_unknown_worker",
	RejectedSessionID:     "rejected_session_id",
	RejectedCapacity:      "rejected_capacity",
}

func (o ApplyOutcome) String() string {
	if int(o) < len(applyOutcomeNames) {
		return applyOutcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// Applied reports whether the binding changed the table.
func (o ApplyOutcome) Applied() bool { return o <= ReplacedNewer }

// ApplyRemote applies a binding a peer published, by the receiver rules of
// Dynamo's affinity.rs. The caller has already routed it to this partition's
// table (an unknown partition or a partition without a table drops it before
// here).
//
//   - Our own writer id: ignored.
//   - Otherwise the sequence is observed first, so this replica's next
//     versions outrank it even when the event is then dropped (replica
//     module test "an unapplied event still advances the replica clock").
//   - A target schedulable rejects (worker not in this partition's catalog,
//     or rank outside its DP range): dropped; replica traffic never pins to
//     a worker this replica cannot reach.
//   - Vacant: inserted bound with no leases, idle deadline now + TTL, if the
//     table has room. Initializing: ignored (the local initializer decides).
//     Expired: replaced. Same target with a newer-or-equal version: version
//     and deadline refreshed. Different target with a strictly newer version:
//     replaced (leases kept). Anything else: ignored.
//
// Applying never publishes. A nil schedulable accepts every target.
func (t *Table) ApplyRemote(now time.Time, ev BindingEvent, schedulable func(Target) bool) ApplyOutcome {
	t.mu.Lock()
	defer t.mu.Unlock()
	if ev.WriterID == t.writerID {
		return IgnoredOwnWriter
	}
	t.observe(ev.Sequence)
	target, v := ev.Target(), ev.Version()
	if schedulable != nil && !schedulable(target) {
		return RejectedUnknownWorker
	}
	if len(ev.SessionID) > t.maxIDBytes {
		return RejectedSessionID
	}
	e, ok := t.entries[ev.SessionID]
	switch {
	case !ok:
		if len(t.entries) >= t.maxEntries {
			return RejectedCapacity
		}
		t.entries[ev.SessionID] = t.remoteEntry(now, target, v)
		return Inserted
	case e.state == initializing:
		return IgnoredInitializing
	case idle(e, now):
		t.entries[ev.SessionID] = t.remoteEntry(now, target, v)
		return ReplacedExpired
	case e.target == target && !v.Less(e.version):
		e.version = v
		e.deadline = now.Add(t.ttl)
		return Refreshed
	case e.version.Less(v):
		e.target = target
		e.version = v
		e.deadline = now.Add(t.ttl)
		return ReplacedNewer
	}
	return IgnoredConflict
}

func (t *Table) remoteEntry(now time.Time, target Target, v Version) *entry {
	e := &entry{state: bound, revision: t.nextRevision, target: target, version: v, deadline: now.Add(t.ttl)}
	t.nextRevision++
	return e
}
