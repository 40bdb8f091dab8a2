package index

import (
	"cmp"
	"container/heap"
	"slices"
	"time"
)

// ttlTracker remembers when each (worker rank, engine hash) recorded by routing
// decisions expires. Re-recording refreshes the deadline. The heap holds one
// entry per recording — every block of one routing decision shares its
// deadline — rather than one per block: a long prompt records thousands of
// blocks at once, and a heap push each cost more than the recording itself.
// The heap may hold stale deadlines for refreshed entries; they are skipped
// when popped and compacted away when they outnumber live entries.
type ttlTracker struct {
	ttl time.Duration
	// deadlines are per worker rank, keyed by engine hash (unix
	// nanoseconds): a map with 8-byte keys is the fast kind, and a
	// recording looks its rank up once.
	deadlines map[WorkerKey]map[uint64]int64
	live      int // hashes in deadlines
	heap      ttlHeap
	queued    int // engine hashes in the heap's entries, stale ones included
}

type ttlKey struct {
	worker WorkerKey
	ext    uint64
}

// ttlEntry is one recording: a worker rank's engine hashes, all at one
// deadline.
type ttlEntry struct {
	deadline int64
	worker   WorkerKey
	exts     []uint64
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
	return &ttlTracker{ttl: ttl, deadlines: make(map[WorkerKey]map[uint64]int64)}
}

// touch records exts of worker w at now: each expires ttl after now unless
// recorded again. exts is copied.
func (tt *ttlTracker) touch(now time.Time, w WorkerKey, exts []uint64) {
	if len(exts) == 0 {
		return
	}
	d := now.Add(tt.ttl).UnixNano()
	m := tt.deadlines[w]
	if m == nil {
		m = make(map[uint64]int64, len(exts))
		tt.deadlines[w] = m
	}
	n := len(m)
	for _, e := range exts {
		m[e] = d
	}
	tt.live += len(m) - n
	heap.Push(&tt.heap, ttlEntry{deadline: d, worker: w, exts: slices.Clone(exts)})
	tt.queued += len(exts)
	if tt.queued > 2*tt.live+1024 {
		tt.compact()
	}
}

// compact drops the stale hashes from the heap's entries, in place, and the
// entries left empty. Hashes recorded twice at one deadline stay twice; if
// that leaves the heap still much larger than the live set (a clock that
// does not move), it is rebuilt from the live deadlines instead.
func (tt *ttlTracker) compact() {
	h, queued := tt.heap[:0], 0
	for _, e := range tt.heap {
		m := tt.deadlines[e.worker]
		live := e.exts[:0]
		for _, x := range e.exts {
			if d, ok := m[x]; ok && d == e.deadline {
				live = append(live, x)
			}
		}
		if len(live) > 0 {
			e.exts = live
			h = append(h, e)
			queued += len(live)
		}
	}
	clear(h[len(h):cap(h)]) // the dropped entries' hash slices
	tt.heap, tt.queued = h, queued
	if queued > tt.live*3/2+1024 {
		tt.rebuild()
		return
	}
	heap.Init(&tt.heap)
}

// rebuild makes the heap anew from the live deadlines, one entry per
// (deadline, worker rank).
func (tt *ttlTracker) rebuild() {
	type due struct {
		deadline int64
		key      ttlKey
	}
	live := make([]due, 0, tt.live)
	for w, m := range tt.deadlines {
		for x, d := range m {
			live = append(live, due{d, ttlKey{w, x}})
		}
	}
	slices.SortFunc(live, func(a, b due) int {
		return cmp.Or(cmp.Compare(a.deadline, b.deadline), CompareWorkerKeys(a.key.worker, b.key.worker), cmp.Compare(a.key.ext, b.key.ext))
	})
	exts := make([]uint64, len(live))
	h := tt.heap[:0]
	for i := 0; i < len(live); {
		j := i
		for j < len(live) && live[j].deadline == live[i].deadline && live[j].key.worker == live[i].key.worker {
			exts[j] = live[j].key.ext
			j++
		}
		h = append(h, ttlEntry{deadline: live[i].deadline, worker: live[i].key.worker, exts: exts[i:j:j]})
		i = j
	}
	clear(h[len(h):cap(h)])
	tt.heap, tt.queued = h, len(live)
	heap.Init(&tt.heap)
}

// expired pops every entry whose deadline is not after now and calls fn for
// each of its engine hashes still due then.
func (tt *ttlTracker) expired(now time.Time, fn func(ttlKey)) int {
	limit := now.UnixNano()
	n := 0
	for len(tt.heap) > 0 && tt.heap[0].deadline <= limit {
		e := heap.Pop(&tt.heap).(ttlEntry)
		tt.queued -= len(e.exts)
		m := tt.deadlines[e.worker]
		for _, x := range e.exts {
			if d, ok := m[x]; !ok || d != e.deadline {
				continue // refreshed or already gone
			}
			delete(m, x)
			tt.live--
			fn(ttlKey{e.worker, x})
			n++
		}
		if m != nil && len(m) == 0 {
			delete(tt.deadlines, e.worker)
		}
	}
	return n
}

func (tt *ttlTracker) forget(match func(WorkerKey) bool) {
	for w, m := range tt.deadlines {
		if match(w) {
			tt.live -= len(m)
			delete(tt.deadlines, w)
		}
	}
}
