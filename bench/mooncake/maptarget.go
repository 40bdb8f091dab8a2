package mooncake

import "fmt"

// MapTarget is a reference Target made of plain maps: per worker, the cached
// blocks by Ext hash and, for prefix matching, the child of each (parent,
// local hash) edge. Match walks every worker's chain from the root, so it
// costs O(workers × prefix) and is meant for checking, not for speed.
//
// MapTarget also audits the event stream: a Store under a parent the worker
// does not hold, a Store of a block already held, a Remove of a block not
// held, or a Remove of a block that still has cached children is recorded in
// Errs (the offending block is skipped, except that a Remove of a block with
// children still removes it).
type MapTarget struct {
	workers []*mapWorker
	Errs    []error
}

type mapWorker struct {
	blocks map[uint64]*mapBlock // by Ext
	kids   map[edge]uint64      // (parent, local) -> child Ext
}

type mapBlock struct {
	BlockInfo
	children int
}

// edge names a child slot: the parent's Ext (when hasParent) and the
// child's local hash.
type edge struct {
	parent    uint64
	hasParent bool
	local     uint64
}

// NewMapTarget returns an empty MapTarget.
func NewMapTarget() *MapTarget { return &MapTarget{} }

// Name implements Target.
func (m *MapTarget) Name() string { return "map" }

func (m *MapTarget) worker(w int) *mapWorker {
	for len(m.workers) <= w {
		m.workers = append(m.workers, &mapWorker{blocks: map[uint64]*mapBlock{}, kids: map[edge]uint64{}})
	}
	return m.workers[w]
}

func (m *MapTarget) errorf(format string, args ...any) {
	m.Errs = append(m.Errs, fmt.Errorf(format, args...))
}

// Store implements Target.
func (m *MapTarget) Store(worker int, parent uint64, hasParent bool, blocks []Block) {
	wk := m.worker(worker)
	for i, b := range blocks {
		var p *mapBlock
		if hasParent {
			if p = wk.blocks[parent]; p == nil {
				m.errorf("worker %d: store of %#x under unknown parent %#x (dropping %d blocks)", worker, b.Ext, parent, len(blocks)-i)
				return
			}
		}
		if _, dup := wk.blocks[b.Ext]; dup {
			m.errorf("worker %d: store of %#x, already held", worker, b.Ext)
		} else {
			if p != nil {
				p.children++
			}
			wk.blocks[b.Ext] = &mapBlock{BlockInfo: BlockInfo{Local: b.Local, Parent: parent, HasParent: hasParent}}
			wk.kids[edge{parent, hasParent, b.Local}] = b.Ext
		}
		parent, hasParent = b.Ext, true
	}
}

// Remove implements Target.
func (m *MapTarget) Remove(worker int, exts []uint64) {
	wk := m.worker(worker)
	for _, ext := range exts {
		b, ok := wk.blocks[ext]
		if !ok {
			m.errorf("worker %d: remove of %#x, not held", worker, ext)
			continue
		}
		if b.children > 0 {
			m.errorf("worker %d: remove of %#x, which has %d cached children", worker, ext, b.children)
		}
		delete(wk.blocks, ext)
		e := edge{b.Parent, b.HasParent, b.Local}
		if wk.kids[e] == ext {
			delete(wk.kids, e)
		}
		if b.HasParent {
			if p, ok := wk.blocks[b.Parent]; ok {
				p.children--
			}
		}
	}
}

// Overlap returns the number of leading locals worker holds as a chain
// from the root.
func (m *MapTarget) Overlap(worker int, locals []uint64) int {
	if worker >= len(m.workers) {
		return 0
	}
	wk := m.workers[worker]
	var parent uint64
	hasParent := false
	for i, l := range locals {
		ext, ok := wk.kids[edge{parent, hasParent, l}]
		if !ok {
			return i
		}
		parent, hasParent = ext, true
	}
	return len(locals)
}

// Overlaps returns Overlap for workers 0..n-1.
func (m *MapTarget) Overlaps(n int, locals []uint64) []int {
	out := make([]int, n)
	for w := range out {
		out[w] = m.Overlap(w, locals)
	}
	return out
}

// Match implements Target.
func (m *MapTarget) Match(locals []uint64) int {
	n := 0
	for w := range m.workers {
		if m.Overlap(w, locals) > 0 {
			n++
		}
	}
	return n
}

// Len returns the number of blocks worker holds.
func (m *MapTarget) Len(worker int) int {
	if worker >= len(m.workers) {
		return 0
	}
	return len(m.workers[worker].blocks)
}

// Snapshot returns the blocks worker holds, keyed by Ext hash.
func (m *MapTarget) Snapshot(worker int) map[uint64]BlockInfo {
	out := map[uint64]BlockInfo{}
	if worker < len(m.workers) {
		for ext, b := range m.workers[worker].blocks {
			out[ext] = b.BlockInfo
		}
	}
	return out
}

var _ Target = (*MapTarget)(nil)
