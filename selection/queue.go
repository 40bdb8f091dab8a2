package selection

import (
	"time"

	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/loads"
	"github.com/kvselect/kvselect/selection/scheduler"
)

// waiter is one selection parked in its partition's queue while every
// eligible rank is busy (Dynamo's lib/kv-router/src/scheduling/queue.rs).
// The queue itself (ordering by strict priority and the fcfs / wspt / lcfs key)
// is scheduler.Queue; the partition only adds the waking.
// A waiter must not be zero-sized: distinct zero-sized allocations may share one
// address, and the queue tells waiters apart by pointer.
type waiter struct{ isl int }

func (p *partition) enqueue(req *SelectRequest, pr prompt, cached int, now time.Time) *waiter {
	w := &waiter{isl: pr.isl}
	e := scheduler.Entry[*waiter]{Payload: w, ISL: pr.isl, CachedTokens: cached, Enqueued: now}
	if req != nil {
		e.PriorityJump, e.StrictPriority = req.PriorityJump, req.StrictPriority
	}
	p.queueMu.Lock()
	p.queue.Push(now, e)
	p.queueMu.Unlock()
	return w
}

func (p *partition) leave(w *waiter) {
	p.queueMu.Lock()
	p.queue.Remove(func(e *scheduler.Entry[*waiter]) bool { return e.Payload == w })
	p.queueMu.Unlock()
	p.wake()
}

// mayProceed: only the head of the queue goes, and only once some rank is no
// longer busy.
// A saturated rank (its engine's figures, saturated) counts as busy.
func (p *partition) mayProceed(w *waiter, ws *workerSet, projs []loads.Projection, threshold float64,
	saturated func(w index.WorkerKey, rankCount int) bool) bool {
	// Peek points into the queue's heap: read it under the lock.
	p.queueMu.Lock()
	head := p.queue.Peek()
	first := head != nil && head.Payload == w
	p.queueMu.Unlock()
	if !first {
		return false
	}
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
	return uint64(p.queue.Len()), uint64(p.queue.PendingISL())
}
