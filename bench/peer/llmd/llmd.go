// Package llmd adapts llm-d-kv-cache-manager's in-memory KV-block index
// (pkg/kvcache/kvblock.InMemoryIndex, v0.3.2) to the mooncake replay
// driver's Target interface, so that kvselect can be measured side by side
// with it on the same event stream.
//
// # How events map onto llm-d
//
// llm-d's index is a flat map from a block key to the set of pods holding
// the block. Its key is the block hash the router computes from the prompt
// tokens, chained over the prefix (ChunkedTokenDatabase: hash(parent,
// tokens)), and llm-d expects engines to publish the same hashes (their
// PYTHONHASHSEED aligned with the router's). The index has no notion of an
// engine-side hash distinct from the router's key, nor of parent links: a
// Stored event's parent is only used here to continue the key chain.
//
// The mooncake engines publish per-worker engine hashes (Block.Ext) next to
// the router's per-block content hash (Block.Local). The adapter therefore
// keys llm-d by a hash computed from the locals:
//
//   - ChainedKeys (default): key_i = mix(key_{i-1}, local_i), the prefix
//     hash llm-d's router would compute: equal keys mean equal prefixes.
//   - LocalKeys: key_i = local_i, unchained. Exact only when a block's
//     content determines its prefix, as in the Mooncake traces (every hash
//     id there has a single parent); otherwise Lookup gives false positives
//     for equal blocks under different prefixes.
//
// Remove receives engine hashes, which llm-d cannot resolve, so the adapter
// keeps, per worker, a map from engine hash to key (and, with LocalKeys, a
// reference count per key, since two cached blocks of one worker may share a
// key). That map, and computing keys for Store and Match, are adapter costs
// that a native llm-d deployment does not pay in the index (it pays hashing
// in the router instead, with SHA-256 over CBOR, far more than here).
//
// # Match
//
// Match does what llm-d's Indexer.GetPodScores does after tokenization:
// one InMemoryIndex.Lookup of all the request's keys with an empty pod
// filter, then longest-prefix scoring as kvcache.LongestPrefixScorer does
// (pods holding the first key score 1, and the set of active pods is
// intersected with each next key's pods, every survivor scoring one more).
// The scorer is reimplemented here because package kvcache links the
// tokenizers C library; Match returns the number of pods with a score above
// zero.
package llmd

import (
	"context"
	"fmt"
	"strconv"

	"github.com/llm-d/llm-d-kv-cache-manager/pkg/kvcache/kvblock"

	"github.com/kvselect/kvselect/bench/mooncake"
)

// KeyMode chooses how llm-d block keys are derived from local hashes.
type KeyMode int

const (
	// ChainedKeys keys each block by a hash of its whole prefix of locals.
	ChainedKeys KeyMode = iota
	// LocalKeys keys each block by its local hash alone.
	LocalKeys
)

func (m KeyMode) String() string {
	switch m {
	case ChainedKeys:
		return "chained"
	case LocalKeys:
		return "local"
	}
	return "KeyMode(" + strconv.Itoa(int(m)) + ")"
}

// ModelName is the model name in every llm-d key.
const ModelName = "mooncake"

// DeviceTier is the device tier of every pod entry.
const DeviceTier = "gpu"

// PodName returns the llm-d pod identifier of a worker: "worker-N".
func PodName(worker int) string { return "worker-" + strconv.Itoa(worker) }

// Target is a mooncake.Target backed by a kvblock.InMemoryIndex.
// It is not safe for concurrent use (llm-d's index is; the adapter's maps
// are not).
type Target struct {
	idx     *kvblock.InMemoryIndex
	ctx     context.Context
	mode    KeyMode
	pods    []string
	entries [][]kvblock.PodEntry // one single-entry slice per worker
	workers []*workerKeys
	keys    []kvblock.Key // scratch

	// Anomalies counts events the adapter could not map: a Remove of an
	// engine hash it never stored, or a Store under an unknown parent
	// (keyed as if the parent were the root). Both mean an inconsistent
	// event stream; the mooncake engines produce neither.
	Anomalies int
}

type workerKeys struct {
	keyOf map[uint64]uint64 // engine hash -> llm-d chunk hash
	refs  map[uint64]int32  // LocalKeys only: cached blocks per chunk hash
}

// New returns an empty target for the given number of workers.
//
// llm-d's InMemoryIndex keeps at most PodCacheSize pods per key (10 by
// default), silently dropping the least recently added pod beyond that;
// New sets it to workers so that no pod is lost, and keeps the default
// global key capacity (1e8 keys, also LRU).
func New(workers int, mode KeyMode) (*Target, error) {
	if workers <= 0 {
		return nil, fmt.Errorf("llmd: need at least one worker, got %d", workers)
	}
	cfg := kvblock.DefaultInMemoryIndexConfig()
	cfg.PodCacheSize = max(cfg.PodCacheSize, workers)
	idx, err := kvblock.NewInMemoryIndex(cfg)
	if err != nil {
		return nil, fmt.Errorf("llmd: %w", err)
	}
	t := &Target{
		idx:     idx,
		ctx:     context.Background(),
		mode:    mode,
		pods:    make([]string, workers),
		entries: make([][]kvblock.PodEntry, workers),
		workers: make([]*workerKeys, workers),
	}
	for w := range workers {
		t.pods[w] = PodName(w)
		t.entries[w] = []kvblock.PodEntry{{PodIdentifier: t.pods[w], DeviceTier: DeviceTier}}
		t.workers[w] = &workerKeys{keyOf: map[uint64]uint64{}}
		if mode == LocalKeys {
			t.workers[w].refs = map[uint64]int32{}
		}
	}
	return t, nil
}

// Name implements mooncake.Target.
func (t *Target) Name() string { return "llm-d/" + t.mode.String() }

// Index returns the underlying llm-d index.
func (t *Target) Index() *kvblock.InMemoryIndex { return t.idx }

// rootKey starts every key chain (llm-d hashes its HashSeed for this).
const rootKey = 0x6c6c6d2d64000001

func chainKey(prev, local uint64) uint64 {
	return mooncake.Mix64(prev ^ (local * 0x9e3779b97f4a7c15))
}

func (t *Target) key(prev, local uint64) uint64 {
	if t.mode == LocalKeys {
		return local
	}
	return chainKey(prev, local)
}

// Store implements mooncake.Target: one InMemoryIndex.Add of all the
// blocks' keys for the worker's pod entry, as llm-d's event pool does for a
// BlockStored event.
func (t *Target) Store(worker int, parent uint64, hasParent bool, blocks []mooncake.Block) {
	if len(blocks) == 0 {
		return
	}
	wk := t.workers[worker]
	prev := uint64(rootKey)
	if hasParent {
		k, ok := wk.keyOf[parent]
		if ok {
			prev = k
		} else {
			t.Anomalies++
		}
	}
	keys := t.keys[:0]
	for _, b := range blocks {
		k := t.key(prev, b.Local)
		if _, dup := wk.keyOf[b.Ext]; !dup {
			wk.keyOf[b.Ext] = k
			if wk.refs != nil {
				wk.refs[k]++
			}
		}
		keys = append(keys, kvblock.Key{ModelName: ModelName, ChunkHash: k})
		prev = k
	}
	t.keys = keys
	if err := t.idx.Add(t.ctx, keys, t.entries[worker]); err != nil {
		panic(fmt.Sprintf("llmd: Add: %v", err)) // only for empty keys or entries
	}
}

// Remove implements mooncake.Target: one InMemoryIndex.Evict per block, as
// llm-d's event pool does for a BlockRemoved event, after mapping the
// engine hash back to its key.
func (t *Target) Remove(worker int, exts []uint64) {
	wk := t.workers[worker]
	for _, ext := range exts {
		k, ok := wk.keyOf[ext]
		if !ok {
			t.Anomalies++
			continue
		}
		delete(wk.keyOf, ext)
		if wk.refs != nil {
			if wk.refs[k]--; wk.refs[k] > 0 {
				continue // another cached block of this worker has the key
			}
			delete(wk.refs, k)
		}
		key := kvblock.Key{ModelName: ModelName, ChunkHash: k}
		if err := t.idx.Evict(t.ctx, key, t.entries[worker]); err != nil {
			panic(fmt.Sprintf("llmd: Evict: %v", err)) // only for empty entries
		}
	}
}

// Match implements mooncake.Target.
func (t *Target) Match(locals []uint64) int {
	return len(t.Scores(locals))
}

// Scores returns llm-d's longest-prefix score (matched blocks) for every pod
// that holds at least the first block of the request.
func (t *Target) Scores(locals []uint64) map[string]int {
	if len(locals) == 0 {
		return nil // llm-d's Lookup rejects an empty key list
	}
	keys := t.keys[:0]
	prev := uint64(rootKey)
	for _, l := range locals {
		k := t.key(prev, l)
		keys = append(keys, kvblock.Key{ModelName: ModelName, ChunkHash: k})
		prev = k
	}
	t.keys = keys
	keyToPods, err := t.idx.Lookup(t.ctx, keys, nil)
	if err != nil {
		panic(fmt.Sprintf("llmd: Lookup: %v", err)) // only for empty keys
	}
	return longestPrefixScores(keys, keyToPods)
}

// longestPrefixScores mirrors kvcache.LongestPrefixScorer.Score of
// llm-d-kv-cache-manager v0.3.2.
func longestPrefixScores(keys []kvblock.Key, keyToPods map[kvblock.Key][]string) map[string]int {
	scores := make(map[string]int)
	if len(keys) == 0 {
		return scores
	}
	active := make(map[string]struct{})
	for _, pod := range keyToPods[keys[0]] {
		active[pod] = struct{}{}
		scores[pod] = 1
	}
	for _, key := range keys[1:] {
		if len(active) == 0 {
			break
		}
		holders := make(map[string]struct{}, len(keyToPods[key]))
		for _, pod := range keyToPods[key] {
			holders[pod] = struct{}{}
		}
		for pod := range active {
			if _, ok := holders[pod]; ok {
				scores[pod]++
			} else {
				delete(active, pod)
			}
		}
	}
	return scores
}

var _ mooncake.Target = (*Target)(nil)
