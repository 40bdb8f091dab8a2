package index

import (
	"fmt"
	"slices"
	"sync"
)

// Tree is the KV radix index of one partition: a prefix tree keyed by
// LocalBlockHash, whose nodes record which (worker, rank, tier) hold that block,
// plus, per worker rank and tier, a map from the engine's block hash to the node.
//
// Layout. Nodes live in fixed-size pages and refer to each other by uint32 index;
// a node holds no pointer, so the garbage collector never scans the tree however
// large it grows (docs/benchmarks.md has the measured heap per entry). A node keeps its first
// child inline, so walking a chain costs one indexed load per block; further
// children live in one map keyed by (parent, local hash). Ownership is an interned
// set id (sets.go).
//
// Semantics follow Dynamo's radix tree (lib/kv-router/src/indexer/radix_tree.rs,
// the reference its compressed and concurrent trees match): a store walks down
// from the parent the worker holds (ErrParentNotFound otherwise) creating nodes
// by local hash; removal is per block and not cascading; a lookup credits a
// worker with the leading query blocks it holds along the path. One deliberate
// difference: a node that no worker holds any more keeps its subtree while
// other blocks below it are held, so a worker that re-stores it is credited
// with the descendants it still holds. Dynamo's own indexer harness (harness/reference.rs) accepts any score
// between the "reachable" and the "held" prefix in that case; this tree reports
// the held one, and the property test checks those bounds.
//
// Tree is not safe for concurrent use; Index wraps it with a lock.
type Tree struct {
	pages    []*nodePage // node id → pages[id>>pageShift][id&pageMask]
	used     uint32      // node ids handed out so far (live + free)
	freeIDs  []uint32
	children map[childKey]uint32
	sets     setTable

	slots     map[WorkerKey]uint32
	workers   []workerState // by slot
	keys      []WorkerKey   // by slot: workers[slot].key, packed for lookups
	freeSlots []uint32
	// byKey lists the live slots in (worker id, dp rank) order. A lookup
	// that matches thousands of ranks (a prompt the whole fleet caches)
	// puts its rows in that order with one pass over it; sorting them cost
	// more than the rest of a 4,096-rank selection (kvbench scale).
	byKey []uint32

	// The slot of the last worker looked up: a batch's events all come from
	// one worker rank, and a map lookup per event costs as much as
	// removing its block.
	lastKey  WorkerKey
	lastSlot uint32
	lastOK   bool
}

// A node is split in two: the fields a lookup reads on every block (16 bytes,
// four nodes per cache line) and the bookkeeping only writers and branch points
// touch. A 128-block walk along a chain then streams through 2 KB of hot nodes.
type node struct {
	hash  uint64 // LocalBlockHash: the edge label from the parent
	child uint32 // first child kept inline; 0 = none (the root is never a child)
	set   uint32 // interned owner set
}

type nodeMeta struct {
	parent uint32
	kids   uint32 // number of children, inline and in Tree.children
	refs   uint32 // (worker, tier, engine hash) entries pointing here
}

// Nodes live in fixed-size pages rather than one growing slice: growing a
// 10M-node slice would copy hundreds of megabytes under the write lock and stall
// every lookup. A page holds no pointer, so the collector skips it.
const (
	pageShift = 13
	pageSize  = 1 << pageShift
	pageMask  = pageSize - 1
)

type nodePage struct {
	hot  [pageSize]node
	meta [pageSize]nodeMeta
}

func (t *Tree) node(id uint32) *node     { return &t.pages[id>>pageShift].hot[id&pageMask] }
func (t *Tree) meta(id uint32) *nodeMeta { return &t.pages[id>>pageShift].meta[id&pageMask] }

type childKey struct {
	parent uint32
	hash   uint64
}

type workerState struct {
	key    WorkerKey
	lookup [numTiers]handleMap // engine hash → node
}

const root = 0

// NewTree returns an empty tree.
func NewTree() *Tree {
	return &Tree{
		pages:    []*nodePage{new(nodePage)},
		used:     1, // the root
		children: make(map[childKey]uint32),
		sets:     newSetTable(),
		slots:    make(map[WorkerKey]uint32),
	}
}

func (t *Tree) child(cur uint32, h uint64) uint32 {
	n := t.node(cur)
	c := n.child
	if c != 0 && t.node(c).hash == h {
		return c
	}
	if kids := t.meta(cur).kids; kids > 1 || (kids == 1 && c == 0) {
		return t.children[childKey{cur, h}]
	}
	return 0
}

func (t *Tree) newChild(parent uint32, h uint64) uint32 {
	var id uint32
	if k := len(t.freeIDs); k > 0 {
		id = t.freeIDs[k-1]
		t.freeIDs = t.freeIDs[:k-1]
	} else {
		id = t.used
		t.used++
		if int(id>>pageShift) == len(t.pages) {
			t.pages = append(t.pages, new(nodePage))
		}
	}
	*t.node(id) = node{hash: h}
	*t.meta(id) = nodeMeta{parent: parent}
	p := t.node(parent)
	if p.child == 0 {
		p.child = id
	} else {
		t.children[childKey{parent, h}] = id
	}
	t.meta(parent).kids++
	return id
}

// reclaim frees n, and then its ancestors, while they are held by nobody, named
// by no engine hash and have no children.
func (t *Tree) reclaim(id uint32) {
	for id != root {
		n, m := t.node(id), t.meta(id)
		if n.set != 0 || m.refs != 0 || m.kids != 0 {
			return
		}
		parent := m.parent
		p := t.node(parent)
		if p.child == id {
			p.child = 0
		} else {
			delete(t.children, childKey{parent, n.hash})
		}
		t.meta(parent).kids--
		*n, *m = node{}, nodeMeta{}
		t.freeIDs = append(t.freeIDs, id)
		id = parent
	}
}

func (t *Tree) setOwner(id uint32, e ownerElem, add bool) {
	n := t.node(id)
	to := t.sets.with(n.set, e, add)
	if to == n.set {
		return
	}
	t.sets.acquire(to)
	t.sets.release(n.set)
	n.set = to
}

// slotOf returns the slot of w, if it has one.
func (t *Tree) slotOf(w WorkerKey) (uint32, bool) {
	if t.lastOK && t.lastKey == w {
		return t.lastSlot, true
	}
	s, ok := t.slots[w]
	if ok {
		t.lastKey, t.lastSlot, t.lastOK = w, s, true
	}
	return s, ok
}

func (t *Tree) slotFor(w WorkerKey) uint32 {
	if s, ok := t.slotOf(w); ok {
		return s
	}
	var s uint32
	if k := len(t.freeSlots); k > 0 {
		s = t.freeSlots[k-1]
		t.freeSlots = t.freeSlots[:k-1]
		t.workers[s] = workerState{key: w}
		t.keys[s] = w
	} else {
		s = uint32(len(t.workers))
		t.workers = append(t.workers, workerState{key: w})
		t.keys = append(t.keys, w)
	}
	t.slots[w] = s
	i, _ := t.keyPos(w)
	t.byKey = slices.Insert(t.byKey, i, s)
	return s
}

// keyPos is where w's slot is, or would be, in byKey.
func (t *Tree) keyPos(w WorkerKey) (int, bool) {
	return slices.BinarySearchFunc(t.byKey, w, func(s uint32, w WorkerKey) int {
		return CompareWorkerKeys(t.keys[s], w)
	})
}

// findExt resolves a worker's engine hash to a node, preferring tier first: a
// lower-tier block's parent may live in another tier (an offloaded child of a
// block still on the device).
func (t *Tree) findExt(ws *workerState, first Tier, h uint64) (uint32, bool) {
	if id, ok := ws.lookup[first].get(h); ok {
		return id, true
	}
	for tier := range numTiers {
		if tier == first {
			continue
		}
		if id, ok := ws.lookup[tier].get(h); ok {
			return id, true
		}
	}
	return 0, false
}

// Apply applies one event. A Removed event naming unknown blocks still removes the
// others and reports ErrBlockNotFound.
func (t *Tree) Apply(ev *Event) error {
	if ev.Tier >= numTiers {
		return fmt.Errorf("%w: tier %d", ErrInvalidEvent, ev.Tier)
	}
	switch ev.Kind {
	case EventStored:
		return t.store(ev.Worker, ev.Tier, ev.Parent, ev.HasParent, ev.Blocks)
	case EventRemoved:
		return t.remove(ev.Worker, ev.Tier, ev.Hashes)
	case EventCleared:
		t.clearTier(ev.Worker, ev.Tier)
		return nil
	}
	return fmt.Errorf("%w: kind %d", ErrInvalidEvent, ev.Kind)
}

func (t *Tree) store(w WorkerKey, tier Tier, parent uint64, hasParent bool, blocks []Block) error {
	slot, known := t.slotOf(w)
	if hasParent && parent == 0 && !t.holdsExt(slot, known, tier, 0) {
		// Some publishers write 0 for "no parent" where vLLM writes nil: the
		// array encoding of llm-d-inference-sim does. A parent of 0 is read as
		// the root unless the worker holds a block whose engine hash is 0, which
		// a 64-bit hash makes a 2^-64 event.
		hasParent = false
	}
	if RepeatsExt(len(blocks), parent, hasParent, func(i int) uint64 { return blocks[i].Ext }, nil) {
		return fmt.Errorf("%w: repeated engine hash in a stored chain of worker %v", ErrInvalidBlockSequence, w)
	}
	cur := uint32(root)
	if hasParent {
		if !known {
			return fmt.Errorf("%w: worker %v holds no blocks (parent %d)", ErrParentNotFound, w, parent)
		}
		id, ok := t.findExt(&t.workers[slot], tier, parent)
		if !ok {
			return fmt.Errorf("%w: worker %v parent %d", ErrParentNotFound, w, parent)
		}
		cur = id
	}
	if len(blocks) == 0 {
		return nil
	}
	if !known {
		slot = t.slotFor(w)
	}
	lk := &t.workers[slot].lookup[tier]
	e := elemOf(slot, tier)
	for _, b := range blocks {
		c := t.child(cur, b.Local)
		if c == 0 {
			c = t.newChild(cur, b.Local)
		}
		if old, existed := lk.put(b.Ext, c); !existed {
			t.meta(c).refs++
		} else if old != c {
			// The engine reused a hash for other content: the handle moved;
			// drop the stale holding. reclaim cannot free cur or c: both are
			// held or named by an engine hash.
			t.meta(c).refs++
			t.meta(old).refs--
			t.setOwner(old, e, false)
			t.reclaim(old)
		}
		t.setOwner(c, e, true)
		cur = c
	}
	return nil
}

// holdsExt reports whether the worker in slot (known: it has one) holds a
// block with engine hash ext on tier.
func (t *Tree) holdsExt(slot uint32, known bool, tier Tier, ext uint64) bool {
	if !known {
		return false
	}
	_, ok := t.findExt(&t.workers[slot], tier, ext)
	return ok
}

func (t *Tree) remove(w WorkerKey, tier Tier, hashes []uint64) error {
	slot, known := t.slotOf(w)
	missing := 0
	e := elemOf(slot, tier)
	for i, h := range hashes {
		var id uint32
		ok := false
		if known {
			id, ok = t.workers[slot].lookup[tier].del(h)
		}
		if !ok {
			// A hash repeated within one event is not missing (Dynamo's batched
			// removal accepts [4, 2, 2]).
			if !slices.Contains(hashes[:i], h) {
				missing++
			}
			continue
		}
		t.meta(id).refs--
		t.setOwner(id, e, false)
		t.reclaim(id)
	}
	if missing > 0 {
		return fmt.Errorf("%w: worker %v: %d of %d removed blocks", ErrBlockNotFound, w, missing, len(hashes))
	}
	return nil
}

func (t *Tree) clearTier(w WorkerKey, tier Tier) {
	slot, ok := t.slots[w]
	if !ok {
		return
	}
	lk := &t.workers[slot].lookup[tier]
	e := elemOf(slot, tier)
	lk.all(func(_ uint64, id uint32) {
		t.meta(id).refs--
		t.setOwner(id, e, false)
		t.reclaim(id) // touches nodes only, never lk
	})
	*lk = handleMap{}
}

// Reserve sizes a worker rank's handle table for a tier to hold blocks entries,
// so the tree does not rehash it while the worker fills its cache. The catalog
// knows each worker's KV capacity (total_kv_blocks) when it registers.
func (t *Tree) Reserve(w WorkerKey, tier Tier, blocks int) {
	if tier >= numTiers || blocks <= 0 {
		return
	}
	slot := t.slotFor(w)
	t.workers[slot].lookup[tier].reserve(blocks)
}

// RemoveRank drops every block of one worker rank in every tier.
func (t *Tree) RemoveRank(w WorkerKey) {
	slot, ok := t.slots[w]
	if !ok {
		return
	}
	for tier := range numTiers {
		t.clearTier(w, tier)
	}
	if i, ok := t.keyPos(w); ok {
		t.byKey = slices.Delete(t.byKey, i, i+1)
	}
	delete(t.slots, w)
	t.lastOK = false
	t.workers[slot], t.keys[slot] = workerState{}, WorkerKey{}
	t.freeSlots = append(t.freeSlots, slot)
}

// RemoveWorker drops every rank of a worker (deregistration, lease loss).
func (t *Tree) RemoveWorker(workerID uint64) {
	var ranks []WorkerKey
	for w := range t.slots {
		if w.WorkerID == workerID {
			ranks = append(ranks, w)
		}
	}
	for _, w := range ranks {
		t.RemoveRank(w)
	}
}

// Held is how many blocks worker rank w holds in tier.
func (t *Tree) Held(w WorkerKey, tier Tier) int {
	s, ok := t.slots[w]
	if !ok {
		return 0
	}
	return t.workers[s].lookup[tier].len()
}

// Workers lists the worker ranks that have sent events to this tree.
func (t *Tree) Workers() []WorkerKey {
	out := make([]WorkerKey, 0, len(t.slots))
	for w := range t.slots {
		out = append(out, w)
	}
	return out
}

// Stats describe the tree's size.
type Stats struct {
	Nodes     int // live tree nodes, root excluded
	Entries   int // (block, worker rank, tier) entries
	OwnerSets int // distinct interned owner sets
	Workers   int // worker ranks with state
}

// Stats counts the tree's contents.
func (t *Tree) Stats() Stats {
	s := Stats{Nodes: int(t.used) - 1 - len(t.freeIDs), OwnerSets: t.sets.live, Workers: len(t.slots)}
	for _, ws := range t.workers {
		for i := range ws.lookup {
			s.Entries += ws.lookup[i].len()
		}
	}
	return s
}

// candidate is one worker rank still on the walk of a lookup.
type candidate struct {
	slot  uint32
	phase Tier   // tier whose run the worker is in
	start uint32 // depth at which that run began
	runs  [numTiers]uint32
}

// matchScratch is one lookup's working memory, pooled so lookups do not
// allocate: the candidates, kept sorted by slot like owner sets; the slot of
// each row emitted; and what putting the rows in key order takes.
type matchScratch struct {
	cands []candidate
	slots []uint32  // slots[i] is the slot of the lookup's i-th row
	at    []int32   // by slot: 1 + the index of its row; all zero between uses
	rows  []Overlap // the rows, copied out while they are reordered
}

var scratchPool = sync.Pool{New: func() any { return &matchScratch{cands: make([]candidate, 0, 64)} }}

// Match walks the query's local block hashes from the root and appends one
// Overlap per worker rank that holds at least the first block in some tier,
// in (worker id, dp rank) order. With earlyExit the walk stops once a single
// candidate remains, so that candidate's counts are lower bounds (Dynamo's
// early_exit).
func (t *Tree) Match(locals []uint64, earlyExit bool, dst []Overlap) []Overlap {
	sc := scratchPool.Get().(*matchScratch)
	cands, start := sc.cands[:0], len(dst)
	sc.slots = sc.slots[:0]
	// The walk inlines child(): along a cached chain the next node is the
	// current one's inline child, usually on the same page, so each block costs
	// one load and one compare.
	pages := t.pages
	curID := uint32(root)
	cur := &pages[0].hot[0]
	depth := uint32(0)
	prevSet := ^uint32(0)
	for _, h := range locals {
		c := cur.child
		var next *node
		if c != 0 {
			next = &pages[c>>pageShift].hot[c&pageMask]
			if next.hash != h {
				next = nil
			}
		}
		if next == nil {
			kids := pages[curID>>pageShift].meta[curID&pageMask].kids
			if kids <= 1 && (kids == 0 || c != 0) {
				break
			}
			if c = t.children[childKey{curID, h}]; c == 0 {
				break
			}
			next = &pages[c>>pageShift].hot[c&pageMask]
		}
		set := next.set
		if set != prevSet {
			elems := t.sets.elems(set)
			if prevSet == ^uint32(0) {
				cands = seed(cands, elems)
				// Every candidate emits at most one row: one allocation of
				// the right size instead of append's doublings, which cost
				// more than the walk when a prefix is on thousands of ranks
				// (kvbench scale).
				dst = slices.Grow(dst, len(cands))
			} else {
				cands, dst = t.advance(cands, elems, depth, dst, sc)
			}
			prevSet = set
			if len(cands) == 0 {
				break
			}
		}
		depth++
		cur, curID = next, c
		if earlyExit && len(cands) == 1 {
			break
		}
	}
	for i := range cands {
		dst = t.emit(&cands[i], depth, dst, sc)
	}
	sc.cands = cands
	t.orderRows(dst[start:], sc)
	scratchPool.Put(sc)
	return dst
}

// orderRows puts a lookup's rows (sc.slots names their slots) in key order.
// Candidates leave the walk as their runs end, so rows come out in no
// useful order. Few rows are sorted; many are placed by one pass over
// byKey, O(slots) rather than O(rows log rows).
func (t *Tree) orderRows(rows []Overlap, sc *matchScratch) {
	if len(rows) < 2 {
		return
	}
	if len(rows)*16 < len(t.byKey) {
		slices.SortFunc(rows, CompareOverlaps)
		return
	}
	if len(sc.at) < len(t.workers) {
		sc.at = make([]int32, len(t.workers))
	}
	at := sc.at
	for i, s := range sc.slots {
		at[s] = int32(i + 1)
	}
	sc.rows = append(sc.rows[:0], rows...)
	k := 0
	for _, s := range t.byKey {
		if i := at[s]; i != 0 {
			rows[k] = sc.rows[i-1]
			at[s] = 0
			k++
		}
	}
	if k != len(rows) {
		// A row of a slot byKey does not list: byKey is out of step with
		// the slots, a bug, but the rows are still the answer.
		for _, s := range sc.slots {
			at[s] = 0
		}
		copy(rows, sc.rows)
		slices.SortFunc(rows, CompareOverlaps)
	}
}

// seed starts a candidate for every slot in the first node's owner set, in the
// first tier it holds that block in.
func seed(cands []candidate, elems []ownerElem) []candidate {
	for i := 0; i < len(elems); {
		slot := elemSlot(elems[i])
		cands = append(cands, candidate{slot: slot, phase: elemTier(elems[i])})
		for i < len(elems) && elemSlot(elems[i]) == slot {
			i++
		}
	}
	return cands
}

// advance updates the candidates at a node whose owner set differs from the
// previous node's: a candidate whose current tier is missing moves on to the next
// tier it holds this block in (Device → Host → Disk → External) or drops out.
func (t *Tree) advance(cands []candidate, elems []ownerElem, depth uint32, dst []Overlap, sc *matchScratch) ([]candidate, []Overlap) {
	j, kept := 0, 0
	for i := range cands {
		c := cands[i]
		for j < len(elems) && elemSlot(elems[j]) < c.slot {
			j++
		}
		var mask uint8
		for k := j; k < len(elems) && elemSlot(elems[k]) == c.slot; k++ {
			mask |= 1 << elemTier(elems[k])
		}
		if mask&(1<<c.phase) == 0 {
			c.runs[c.phase] = depth - c.start
			p := c.phase + 1
			for p < numTiers && mask&(1<<p) == 0 {
				p++
			}
			if p == numTiers {
				c.phase = numTiers
				dst = t.emit(&c, depth, dst, sc)
				continue
			}
			c.phase, c.start = p, depth
		}
		cands[kept] = c
		kept++
	}
	return cands[:kept], dst
}

func (t *Tree) emit(c *candidate, depth uint32, dst []Overlap, sc *matchScratch) []Overlap {
	sc.slots = append(sc.slots, c.slot)
	if c.phase < numTiers {
		c.runs[c.phase] = depth - c.start
		c.phase = numTiers
	}
	// The key comes from the packed keys, not the worker's state: a lookup
	// that matches thousands of ranks would miss the cache on each.
	return append(dst, Overlap{
		Worker:   t.keys[c.slot],
		Device:   c.runs[TierDevice],
		Host:     c.runs[TierHostPinned],
		Disk:     c.runs[TierDisk],
		External: c.runs[TierExternal],
	})
}
