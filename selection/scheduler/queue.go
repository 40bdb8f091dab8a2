package scheduler

import (
	"errors"
	"fmt"
	"time"
)

// QueuePolicy orders waiting requests (router_queue_policy).
type QueuePolicy int

const (
	// FCFS: priority_jump − arrival offset in seconds; FIFO with a priority
	// boost measured in seconds. Dynamo's default.
	FCFS QueuePolicy = iota
	// WSPT: (1 + priority_jump) / max(1, isl − cached tokens); weighted
	// shortest (effective) prefill first, Smith's rule.
	WSPT
	// LCFS: priority_jump + arrival offset; newest first. Internal/testing only
	// in Dynamo.
	LCFS
)

var queuePolicyNames = [...]string{FCFS: "fcfs", WSPT: "wspt", LCFS: "lcfs"}

func (p QueuePolicy) String() string {
	if p >= 0 && int(p) < len(queuePolicyNames) {
		return queuePolicyNames[p]
	}
	return fmt.Sprintf("QueuePolicy(%d)", int(p))
}

// ErrQueuePolicy is wrapped by ParseQueuePolicy's errors.
var ErrQueuePolicy = errors.New("unknown router queue policy")

// ParseQueuePolicy parses Dynamo's spelling: fcfs, wspt or lcfs.
func ParseQueuePolicy(s string) (QueuePolicy, error) {
	for p, name := range queuePolicyNames {
		if s == name {
			return QueuePolicy(p), nil
		}
	}
	return 0, fmt.Errorf("%w %q (want fcfs, wspt or lcfs)", ErrQueuePolicy, s)
}

// Entry is one waiting request. The caller fills the exported fields; Push
// stamps Enqueued and the ordering key.
type Entry[T any] struct {
	Payload T
	// ISL is the prompt length; PendingISL sums it (/loads pending_isl_tokens).
	ISL int
	// CachedTokens is the best cached prefix among the ranks the request can
	// run on (BestCachedTokens); WSPT orders by isl − cached.
	CachedTokens int
	// PriorityJump (nvext.agent_hints.priority, seconds; negative counts as 0)
	// and StrictPriority (compared first) raise a request.
	PriorityJump   float64
	StrictPriority uint32
	// Enqueued is set by Push; compare it with OverlapRefreshDue at dequeue.
	Enqueued time.Time

	score float64
	seq   uint64
}

// Score is the entry's policy score; with StrictPriority it forms the
// ordering key, higher first.
func (e *Entry[T]) Score() float64 { return e.score }

// Queue is the router queue's ordering (Dynamo's scheduling/queue.rs): a priority queue
// keyed by (strict_priority, policy score), highest first, ties in arrival
// order (policy_queue.rs: enqueue sequence breaks ties). Admission — whether
// the head may leave — is the caller's test, typically !AllBusy. Not safe for
// concurrent use.
type Queue[T any] struct {
	policy        QueuePolicy
	epoch         time.Time
	seq           uint64
	heap          []Entry[T]
	pendingISL    int
	pendingCached int
}

// NewQueue returns an empty queue. Arrival offsets are measured from epoch
// (Dynamo: the queue actor's start time).
func NewQueue[T any](policy QueuePolicy, epoch time.Time) *Queue[T] {
	return &Queue[T]{policy: policy, epoch: epoch}
}

// Push enqueues e as arriving at now.
func (q *Queue[T]) Push(now time.Time, e Entry[T]) {
	e.Enqueued = now
	e.CachedTokens = min(max(e.CachedTokens, 0), max(e.ISL, 0))
	e.score = q.policyScore(now, &e)
	e.seq = q.seq
	q.seq++
	q.pendingISL += e.ISL
	q.pendingCached += e.CachedTokens
	q.heap = append(q.heap, e)
	q.up(len(q.heap) - 1)
}

// policyScore mirrors policy_queue.rs make_entry.
func (q *Queue[T]) policyScore(now time.Time, e *Entry[T]) float64 {
	jump := e.PriorityJump
	if !(jump > 0) { // negative and NaN count as 0, as Rust's f64::max(0.0) does
		jump = 0
	}
	offset := max(now.Sub(q.epoch).Seconds(), 0)
	switch q.policy {
	case WSPT:
		cost := max(e.ISL-e.CachedTokens, 1)
		return (1 + jump) / float64(cost)
	case LCFS:
		return jump + offset
	}
	return jump - offset
}

// Len is the number of waiting requests (/loads pending_count).
func (q *Queue[T]) Len() int { return len(q.heap) }

// PendingISL is the sum of waiting prompts' lengths (/loads pending_isl_tokens).
func (q *Queue[T]) PendingISL() int { return q.pendingISL }

// PendingCachedTokens is the sum of waiting requests' cached tokens.
func (q *Queue[T]) PendingCachedTokens() int { return q.pendingCached }

// Peek returns the head, nil if the queue is empty. The pointer is valid
// until the next Push, Pop or Remove.
func (q *Queue[T]) Peek() *Entry[T] {
	if len(q.heap) == 0 {
		return nil
	}
	return &q.heap[0]
}

// Pop removes and returns the head.
func (q *Queue[T]) Pop() (Entry[T], bool) {
	if len(q.heap) == 0 {
		return Entry[T]{}, false
	}
	return q.removeAt(0), true
}

// PopReady removes and returns the head if ready(head) holds. The head blocks
// the entries behind it, as in Dynamo's single-class queue, so a high-priority
// request is not overtaken while it waits.
func (q *Queue[T]) PopReady(ready func(*Entry[T]) bool) (Entry[T], bool) {
	if len(q.heap) == 0 || !ready(&q.heap[0]) {
		return Entry[T]{}, false
	}
	return q.removeAt(0), true
}

// Remove takes out every entry match selects (cancelled or shut-down
// requests) and returns them in queue order.
func (q *Queue[T]) Remove(match func(*Entry[T]) bool) []Entry[T] {
	var out []Entry[T]
	for i := 0; i < len(q.heap); {
		if match(&q.heap[i]) {
			out = append(out, q.removeAt(i))
			continue // removeAt moved another entry into i
		}
		i++
	}
	// Queue order: the same comparison the heap uses.
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && before(&out[j], &out[j-1]); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

func (q *Queue[T]) removeAt(i int) Entry[T] {
	e := q.heap[i]
	last := len(q.heap) - 1
	q.heap[i] = q.heap[last]
	q.heap[last] = Entry[T]{} // drop the payload reference
	q.heap = q.heap[:last]
	if i < last {
		q.down(i)
		q.up(i)
	}
	q.pendingISL -= e.ISL
	q.pendingCached -= e.CachedTokens
	return e
}

// before orders a ahead of b: higher strict priority, then higher score, then
// earlier arrival.
func before[T any](a, b *Entry[T]) bool {
	if a.StrictPriority != b.StrictPriority {
		return a.StrictPriority > b.StrictPriority
	}
	if a.score != b.score {
		return a.score > b.score
	}
	return a.seq < b.seq
}

func (q *Queue[T]) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !before(&q.heap[i], &q.heap[parent]) {
			return
		}
		q.heap[i], q.heap[parent] = q.heap[parent], q.heap[i]
		i = parent
	}
}

func (q *Queue[T]) down(i int) {
	n := len(q.heap)
	for {
		first := i
		if l := 2*i + 1; l < n && before(&q.heap[l], &q.heap[first]) {
			first = l
		}
		if r := 2*i + 2; r < n && before(&q.heap[r], &q.heap[first]) {
			first = r
		}
		if first == i {
			return
		}
		q.heap[i], q.heap[first] = q.heap[first], q.heap[i]
		i = first
	}
}

// BestCachedTokens is the cached prefix WSPT orders by: the pinned rank's
// cached tokens if the request is pinned, else the best over the eligible,
// non-overloaded candidates (types.rs SchedulingContext::best_cached_tokens).
func BestCachedTokens(req *Request, cands []Candidate) int {
	w := &req.Weights
	best := 0
	for i := range cands {
		c := &cands[i]
		if req.Pinned != nil {
			if c.Worker == *req.Pinned {
				return CachedTokens(c.Overlap, req.BlockSize, w.HostCacheHitWeight, w.DiskCacheHitWeight)
			}
			continue
		}
		if c.Overloaded || !Eligible(req, c) {
			continue
		}
		best = max(best, CachedTokens(c.Overlap, req.BlockSize, w.HostCacheHitWeight, w.DiskCacheHitWeight))
	}
	return best
}
