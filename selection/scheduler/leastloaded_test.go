package scheduler

import (
	"slices"
	"testing"

	"github.com/kvselect/kvselect/selection/index"
)

func TestLeastLoadedPicksTheLightestRank(t *testing.T) {
	p, err := New("least-loaded", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		cands []Candidate
		want  []uint64 // the ranks it may choose
	}{
		{"fewest prefill tokens win over fewer requests", []Candidate{
			{Worker: key(1), ActivePrefillTokens: 2048, ActiveRequests: 1},
			{Worker: key(2), ActivePrefillTokens: 512, ActiveRequests: 30},
			{Worker: key(3), ActivePrefillTokens: 4096},
		}, []uint64{2}},
		{"equal prefill: fewest requests", []Candidate{
			{Worker: key(1), ActivePrefillTokens: 512, ActiveRequests: 3},
			{Worker: key(2), ActivePrefillTokens: 512, ActiveRequests: 2},
			{Worker: key(3), ActivePrefillTokens: 512, ActiveRequests: 4},
		}, []uint64{2}},
		{"the cache does not count", []Candidate{
			{Worker: key(1), ActivePrefillTokens: 16, Overlap: index.Overlap{Device: 100}},
			{Worker: key(2)},
		}, []uint64{2}},
		{"decode blocks do not count", []Candidate{
			{Worker: key(1), ActiveDecodeBlocks: 10_000},
			{Worker: key(2), ActiveRequests: 1},
		}, []uint64{1}},
		{"a busy-rejected idle rank is skipped", []Candidate{
			{Worker: key(1), Overloaded: true},
			{Worker: key(2), ActivePrefillTokens: 99},
		}, []uint64{2}},
		{"full ties are broken among the tied", []Candidate{
			{Worker: key(1), ActivePrefillTokens: 64, ActiveRequests: 1},
			{Worker: key(2), ActivePrefillTokens: 64, ActiveRequests: 1},
			{Worker: key(3), ActivePrefillTokens: 64, ActiveRequests: 2},
			{Worker: key(4), ActivePrefillTokens: 64, ActiveRequests: 1},
		}, []uint64{1, 2, 4}},
	} {
		t.Run(tc.name, func(t *testing.T) { picksSpreadOver(t, p, tc.cands, tc.want) })
	}
}

// The cost orders prefill first and requests second, so fallbacks come
// lightest first.
func TestLoadScorerOrdersPrefillThenRequests(t *testing.T) {
	loads := []struct{ prefill, requests int }{
		{0, 0}, {0, 1}, {0, 10_000}, {1, 0}, {999_999, 9_999}, {999_999, 10_000}, {1_000_000, 0},
	}
	var prev float64
	for i, l := range loads {
		cost, err := LoadScorer{}.Score(nil, &Candidate{ActivePrefillTokens: l.prefill, ActiveRequests: l.requests})
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 && !(cost > prev) {
			t.Errorf("load %+v costs %v, not above the previous %v", l, cost, prev)
		}
		prev = cost
	}
}

func TestLeastLoadedFallbacksAreLightestFirst(t *testing.T) {
	p, _ := New("least-loaded", nil)
	cands := []Candidate{
		{Worker: key(1), ActivePrefillTokens: 300},
		{Worker: key(2), ActivePrefillTokens: 100, ActiveRequests: 2},
		{Worker: key(3), ActivePrefillTokens: 0},
		{Worker: key(4), ActivePrefillTokens: 100, ActiveRequests: 1},
	}
	req := &Request{ISL: 64, BlockSize: 16, Weights: DefaultWeights()}
	var s Scratch
	got := picks(t, p, &s, req, cands, 1)[0]
	var alts []uint64
	for _, r := range s.Ranked(got, 8) {
		alts = append(alts, r.Worker.WorkerID)
	}
	if got.WorkerID != 3 || !slices.Equal(alts, []uint64{4, 2, 1}) {
		t.Errorf("chose %d with fallbacks %v, want 3 then 4 2 1", got.WorkerID, alts)
	}
}

func TestRunnerUpIsTheCheapestOtherRow(t *testing.T) {
	p, _ := New("least-loaded", nil)
	req := &Request{ISL: 64, BlockSize: 16, Weights: DefaultWeights()}
	var s Scratch
	got := picks(t, p, &s, req, []Candidate{
		{Worker: key(1), ActivePrefillTokens: 300},
		{Worker: key(2), ActivePrefillTokens: 100},
		{Worker: key(3), ActivePrefillTokens: 0},
	}, 1)[0]
	ru, ok := s.RunnerUp(got)
	if !ok || ru.Worker.WorkerID != 2 || s.Candidates() != 3 {
		t.Errorf("runner-up %v (%v) of %d candidates, want worker 2 of 3", ru.Worker, ok, s.Candidates())
	}
	if want := s.Ranked(got, 1)[0]; want.Cost != ru.Cost {
		t.Errorf("runner-up cost %v, Ranked's first %v", ru.Cost, want.Cost)
	}

	got = picks(t, p, &s, req, []Candidate{{Worker: key(7)}}, 1)[0]
	if _, ok := s.RunnerUp(got); ok || s.Candidates() != 1 {
		t.Errorf("a single candidate has a runner-up (%v) or %d candidates", ok, s.Candidates())
	}
}

// MostCached is the best-cached scored row, whichever row the policy chose,
// and starts again with every selection.
func TestMostCachedIsTheBestCachedScoredRow(t *testing.T) {
	p, _ := New("least-loaded", nil)
	req := &Request{ISL: 64, BlockSize: 16, Weights: DefaultWeights()}
	var s Scratch
	got := picks(t, p, &s, req, []Candidate{
		{Worker: key(1), ActivePrefillTokens: 300, Overlap: index.Overlap{Device: 3}},
		{Worker: key(2), ActivePrefillTokens: 0, Overlap: index.Overlap{Device: 1}},
		{Worker: key(3), ActivePrefillTokens: 100},
	}, 1)[0]
	if got.WorkerID != 2 || s.MostCached() != 48 {
		t.Errorf("chose worker %d with %d tokens at best, want worker 2 and 48 (worker 1's 3 blocks)", got.WorkerID, s.MostCached())
	}
	picks(t, p, &s, req, []Candidate{{Worker: key(7)}}, 1)
	if s.MostCached() != 0 {
		t.Errorf("a selection over an uncached rank kept %d tokens at best from the one before", s.MostCached())
	}
}
