package scheduler

import (
	"cmp"
	"slices"
	"testing"

	"github.com/kvselect/kvselect/selection/index"
)

func TestRandomIsUniformOverTheEligibleRanks(t *testing.T) {
	p, err := New("random", nil)
	if err != nil {
		t.Fatal(err)
	}
	cands := []Candidate{
		{Worker: rank(1, 0), Overlap: index.Overlap{Device: 4}},
		{Worker: rank(1, 1)},
		{Worker: rank(2, 0), ActivePrefillTokens: 10_000},
		{Worker: rank(3, 0)},
		{Worker: rank(4, 0), Overloaded: true}, // busy-rejected
		{Worker: rank(5, 0)},                   // outside the allow list
	}
	req := &Request{ISL: 64, BlockSize: 16, Weights: DefaultWeights(), AllowedWorkers: []uint64{1, 2, 3, 4}}
	var s Scratch
	rnd := seeded(11)
	counts := map[index.WorkerKey]int{}
	const n = 40_000
	for range n {
		got, err := p.Select(rnd, req, cands, &s)
		if err != nil {
			t.Fatal(err)
		}
		counts[got.Worker]++
	}
	eligible := []index.WorkerKey{rank(1, 0), rank(1, 1), rank(2, 0), rank(3, 0)}
	if len(counts) != len(eligible) {
		t.Fatalf("chose %v, want only %v", counts, eligible)
	}
	got := make([]int, len(eligible))
	for i, k := range eligible {
		got[i] = counts[k]
	}
	// The seed is fixed, so this cannot flake; checkNear says the counts are
	// within 2% of the draws of a quarter each.
	checkNear(t, got, []float64{1, 1, 1, 1})
}

func TestRandomRepeatsWithTheSameSeed(t *testing.T) {
	p, _ := New("random", nil)
	cands := []Candidate{{Worker: rank(1, 0)}, {Worker: rank(2, 0)}, {Worker: rank(3, 0)}}
	req := &Request{ISL: 64, BlockSize: 16, Weights: DefaultWeights()}
	var s1, s2 Scratch
	a, b := picks(t, p, &s1, req, cands, 50), picks(t, p, &s2, req, cands, 50)
	if !slices.Equal(a, b) {
		t.Errorf("same seed, different picks:\n%v\n%v", a, b)
	}
}

// The fallbacks come in random order, not worker-id order: retries spread.
func TestRandomFallbacksAreShuffled(t *testing.T) {
	p, _ := New("random", nil)
	cands := []Candidate{{Worker: rank(1, 0)}, {Worker: rank(2, 0)}, {Worker: rank(3, 0)}, {Worker: rank(4, 0)}}
	req := &Request{ISL: 64, BlockSize: 16, Weights: DefaultWeights()}
	var s Scratch
	rnd := seeded(2)
	firstAlt := map[uint64]int{}
	for range 400 {
		got, err := p.Select(rnd, req, cands, &s)
		if err != nil {
			t.Fatal(err)
		}
		alts := s.Ranked(got.Worker, 3)
		if len(alts) != 3 || !slices.IsSortedFunc(alts, func(a, b Scored) int { return cmp.Compare(a.Cost, b.Cost) }) {
			t.Fatalf("fallbacks %+v", alts)
		}
		firstAlt[alts[0].Worker.WorkerID]++
	}
	for id := uint64(1); id <= 4; id++ {
		if firstAlt[id] < 50 {
			t.Errorf("worker %d came first among the fallbacks %d times in 400", id, firstAlt[id])
		}
	}
}
