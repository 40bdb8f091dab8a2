// Package partition is the state of one (model, routing group) partition of
// the selection service: its KV index, the load tracker, the session
// affinity table, the text index, the schedulable workers as an immutable
// snapshot, the scheduling state that makes select-and-book atomic, the
// waiting room of selections while every worker is busy, and the routing
// counters. A Set holds the partitions of a service.
package partition

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvselect/kvselect/selection/admission"
	"github.com/kvselect/kvselect/selection/affinity"
	"github.com/kvselect/kvselect/selection/apierr"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/decisionlog"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/loads"
	"github.com/kvselect/kvselect/selection/scheduler"
	"github.com/kvselect/kvselect/selection/textindex"
)

// Name is the partition key as messages name it.
func Name(k index.Partition) string {
	return fmt.Sprintf("model=%s routing_group=%s", k.Model, k.RoutingGroup)
}

// Parts are what a partition is made of; New takes them over.
type Parts struct {
	Key       index.Partition
	BlockSize uint32
	Eagle     bool
	Index     *index.Index
	Loads     *loads.Tracker
	Affinity  *affinity.Table // nil: session affinity off
	Queue     *admission.Queue
	// Rand draws the partition's tie-breaks and softmax samples.
	Rand *rand.Rand
}

// Partition is one partition's state. It is safe for concurrent use.
type Partition struct {
	key       index.Partition
	blockSize uint32
	eagle     bool
	ix        *index.Index
	loads     *loads.Tracker
	affinity  *affinity.Table
	text      textindex.Index
	queue     *admission.Queue
	routing   decisionlog.Counters

	// workers is an immutable snapshot of the schedulable workers, replaced
	// on every catalog change, so selection never takes the catalog lock.
	workers atomic.Pointer[Workers]

	sched Sched
}

// Sched is a partition's scheduling state. Its mutex makes select-and-book
// atomic within the partition, as Dynamo's per-partition scheduler task is:
// two bookings never decide on the same load snapshot. It comes after the
// catalog's and the partition set's locks and before the queue's (the lock
// order on selection.Service). Every field is guarded by it.
type Sched struct {
	sync.Mutex
	// Rand draws tie-breaks and softmax samples.
	Rand *rand.Rand
	// Scratch is the picker's working set.
	Scratch scheduler.Scratch
	// Projections is a buffer a decision reuses; its candidates go in
	// Scratch.Rows.
	Projections []loads.Projection
}

// New assembles a partition with no schedulable worker.
func New(p Parts) *Partition {
	out := &Partition{key: p.Key, blockSize: p.BlockSize, eagle: p.Eagle, ix: p.Index, loads: p.Loads,
		affinity: p.Affinity, queue: p.Queue, sched: Sched{Rand: p.Rand}}
	out.workers.Store(&Workers{ByID: map[uint64]*catalog.Record{}})
	return out
}

// Key is the partition's (model, routing group).
func (p *Partition) Key() index.Partition { return p.key }

// BlockSize is the partition's block size, frozen by its first worker.
func (p *Partition) BlockSize() uint32 { return p.blockSize }

// Eagle is the partition's Eagle mode, frozen by its first worker.
func (p *Partition) Eagle() bool { return p.eagle }

// Index is the partition's KV index.
func (p *Partition) Index() *index.Index { return p.ix }

// Loads is the partition's load tracker. Frees, prefill completions and
// output blocks go to it directly; bookings go through Book or a decision
// under Sched.
func (p *Partition) Loads() *loads.Tracker { return p.loads }

// Affinity is the partition's session table, nil when session affinity is
// off.
func (p *Partition) Affinity() *affinity.Table { return p.affinity }

// Text is the partition's index of text prompts.
func (p *Partition) Text() *textindex.Index { return &p.text }

// Queue is the partition's waiting room.
func (p *Partition) Queue() *admission.Queue { return p.queue }

// Routing is the partition's routing-quality counters.
func (p *Partition) Routing() *decisionlog.Counters { return &p.routing }

// Sched is the partition's scheduling state; lock it to use it.
func (p *Partition) Sched() *Sched { return &p.sched }

// Workers is the snapshot of the partition's schedulable workers.
func (p *Partition) Workers() *Workers { return p.workers.Load() }

// Wake tells waiting selections that load or workers changed.
func (p *Partition) Wake() { p.queue.Wake() }

// Book adds b to the load tracker, at the time clock reads under the
// scheduling lock, so that it never lands between a decision's projection
// and its booking.
func (p *Partition) Book(clock func() time.Time, b loads.Booking) error {
	p.sched.Lock()
	defer p.sched.Unlock()
	return LoadsError(p.loads.Add(clock(), b))
}

// Move moves booking id to rank w under the scheduling lock and returns its
// remaining prefill tokens.
func (p *Partition) Move(id string, w index.WorkerKey) (prefill int, err error) {
	p.sched.Lock()
	defer p.sched.Unlock()
	prefill, err = p.loads.Move(id, w)
	return prefill, LoadsError(err)
}

// LoadsError classifies a load tracker's error: an unknown rank or booking
// is a 404, a booking id taken a 409.
func LoadsError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, loads.ErrWorkerNotFound), errors.Is(err, loads.ErrRequestNotFound):
		return apierr.Wrap(apierr.NotFound, err)
	case errors.Is(err, loads.ErrDuplicateRequest):
		return apierr.Wrap(apierr.Conflict, err)
	}
	return apierr.Wrap(apierr.Internal, err)
}

// Publish makes rec a selection candidate, reserving its device blocks in the
// index. It returns the bookings dropped with ranks that left (none when rec
// only joins or grows).
func (p *Partition) Publish(rec *catalog.Record) (dropped []string) {
	dropped = p.ReplaceWorkers(func(m map[uint64]*catalog.Record) { m[rec.WorkerID] = rec.Clone() })
	if n := rec.TotalKVBlocks; n != nil {
		for _, rank := range rec.Ranks() {
			p.ix.Reserve(index.WorkerKey{WorkerID: rec.WorkerID, DPRank: rank}, index.TierDevice, int(min(*n, 1<<24)))
		}
	}
	return dropped
}

// ReplaceWorkers edits a copy of the schedulable workers and publishes it,
// with the load tracker's ranks under the scheduling lock. A rank that left
// takes its indexed blocks along, whatever fed them (KV events or recorded
// routing decisions). It returns the ids of the bookings dropped with the
// ranks that left, which the caller forgets before it wakes the queue.
func (p *Partition) ReplaceWorkers(edit func(map[uint64]*catalog.Record)) (dropped []string) {
	cur := p.workers.Load()
	next := &Workers{ByID: make(map[uint64]*catalog.Record, len(cur.ByID)+1)}
	for id, r := range cur.ByID {
		next.ByID[id] = r
	}
	edit(next.ByID)
	for _, r := range next.ByID {
		for _, rank := range r.Ranks() {
			next.Ranks = append(next.Ranks, index.WorkerKey{WorkerID: r.WorkerID, DPRank: rank})
		}
	}
	slices.SortFunc(next.Ranks, index.CompareWorkerKeys)
	next.recs = make([]*catalog.Record, len(next.Ranks))
	for i, w := range next.Ranks {
		next.recs[i] = next.ByID[w.WorkerID]
	}
	dropped = p.swapWorkers(next)
	for _, w := range cur.Ranks {
		if _, ok := slices.BinarySearchFunc(next.Ranks, w, index.CompareWorkerKeys); !ok {
			p.ix.RemoveRank(w)
			p.text.RemoveRank(w)
		}
	}
	return dropped
}

func (p *Partition) swapWorkers(next *Workers) (dropped []string) {
	p.sched.Lock()
	defer p.sched.Unlock()
	p.workers.Store(next)
	return p.loads.SetWorkers(next.Ranks)
}

// Match looks the prompt's block hashes up in the partition's index (the
// text index for a text prompt) and returns the rows sorted by (worker_id,
// dp_rank), so OverlapOf can find a rank by binary search: joining them with
// a thousand ranks by scanning would cost more than the selection itself.
// The rows are appended to dst[:0], whose array the caller may recycle.
func (p *Partition) Match(locals []uint64, text bool, dst []index.Overlap) []index.Overlap {
	if len(locals) == 0 {
		return dst[:0]
	}
	ix := p.ix
	if text {
		ix = p.text.Index()
	}
	rows := ix.Match(locals, false, dst[:0])
	// A tree's rows come in key order; only a side tree's merged rows
	// (Index.Match) can leave them out of it.
	if !slices.IsSortedFunc(rows, index.CompareOverlaps) {
		slices.SortFunc(rows, index.CompareOverlaps)
	}
	return rows
}

// OverlapOf returns w's row of overlaps (sorted by Match), or a zero row.
func OverlapOf(overlaps []index.Overlap, w index.WorkerKey) index.Overlap {
	i, ok := slices.BinarySearchFunc(overlaps, w, func(o index.Overlap, w index.WorkerKey) int {
		return index.CompareWorkerKeys(o.Worker, w)
	})
	if !ok {
		return index.Overlap{}
	}
	return overlaps[i]
}

// Workers is an immutable snapshot of a partition's schedulable workers.
type Workers struct {
	ByID  map[uint64]*catalog.Record
	Ranks []index.WorkerKey // sorted (worker_id, dp_rank)
	// recs[i] is Ranks[i]'s record, so that Candidates joins ranks with
	// their records by walking both lists rather than by a map lookup per
	// rank. ReplaceWorkers fills it; a Workers built without it is joined
	// through ByID.
	recs []*catalog.Record
}

// Rank returns the record of rank w's worker, if w is schedulable.
func (ws *Workers) Rank(w index.WorkerKey) (*catalog.Record, bool) {
	if ws == nil {
		return nil, false
	}
	r, ok := ws.ByID[w.WorkerID]
	if !ok || !r.HasRank(w.DPRank) {
		return nil, false
	}
	return r, true
}

// Schedulable is the liveness test affinity applies to bindings: the worker
// is schedulable in the partition and a ranked target's rank is inside its
// current range (so a DP shrink rebinds only the removed ranks).
func (ws *Workers) Schedulable(t affinity.Target) bool {
	r, ok := ws.ByID[t.WorkerID]
	if !ok {
		return false
	}
	return !t.HasDPRank || r.HasRank(t.DPRank)
}
