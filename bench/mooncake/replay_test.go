package mooncake

import (
	"maps"
	"sync"
	"testing"
)

var (
	traceOnce sync.Once
	traceReqs []Request
	traceErr  error
)

// shipped returns the first n requests of the shipped trace.
func shipped(t *testing.T, n int) []Request {
	t.Helper()
	traceOnce.Do(func() { traceReqs, traceErr = LoadTrace(shippedTrace) })
	if traceErr != nil {
		t.Fatal(traceErr)
	}
	return traceReqs[:min(n, len(traceReqs))]
}

// auditTarget wraps MapTarget and checks capacity after every event.
type auditTarget struct {
	*MapTarget
	t        *testing.T
	capacity int
	matches  int
}

func (a *auditTarget) Store(w int, parent uint64, hasParent bool, blocks []Block) {
	a.MapTarget.Store(w, parent, hasParent, blocks)
	if n := a.Len(w); n > a.capacity {
		a.t.Fatalf("worker %d holds %d blocks, capacity %d", w, n, a.capacity)
	}
}

func (a *auditTarget) Match(locals []uint64) int {
	a.matches++
	return a.MapTarget.Match(locals)
}

func TestReplayConsistency(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		n    int // requests loaded from the trace
	}{
		{"round-robin", Config{Workers: 8, BlocksPerWorker: 300}, 3000},
		{"round-robin batched", Config{Workers: 8, BlocksPerWorker: 300, BatchRemovals: true}, 3000},
		{"prefix-hash", Config{Workers: 8, BlocksPerWorker: 200, Assign: AssignPrefixHash}, 3000},
		{"prefix-hash one block", Config{Workers: 4, BlocksPerWorker: 500, Assign: AssignPrefixHash, PrefixBlocks: 1}, 1000},
		{"random", Config{Workers: 5, BlocksPerWorker: 250, Assign: AssignRandom, Seed: 42}, 3000},
		{"duplicated and capped", Config{Workers: 6, BlocksPerWorker: 400, TraceDuplication: 3, MaxRequests: 2500}, 1000},
		{"tiny pool", Config{Workers: 3, BlocksPerWorker: 16}, 500},
		{"no eviction", Config{Workers: 4, BlocksPerWorker: 1 << 20}, 500},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reqs := shipped(t, tc.n)
			w := Prepare(tc.cfg, reqs)
			cfg := w.Config()
			wantReqs := len(reqs) * cfg.TraceDuplication
			if cfg.MaxRequests > 0 {
				wantReqs = min(wantReqs, cfg.MaxRequests)
			}
			target := &auditTarget{MapTarget: NewMapTarget(), t: t, capacity: cfg.BlocksPerWorker}
			res := w.Run(target)

			if len(target.Errs) > 0 {
				t.Fatalf("%d inconsistent events, first: %v", len(target.Errs), target.Errs[0])
			}
			cached := 0
			for i, e := range w.Engines() {
				if !maps.Equal(e.Snapshot(), target.Snapshot(i)) {
					t.Fatalf("worker %d: engine holds %d blocks, index %d, contents differ", i, e.Len(), target.Len(i))
				}
				cached += e.Len()
			}
			if res.Requests != wantReqs || res.Lookups != wantReqs || target.matches != wantReqs {
				t.Errorf("requests %d, lookups %d, Match calls %d; want %d", res.Requests, res.Lookups, target.matches, wantReqs)
			}
			if res.StoredBlocks-res.RemovedBlocks != cached {
				t.Errorf("stored %d - removed %d != %d cached", res.StoredBlocks, res.RemovedBlocks, cached)
			}
			if res.BlockEvents != res.StoredBlocks+res.RemovedBlocks {
				t.Errorf("BlockEvents %d", res.BlockEvents)
			}
			if !cfg.BatchRemovals && res.RemoveEvents != res.RemovedBlocks {
				t.Errorf("unbatched: %d Removed events for %d blocks", res.RemoveEvents, res.RemovedBlocks)
			}
			if cfg.BlocksPerWorker < 1<<20 && res.RemovedBlocks == 0 {
				t.Error("no evictions: pool too large for this case")
			}
			if res.Target != "map" || res.Wall <= 0 || res.OpsPerSec <= 0 || res.BlockOpsPerSec <= 0 {
				t.Errorf("bad timing fields: %+v", res)
			}
			if !(res.LookupP50 <= res.LookupP90 && res.LookupP90 <= res.LookupP99 && res.LookupP99 <= res.LookupMax) {
				t.Errorf("percentiles out of order: %d %d %d %d", res.LookupP50, res.LookupP90, res.LookupP99, res.LookupMax)
			}

			// Replaying the same workload again gives the same matches.
			again := w.Run(NewMapTarget())
			if again.MatchSum != res.MatchSum || again.MatchDigest != res.MatchDigest {
				t.Error("second run disagrees with the first")
			}
		})
	}
}

// TestIndexAgreesWithEngineHits checks, request by request, that the
// index's overlap for the assigned worker before applying the request's
// events equals the engine's prefix hit: the blocks it did not store.
func TestIndexAgreesWithEngineHits(t *testing.T) {
	reqs := shipped(t, 4000)
	w := Prepare(Config{Workers: 4, BlocksPerWorker: 2000, Assign: AssignPrefixHash}, reqs)
	ref := NewMapTarget()
	hits := 0
	for i := range w.Len() {
		worker, locals, events := w.Request(i)
		overlap := ref.Overlap(worker, locals)
		stored := 0
		for _, ev := range events {
			if s, ok := ev.(Stored); ok {
				stored = len(s.Blocks)
			}
			Apply(ref, worker, ev)
		}
		if overlap+stored != len(locals) {
			t.Fatalf("request %d: index overlap %d + stored %d != %d blocks", i, overlap, stored, len(locals))
		}
		hits += overlap
	}
	if hits == 0 {
		t.Error("no prefix hits")
	}
	if len(ref.Errs) > 0 {
		t.Fatal(ref.Errs[0])
	}
}

func TestRunSmall(t *testing.T) {
	reqs := []Request{
		{HashIDs: []uint64{1, 2}},
		{HashIDs: []uint64{1, 3}},
		{HashIDs: []uint64{1, 2}},
		{HashIDs: []uint64{4}},
		{HashIDs: []uint64{1, 3}},
	}
	tests := []struct {
		name    string
		cfg     Config
		matches int64
	}{
		// w0 gets 0,2,4; w1 gets 1,3. Matches: 0, 1, 2, 0, 2.
		{"round-robin", Config{Workers: 2}, 5},
		// One worker with room for 2 blocks; [4] evicts the leaf 1.2 and
		// keeps 1. Matches: 0, 1, 1, 0, 1.
		{"one small worker", Config{Workers: 1, BlocksPerWorker: 2}, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := Replay(tc.cfg, reqs, NewMapTarget())
			if res.MatchSum != tc.matches {
				t.Errorf("MatchSum %d, want %d", res.MatchSum, tc.matches)
			}
			if res.LookupBlocks != 9 || res.Requests != 5 {
				t.Errorf("lookup blocks %d, requests %d", res.LookupBlocks, res.Requests)
			}
		})
	}
}

func TestConfigAndAssign(t *testing.T) {
	d := Config{}.WithDefaults()
	if d.Workers != 64 || d.BlocksPerWorker != 16384 || d.TraceDuplication != 1 || d.PrefixBlocks != 2 || d.Assign != AssignRoundRobin {
		t.Errorf("defaults: %+v", d)
	}
	for _, a := range []Assign{AssignRoundRobin, AssignPrefixHash, AssignRandom} {
		got, err := ParseAssign(a.String())
		if err != nil || got != a {
			t.Errorf("ParseAssign(%q) = %v, %v", a.String(), got, err)
		}
	}
	if _, err := ParseAssign("kv-aware"); err == nil {
		t.Error("ParseAssign accepted an unknown policy")
	}
	// Random assignment is deterministic for a seed and spreads requests.
	reqs := shipped(t, 500)
	a := Prepare(Config{Workers: 8, Assign: AssignRandom, Seed: 1}, reqs)
	b := Prepare(Config{Workers: 8, Assign: AssignRandom, Seed: 1}, reqs)
	seen := map[int]bool{}
	for i := range a.Len() {
		wa, _, _ := a.Request(i)
		wb, _, _ := b.Request(i)
		if wa != wb {
			t.Fatal("random assignment is not deterministic")
		}
		seen[wa] = true
	}
	if len(seen) != 8 {
		t.Errorf("random assignment used %d of 8 workers", len(seen))
	}
}
