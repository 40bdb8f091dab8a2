package index

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"
)

// Partition names one index: selection, indexing and load state are scoped by
// model name and routing group.
type Partition struct {
	Model        string
	RoutingGroup string
}

// Key is the partition's /dump key.
func (p Partition) Key() string { return PartitionKey(p.Model, p.RoutingGroup) }

// Partitions holds one Index per partition. A partition's block size is fixed
// when it is created; every later user must agree with it.
type Partitions struct {
	base Config // mode settings shared by every partition; BlockSize is per partition

	mu    sync.RWMutex
	byKey map[Partition]*Index
}

// NewPartitions validates the mode settings (base.BlockSize is ignored) and
// returns an empty set.
func NewPartitions(base Config) (*Partitions, error) {
	probe := base
	probe.BlockSize = 1
	if _, err := probe.Validate(); err != nil {
		return nil, err
	}
	return &Partitions{base: base, byKey: make(map[Partition]*Index)}, nil
}

// Get returns the partition's index, or nil.
func (ps *Partitions) Get(p Partition) *Index {
	ps.mu.RLock()
	defer ps.mu.RUnlock()
	return ps.byKey[p]
}

// Ensure returns the partition's index, creating it with blockSize. An existing
// partition with another block size is an error: its hashes would not compare.
func (ps *Partitions) Ensure(p Partition, blockSize uint32) (*Index, error) {
	if ix := ps.Get(p); ix != nil {
		if got := ix.cfg.BlockSize; got != blockSize {
			return nil, fmt.Errorf("%w: partition %s has block size %d, not %d", ErrConfig, p.Key(), got, blockSize)
		}
		return ix, nil
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ix := ps.byKey[p]; ix != nil { // lost a race with another creator
		if got := ix.cfg.BlockSize; got != blockSize {
			return nil, fmt.Errorf("%w: partition %s has block size %d, not %d", ErrConfig, p.Key(), got, blockSize)
		}
		return ix, nil
	}
	cfg := ps.base
	cfg.BlockSize = blockSize
	ix, err := New(cfg)
	if err != nil {
		return nil, fmt.Errorf("partition %s: %w", p.Key(), err)
	}
	ps.byKey[p] = ix
	return ix, nil
}

// Remove drops a partition and its index.
func (ps *Partitions) Remove(p Partition) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	delete(ps.byKey, p)
}

// List returns the partitions, sorted.
func (ps *Partitions) List() []Partition {
	ps.mu.RLock()
	keys := slices.Collect(maps.Keys(ps.byKey))
	ps.mu.RUnlock()
	slices.SortFunc(keys, func(a, b Partition) int {
		return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.RoutingGroup, b.RoutingGroup))
	})
	return keys
}

// Dump snapshots every partition (GET /dump).
func (ps *Partitions) Dump() Dump {
	d := make(Dump)
	for _, p := range ps.List() {
		if ix := ps.Get(p); ix != nil {
			d[p.Key()] = ix.Snapshot()
		}
	}
	return d
}

// RestoreResult reports what Restore did per partition.
type RestoreResult struct {
	Partition Partition
	Events    int
	Failed    int
	Err       error // the first failure, or why the partition was skipped
}

// Restore replays a dump (startup recovery from a peer): each key is split at
// its first ':' into model and routing group, the partition is created with the
// dump's block size, and its events are applied. A partition that exists with
// another block size is skipped with an error in its result.
func (ps *Partitions) Restore(now time.Time, d Dump) []RestoreResult {
	keys := slices.Sorted(maps.Keys(d))
	out := make([]RestoreResult, 0, len(keys))
	for _, k := range keys {
		pd := d[k]
		model, group, err := SplitPartitionKey(k)
		r := RestoreResult{Partition: Partition{model, group}, Events: len(pd.Events)}
		if err == nil {
			var ix *Index
			if ix, err = ps.Ensure(r.Partition, pd.BlockSize); err == nil {
				r.Failed, err = ix.Replay(now, pd.Events)
			}
		}
		r.Err = err
		out = append(out, r)
	}
	return out
}
