package affinity

import (
	"fmt"
	"math"
	"sync"
	"time"
)

type entryState uint8

const (
	initializing entryState = iota
	bound
)

// entry is one session's row: Initializing while its first request selects a
// worker, then Bound (the two entry states of Dynamo's affinity table).
type entry struct {
	state entryState
	// revision identifies one initialization and the binding it produced; a
	// hold or lease from an older revision never touches a newer binding.
	revision uint64
	// wait is closed when an initialization resolves (commit, join or
	// abort), waking requests that found the session initializing.
	wait chan struct{}

	target   Target
	version  Version
	leases   int
	deadline time.Time // idle deadline; meaningful only with zero leases
}

// Table is one partition's session-affinity table. It is safe for concurrent
// use. Callbacks it takes (schedulable) run under its lock and must not call
// back into the table.
type Table struct {
	ttl        time.Duration
	maxEntries int
	maxIDBytes int
	mode       Mode
	writerID   uint64

	mu           sync.Mutex
	entries      map[string]*entry
	nextRevision uint64
	nextSequence uint64
	outbox       []BindingEvent
	dropped      uint64
	fallbacks    uint64
	ended        uint64
}

// NewTable validates cfg and returns an empty table. Version sequences start
// at now's Unix nanoseconds, as Dynamo seeds them from the wall clock at table
// creation, so a restarted replica's bindings outrank its old ones.
func NewTable(cfg Config, now time.Time) (*Table, error) {
	if cfg.TTL < MinTTL || cfg.TTL > MaxTTL {
		return nil, ErrInvalidTTL
	}
	switch {
	case cfg.MaxEntries < 0:
		return nil, fmt.Errorf("max entries %d is negative: %w", cfg.MaxEntries, ErrInvalidConfig)
	case cfg.MaxSessionIDBytes < 0:
		return nil, fmt.Errorf("max session id bytes %d is negative: %w", cfg.MaxSessionIDBytes, ErrInvalidConfig)
	case cfg.Mode != Hard && cfg.Mode != Soft:
		return nil, fmt.Errorf("unknown mode %v: %w", cfg.Mode, ErrInvalidConfig)
	}
	if cfg.MaxEntries == 0 {
		cfg.MaxEntries = DefaultMaxEntries
	}
	if cfg.MaxSessionIDBytes == 0 {
		cfg.MaxSessionIDBytes = DefaultMaxSessionIDBytes
	}
	return &Table{
		ttl:          cfg.TTL,
		maxEntries:   cfg.MaxEntries,
		maxIDBytes:   cfg.MaxSessionIDBytes,
		mode:         cfg.Mode,
		writerID:     cfg.WriterID,
		entries:      make(map[string]*entry),
		nextRevision: 1,
		nextSequence: uint64(max(now.UnixNano(), 0)),
	}, nil
}

// Mode is the table's mode.
func (t *Table) Mode() Mode { return t.mode }

// TTL is the idle TTL. The host's reaper runs Reap every min(TTL, 30 s).
func (t *Table) TTL() time.Duration { return t.ttl }

func (t *Table) checkID(sessionID string) error {
	if len(sessionID) > t.maxIDBytes {
		return &SessionIDTooLongError{Limit: t.maxIDBytes}
	}
	return nil
}

// idle reports whether a bound entry has expired: no leases and its deadline
// reached (affinity.rs treats deadline <= now as expired).
func idle(e *entry, now time.Time) bool {
	return e.state == bound && e.leases == 0 && !e.deadline.After(now)
}

func (t *Table) newInit() *entry {
	e := &entry{state: initializing, revision: t.nextRevision, wait: make(chan struct{})}
	t.nextRevision++
	return e
}

func (t *Table) nextVersion() Version {
	v := Version{Sequence: t.nextSequence, WriterID: t.writerID}
	t.nextSequence++
	return v
}

// observe keeps local versions ahead of every sequence seen from a peer
// (affinity.rs observe_replica_sequence).
func (t *Table) observe(seq uint64) {
	if seq == math.MaxUint64 {
		t.nextSequence = seq
	} else if seq+1 > t.nextSequence {
		t.nextSequence = seq + 1
	}
}

func (t *Table) publish(sessionID string, target Target, v Version) {
	if t.writerID == 0 {
		return
	}
	if len(t.outbox) >= OutboxLimit {
		t.dropped++
		return
	}
	t.outbox = append(t.outbox, newBindingEvent(sessionID, target, v))
}

// resolve turns an initializing entry into a binding and wakes its waiters.
func (t *Table) resolve(l *Lease, sessionID string, e *entry, now time.Time, target Target, leases int) *Lease {
	e.state = bound
	e.target = target
	e.version = t.nextVersion()
	e.leases = leases
	e.deadline = now.Add(t.ttl)
	close(e.wait)
	e.wait = nil
	t.publish(sessionID, target, e.version)
	*l = Lease{t: t, sessionID: sessionID, revision: e.revision, version: e.version, active: true}
	return l
}

// Query is the read-only lookup a query-only POST /select uses: the live
// binding, if any. It never creates or refreshes a binding and takes no lease;
// an initializing session reads as unbound.
func (t *Table) Query(now time.Time, sessionID string) (Target, bool, error) {
	if err := t.checkID(sessionID); err != nil {
		return Target{}, false, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.entries[sessionID]
	if !ok || e.state != bound || idle(e, now) {
		return Target{}, false, nil
	}
	return e.target, true, nil
}

// Acquire holds sessionID for a request about to select and book: a
// select_and_reserve, or the cached replay of POST /reservations.
//
// It returns exactly one of a hold or a wait channel, or an error (only
// *SessionIDTooLongError). The wait channel means another request is
// initializing the session: the caller waits for it to close (or for its own
// context) and calls Acquire again. The hold is one of:
//   - HoldBound: a live binding, now with one more lease; steer selection to
//     Hold.Target().
//   - HoldInitialize: a new or idle-expired session; select freely, and Commit
//     binds the worker the booking landed on.
//   - HoldUnpinned: the table is full; route without affinity. As in Dynamo,
//     a full table is not an error.
//
// A binding whose target schedulable rejects is dropped and the session
// re-initialized, so a departed worker or a removed DP rank never pins a
// request (resolver.rs resolve; the service's predicate checks the worker is
// schedulable in the partition and, for a ranked target, that the rank is in
// its current DP range — a DP shrink thus rebinds only sessions on removed
// ranks). A nil schedulable accepts every target.
func (t *Table) Acquire(now time.Time, sessionID string, schedulable func(Target) bool) (*Hold, <-chan struct{}, error) {
	if err := t.checkID(sessionID); err != nil {
		return nil, nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for {
		e, ok := t.entries[sessionID]
		switch {
		case !ok:
			if len(t.entries) >= t.maxEntries {
				t.fallbacks++
				return &Hold{t: t, kind: HoldUnpinned, sessionID: sessionID}, nil, nil
			}
			e = t.newInit()
			t.entries[sessionID] = e
			return &Hold{t: t, kind: HoldInitialize, sessionID: sessionID, revision: e.revision}, nil, nil
		case e.state == initializing:
			return nil, e.wait, nil
		case idle(e, now):
			e = t.newInit()
			t.entries[sessionID] = e
			return &Hold{t: t, kind: HoldInitialize, sessionID: sessionID, revision: e.revision}, nil, nil
		case schedulable != nil && !schedulable(e.target):
			// Invalidate and start over; the next pass initializes. Other
			// requests' leases on the dropped revision release as no-ops.
			delete(t.entries, sessionID)
		default:
			e.leases++
			return &Hold{t: t, kind: HoldBound, sessionID: sessionID, revision: e.revision, target: e.target, version: e.version}, nil, nil
		}
	}
}

// HoldKind says what Acquire found.
type HoldKind uint8

// Hold kinds.
const (
	HoldUnpinned HoldKind = iota
	HoldInitialize
	HoldBound
)

func (k HoldKind) String() string {
	switch k {
	case HoldUnpinned:
		return "unpinned"
	case HoldInitialize:
		return "initialize"
	case HoldBound:
		return "bound"
	}
	return fmt.Sprintf("hold(%d)", uint8(k))
}

// Hold is one request's claim on a session between Acquire and Commit. A
// bound hold already counts as a lease; an initializing hold keeps concurrent
// requests for the session waiting. Exactly one of Commit or Abort takes
// effect; calling Abort after Commit is a no-op, so `defer hold.Abort(...)`
// is safe.
type Hold struct {
	t         *Table
	kind      HoldKind
	sessionID string
	revision  uint64
	target    Target  // HoldBound
	version   Version // HoldBound: the version its lease was taken at
	done      bool    // guarded by t.mu
	// lease is the Lease Commit returns, allocated with the hold so a
	// booking costs one allocation for both.
	lease Lease
}

// Kind says whether the session is bound, initializing or unpinned.
func (h *Hold) Kind() HoldKind { return h.kind }

// SessionID is the held session.
func (h *Hold) SessionID() string { return h.sessionID }

// Target is the bound target to steer selection to (it becomes the request's
// affinity target); ok is false unless the hold is HoldBound.
func (h *Hold) Target() (target Target, ok bool) { return h.target, h.kind == HoldBound }

// Commit binds the session after the booking landed on dispatched and
// returns the lease the reservation owns. The caller commits after booking and
// before installing the reservation, and frees the booking (400) on a
// Hard-mode conflict. The hold is used up whatever the outcome.
//
//   - Unpinned: (nil, nil); the request runs without a lease.
//   - Initialize: binds dispatched with one lease. If a failover already
//     joined this initialization (see below), the joined binding stands:
//     Hard mode requires dispatched to match it, Soft mode rebinds it.
//   - Bound, Soft mode: the binding follows the dispatch (a worker-only
//     binding stays worker-only).
//   - Bound, Hard mode: dispatched must be the bound worker (and rank, when
//     the binding has one); otherwise the binding is dropped and a
//     *ConflictError returned, for the caller to free the booking and answer
//     400. Except when schedulable now rejects the bound target: the worker
//     departed after Acquire, which is not the client's fault, so the session
//     fails over to dispatched instead — a fresh binding, or joining another
//     request's initialization by binding it to dispatched at once
//     (resolver.rs commit; core tests failover_commit_behind_an_initializing_
//     hold_keeps_a_lease and session_dp_rank_shrink_rebinds_only_removed_
//     targets). A lease may then be nil if the table filled meanwhile.
func (h *Hold) Commit(now time.Time, dispatched Target, schedulable func(Target) bool) (*Lease, error) {
	t := h.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if h.done {
		return nil, ErrHoldDone
	}
	h.done = true
	switch h.kind {
	case HoldInitialize:
		return t.commitInit(now, h, dispatched)
	case HoldBound:
		l := &h.lease
		*l = Lease{t: t, sessionID: h.sessionID, revision: h.revision, version: h.version, active: true}
		lease, err := t.commitBound(now, l, h.target, dispatched)
		if err == nil || schedulable == nil || schedulable(h.target) {
			return lease, err
		}
		return t.failover(now, l, h.sessionID, dispatched)
	}
	return nil, nil
}

func (t *Table) commitInit(now time.Time, h *Hold, dispatched Target) (*Lease, error) {
	e, ok := t.entries[h.sessionID]
	switch {
	case !ok:
		return nil, ErrInitializationCancelled
	case e.revision != h.revision:
		return nil, ErrInitializationChanged
	case e.state == initializing:
		return t.resolve(&h.lease, h.sessionID, e, now, dispatched, 1), nil
	}
	// A failover booking joined this initialization and bound it; the use it
	// reserved for us becomes this request's lease (affinity.rs
	// AffinityInitialization::commit).
	if t.mode == Hard {
		if err := checkDispatch(h.sessionID, e.target, dispatched); err != nil {
			// Give the reserved use back without refreshing or dropping the
			// binding the successful booking owns.
			if e.leases > 0 {
				e.leases--
			}
			return nil, err
		}
	}
	l := &h.lease
	*l = Lease{t: t, sessionID: h.sessionID, revision: e.revision, version: e.version, active: true}
	return t.commitBound(now, l, e.target, dispatched)
}

// commitBound is the table-level commit of a bound lease (affinity.rs
// SessionAffinity::commit): publish the binding, rebind it (Soft), or drop it
// on a mismatch (Hard).
func (t *Table) commitBound(now time.Time, l *Lease, boundTo, dispatched Target) (*Lease, error) {
	if t.mode == Soft {
		rebound := reboundTarget(boundTo, dispatched)
		if rebound == boundTo {
			t.publish(l.sessionID, boundTo, l.version)
		} else if t.rebind(l, boundTo, rebound) {
			t.publish(l.sessionID, rebound, l.version)
		}
		return l, nil
	}
	if err := checkDispatch(l.sessionID, boundTo, dispatched); err != nil {
		t.invalidate(now, l)
		return nil, err
	}
	t.publish(l.sessionID, boundTo, l.version)
	return l, nil
}

// failover re-binds a session whose bound worker departed between Acquire and
// Commit to the worker the booking actually landed on.
// l is the (spent) lease of the failed commit, reused for the new one.
func (t *Table) failover(now time.Time, l *Lease, sessionID string, dispatched Target) (*Lease, error) {
	e, ok := t.entries[sessionID]
	switch {
	case !ok:
		if len(t.entries) >= t.maxEntries {
			t.fallbacks++
			return nil, nil
		}
		e = t.newInit()
		t.entries[sessionID] = e
		return t.resolve(l, sessionID, e, now, dispatched, 1), nil
	case idle(e, now):
		e = t.newInit()
		t.entries[sessionID] = e
		return t.resolve(l, sessionID, e, now, dispatched, 1), nil
	case e.state == initializing:
		// Join rather than wait: this booking succeeded, so it binds now and
		// holds two uses, its own and one reserved for the initializer until
		// that commits or aborts (affinity.rs join_initializing).
		return t.resolve(l, sessionID, e, now, dispatched, 2), nil
	}
	// A competing failover already bound a live replacement.
	e.leases++
	*l = Lease{t: t, sessionID: sessionID, revision: e.revision, version: e.version, active: true}
	if t.mode == Hard {
		if err := checkDispatch(sessionID, e.target, dispatched); err != nil {
			// Reject the mismatch without erasing the replacement; the lease
			// just taken is released like any dropped hold.
			t.release(now, l)
			return nil, err
		}
	}
	return t.commitBound(now, l, e.target, dispatched)
}

// Abort gives the hold up because the request will not be booked (selection
// or booking failed, client went away). An initialization is cancelled and
// its waiters woken; a bound hold releases its lease, which counts as a use
// of the binding (its idle TTL restarts). No-op after Commit or Abort.
func (h *Hold) Abort(now time.Time) {
	t := h.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if h.done {
		return
	}
	h.done = true
	switch h.kind {
	case HoldBound:
		t.release(now, &Lease{t: t, sessionID: h.sessionID, revision: h.revision, version: h.version, active: true})
	case HoldInitialize:
		e, ok := t.entries[h.sessionID]
		if !ok || e.revision != h.revision {
			return
		}
		if e.state == initializing {
			delete(t.entries, h.sessionID)
			close(e.wait)
			e.wait = nil
		} else if e.leases > 0 {
			// A joiner reserved this use; cancelling never invalidates its
			// binding or refreshes it.
			e.leases--
		}
	}
}

// AbortFiltered gives the hold up because the selection policy filtered out
// every candidate. In Hard mode that includes the bound worker selection was
// limited to, so the binding is dropped and the session re-binds instead of
// failing on every retry; otherwise it is Abort (resolver.rs
// release_filtered).
func (h *Hold) AbortFiltered(now time.Time) {
	t := h.t
	if t.mode != Hard || h.kind != HoldBound {
		h.Abort(now)
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if h.done {
		return
	}
	h.done = true
	t.invalidate(now, &Lease{t: t, sessionID: h.sessionID, revision: h.revision, version: h.version, active: true})
}

// Lease is one live use of a binding, owned by the reservation that booked
// it; freeing (DELETE /reservations/{id}) or expiring the reservation
// releases it. A nil *Lease (unpinned request) is valid and releases as a
// no-op.
type Lease struct {
	t         *Table
	sessionID string
	revision  uint64
	version   Version
	active    bool // guarded by t.mu
	// final: the session's last request; releasing this use ends the
	// binding instead of refreshing it (EndOnRelease). Guarded by t.mu.
	final bool
}

// EndOnRelease marks the lease as the use of the session's last request
// (Dynamo's session_final): when it is released — the request's booking
// freed or expired — the binding it was taken on is dropped, whatever other
// leases it has, so the session's next request selects afresh. Until then
// the binding routes as before, the final request included. A nil or
// released lease is left alone.
func (l *Lease) EndOnRelease() {
	if l == nil {
		return
	}
	l.t.mu.Lock()
	defer l.t.mu.Unlock()
	if l.active {
		l.final = true
	}
}

// SessionID is the leased session ("" for a nil lease).
func (l *Lease) SessionID() string {
	if l == nil {
		return ""
	}
	return l.sessionID
}

// Release ends this use. If the binding is still the version this lease was
// taken at (not rebound since), its idle deadline restarts at now + TTL, so
// the TTL counts from the last release, and the binding is re-published.
// Idempotent.
func (l *Lease) Release(now time.Time) {
	if l == nil {
		return
	}
	l.t.mu.Lock()
	defer l.t.mu.Unlock()
	l.t.release(now, l)
}

func (t *Table) release(now time.Time, l *Lease) {
	if !l.active {
		return
	}
	l.active = false
	e, ok := t.entries[l.sessionID]
	if !ok || e.state != bound || e.revision != l.revision || e.leases == 0 {
		return
	}
	if l.final {
		// The other leases of this revision then release as no-ops. Not
		// published: the replica-sync topic carries bindings only, so peers
		// keep theirs until its idle TTL runs out (docs/selection.md).
		delete(t.entries, l.sessionID)
		t.ended++
		return
	}
	e.leases--
	if e.version != l.version {
		return
	}
	e.deadline = now.Add(t.ttl)
	t.publish(l.sessionID, e.target, e.version)
}

// invalidate drops the binding l holds; a binding already replaced by a newer
// version is left alone and this use just released (affinity.rs invalidate).
func (t *Table) invalidate(now time.Time, l *Lease) {
	if !l.active {
		return
	}
	if e, ok := t.entries[l.sessionID]; ok && e.state == bound && e.revision == l.revision && e.version == l.version {
		delete(t.entries, l.sessionID)
		l.active = false
		return
	}
	t.release(now, l)
}

// rebind moves the binding from expected to target if nothing changed it
// since l was taken.
func (t *Table) rebind(l *Lease, expected, target Target) bool {
	e, ok := t.entries[l.sessionID]
	if !ok || e.state != bound || e.revision != l.revision || e.version != l.version || e.target != expected {
		return false
	}
	e.target = target
	e.version = t.nextVersion()
	l.version = e.version
	return true
}

// Reap drops bound entries with no leases past their idle deadline and
// returns how many. The host calls it every min(TTL, 30 s), the period of
// Dynamo's reaper task; expired entries are already invisible to Query and
// Acquire in between.
func (t *Table) Reap(now time.Time) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for id, e := range t.entries {
		if idle(e, now) {
			delete(t.entries, id)
			n++
		}
	}
	return n
}

// Len is the number of entries (bindings, expired ones not yet reaped, and
// initializations), the count MaxEntries caps.
func (t *Table) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.entries)
}

// LeaseCount is the number of live leases on sessionID (zero while it is
// initializing); ok is false when the table has no entry for it.
func (t *Table) LeaseCount(sessionID string) (n int, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.entries[sessionID]
	if !ok {
		return 0, false
	}
	return e.leases, true
}

// EndedBindings counts bindings dropped by the release of a final lease
// (EndOnRelease).
func (t *Table) EndedBindings() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ended
}

// FullTableFallbacks counts requests routed without affinity because the
// table was full (at Acquire, or at a failover Commit).
func (t *Table) FullTableFallbacks() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.fallbacks
}
