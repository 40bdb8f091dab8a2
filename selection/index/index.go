package index

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// Cache policies of the approximate indexer (router_approximate_cache_policy).
const (
	PolicyTTL = "ttl"
	PolicyLRU = "lru"
)

// DefaultTTL is router_ttl_secs' default: how long a routing decision stays in
// the approximate index.
const DefaultTTL = 120 * time.Second

// ErrConfig is wrapped by every configuration error of New.
var ErrConfig = errors.New("invalid index configuration")

// Config selects the indexing mode of one partition, as Dynamo resolves it from
// the router config: event-driven (use_kv_events, the default), event-driven
// plus a predict-on-route side index (router_predicted_ttl_secs), or
// approximate, where routing decisions stand in for KV events and expire.
type Config struct {
	// BlockSize is the partition's KV block size in tokens (> 0). The index works
	// on block hashes; the size is kept for dumps and hash computation.
	BlockSize uint32
	// Approximate is use_kv_events=false: no KV events; routing decisions are
	// recorded into the primary index and expire after TTL.
	Approximate bool
	// TTL is router_ttl_secs for the approximate primary (DefaultTTL when zero).
	TTL time.Duration
	// PredictedTTL is DYN_ROUTER_PREDICTED_TTL_SECS: with KV events, routing
	// decisions go into a side index with this TTL, merged into device scores by
	// per-worker max. Zero disables it. Requires KV events.
	PredictedTTL time.Duration
	// CachePolicy is router_approximate_cache_policy: PolicyTTL (default) or
	// PolicyLRU, which is rejected with KV events and falls back to TTL without.
	CachePolicy string
}

// Validate checks the configuration and returns warnings about settings that
// are accepted but not honoured as asked.
func (c Config) Validate() (warnings []string, err error) {
	if c.BlockSize == 0 {
		return nil, fmt.Errorf("%w: block size must be positive", ErrConfig)
	}
	if c.TTL < 0 || c.PredictedTTL < 0 {
		return nil, fmt.Errorf("%w: TTLs must not be negative", ErrConfig)
	}
	switch c.CachePolicy {
	case "", PolicyTTL:
	case PolicyLRU:
		if !c.Approximate {
			return nil, fmt.Errorf("%w: router_approximate_cache_policy=lru requires use_kv_events=false", ErrConfig)
		}
		warnings = append(warnings, "router_approximate_cache_policy=lru is not supported by the standalone selector; using ttl retention")
	default:
		return nil, fmt.Errorf("%w: unknown approximate cache policy %q (want ttl or lru)", ErrConfig, c.CachePolicy)
	}
	if c.Approximate && c.PredictedTTL > 0 {
		return nil, fmt.Errorf("%w: a predicted TTL (DYN_ROUTER_PREDICTED_TTL_SECS) requires use_kv_events=true", ErrConfig)
	}
	return warnings, nil
}

// Index is the KV index of one partition (model name, routing group): the primary
// tree fed by KV events (or by routing decisions in approximate mode), and the
// optional predict-on-route side tree.
//
// Concurrency: one sync.RWMutex per partition. Lookups take the read lock and run
// in parallel; event application takes the write lock for one event or one batch.
// Partitions are independent, so events for different models never contend. A
// write holds the lock for the time it takes to apply its blocks (≈100 ns per
// block, docs/kv-index.md), which bounds how long a lookup can wait. The index does
// no I/O, starts no goroutine and reads no clock: callers pass the time in.
type Index struct {
	cfg Config

	mu      sync.RWMutex
	primary *Tree
	side    *Tree       // nil unless PredictedTTL > 0
	ttl     *ttlTracker // expiry of recorded routing decisions: primary (approximate) or side
	sink    uint32      // what Tree.warm read, kept so that its reads are not dropped
}

// New builds an empty index.
func New(cfg Config) (*Index, error) {
	if _, err := cfg.Validate(); err != nil {
		return nil, err
	}
	ix := &Index{cfg: cfg, primary: NewTree()}
	switch {
	case cfg.Approximate:
		ttl := cfg.TTL
		if ttl == 0 {
			ttl = DefaultTTL
		}
		ix.ttl = newTTLTracker(ttl)
	case cfg.PredictedTTL > 0:
		ix.side = NewTree()
		ix.ttl = newTTLTracker(cfg.PredictedTTL)
	}
	return ix, nil
}

// Config returns the configuration the index was built with.
func (ix *Index) Config() Config { return ix.cfg }

// Apply applies one KV event to the primary tree.
func (ix *Index) Apply(ev *Event) error {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.primary.Apply(ev)
}

// ApplyBatch applies events in order under one lock acquisition and returns how
// many failed, with the first failure (errors.Is works on it).
func (ix *Index) ApplyBatch(evs []Event) (failed int, first error) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.sink += ix.primary.warm(evs)
	for i := range evs {
		if err := ix.primary.Apply(&evs[i]); err != nil {
			failed++
			if first == nil {
				first = err
			}
		}
	}
	return failed, first
}

// RecordRouting records that a request with these local block hashes and router
// sequence hashes was booked on worker w at now: into the primary in
// approximate mode, into the side index with a predicted TTL, nowhere otherwise.
// It reports whether the decision was recorded.
func (ix *Index) RecordRouting(now time.Time, w WorkerKey, locals, seqs []uint64) (bool, error) {
	if ix.ttl == nil {
		return false, nil
	}
	n := min(len(locals), len(seqs))
	if n == 0 {
		return false, nil
	}
	blocks := make([]Block, n)
	for i := range n {
		blocks[i] = Block{Ext: seqs[i], Local: locals[i]}
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	tree := ix.primary
	if ix.side != nil {
		tree = ix.side
	}
	ev := Event{Worker: w, Kind: EventStored, Blocks: blocks}
	if err := tree.Apply(&ev); err != nil {
		return false, fmt.Errorf("record routing decision: %w", err)
	}
	ix.ttl.touch(now, w, seqs[:n])
	return true, nil
}

// Expire removes recorded routing decisions whose TTL ran out by now and returns
// how many blocks it removed. The caller's timer drives it (Dynamo's prune
// manager); until then expired entries still count.
func (ix *Index) Expire(now time.Time) int {
	if ix.ttl == nil {
		return 0
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	tree := ix.primary
	if ix.side != nil {
		tree = ix.side
	}
	return ix.ttl.expired(now, func(k ttlKey) {
		_ = tree.remove(k.worker, TierDevice, []uint64{k.ext})
	})
}

// Match appends the overlap of every worker rank that holds a prefix of locals,
// in (worker id, dp rank) order. With a side index, a worker's device count is
// the max of the two trees, and the workers only the side tree matched follow
// the primary's rows, in their own order.
func (ix *Index) Match(locals []uint64, earlyExit bool, dst []Overlap) []Overlap {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	start := len(dst)
	dst = ix.primary.Match(locals, earlyExit, dst)
	if ix.side == nil {
		return dst
	}
	n := len(dst)
	dst = ix.side.Match(locals, earlyExit, dst)
	// Merge the side rows into the primary rows by worker; a handful of candidates,
	// so a nested scan is cheaper than a map.
	out := n
	for _, s := range dst[n:] {
		merged := false
		for i := start; i < n; i++ {
			if dst[i].Worker == s.Worker {
				dst[i].Device = max(dst[i].Device, s.Device)
				merged = true
				break
			}
		}
		if !merged {
			dst[out] = Overlap{Worker: s.Worker, Device: s.Device}
			out++
		}
	}
	return dst[:out]
}

// Held is how many blocks worker rank w holds in tier of the primary tree
// (Dynamo's tree size, for the device tier).
func (ix *Index) Held(w WorkerKey, tier Tier) int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.primary.Held(w, tier)
}

// Reserve pre-sizes a worker rank's engine-hash table in the primary tree for
// blocks entries of a tier (for instance the worker's total_kv_blocks on the
// device), so filling the cache never rehashes it under the write lock.
func (ix *Index) Reserve(w WorkerKey, tier Tier, blocks int) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.primary.Reserve(w, tier, blocks)
}

// RemoveWorker drops every rank of a worker from all trees.
func (ix *Index) RemoveWorker(workerID uint64) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.primary.RemoveWorker(workerID)
	if ix.side != nil {
		ix.side.RemoveWorker(workerID)
	}
	if ix.ttl != nil {
		ix.ttl.forget(func(w WorkerKey) bool { return w.WorkerID == workerID })
	}
}

// RemoveRank drops one worker rank from all trees.
func (ix *Index) RemoveRank(w WorkerKey) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.primary.RemoveRank(w)
	if ix.side != nil {
		ix.side.RemoveRank(w)
	}
	if ix.ttl != nil {
		ix.ttl.forget(func(k WorkerKey) bool { return k == w })
	}
}

// Stats reports the primary tree's size.
func (ix *Index) Stats() Stats {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.primary.Stats()
}
