// Package kvtarget adapts kvselect's KV index (selection/index) to the Mooncake
// replay driver's Target interface, so the benchmarks drive the product's index
// exactly as the KV-event listeners and the scheduler will.
package kvtarget

import (
	"fmt"

	"github.com/kvselect/kvselect/bench/mooncake"
	"github.com/kvselect/kvselect/selection/index"
)

// Target is a mooncake.Target over one index partition. Worker n of the replay
// is index worker rank {n, 0}. It is not safe for concurrent use (it reuses
// buffers), matching the driver, which calls from one goroutine.
type Target struct {
	ix      *index.Index
	blocks  []index.Block
	matches []index.Overlap
	errs    int
}

// New returns a target over a fresh event-driven index.
func New(blockSize uint32) (*Target, error) {
	ix, err := index.New(index.Config{BlockSize: blockSize})
	if err != nil {
		return nil, fmt.Errorf("kvtarget: %w", err)
	}
	return &Target{ix: ix}, nil
}

// Reserve pre-sizes the index for workers 0..workers-1 holding up to blocks
// each, as the selection service does from each worker's registered
// total_kv_blocks.
func (t *Target) Reserve(workers, blocks int) {
	for w := range workers {
		t.ix.Reserve(index.WorkerKey{WorkerID: uint64(w)}, index.TierDevice, blocks)
	}
}

// Name identifies the target in result tables.
func (t *Target) Name() string { return "kvselect" }

// Index exposes the underlying index (for statistics).
func (t *Target) Index() *index.Index { return t.ix }

// Errors counts events the index rejected; a correct replay has none.
func (t *Target) Errors() int { return t.errs }

// Store applies a Stored event.
func (t *Target) Store(worker int, parent uint64, hasParent bool, blocks []mooncake.Block) {
	t.blocks = t.blocks[:0]
	for _, b := range blocks {
		t.blocks = append(t.blocks, index.Block{Ext: b.Ext, Local: b.Local})
	}
	ev := index.Event{Worker: index.WorkerKey{WorkerID: uint64(worker)}, Kind: index.EventStored,
		Parent: parent, HasParent: hasParent, Blocks: t.blocks}
	if err := t.ix.Apply(&ev); err != nil {
		t.errs++
	}
}

// Remove applies a Removed event.
func (t *Target) Remove(worker int, exts []uint64) {
	ev := index.Event{Worker: index.WorkerKey{WorkerID: uint64(worker)}, Kind: index.EventRemoved, Hashes: exts}
	if err := t.ix.Apply(&ev); err != nil {
		t.errs++
	}
}

// Match returns how many workers hold a prefix of locals.
func (t *Target) Match(locals []uint64) int {
	t.matches = t.ix.Match(locals, false, t.matches[:0])
	return len(t.matches)
}

// Overlaps returns the per-worker device overlap of the last Match, for
// comparing targets.
func (t *Target) Overlaps() map[int]int {
	out := make(map[int]int, len(t.matches))
	for _, o := range t.matches {
		out[int(o.Worker.WorkerID)] = int(o.Device)
	}
	return out
}
