package selection

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kvselect/kvselect/selection/affinity"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/loads"
	"github.com/kvselect/kvselect/selection/partition"
	"github.com/kvselect/kvselect/selection/randsrc"
	"github.com/kvselect/kvselect/selection/readiness"
	"github.com/kvselect/kvselect/selection/reservation"
)

// This file holds the service's side of the replica planes (the "Peer Planes"
// of Dynamo's standalone selection service docs; Dynamo's
// lib/kv-router/src/services/common/replica_sync.rs), the Replica that
// Service.Replica returns: what a replica publishes (booking transitions and
// session bindings, handed to a ReplicaObserver), how it applies what its
// peers published (ApplyRemoteBooking, ApplyRemoteBinding), and startup index
// recovery (Restore, SetIndexRecovery, which readiness waits for). The
// transport — ZMQ sockets, the wire envelope, peer membership — lives in
// replicas/mesh; fetching a peer's /dump in replicas/recovery. The service
// itself does no I/O.

// BookingEventKind names a replicated booking transition: the variants of
// Dynamo's ActiveSequenceEventData. Output-block growth has no kind: output
// blocks stay local to the replica that streams them, one of the consistency
// invariants of Dynamo's standalone selection service.
type BookingEventKind uint8

// Booking transitions.
const (
	BookingAdded            BookingEventKind = iota + 1 // AddRequest: every booking
	BookingPrefillCompleted                             // MarkPrefillCompleted
	BookingFreed                                        // Free: DELETE /reservations, never expiry
)

var bookingKindNames = [...]string{BookingAdded: "add_request", BookingPrefillCompleted: "mark_prefill_completed", BookingFreed: "free"}

func (k BookingEventKind) String() string {
	if int(k) < len(bookingKindNames) && bookingKindNames[k] != "" {
		return bookingKindNames[k]
	}
	return fmt.Sprintf("booking_event(%d)", uint8(k))
}

// BookingEvent is one booking transition scoped to its partition: the content of
// the dynamo.slot-tracker.v1 envelope without the wire encoding.
type BookingEvent struct {
	Kind      BookingEventKind
	Partition index.Partition
	// BlockSize is the publisher's partition block size; a receiver whose
	// partition has another block size drops the event.
	BlockSize uint32
	RequestID string
	Worker    index.WorkerKey
	// Origin is the publishing replica's id (router_id); a replica ignores its
	// own events.
	Origin   uint64
	LoraName string // "" = none

	// The rest describes BookingAdded only.

	// TrackingHashes are the booking's tracking hashes (token_sequence): opaque
	// to the receiver, which de-duplicates active blocks by them. Replicas do not
	// negotiate the tracking algorithm; operators configure them alike, as they
	// must register the same catalog on every replica.
	TrackingHashes       []uint64
	TrackPrefill         bool
	ExpectedOutputTokens *uint32
	// PrefillTokens is the booking's initial effective prefill
	// (prefill_load_hint.initial_effective_prefill_tokens). Nil counts none.
	PrefillTokens *uint64
}

// SessionBinding is one replicated session binding (the
// dynamo.session-affinity.v1 topic): the affinity table's event and the
// partition it belongs to.
type SessionBinding struct {
	Partition index.Partition
	affinity.BindingEvent
}

// ReplicaObserver receives what this replica publishes to its peers: every
// booking admission, prefill completion and free, after the service applied it,
// and the session bindings its affinity tables committed, refreshed or rebound.
// The service calls it on the request path (and from Maintain), so an
// implementation must not block and must not call back into the service; the
// replica-sync adapter queues and drops when full (replica sync is best effort).
type ReplicaObserver interface {
	BookingChanged(ev BookingEvent)
	SessionBound(b SessionBinding)
}

// Replica is the service's side of the replica planes (Service.Replica):
// what the replica-sync adapter (replicas/mesh) applies from its peers and
// connects to hear this replica's changes, and what startup recovery
// (replicas/recovery) restores. It implements mesh.Replica and
// recovery.Target, and is handed what it reads and writes: the partitions,
// the reservation table, the index partitions, the readiness gate, the
// random source (for the replica id) and the clock.
type Replica struct {
	parts   *partition.Set
	resv    *reservation.Table
	indexes *index.Partitions
	gate    *readiness.Gate
	rnd     *randsrc.Source
	clock   func() time.Time

	observer atomic.Pointer[observerBox]
}

type observerBox struct{ o ReplicaObserver }

// Replica returns the service's replica side.
func (s *Service) Replica() *Replica { return &s.repl }

// ObserveReplicas connects the replica-sync adapter; nil disconnects it. Events
// before the call are not replayed.
func (r *Replica) ObserveReplicas(o ReplicaObserver) {
	if o == nil {
		r.observer.Store(nil)
		return
	}
	r.observer.Store(&observerBox{o})
}

func (r *Replica) replicaObserver() ReplicaObserver {
	if b := r.observer.Load(); b != nil {
		return b.o
	}
	return nil
}

// ReplicaID is this process's non-zero replica identity: the router_id of the
// booking events and the writer_id of the session bindings it publishes.
func (r *Replica) ReplicaID() uint64 { return r.rnd.ReplicaID() }

// added publishes a booking the service just installed.
func (r *Replica) added(p *partition.Partition, b *loads.Booking, lora string) {
	if o := r.replicaObserver(); o != nil {
		ev := BookingEvent{Kind: BookingAdded, Partition: p.Key(), BlockSize: p.BlockSize(), RequestID: b.RequestID,
			Worker: b.Worker, Origin: r.rnd.ReplicaID(), LoraName: lora, TrackingHashes: b.TrackingHashes,
			TrackPrefill: b.TrackPrefill, ExpectedOutputTokens: b.ExpectedOutputTokens}
		if b.TrackPrefill {
			n := uint64(b.PrefillTokens)
			ev.PrefillTokens = &n
		}
		o.BookingChanged(ev)
	}
	// Admission may have committed a session binding.
	r.flushBindings(p)
}

// changed publishes a prefill completion or a free of a live booking.
func (r *Replica) changed(kind BookingEventKind, p *partition.Partition, id string, w index.WorkerKey) {
	if o := r.replicaObserver(); o != nil {
		o.BookingChanged(BookingEvent{Kind: kind, Partition: p.Key(), BlockSize: p.BlockSize(), RequestID: id, Worker: w, Origin: r.rnd.ReplicaID()})
	}
	if kind == BookingFreed {
		r.flushBindings(p) // the free released a session lease
	}
}

// flushBindings hands the partition's queued binding events to the observer.
// The table's outbox is drained even without an observer, so it never fills
// with events nobody will send.
func (r *Replica) flushBindings(p *partition.Partition) {
	if p.Affinity() == nil {
		return
	}
	evs := p.Affinity().Events()
	if len(evs) == 0 {
		return
	}
	o := r.replicaObserver()
	if o == nil {
		return
	}
	for _, ev := range evs {
		o.SessionBound(SessionBinding{Partition: p.Key(), BindingEvent: ev})
	}
}

// RemoteOutcome says what the service did with a peer's event. Everything but
// RemoteApplied is a drop; the adapter counts them. Replica traffic never
// creates anything: events naming a worker, model, routing group, rank or
// block size this replica does not have are dropped, as Dynamo drops them.
type RemoteOutcome uint8

// Remote event outcomes.
const (
	RemoteApplied           RemoteOutcome = iota
	RemoteOwn                             // our own event echoed back (router_id / writer_id)
	RemoteUnknownPartition                // no such (model, routing group) here
	RemoteBlockSizeMismatch               // the partition has another block size
	RemoteUnknownWorker                   // worker not schedulable in the partition
	RemoteUnknownRank                     // worker known, DP rank outside its range
	RemoteDuplicate                       // AddRequest for an id booked or being booked here
	RemoteUnknownRequest                  // prefill-complete or free of an id not booked in the partition here
	RemoteInvalid                         // content the service cannot book (empty id, absurd prefill, unknown kind)
	RemoteAffinityDisabled                // binding for a partition without session affinity
	RemoteIgnored                         // binding the table's version rules did not take
)

var remoteOutcomeNames = [...]string{
	RemoteApplied:           "applied",
	RemoteOwn:               "own",
	RemoteUnknownPartition:  "unknown_partition",
	RemoteBlockSizeMismatch: "block_size_mismatch",
	RemoteUnknownWorker:     "unknown_worker",
	RemoteUnknownRank:       "unknown_rank",
	RemoteDuplicate:         "duplicate",
	RemoteUnknownRequest:    "unknown_request",
	RemoteInvalid:           "invalid",
	RemoteAffinityDisabled:  "affinity_disabled",
	RemoteIgnored:           "ignored",
}

// RemoteOutcomes lists every outcome, for counters.
var RemoteOutcomes = []RemoteOutcome{RemoteApplied, RemoteOwn, RemoteUnknownPartition, RemoteBlockSizeMismatch,
	RemoteUnknownWorker, RemoteUnknownRank, RemoteDuplicate, RemoteUnknownRequest, RemoteInvalid,
	RemoteAffinityDisabled, RemoteIgnored}

func (o RemoteOutcome) String() string {
	if int(o) < len(remoteOutcomeNames) {
		return remoteOutcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// ApplyRemoteBooking applies a peer's booking transition to the partition's
// load tracker and reservation index, never publishing anything back.
//
// A mirrored booking is an ordinary reservation row: it counts in /loads and in
// selection, a local booking of the same id conflicts (409) until it is freed,
// and lifecycle calls on its id work here and are published like local ones,
// as in Dynamo. It expires like a local booking — Maintain reclaims it after
// DYN_ROUTER_ACTIVE_REQUEST_EXPIRY_SECS — so a peer that dies without freeing
// leaves no load behind for longer than that (Dynamo's expiry task covers
// replicated sequences the same way).
func (r *Replica) ApplyRemoteBooking(ev BookingEvent) RemoteOutcome {
	if ev.Origin == r.rnd.ReplicaID() {
		return RemoteOwn
	}
	p := r.parts.Get(ev.Partition)
	if p == nil {
		return RemoteUnknownPartition
	}
	if ev.BlockSize != p.BlockSize() {
		return RemoteBlockSizeMismatch
	}
	if ev.RequestID == "" {
		return RemoteInvalid
	}
	if rec, ok := p.Workers().ByID[ev.Worker.WorkerID]; !ok {
		return RemoteUnknownWorker
	} else if !rec.HasRank(ev.Worker.DPRank) {
		return RemoteUnknownRank
	}
	switch ev.Kind {
	case BookingAdded:
		return r.applyRemoteAdd(p, &ev)
	case BookingPrefillCompleted, BookingFreed:
		return r.applyRemoteLifecycle(p, &ev)
	}
	return RemoteInvalid
}

func (r *Replica) applyRemoteAdd(p *partition.Partition, ev *BookingEvent) RemoteOutcome {
	prefill := 0
	if ev.TrackPrefill && ev.PrefillTokens != nil {
		if *ev.PrefillTokens > maxISLTokens {
			return RemoteInvalid
		}
		prefill = int(*ev.PrefillTokens)
	}
	if r.resv.Claim(ev.RequestID) != nil {
		return RemoteDuplicate
	}
	// ISL only drives RecordOutputTokens, which never runs for a mirror (output
	// blocks stay local to the replica that streams them); the envelope does not
	// carry it.
	b := loads.Booking{RequestID: ev.RequestID, Worker: ev.Worker, TrackingHashes: ev.TrackingHashes,
		PrefillTokens: prefill, TrackPrefill: ev.TrackPrefill, ExpectedOutputTokens: ev.ExpectedOutputTokens}
	if err := p.Book(r.clock, b); err != nil {
		r.resv.Unclaim(ev.RequestID)
		switch KindOf(err) {
		case KindNotFound:
			return RemoteUnknownRank // the rank left between the check and the booking
		case KindConflict:
			return RemoteDuplicate
		}
		return RemoteInvalid
	}
	r.resv.Install(ev.RequestID, &reservation.Row{Part: p, Worker: ev.Worker})
	return RemoteApplied
}

func (r *Replica) applyRemoteLifecycle(p *partition.Partition, ev *BookingEvent) RemoteOutcome {
	row, err := r.resv.Booked(ev.RequestID)
	// Reservation ids are process-global and single-booking, so the id and
	// partition find the booking even when the event names another rank: the
	// origin may have moved the booking to the rank that actually served it
	// (rebook), which is not replicated.
	if err != nil || row.Part != p {
		return RemoteUnknownRequest
	}
	now := r.clock()
	if ev.Kind == BookingPrefillCompleted {
		if p.Loads().PrefillComplete(ev.RequestID) != nil {
			r.resv.Release(ev.RequestID, now)
			return RemoteUnknownRequest
		}
		p.Wake()
		return RemoteApplied
	}
	ferr := p.Loads().Free(ev.RequestID)
	r.resv.Release(ev.RequestID, now)
	p.Wake()
	// A local booking freed by a peer releases its session lease here; the
	// refreshed binding is ours to publish.
	r.flushBindings(p)
	if ferr != nil {
		return RemoteUnknownRequest
	}
	return RemoteApplied
}

// ApplyRemoteBinding applies a peer's session binding by the table's receiver
// rules (Dynamo's lib/kv-router/src/services/selection/affinity.rs): ignore
// our own writer id, drop targets not schedulable here, then version-ordered
// insert / refresh / replace. The second result is the table's own verdict
// when the binding reached a table.
func (r *Replica) ApplyRemoteBinding(b SessionBinding) (RemoteOutcome, affinity.ApplyOutcome) {
	if b.WriterID == r.rnd.ReplicaID() {
		return RemoteOwn, affinity.IgnoredOwnWriter
	}
	p := r.parts.Get(b.Partition)
	if p == nil {
		return RemoteUnknownPartition, 0
	}
	if p.Affinity() == nil {
		return RemoteAffinityDisabled, 0
	}
	ws := p.Workers()
	out := p.Affinity().ApplyRemote(r.clock(), b.BindingEvent, ws.Schedulable)
	switch {
	case out.Applied():
		return RemoteApplied, out
	case out == affinity.IgnoredOwnWriter:
		return RemoteOwn, out
	case out == affinity.RejectedUnknownWorker:
		return RemoteUnknownWorker, out
	}
	return RemoteIgnored, out
}

// Restore replays a peer's dump into the local indexes (startup recovery).
func (r *Replica) Restore(d index.Dump) []index.RestoreResult {
	return r.indexes.Restore(r.clock(), d)
}

// SetIndexRecovery records the startup recovery state; readiness waits while it
// is RecoveryPending.
func (r *Replica) SetIndexRecovery(state IndexRecovery) { r.gate.SetRecovery(state) }
