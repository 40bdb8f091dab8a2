package llmd

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/kvselect/kvselect/bench/mooncake"
)

const shippedTrace = "../../testdata/mooncake/conversation_trace.jsonl.gz"

// overlaps converts llm-d scores to per-worker overlaps.
func overlaps(t *testing.T, workers int, scores map[string]int) []int {
	t.Helper()
	out := make([]int, workers)
	for pod, s := range scores {
		var w int
		if _, err := fmt.Sscanf(pod, "worker-%d", &w); err != nil || w < 0 || w >= workers {
			t.Fatalf("unexpected pod %q", pod)
		}
		out[w] = s
	}
	return out
}

// both applies one request's events to the reference and to llm-d.
type both struct {
	ref  *mooncake.MapTarget
	llmd *Target
}

func (b both) apply(worker int, events []mooncake.Event) {
	for _, ev := range events {
		mooncake.Apply(b.ref, worker, ev)
		mooncake.Apply(b.llmd, worker, ev)
	}
}

func TestAgreesWithMapTarget(t *testing.T) {
	type req struct {
		worker int
		ids    []uint64
	}
	// Hash ids follow the Mooncake convention: an id always has the same
	// parent, so LocalKeys is exact too.
	reqs := []req{
		{0, []uint64{1, 2, 3}},
		{1, []uint64{1, 2, 4, 5}},
		{2, []uint64{6, 7}},
		{0, []uint64{1, 2, 4}},
		{0, []uint64{8, 9}},       // capacity 5: evicts 1.2.3
		{1, []uint64{1, 10}},      // evicts 1.2.4.5 then 1.2.4
		{2, []uint64{6, 7, 11}},   //
		{2, []uint64{12, 13, 14}}, // evicts 6.7.11 6.7 6
		{0, []uint64{1, 2, 4, 15}},
	}
	// Probes also follow the convention, except the chained-only ones that
	// start mid-chain (see TestLocalKeysFalsePositive).
	probes := [][]uint64{
		{1}, {1, 2}, {1, 2, 3}, {1, 2, 4, 5}, {1, 2, 4, 15}, {1, 10}, {6, 7, 11},
		{8, 9}, {12, 13, 14, 16}, {99}, {1, 99, 3},
	}
	chainedOnly := [][]uint64{{2}, {2, 4}, {7, 11}}
	const workers, capacity = 3, 5
	for _, mode := range []KeyMode{ChainedKeys, LocalKeys} {
		t.Run(mode.String(), func(t *testing.T) {
			target, err := New(workers, mode)
			if err != nil {
				t.Fatal(err)
			}
			b := both{mooncake.NewMapTarget(), target}
			engines := make([]*mooncake.Engine, workers)
			for w := range engines {
				engines[w] = mooncake.NewEngine(w, capacity, false)
			}
			removed := 0
			for i, r := range reqs {
				events := engines[r.worker].Process(r.ids)
				for _, ev := range events {
					if rm, ok := ev.(mooncake.Removed); ok {
						removed += len(rm.Exts)
					}
				}
				b.apply(r.worker, events)
				ps := probes
				if mode == ChainedKeys {
					ps = append(ps[:len(ps):len(ps)], chainedOnly...)
				}
				for _, p := range ps {
					locals := mooncake.LocalHashes(p)
					want := b.ref.Overlaps(workers, locals)
					got := overlaps(t, workers, target.Scores(locals))
					if !reflect.DeepEqual(got, want) {
						t.Fatalf("after request %d, probe %v: llm-d overlaps %v, map %v", i, p, got, want)
					}
					if g, w := target.Match(locals), b.ref.Match(locals); g != w {
						t.Fatalf("after request %d, probe %v: llm-d Match %d, map %d", i, p, g, w)
					}
				}
			}
			if removed == 0 {
				t.Fatal("no evictions")
			}
			if target.Anomalies != 0 || len(b.ref.Errs) != 0 {
				t.Fatalf("anomalies: llm-d %d, map %v", target.Anomalies, b.ref.Errs)
			}
		})
	}
}

// TestLocalKeysFalsePositive pins the caveat of unchained keys: a block
// equal in content to one cached under another prefix, or at another
// position, extends or starts a match.
func TestLocalKeysFalsePositive(t *testing.T) {
	tests := []struct {
		mode  KeyMode
		probe []uint64
		want  int
	}{
		{ChainedKeys, []uint64{1, 2, 5}, 2},
		{LocalKeys, []uint64{1, 2, 5}, 3},
		{ChainedKeys, []uint64{2, 3}, 0},
		{LocalKeys, []uint64{2, 3}, 2},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprint(tc.mode, tc.probe), func(t *testing.T) {
			target, err := New(1, tc.mode)
			if err != nil {
				t.Fatal(err)
			}
			e := mooncake.NewEngine(0, 100, false)
			for _, ids := range [][]uint64{{1, 2, 3}, {4, 2, 5}} {
				for _, ev := range e.Process(ids) {
					mooncake.Apply(target, 0, ev)
				}
			}
			got := target.Scores(mooncake.LocalHashes(tc.probe))[PodName(0)]
			if got != tc.want {
				t.Errorf("score %d, want %d", got, tc.want)
			}
		})
	}
}

// TestReplayAgrees replays the head of the shipped trace with evictions and
// compares, request by request, every worker's overlap.
func TestReplayAgrees(t *testing.T) {
	reqs, err := mooncake.LoadTrace(shippedTrace)
	if err != nil {
		t.Fatal(err)
	}
	reqs = reqs[:1500]
	cfg := mooncake.Config{Workers: 6, BlocksPerWorker: 300, Assign: mooncake.AssignRandom, Seed: 7}
	w := mooncake.Prepare(cfg, reqs)
	for _, mode := range []KeyMode{ChainedKeys, LocalKeys} {
		t.Run(mode.String(), func(t *testing.T) {
			target, err := New(cfg.Workers, mode)
			if err != nil {
				t.Fatal(err)
			}
			b := both{mooncake.NewMapTarget(), target}
			removed := 0
			for i := range w.Len() {
				worker, locals, events := w.Request(i)
				want := b.ref.Overlaps(cfg.Workers, locals)
				got := overlaps(t, cfg.Workers, target.Scores(locals))
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("request %d: llm-d overlaps %v, map %v", i, got, want)
				}
				for _, ev := range events {
					if rm, ok := ev.(mooncake.Removed); ok {
						removed += len(rm.Exts)
					}
				}
				b.apply(worker, events)
			}
			if removed == 0 {
				t.Fatal("no evictions")
			}
			if target.Anomalies != 0 || len(b.ref.Errs) != 0 {
				t.Fatalf("anomalies: llm-d %d, map %d", target.Anomalies, len(b.ref.Errs))
			}
			// The timed driver agrees too.
			fresh, _ := New(cfg.Workers, mode)
			got, ref := w.Run(fresh), w.Run(mooncake.NewMapTarget())
			if got.MatchSum != ref.MatchSum || got.MatchDigest != ref.MatchDigest {
				t.Errorf("Run: llm-d match sum %d, map %d", got.MatchSum, ref.MatchSum)
			}
			if got.Target != "llm-d/"+mode.String() {
				t.Errorf("Name %q", got.Target)
			}
		})
	}
}

func TestNew(t *testing.T) {
	tests := []struct {
		workers int
		ok      bool
	}{{0, false}, {-1, false}, {1, true}, {64, true}}
	for _, tc := range tests {
		_, err := New(tc.workers, ChainedKeys)
		if (err == nil) != tc.ok {
			t.Errorf("New(%d): err %v", tc.workers, err)
		}
	}
	if PodName(7) != "worker-7" {
		t.Error(PodName(7))
	}
}

// TestManyPods checks that a block held by more pods than llm-d's default
// per-key pod cache (10) is still reported for all of them.
func TestManyPods(t *testing.T) {
	const workers = 40
	target, err := New(workers, ChainedKeys)
	if err != nil {
		t.Fatal(err)
	}
	ids := []uint64{0, 1}
	for w := range workers {
		for _, ev := range mooncake.NewEngine(w, 10, false).Process(ids) {
			mooncake.Apply(target, w, ev)
		}
	}
	if got := target.Match(mooncake.LocalHashes(ids)); got != workers {
		t.Errorf("Match = %d, want %d", got, workers)
	}
}
