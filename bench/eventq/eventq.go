// Package eventq is the agenda of kvselect's discrete-event simulations
// (bench/routesim, bench/pdsim, bench/flowsim): events ordered by their
// virtual time, ties in the order they were pushed, so that a simulation
// driven by a seeded source replays exactly.
package eventq

import (
	"container/heap"
	"time"
)

// Queue holds events of type E by time. The zero value is empty and ready.
type Queue[E any] struct {
	h entries[E]
	n uint64 // pushes so far: the tie-break
}

type entry[E any] struct {
	at time.Duration
	n  uint64
	ev E
}

// Len is how many events are waiting.
func (q *Queue[E]) Len() int { return len(q.h) }

// Push schedules ev at at.
func (q *Queue[E]) Push(at time.Duration, ev E) {
	q.n++
	heap.Push(&q.h, entry[E]{at: at, n: q.n, ev: ev})
}

// Pop removes and returns the earliest event; the queue must not be empty.
func (q *Queue[E]) Pop() E { return heap.Pop(&q.h).(entry[E]).ev }

// Next is the time of the earliest event, false when the queue is empty.
func (q *Queue[E]) Next() (time.Duration, bool) {
	if len(q.h) == 0 {
		return 0, false
	}
	return q.h[0].at, true
}

type entries[E any] []entry[E]

func (h entries[E]) Len() int { return len(h) }
func (h entries[E]) Less(i, j int) bool {
	return h[i].at < h[j].at || h[i].at == h[j].at && h[i].n < h[j].n
}
func (h entries[E]) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *entries[E]) Push(x any)   { *h = append(*h, x.(entry[E])) }
func (h *entries[E]) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = entry[E]{} // let the event be collected
	*h = old[:len(old)-1]
	return e
}
