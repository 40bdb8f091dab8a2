package engine

import (
	"math"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/scheduler"
)

func cands(ranks ...index.WorkerKey) []scheduler.Scored {
	out := make([]scheduler.Scored, len(ranks))
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

func TestPutIntervals(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	h := func(count, sum float64) Histogram { return Histogram{Count: count, Sum: sum, Reported: true} }
	scrape := func(at time.Duration, ranks map[uint32]Rank) Snapshot {
		return Snapshot{At: t0.Add(at), Ranks: ranks}
	}
	var tab Table
	steps := []struct {
		name string
		snap Snapshot
		want []Interval
	}{
		{"first scrape: the histograms' start, nothing gained",
			scrape(0, map[uint32]Rank{0: {Running: 2, TTFT: h(10, 1), ITL: h(100, 2)}, 1: {Running: 1}}),
			[]Interval{{Rank: 0, Running: 2}}},
		{"growth since the last scrape; a rank without histograms gives none",
			scrape(time.Second, map[uint32]Rank{0: {Running: 3, TTFT: h(14, 1.8), ITL: h(150, 3)}, 1: {Running: 1}}),
			[]Interval{{Rank: 0, Running: 3, Span: time.Second, TTFT: h(4, 0.8), ITL: h(50, 1)}}},
		{"a failed scrape gives nothing and keeps the last good reading",
			Snapshot{At: t0.Add(2 * time.Second), Err: "connection refused"}, nil},
		{"measured from the last good reading",
			scrape(3*time.Second, map[uint32]Rank{0: {Running: 1, TTFT: h(16, 2.0), ITL: h(150, 3)}}),
			[]Interval{{Rank: 0, Running: 1, Span: 2 * time.Second, TTFT: h(2, 0.2)}}},
		{"an engine restart (counts went back) gains nothing",
			scrape(4*time.Second, map[uint32]Rank{0: {TTFT: h(1, 0.1), ITL: h(5, 0.1)}}),
			[]Interval{{Rank: 0, Span: time.Second}}},
		{"then counts from the restart's reading",
			scrape(5*time.Second, map[uint32]Rank{0: {TTFT: h(3, 0.5), ITL: h(5, 0.1)}}),
			[]Interval{{Rank: 0, Span: time.Second, TTFT: h(2, 0.4)}}},
		{"a histogram with a bad sum is dropped, not subtracted",
			scrape(6*time.Second, map[uint32]Rank{0: {TTFT: Histogram{Count: 4, Sum: math.Inf(1), Reported: true}, ITL: h(6, 0.2)}}),
			[]Interval{{Rank: 0, Span: time.Second, ITL: h(1, 0.1)}}},
	}
	for _, s := range steps {
		got := tab.Put(1, s.snap)
		if len(got) != len(s.want) {
			t.Fatalf("%s: Put = %+v, want %+v", s.name, got, s.want)
		}
		for i := range got {
			g, w := got[i], s.want[i]
			near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
			if g.Rank != w.Rank || g.Running != w.Running || g.Span != w.Span ||
				g.TTFT.Count != w.TTFT.Count || !near(g.TTFT.Sum, w.TTFT.Sum) ||
				g.ITL.Count != w.ITL.Count || !near(g.ITL.Sum, w.ITL.Sum) {
				t.Fatalf("%s: interval %d = %+v, want %+v", s.name, i, g, w)
			}
		}
	}
}
