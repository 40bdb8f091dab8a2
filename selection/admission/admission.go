// Package admission holds the selections of one partition that wait while
// every eligible rank is busy, and says when each may go on. Without flow
// control the queue is Dynamo's (lib/kv-router/src/scheduling/queue.rs):
// scheduler.Queue orders by strict priority and the fcfs / wspt / lcfs key.
// With flow control (selection.Config.Flow) the partition's flow.Controller
// orders the waiting requests instead — priority bands, fairness between
// tenants, FIFO inside a tenant — and limits them: queued bytes, a time to
// live, and sheddable requests (negative priority) that never wait. The
// controller is the deterministic part; a Queue adds the lock, the waking
// and the errors and events of requests that leave flow control.
package admission

import (
	"errors"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/kvselect/kvselect/selection/apierr"
	"github.com/kvselect/kvselect/selection/flow"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/scheduler"
)

// Flow outcomes, one per request that met flow control (Event.Outcome).
const (
	Dispatched = "dispatched" // waited (possibly 0), then got a worker
	Expired    = "expired"    // waited its TTL
	Shed       = "shed"       // sheddable, the pool saturated: not queued
	Rejected   = "rejected"   // the queue's byte or tenant limit
	Abandoned  = "abandoned"  // its client went away while it waited
)

// Event is one request leaving flow control, for metrics.
type Event struct {
	Model, RoutingGroup string
	Priority            int
	Tenant              string
	Outcome             string
	Wait                time.Duration
}

// Request is what admission knows of a selection request: its queue keys
// and its flow control fields. The zero value is a request that sets none.
type Request struct {
	// PriorityJump and StrictPriority are Dynamo's queue keys.
	PriorityJump   float64
	StrictPriority uint32
	// Priority is the flow control band; nil uses StrictPriority.
	Priority *int
	// Tenant shares a band fairly; "" is flow.DefaultTenant.
	Tenant string
	// Bytes is the request's size, counted against the byte limits.
	Bytes int
	// ExpectedOutputTokens adds to the request's cost.
	ExpectedOutputTokens *uint32
}

// band is the flow control band of r: its priority, else Dynamo's
// strict_priority.
func (r *Request) band() int {
	if r.Priority != nil {
		return *r.Priority
	}
	return int(min(r.StrictPriority, flow.MaxPriority))
}

// flow is what the controller knows of r: its band, tenant, bytes and cost —
// the uncached prompt tokens at the best cached prefix plus the expected
// output tokens.
func (r *Request) flow(isl, cached int) flow.Request {
	fr := flow.Request{Priority: r.band(), ISL: isl, Cost: int64(max(isl-cached, 1)),
		Tenant: r.Tenant, Bytes: int64(r.Bytes)}
	if o := r.ExpectedOutputTokens; o != nil {
		fr.Cost += int64(*o)
	}
	if fr.Tenant == "" {
		fr.Tenant = flow.DefaultTenant
	}
	return fr
}

// CheckFields validates what flow control reads from a request, whether or
// not flow control is on: a request is refused the same way everywhere.
func CheckFields(priority *int, tenant string) error {
	if p := priority; p != nil && (*p < flow.MinPriority || *p > flow.MaxPriority) {
		return apierr.New(apierr.BadRequest, "priority %d is out of range [%d, %d]", *p, flow.MinPriority, flow.MaxPriority)
	}
	return CheckTenant(tenant)
}

// CheckTenant validates a tenant id: at most flow.MaxTenantLen bytes of
// printable UTF-8.
func CheckTenant(t string) error {
	if len(t) > flow.MaxTenantLen {
		return apierr.New(apierr.BadRequest, "tenant id is %d bytes long, more than %d", len(t), flow.MaxTenantLen)
	}
	if !utf8.ValidString(t) {
		return apierr.New(apierr.BadRequest, "tenant id is not valid UTF-8")
	}
	for _, r := range t {
		if r < 0x20 || r == 0x7f {
			return apierr.New(apierr.BadRequest, "tenant id contains the control character %U", r)
		}
	}
	return nil
}

// Causes inside the errors of shed and expired requests.
var (
	errShed    = errors.New("flow control: sheddable request while saturated")
	errExpired = errors.New("flow control: queue TTL passed")
)

// Waiter is one selection parked in the queue. It must not be zero-sized:
// distinct zero-sized allocations may share one address, and the queue tells
// waiters apart by pointer.
type Waiter struct {
	isl        int
	ticket     *flow.Ticket // with flow control
	dispatched bool         // it left the queue for a worker
	expired    bool         // it waited the flow control TTL
}

// Dispatch marks w as leaving the queue for a worker.
func (w *Waiter) Dispatch() { w.dispatched = true }

// Queue is one partition's waiting room. It is safe for concurrent use; its
// mutex comes after the partition's scheduling lock (the lock order on
// selection.Service) and calls into nothing that locks.
type Queue struct {
	key  index.Partition
	name string // the partition as messages name it

	mu      sync.Mutex
	queue   *scheduler.Queue[*Waiter]
	flow    *flow.Controller // with flow control, in place of queue
	changed chan struct{}    // closed and replaced whenever load may have dropped
}

// New returns the empty waiting room of partition key, which messages call
// name. flowCfg, when not nil, turns flow control on; epoch starts the queue
// policy's clock.
func New(key index.Partition, name string, policy scheduler.QueuePolicy, flowCfg *flow.Config, epoch time.Time) *Queue {
	q := &Queue{key: key, name: name, changed: make(chan struct{}), queue: scheduler.NewQueue[*Waiter](policy, epoch)}
	if flowCfg != nil {
		q.flow = flow.New(*flowCfg)
	}
	return q
}

// Wake tells waiting selections that load or workers changed.
func (q *Queue) Wake() {
	q.mu.Lock()
	close(q.changed)
	q.changed = make(chan struct{})
	q.mu.Unlock()
}

// Changed is closed at the next Wake.
func (q *Queue) Changed() <-chan struct{} {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.changed
}

// Sheddable reports a request flow control turns away rather than queue
// (negative priority) when the partition is busy.
func (q *Queue) Sheddable(r *Request) bool {
	return q.flow != nil && flow.Sheddable(r.band())
}

// Enqueue parks a selection of isl prompt tokens, cached of them at the best
// rank, at now; with flow control the controller may refuse it (its limits),
// which is the request's 429, reported in the event.
func (q *Queue) Enqueue(r *Request, isl, cached int, now time.Time) (*Waiter, *Event, error) {
	w := &Waiter{isl: isl}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.flow != nil {
		fr := r.flow(isl, cached)
		t, err := q.flow.Push(now, fr)
		if err != nil {
			ev := q.event(r.flow(isl, 0), Rejected, 0)
			return nil, &ev, q.refusal(Rejected, fr, err)
		}
		w.ticket = t
		return w, nil, nil
	}
	q.queue.Push(now, scheduler.Entry[*Waiter]{Payload: w, ISL: isl, CachedTokens: cached, Enqueued: now,
		PriorityJump: r.PriorityJump, StrictPriority: r.StrictPriority})
	return w, nil, nil
}

// Leave takes w out of the queue and wakes the others; a flow controller
// charges its tenant only when it was dispatched. With flow control it
// returns the event of w's leaving, its wait measured to clock().
func (q *Queue) Leave(w *Waiter, clock func() time.Time) (Event, bool) {
	q.mu.Lock()
	if w.ticket != nil {
		if w.dispatched {
			q.flow.Dispatch(w.ticket)
		} else {
			q.flow.Abandon(w.ticket)
		}
	} else {
		q.queue.Remove(func(e *scheduler.Entry[*Waiter]) bool { return e.Payload == w })
	}
	q.mu.Unlock()
	q.Wake()
	ft := w.ticket
	if ft == nil {
		return Event{}, false
	}
	outcome := Abandoned
	switch {
	case w.dispatched:
		outcome = Dispatched
	case w.expired:
		outcome = Expired
	}
	return q.event(ft.Request(), outcome, clock().Sub(ft.Enqueued())), true
}

// CheckExpired is the 429 of w when, under flow control, it has waited its
// TTL at now (or Expire already took it out for that), nil otherwise.
func (q *Queue) CheckExpired(w *Waiter, now time.Time) error {
	if w.ticket == nil {
		return nil
	}
	q.mu.Lock()
	expired := w.ticket.Expired() || q.flow.Expired(w.ticket, now)
	q.mu.Unlock()
	if !expired {
		return nil
	}
	w.expired = true
	return q.refusal(Expired, w.ticket.Request(), errExpired)
}

// ShedError is the 429 of a sheddable request r of isl prompt tokens turned
// away while the partition is busy, and the event that reports it.
func (q *Queue) ShedError(r *Request, isl int) (Event, error) {
	fr := r.flow(isl, 0)
	return q.event(fr, Shed, 0), q.refusal(Shed, fr, errShed)
}

// DispatchedUnqueued is the event of a sheddable request that found room and
// went on without queueing.
func (q *Queue) DispatchedUnqueued(r *Request, isl int) Event {
	return q.event(r.flow(isl, 0), Dispatched, 0)
}

// Expire takes the requests that waited their TTL at now out of the flow
// controller (the caller then wakes them): the queue moves on without
// waiting for each to notice.
func (q *Queue) Expire(now time.Time) {
	if q.flow == nil {
		return
	}
	q.mu.Lock()
	q.flow.Expire(now)
	q.mu.Unlock()
}

// Len is the number of waiting selections.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.flow != nil {
		return q.flow.Len()
	}
	return q.queue.Len()
}

// IsHead reports whether w is the next to go.
func (q *Queue) IsHead(w *Waiter) bool {
	// Peek points into the queue's heap: read it under the lock.
	q.mu.Lock()
	defer q.mu.Unlock()
	if w.ticket != nil {
		return q.flow.Head() == w.ticket
	}
	head := q.queue.Peek()
	return head != nil && head.Payload == w
}

// Pending returns the queue's length and total input tokens (/loads).
func (q *Queue) Pending() (count, isl uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.flow != nil {
		return uint64(q.flow.Len()), uint64(q.flow.PendingISL())
	}
	return uint64(q.queue.Len()), uint64(q.queue.PendingISL())
}

// FlowState snapshots the flow controller at now; the zero State without
// flow control.
func (q *Queue) FlowState(now time.Time) flow.State {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.flow.State(now)
}

func (q *Queue) event(r flow.Request, outcome string, wait time.Duration) Event {
	return Event{Model: q.key.Model, RoutingGroup: q.key.RoutingGroup, Priority: r.Priority, Tenant: r.Tenant, Outcome: outcome, Wait: wait}
}

// refusal is the 429 of a request flow control turned away.
func (q *Queue) refusal(outcome string, r flow.Request, cause error) error {
	msg := cause.Error()
	switch outcome {
	case Shed:
		msg = fmt.Sprintf("sheddable request (priority %d) rejected: every worker of %s is busy", r.Priority, q.name)
	case Expired:
		msg = fmt.Sprintf("request waited the flow control queue TTL for a worker of %s", q.name)
	}
	return apierr.WithDetails(apierr.Overloaded, msg, cause,
		map[string]any{"flow_outcome": outcome, "priority": r.Priority, "tenant": r.Tenant})
}
