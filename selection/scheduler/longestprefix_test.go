package scheduler

import (
	"slices"
	"testing"

	"github.com/kvselect/kvselect/selection/index"
)

func TestLongestPrefixPicksTheLongestDevicePrefix(t *testing.T) {
	p, err := New("longest-prefix", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		cands []Candidate
		want  []uint64
	}{
		{"longest device prefix wins whatever the load", []Candidate{
			{Worker: key(1), Overlap: index.Overlap{Device: 2}},
			{Worker: key(2), Overlap: index.Overlap{Device: 3}, ActivePrefillTokens: 1 << 20, ActiveDecodeBlocks: 1 << 16, ActiveRequests: 500},
			{Worker: key(3), Overlap: index.Overlap{Device: 1}},
		}, []uint64{2}},
		{"lower tiers do not count", []Candidate{
			{Worker: key(1), Overlap: index.Overlap{Device: 1, Host: 3, Disk: 3, External: 3}},
			{Worker: key(2), Overlap: index.Overlap{Device: 2}},
		}, []uint64{2}},
		{"a busy-rejected warm rank is skipped", []Candidate{
			{Worker: key(1), Overlap: index.Overlap{Device: 4}, Overloaded: true},
			{Worker: key(2), Overlap: index.Overlap{Device: 1}},
			{Worker: key(3)},
		}, []uint64{2}},
		{"ties are broken among the tied", []Candidate{
			{Worker: key(1), Overlap: index.Overlap{Device: 2}},
			{Worker: key(2), Overlap: index.Overlap{Device: 1}},
			{Worker: key(3), Overlap: index.Overlap{Device: 2}},
		}, []uint64{1, 3}},
		{"no cache anywhere: any rank", []Candidate{{Worker: key(1)}, {Worker: key(2)}, {Worker: key(3)}}, []uint64{1, 2, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) { picksSpreadOver(t, p, tc.cands, tc.want) })
	}
}

// The cost is the blocks left to prefill, so fallbacks come warmest first
// and the chosen rank reports what it would prefill.
func TestLongestPrefixCostIsTheUncachedBlocks(t *testing.T) {
	p, _ := New("longest-prefix", nil)
	cands := []Candidate{
		{Worker: key(1), Overlap: index.Overlap{Device: 1}},
		{Worker: key(2), Overlap: index.Overlap{Device: 4}},
		{Worker: key(3)},
		{Worker: key(4), Overlap: index.Overlap{Device: 2}},
	}
	req := &Request{ISL: 70, BlockSize: 16, Weights: DefaultWeights()} // 5 request blocks
	var s Scratch
	got, err := p.Select(seeded(1), req, cands, &s)
	if err != nil {
		t.Fatal(err)
	}
	var alts []uint64
	for _, r := range s.Ranked(got.Worker, 8) {
		alts = append(alts, r.Worker.WorkerID)
	}
	if got.Worker.WorkerID != 2 || got.Cost != 1 || got.EffectivePrefillTokens != 70-64 || !slices.Equal(alts, []uint64{4, 1, 3}) {
		t.Errorf("chose %d at cost %v (prefill %d) with fallbacks %v, want 2 at 1 (6) then 4 1 3",
			got.Worker.WorkerID, got.Cost, got.EffectivePrefillTokens, alts)
	}
}
