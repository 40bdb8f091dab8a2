package scheduler

import (
	"math"
	"testing"

	"github.com/kvselect/kvselect/selection/index"
)

func key(id uint64) index.WorkerKey { return index.WorkerKey{WorkerID: id} }

func scoreOne(t *testing.T, s Scorer, req *Request, c Candidate) float64 {
	t.Helper()
	ctx := &Context{Request: req, RequestBlocks: RequestBlocks(req.ISL, req.BlockSize)}
	cost, err := s.Score(ctx, &c)
	if err != nil {
		t.Fatal(err)
	}
	return cost
}

// scheduling/overlap.rs converts_weighted_and_raw_tier_overlap_once.
func TestCachedTokensWeighsLowerTiers(t *testing.T) {
	for _, tc := range []struct {
		name         string
		o            index.Overlap
		bs           uint32
		hostW, diskW float64
		eff          float64
		tokens       int
	}{
		{"device 2 host 3 disk 4 external 5 is 92 tokens", index.Overlap{Device: 2, Host: 3, Disk: 4, External: 5}, 16, 0.5, 0.25, 5.75, 92},
		{"default weights", index.Overlap{Device: 4, Host: 4, Disk: 4}, 16, 0.75, 0.25, 8, 128},
		{"device weight is 1 whatever the credit", index.Overlap{Device: 6}, 16, 0.75, 0.25, 6, 96},
		{"rounds half away from zero", index.Overlap{Host: 1}, 2, 0.75, 0.25, 0.75, 2},
		{"nothing cached", index.Overlap{}, 16, 0.75, 0.25, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := EffectiveOverlapBlocks(tc.o, tc.hostW, tc.diskW); got != tc.eff {
				t.Errorf("effective blocks = %v, want %v", got, tc.eff)
			}
			if got := CachedTokens(tc.o, tc.bs, tc.hostW, tc.diskW); got != tc.tokens {
				t.Errorf("cached tokens = %d, want %d", got, tc.tokens)
			}
		})
	}
}

func TestEffectivePrefillTokensClampsCachedToPrompt(t *testing.T) {
	for _, tc := range []struct{ isl, cached, want int }{
		{64, 0, 64}, {64, 32, 32}, {64, 64, 0}, {64, 96, 0}, {4, -1, 4}, {0, 5, 0},
	} {
		if got := EffectivePrefillTokens(tc.isl, tc.cached); got != tc.want {
			t.Errorf("EffectivePrefillTokens(%d, %d) = %d, want %d", tc.isl, tc.cached, got, tc.want)
		}
	}
}

// types.rs potential_decode_blocks_after_admission_counts_only_untracked_request_blocks.
func TestPotentialDecodeBlocksCountsOnlyUntrackedRequestBlocks(t *testing.T) {
	for _, tc := range []struct {
		name                           string
		isl, tracked, additional, want int
	}{
		{"untracked", 32, 0, 0, 102},
		{"tracked no overlap", 32, 2, 2, 102},
		{"tracked full active overlap", 32, 2, 0, 100},
		{"tracked partial tail", 33, 2, 2, 103},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := PotentialDecodeBlocks(100, tc.additional, tc.isl, 16, tc.tracked); got != tc.want {
				t.Errorf("got %d, want %d", got, tc.want)
			}
		})
	}
}

// default.rs test_worker_logit_clamps_non_decode_overlap_credit.
func TestCostIsSevenWithPrefillTrackingAndFiveWithout(t *testing.T) {
	w := DefaultWeights()
	w.PrefillLoadScale = 2
	req := &Request{ISL: 64, BlockSize: 16, Weights: w}
	c := Candidate{
		Worker:              key(0),
		Overlap:             index.Overlap{Device: 6}, // 96 cached tokens
		ActivePrefillTokens: 16, ActiveDecodeBlocks: 2, AdditionalBlocks: 3,
	}
	if got := scoreOne(t, CostScorer{}, req, c); got != 7.0 {
		t.Errorf("logit = %v, want 7.0 (2·max(112/16 − 6, 0) + 2 + 3)", got)
	}
	req.Weights.TrackPrefillTokens = false
	if got := scoreOne(t, CostScorer{}, req, c); got != 5.0 {
		t.Errorf("logit without prefill tracking = %v, want 5.0", got)
	}
}

func TestCostTerms(t *testing.T) {
	base := DefaultWeights()
	for _, tc := range []struct {
		name  string
		w     func(*Weights)
		isl   int
		c     Candidate
		role  CostScorer
		taint map[string]float64
		want  float64
	}{
		// default.rs test_worker_logit_can_charge_active_requests.
		{"active requests cost nothing by default", nil, 0,
			Candidate{ActiveDecodeBlocks: 100, ActiveRequests: 4}, CostScorer{}, nil, 100},
		{"active requests charged at their weight", func(w *Weights) { w.DecodeActiveRequestWeight = 32 }, 0,
			Candidate{ActiveDecodeBlocks: 100, ActiveRequests: 4}, CostScorer{}, nil, 228},
		// default.rs test_decode_worker_logit_credits_overlap_without_prefill_tracking.
		{"decode role credits overlap against decode blocks", func(w *Weights) { w.TrackPrefillTokens = false }, 64,
			Candidate{Overlap: index.Overlap{Device: 3}, ActiveDecodeBlocks: 10}, CostScorer{DecodeRole: true}, nil, 7},
		{"decode role clamps at zero", func(w *Weights) { w.TrackPrefillTokens = false }, 64,
			Candidate{Overlap: index.Overlap{Device: 30}, ActiveDecodeBlocks: 10}, CostScorer{DecodeRole: true}, nil, 0},
		{"decode role without credit uses the aggregated formula", func(w *Weights) { w.TrackPrefillTokens = false; w.OverlapScoreCredit = 0 }, 64,
			Candidate{Overlap: index.Overlap{Device: 3}, ActiveDecodeBlocks: 10}, CostScorer{DecodeRole: true}, nil, 10},
		{"untracked active blocks cost nothing", func(w *Weights) { w.TrackActiveBlocks = false }, 16,
			Candidate{ActiveDecodeBlocks: 50, AdditionalBlocks: 1}, CostScorer{}, nil, 1},
		{"rank without a load entry is charged the prompt", nil, 64,
			Candidate{NoLoadEntry: true, Overlap: index.Overlap{Device: 1}}, CostScorer{}, nil, 3},
		{"cached beyond the prompt still counts with a load entry", nil, 16,
			Candidate{Overlap: index.Overlap{Device: 3}}, CostScorer{}, nil, 0},
		{"host and disk extensions credit at their weights", nil, 128,
			Candidate{Overlap: index.Overlap{Device: 2, Host: 2, Disk: 1, External: 3}}, CostScorer{}, nil,
			8 - (2 + 0.75*2 + 0.25*4)},
		{"shared cache hits credit past the device prefix", func(w *Weights) { w.SharedCacheMultiplier = 0.5 }, 4 * 16,
			Candidate{Overlap: index.Overlap{Device: 2}, SharedBeyondDevice: 2}, CostScorer{}, nil, 1},
		{"preferred taint scales the cost down", nil, 16,
			Candidate{ActiveDecodeBlocks: 100, Taints: []string{"mdc-a"}}, CostScorer{},
			map[string]float64{"mdc-a": 0.85}, 101 * math.Exp(-math.Tanh(float64(float32(0.85))))},
		{"negative preferred taint scales the cost up", nil, 16,
			Candidate{ActiveDecodeBlocks: 90, Taints: []string{"mdc-a", "mdc-a"}}, CostScorer{},
			map[string]float64{"mdc-a": -0.25}, 91 * math.Exp(-math.Tanh(-0.25))},
		{"unmatched preferred taints leave the cost", nil, 16,
			Candidate{ActiveDecodeBlocks: 90, Taints: []string{"mdc-b"}}, CostScorer{},
			map[string]float64{"mdc-a": 0.5}, 91},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := base
			if tc.w != nil {
				tc.w(&w)
			}
			req := &Request{ISL: tc.isl, BlockSize: 16, Weights: w, PreferredTaints: tc.taint}
			if got := scoreOne(t, tc.role, req, tc.c); math.Abs(got-tc.want) > 1e-12 {
				t.Errorf("cost = %v, want %v", got, tc.want)
			}
		})
	}
}

// The overlap_scores response math (Dynamo's selection-service test of the
// override arithmetic, services/selection/tests.rs): device 2, host
// extension 1, host weight 0.75, credit 0.5 give 1.75 credit blocks.
func TestCreditBlocksMatchesOverlapScoresResponse(t *testing.T) {
	w := DefaultWeights()
	w.OverlapScoreCredit = 0.5
	if got := w.CreditBlocks(index.Overlap{Device: 2, Host: 1}, 0); got != 1.75 {
		t.Errorf("credit blocks = %v, want 1.75", got)
	}
	w.SharedCacheMultiplier = 0.5
	w.DiskCacheHitWeight = 0.1
	if got := w.CreditBlocks(index.Overlap{Device: 2, Host: 1, External: 2}, 4); math.Abs(got-(1+0.75+0.2+2)) > 1e-12 {
		t.Errorf("credit blocks = %v", got)
	}
}

func TestPreferredTaintMultiplierIsBoundedAndReciprocal(t *testing.T) {
	if _, ok := PreferredTaintMultiplier(nil, []string{"a"}); ok {
		t.Error("no preferred taints must leave the cost alone")
	}
	up, _ := PreferredTaintMultiplier(map[string]float64{"a": 0.5}, []string{"a"})
	down, _ := PreferredTaintMultiplier(map[string]float64{"a": -0.5}, []string{"a"})
	if math.Abs(up*down-1) > 1e-12 {
		t.Errorf("±0.5 multipliers %v, %v are not reciprocal", up, down)
	}
	huge, _ := PreferredTaintMultiplier(map[string]float64{"a": 1e6, "b": 1e6}, []string{"a", "b"})
	if huge < math.Exp(-1)-1e-12 {
		t.Errorf("multiplier %v below e^-1", huge)
	}
}
