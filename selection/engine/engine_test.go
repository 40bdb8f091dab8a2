package engine

import (
	"math"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/scheduler"
)

func cands(ranks ...index.WorkerKey) []scheduler.Candidate {
	out := make([]scheduler.Candidate, len(ranks))
	for i, w := range ranks {
		out[i].Worker = w
	}
	return out
}

func TestAnnotate(t *testing.T) {
	cfg := DefaultConfig()
	now := time.Unix(1_700_000_000, 0)
	w1, w2 := index.WorkerKey{WorkerID: 1}, index.WorkerKey{WorkerID: 2}
	oneRank := func(int) int { return 1 }
	for _, tc := range []struct {
		name      string
		reports   map[uint64]Snapshot
		fresh     [2]bool
		saturated [2]bool
	}{
		{"never scraped", nil, [2]bool{}, [2]bool{}},
		{"one queue at the threshold", map[uint64]Snapshot{
			1: {At: now, Ranks: map[uint32]Rank{AllRanks: {Waiting: 5}}},
			2: {At: now, Ranks: map[uint32]Rank{AllRanks: {Waiting: 1}}},
		}, [2]bool{true, true}, [2]bool{true, false}},
		{"every rank saturated, one by KV usage only: the partition is", map[uint64]Snapshot{
			1: {At: now, Ranks: map[uint32]Rank{AllRanks: {Waiting: 5}}},
			2: {At: now, Ranks: map[uint32]Rank{AllRanks: {KVUsage: 0.9, HasKVUsage: true}}},
		}, [2]bool{true, true}, [2]bool{true, true}},
		{"stale figures are not used", map[uint64]Snapshot{
			1: {At: now.Add(-3 * time.Second), Ranks: map[uint32]Rank{AllRanks: {Waiting: 9}}},
		}, [2]bool{false, false}, [2]bool{false, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tab Table
			for id, snap := range tc.reports {
				tab.Put(id, snap)
			}
			cs := cands(w1, w2)
			tab.Annotate(cs, oneRank, "", now, &cfg)
			for i, c := range cs {
				if c.EngineFresh != tc.fresh[i] || c.Saturated != tc.saturated[i] {
					t.Errorf("rank %d: fresh %v saturated %v, want %v %v", i, c.EngineFresh, c.Saturated, tc.fresh[i], tc.saturated[i])
				}
			}
		})
	}
}

func TestWholeWorkerFiguresAreSharedByItsRanks(t *testing.T) {
	cfg := DefaultConfig()
	now := time.Unix(1_700_000_000, 0)
	var tab Table
	tab.Put(1, Snapshot{At: now, Ranks: map[uint32]Rank{AllRanks: {Waiting: 4, Running: 8}}})
	cs := cands(index.WorkerKey{WorkerID: 1, DPRank: 0}, index.WorkerKey{WorkerID: 1, DPRank: 1})
	tab.Annotate(cs, func(int) int { return 2 }, "", now, &cfg)
	for _, c := range cs {
		if c.EngineWaiting != 2 || c.EngineRunning != 4 {
			t.Fatalf("rank %v: waiting %v running %v, want half of the worker's", c.Worker, c.EngineWaiting, c.EngineRunning)
		}
	}
}

func TestReportsAreSanitized(t *testing.T) {
	var tab Table
	now := time.Unix(1_700_000_000, 0)
	tab.Put(1, Snapshot{At: now, Ranks: map[uint32]Rank{0: {Waiting: math.NaN(), Running: math.Inf(1), KVUsage: -1, HasKVUsage: true}}})
	cfg := DefaultConfig()
	cs := cands(index.WorkerKey{WorkerID: 1})
	tab.Annotate(cs, func(int) int { return 1 }, "", now, &cfg)
	if c := cs[0]; !c.EngineFresh || c.EngineWaiting != 0 || c.EngineRunning != 0 || c.EngineKVUsage != 0 {
		t.Fatalf("candidate %+v, want the bad figures dropped", c)
	}
}

func TestLoRAFit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		state   *LoRAState
		adapter string
		want    int
	}{
		{"no adapter asked", &LoRAState{Running: []string{"a"}, MaxLoRA: 1}, "", 0},
		{"no information", nil, "b", 0},
		{"loaded", &LoRAState{Running: []string{"b"}, MaxLoRA: 1}, "b", 0},
		{"free slot", &LoRAState{Running: []string{"a"}, MaxLoRA: 2}, "b", 1},
		{"no free slot", &LoRAState{Running: []string{"a"}, Waiting: []string{"c"}, MaxLoRA: 2}, "b", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := loraFit(tc.state, tc.adapter); got != tc.want {
				t.Fatalf("loraFit = %d, want %d", got, tc.want)
			}
		})
	}
}
