package index

import (
	"container/heap"
	"time"
)

// ttlTracker remembers when each (worker rank, engine hash) recorded by routing
// decisions expires. Re-recording refreshes the deadline. The heap may hold stale
// deadlines for refreshed entries; they are skipped when popped and compacted away
// when they outnumber live entries.
type ttlTracker struct {
	ttl       time.Duration
	deadlines map[ttlKey]int64 // unix nanoseconds
	heap      ttlHeap
}

type ttlKey struct {
	worker WorkerKey
	ext    uint64
}

type ttlEntry struct {
	deadline int64
	key      ttlKey
}

type ttlHeap []ttlEntry

func (h ttlHeap) Len() int           { return len(h) }
func (h ttlHeap) Less(i, j int) bool { return h[i].deadline < h[j].deadline }
func (h ttlHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *ttlHeap) Push(x any)        { *h = append(*h, x.(ttlEntry)) }
func (h *ttlHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

func newTTLTracker(ttl time.Duration) *ttlTracker {
	return &ttlTracker{ttl: ttl, deadlines: make(map[ttlKey]int64)}
}

func (tt *ttlTracker) touch(now time.Time, w WorkerKey, ext uint64) {
	d := now.Add(tt.ttl).UnixNano()
	k := ttlKey{w, ext}
	tt.deadlines[k] = d
	heap.Push(&tt.heap, ttlEntry{d, k})
	if len(tt.heap) > 2*len(tt.deadlines)+1024 {
		tt.compact()
	}
}

func (tt *ttlTracker) compact() {
	h := tt.heap[:0]
	for k, d := range tt.deadlines {
		h = append(h, ttlEntry{d, k})
	}
	tt.heap = h
	heap.Init(&tt.heap)
}

// expired pops every entry whose deadline is not after now and calls fn for it.
func (tt *ttlTracker) expired(now time.Time, fn func(ttlKey)) int {
	limit := now.UnixNano()
	n := 0
	for len(tt.heap) > 0 && tt.heap[0].deadline <= limit {
		e := heap.Pop(&tt.heap).(ttlEntry)
		if d, ok := tt.deadlines[e.key]; !ok || d != e.deadline {
			continue // refreshed or already gone
		}
		delete(tt.deadlines, e.key)
		fn(e.key)
		n++
	}
	return n
}

func (tt *ttlTracker) forget(match func(WorkerKey) bool) {
	for k := range tt.deadlines {
		if match(k.worker) {
			delete(tt.deadlines, k)
		}
	}
}
