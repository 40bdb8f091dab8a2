// Package affinity holds session-affinity binding tables: a session id is
// pinned to the worker (and optionally the DP rank) that served it for as long
// as requests keep arriving within the idle TTL, which counts from the last
// release of a lease on the binding. One Table serves one partition; the same
// session id in two partitions is two independent bindings.
//
// The table is a deterministic state machine in the style of etcd's raft
// package: it reads no clock (time comes in as `now`), starts no goroutines
// and does no I/O. Where Dynamo's table (lib/kv-router/src/services/selection/
// affinity.rs) spawns a reaper task and notifies waiters through tokio, this
// one exposes Reap for the host's ticker and hands a waiter a channel to
// select on with its own context. Replicated bindings leave through an outbox
// the host drains (Events) and arrive through ApplyRemote.
//
// The managed path a booking follows (POST /select_and_reserve and the cached
// POST /reservations replay): hold the session before selecting, commit the
// dispatched worker after booking.
//
//	for {
//		hold, wait, err := table.Acquire(time.Now(), sid, schedulable)
//		if err != nil { return err }            // session id too long → 400
//		if hold != nil { break }
//		select {                                // another request is initializing
//		case <-wait:
//		case <-ctx.Done(): return ctx.Err()
//		}
//	}
//	defer hold.Abort(time.Now())                // no-op once committed
//	target, bound := hold.Target()              // steer selection when bound
//	... select and book ...
//	lease, err := hold.Commit(time.Now(), dispatched, schedulable)
//	if err != nil { free the booking; return err } // ErrSessionConflict → 400
//	... store lease with the reservation; lease.Release(time.Now()) on free ...
package affinity

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvselect/kvselect/selection/index"
)

// Limits of Dynamo's table (affinity.rs MAX_SESSION_AFFINITY_*): the TTL range
// the standalone service accepts at startup, the entry cap past which new
// sessions route unpinned, and the session id length past which a request is
// rejected.
const (
	MinTTL                   = time.Second
	MaxTTL                   = 31_536_000 * time.Second
	DefaultMaxEntries        = 65_536
	DefaultMaxSessionIDBytes = 256
	// OutboxLimit bounds the undrained replication outbox, as Dynamo's
	// replica sync bounds its session-affinity queue at 4,096 events and
	// drops on full.
	OutboxLimit = 4096
)

// Mode says how a bound session treats a dispatch that landed elsewhere.
type Mode int

const (
	// Hard (the standalone service's default): the binding is exact, and a
	// dispatch to another worker or rank is rejected with ErrSessionConflict.
	Hard Mode = iota
	// Soft: the binding follows the dispatch (for embedded hosts).
	Soft
)

func (m Mode) String() string {
	switch m {
	case Hard:
		return "hard"
	case Soft:
		return "soft"
	}
	return fmt.Sprintf("mode(%d)", int(m))
}

// Config configures one table.
type Config struct {
	// TTL is the idle lifetime of a binding with no leases, counted from the
	// last lease release. Required: 1 s to 31,536,000 s.
	TTL time.Duration
	// MaxEntries caps bindings plus initializations; zero means 65,536. A
	// full table routes new sessions unpinned, it is not an error.
	MaxEntries int
	// MaxSessionIDBytes caps the session id; zero means 256.
	MaxSessionIDBytes int
	Mode              Mode
	// WriterID is this process's replica-sync id: the random non-zero u64 each
	// process picks at startup and stamps on everything it publishes.
	// Zero means replication is off: versions carry writer 0 and nothing is
	// queued for Events.
	WriterID uint64
}

// Errors. Their texts are the ones Dynamo returns, so the REST front can send
// err.Error() as is.
var (
	// ErrInvalidTTL: Config.TTL is outside 1 s … 31,536,000 s (startup error).
	ErrInvalidTTL = errors.New("session affinity TTL must be between 1 and 31536000 seconds")
	// ErrInvalidConfig wraps the other constructor errors.
	ErrInvalidConfig = errors.New("invalid session affinity config")
	// ErrSessionIDTooLong is matched by *SessionIDTooLongError (400).
	ErrSessionIDTooLong = errors.New("session affinity ID too long")
	// ErrSessionConflict is matched by *ConflictError: a Hard binding
	// rejected a dispatch elsewhere (400, booking freed, binding dropped).
	ErrSessionConflict = errors.New("session affinity conflict")
	// ErrInitializationCancelled: Commit of an initializing hold whose entry
	// vanished (its binding was invalidated by another request meanwhile).
	ErrInitializationCancelled = errors.New("session affinity initialization was cancelled")
	// ErrInitializationChanged: Commit of an initializing hold whose entry
	// was re-initialized or replaced by another request meanwhile.
	ErrInitializationChanged = errors.New("session affinity initialization changed")
	// ErrHoldDone: Commit of a hold already committed or aborted.
	ErrHoldDone = errors.New("session affinity hold already used")
)

// SessionIDTooLongError reports a session id over MaxSessionIDBytes.
type SessionIDTooLongError struct{ Limit int }

func (e *SessionIDTooLongError) Error() string {
	return fmt.Sprintf("session affinity ID must not exceed %d bytes", e.Limit)
}

// Is makes errors.Is(err, ErrSessionIDTooLong) hold.
func (e *SessionIDTooLongError) Is(target error) bool { return target == ErrSessionIDTooLong }

// ConflictError is a Hard-mode dispatch away from a live binding. Its text is
// affinity.rs validate_dispatch_target's.
type ConflictError struct {
	SessionID  string
	Bound      Target
	Dispatched Target
}

func (e *ConflictError) Error() string {
	if e.Bound.WorkerID != e.Dispatched.WorkerID {
		return fmt.Sprintf("session %s is bound to worker %d, not %d", e.SessionID, e.Bound.WorkerID, e.Dispatched.WorkerID)
	}
	if !e.Dispatched.HasDPRank {
		return fmt.Sprintf("session %s is bound to DP rank %d, but dispatch did not select a DP rank", e.SessionID, e.Bound.DPRank)
	}
	return fmt.Sprintf("session %s is bound to DP rank %d, not %d", e.SessionID, e.Bound.DPRank, e.Dispatched.DPRank)
}

// Is makes errors.Is(err, ErrSessionConflict) hold.
func (e *ConflictError) Is(target error) bool { return target == ErrSessionConflict }

// Target is where a session is bound: a worker, and a DP rank when HasDPRank.
// A worker-only binding (a replicated one from a host that routes by worker)
// accepts any rank of its worker. Value type so targets compare with ==.
type Target struct {
	WorkerID  uint64
	DPRank    uint32
	HasDPRank bool
}

// RankTarget is the target of a booking: a worker and its DP rank.
func RankTarget(k index.WorkerKey) Target {
	return Target{WorkerID: k.WorkerID, DPRank: k.DPRank, HasDPRank: true}
}

// WorkerTarget is a worker-only target.
func WorkerTarget(workerID uint64) Target { return Target{WorkerID: workerID} }

func (t Target) String() string {
	if t.HasDPRank {
		return fmt.Sprintf("%d/%d", t.WorkerID, t.DPRank)
	}
	return fmt.Sprintf("%d/*", t.WorkerID)
}

// checkDispatch is Hard mode's rule: the dispatch must reach the bound worker
// and, when the binding has a rank, that rank.
func checkDispatch(sessionID string, bound, dispatched Target) error {
	if bound.WorkerID == dispatched.WorkerID &&
		(!bound.HasDPRank || (dispatched.HasDPRank && dispatched.DPRank == bound.DPRank)) {
		return nil
	}
	return &ConflictError{SessionID: sessionID, Bound: bound, Dispatched: dispatched}
}

// reboundTarget is Soft mode's rule (affinity.rs rebound_target): a
// worker-only binding stays worker-only on the dispatched worker; a ranked
// binding follows the dispatched rank when the dispatch has one.
func reboundTarget(bound, dispatched Target) Target {
	if !bound.HasDPRank {
		return WorkerTarget(dispatched.WorkerID)
	}
	if !dispatched.HasDPRank {
		return bound
	}
	return dispatched
}

// Version orders replicated bindings: higher sequence wins, ties broken by
// writer id, so every replica settles on the same binding.
type Version struct {
	Sequence uint64
	WriterID uint64
}

// Less compares versions lexicographically.
func (v Version) Less(o Version) bool {
	if v.Sequence != o.Sequence {
		return v.Sequence < o.Sequence
	}
	return v.WriterID < o.WriterID
}
