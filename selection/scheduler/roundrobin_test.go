package scheduler

import (
	"slices"
	"testing"

	"github.com/kvselect/kvselect/selection/index"
)

func rank(id uint64, r uint32) index.WorkerKey { return index.WorkerKey{WorkerID: id, DPRank: r} }

func roundRobin(t *testing.T) Policy {
	t.Helper()
	p, err := New("round-robin", nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// picks runs n Selects with one Scratch and returns the chosen ranks.
func picks(t *testing.T, p Policy, s *Scratch, req *Request, cands []Candidate, n int) []index.WorkerKey {
	t.Helper()
	rnd := seeded(3)
	out := make([]index.WorkerKey, 0, n)
	for range n {
		got, err := p.Select(rnd, req, cands, s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, got.Worker)
	}
	return out
}

// picksSpreadOver picks 64 times from cands and checks that every pick is a
// worker of want and that the random tie-break reached each of them.
func picksSpreadOver(t *testing.T, p Policy, cands []Candidate, want []uint64) {
	t.Helper()
	req := &Request{ISL: 64, BlockSize: 16, Weights: DefaultWeights()}
	var s Scratch
	seen := map[uint64]bool{}
	for _, w := range picks(t, p, &s, req, cands, 64) {
		if !slices.Contains(want, w.WorkerID) {
			t.Fatalf("chose worker %d, want one of %v", w.WorkerID, want)
		}
		seen[w.WorkerID] = true
	}
	if len(seen) != len(want) {
		t.Errorf("64 picks reached %v of %v", seen, want)
	}
}

func TestRoundRobinCyclesInWorkerAndRankOrder(t *testing.T) {
	// Listed out of order, with load and cache that round-robin ignores.
	cands := []Candidate{
		{Worker: rank(3, 0), Overlap: index.Overlap{Device: 9}},
		{Worker: rank(2, 1)},
		{Worker: rank(1, 0), ActivePrefillTokens: 5000, ActiveRequests: 40},
		{Worker: rank(2, 0)},
	}
	req := &Request{ISL: 64, BlockSize: 16, Weights: DefaultWeights()}
	var s Scratch
	cycle := []index.WorkerKey{rank(1, 0), rank(2, 0), rank(2, 1), rank(3, 0)}
	if got := picks(t, roundRobin(t), &s, req, cands, 8); !slices.Equal(got, append(cycle, cycle...)) {
		t.Errorf("picks %v, want the cycle %v twice", got, cycle)
	}
}

// The cycle runs over whichever ranks are eligible at each pick: a joining
// rank is taken in its turn, a busy or departed one is skipped, and the
// cycle does not restart.
func TestRoundRobinFollowsTheEligibleSetAsItChanges(t *testing.T) {
	p := roundRobin(t)
	req := &Request{ISL: 64, BlockSize: 16, Weights: DefaultWeights()}
	var s Scratch
	first := []Candidate{{Worker: rank(1, 0)}, {Worker: rank(2, 0)}, {Worker: rank(3, 0)}}
	if got := picks(t, p, &s, req, first, 2); !slices.Equal(got, []index.WorkerKey{rank(1, 0), rank(2, 0)}) {
		t.Fatalf("first picks %v", got)
	}
	// Worker 3 turns busy, worker 2 gains a second rank and worker 4 joins.
	later := []Candidate{{Worker: rank(1, 0)}, {Worker: rank(2, 0)}, {Worker: rank(2, 1)},
		{Worker: rank(3, 0), Overloaded: true}, {Worker: rank(4, 0)}}
	want := []index.WorkerKey{rank(2, 1), rank(4, 0), rank(1, 0), rank(2, 0)}
	if got := picks(t, p, &s, req, later, 4); !slices.Equal(got, want) {
		t.Errorf("picks %v, want %v", got, want)
	}
}

// A pinned request bypasses ranking, so it does not move the cycle.
func TestRoundRobinPinnedRequestsDoNotAdvanceTheCycle(t *testing.T) {
	p := roundRobin(t)
	cands := []Candidate{{Worker: rank(1, 0)}, {Worker: rank(2, 0)}, {Worker: rank(3, 0)}}
	req := &Request{ISL: 64, BlockSize: 16, Weights: DefaultWeights()}
	pinned := *req
	pinned.Pinned = &index.WorkerKey{WorkerID: 3}
	var s Scratch
	picks(t, p, &s, req, cands, 1) // worker 1
	if got := picks(t, p, &s, &pinned, cands, 1); got[0] != rank(3, 0) {
		t.Fatalf("pinned pick %v", got)
	}
	if got := picks(t, p, &s, req, cands, 1); got[0] != rank(2, 0) {
		t.Errorf("after a pinned request the cycle went to %v, want worker 2", got[0])
	}
}

// The gateway's fallbacks are the ranks the cycle would reach next, in order.
func TestRoundRobinFallbacksFollowTheCycle(t *testing.T) {
	p := roundRobin(t)
	cands := []Candidate{{Worker: rank(1, 0)}, {Worker: rank(2, 0)}, {Worker: rank(3, 0)}, {Worker: rank(4, 0)}}
	req := &Request{ISL: 64, BlockSize: 16, Weights: DefaultWeights()}
	var s Scratch
	picks(t, p, &s, req, cands, 2) // workers 1 and 2
	got := picks(t, p, &s, req, cands, 1)[0]
	var alts []index.WorkerKey
	for _, r := range s.Ranked(got, 8) {
		alts = append(alts, r.Worker)
	}
	if want := []index.WorkerKey{rank(4, 0), rank(1, 0), rank(2, 0)}; got != rank(3, 0) || !slices.Equal(alts, want) {
		t.Errorf("chose %v with fallbacks %v, want worker 3 then %v", got, alts, want)
	}
}

// Two partitions (two Scratches) through one policy value cycle on their own.
func TestRoundRobinPartitionsCycleIndependently(t *testing.T) {
	p := roundRobin(t)
	req := &Request{ISL: 64, BlockSize: 16, Weights: DefaultWeights()}
	a := []Candidate{{Worker: rank(1, 0)}, {Worker: rank(2, 0)}}
	b := []Candidate{{Worker: rank(10, 0)}, {Worker: rank(11, 0)}, {Worker: rank(12, 0)}}
	var sa, sb Scratch
	var gotA, gotB []index.WorkerKey
	for range 3 {
		gotA = append(gotA, picks(t, p, &sa, req, a, 1)...)
		gotB = append(gotB, picks(t, p, &sb, req, b, 1)...)
	}
	if want := []index.WorkerKey{rank(1, 0), rank(2, 0), rank(1, 0)}; !slices.Equal(gotA, want) {
		t.Errorf("partition a: %v, want %v", gotA, want)
	}
	if want := []index.WorkerKey{rank(10, 0), rank(11, 0), rank(12, 0)}; !slices.Equal(gotB, want) {
		t.Errorf("partition b: %v, want %v", gotB, want)
	}
}
