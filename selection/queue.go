package selection

import (
	"time"

	"github.com/kvselect/kvselect/selection/flow"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/loads"
	"github.com/kvselect/kvselect/selection/scheduler"
)

// waiter is one selection parked in its partition's queue while every
// eligible rank is busy. Without flow control the queue is Dynamo's
// (lib/kv-router/src/scheduling/queue.rs): scheduler.Queue orders by strict
// priority and the fcfs / wspt / lcfs key. With flow control the partition's
// flow.Controller orders (flowctl.go). The partition only adds the waking.
// A waiter must not be zero-sized: distinct zero-sized allocations may share one
// address, and the queue tells waiters apart by pointer.
type waiter struct {
	isl        int
	ticket     *flow.Ticket // with flow control
	dispatched bool         // it left the queue for a worker
	expired    bool         // it waited the flow control TTL
}

// enqueue parks a selection; with flow control the controller may refuse it
// (its limits), which is the request's 429.
func (p *partition) enqueue(req *SelectRequest, pr prompt, cached int, now time.Time) (*waiter, error) {
	w := &waiter{isl: pr.isl}
	p.queueMu.Lock()
	defer p.queueMu.Unlock()
	if p.flow != nil {
		fr := flowRequest(req, pr.isl, cached)
		t, err := p.flow.Push(now, fr)
		if err != nil {
			return nil, flowError(FlowRejected, p, fr, err)
		}
		w.ticket = t
		return w, nil
	}
	e := scheduler.Entry[*waiter]{Payload: w, ISL: pr.isl, CachedTokens: cached, Enqueued: now}
	if req != nil {
		e.PriorityJump, e.StrictPriority = req.PriorityJump, req.StrictPriority
	}
	p.queue.Push(now, e)
	return w, nil
}

// leave takes w out of the queue; a flow controller charges its tenant only
// when it was dispatched.
func (p *partition) leave(w *waiter) {
	p.queueMu.Lock()
	if w.ticket != nil {
		if w.dispatched {
			p.flow.Dispatch(w.ticket)
		} else {
			p.flow.Abandon(w.ticket)
		}
	} else {
		p.queue.Remove(func(e *scheduler.Entry[*waiter]) bool { return e.Payload == w })
	}
	p.queueMu.Unlock()
	p.wake()
}

// flowExpired reports whether w, under flow control, has waited its TTL at
// now (or Maintain already took it out for that).
func (p *partition) flowExpired(w *waiter, now time.Time) bool {
	if w.ticket == nil {
		return false
	}
	p.queueMu.Lock()
	defer p.queueMu.Unlock()
	return w.ticket.Expired() || p.flow.Expired(w.ticket, now)
}

// expireFlow takes the requests that waited their TTL out of the flow
// controller (Maintain, which then wakes them): the queue moves on without
// waiting for each to notice.
func (p *partition) expireFlow(now time.Time) {
	if p.flow == nil {
		return
	}
	p.queueMu.Lock()
	p.flow.Expire(now)
	p.queueMu.Unlock()
}

// queued is the number of waiting selections.
func (p *partition) queued() int {
	p.queueMu.Lock()
	defer p.queueMu.Unlock()
	if p.flow != nil {
		return p.flow.Len()
	}
	return p.queue.Len()
}

// mayProceed: only the head of the queue goes, and only once some rank is no
// longer busy.
// A saturated rank (its engine's figures, saturated) counts as busy.
func (p *partition) mayProceed(w *waiter, ws *workerSet, projs []loads.Projection, threshold float64,
	saturated func(w index.WorkerKey, rankCount int) bool) bool {
	// Peek points into the queue's heap: read it under the lock.
	p.queueMu.Lock()
	var first bool
	if w.ticket != nil {
		first = p.flow.Head() == w.ticket
	} else {
		head := p.queue.Peek()
		first = head != nil && head.Payload == w
	}
	p.queueMu.Unlock()
	return first && hasRoom(ws, projs, threshold, saturated)
}

// hasRoom reports whether some rank is neither busy nor saturated.
func hasRoom(ws *workerSet, projs []loads.Projection, threshold float64, saturated func(w index.WorkerKey, rankCount int) bool) bool {
	for _, pj := range projs {
		rec, ok := ws.rank(pj.Worker)
		if !ok {
			continue
		}
		if !scheduler.Busy(pj.ActivePrefillTokens, rec.MaxNumBatchedTokens, threshold) && !saturated(pj.Worker, int(rec.DPSize())) {
			return true
		}
	}
	return false
}

// pending returns the queue's length and total input tokens (/loads).
func (p *partition) pending() (count, isl uint64) {
	p.queueMu.Lock()
	defer p.queueMu.Unlock()
	if p.flow != nil {
		return uint64(p.flow.Len()), uint64(p.flow.PendingISL())
	}
	return uint64(p.queue.Len()), uint64(p.queue.PendingISL())
}
