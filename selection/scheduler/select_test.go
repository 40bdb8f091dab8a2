package scheduler

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvselect/kvselect/selection/index"
)

func seeded(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x5eed)) }

func selectWorker(t *testing.T, p Policy, req *Request, cands []Candidate) Scored {
	t.Helper()
	got, err := p.Select(seeded(1), req, cands, nil)
	if err != nil {
		t.Fatalf("Select: %v", err)
	}
	return got
}

func u32(v uint32) *uint32 { return &v }

// Ports of selector/default.rs tests: which worker the default policy picks.
func TestDefaultPolicyChoosesCheapestWorker(t *testing.T) {
	for _, tc := range []struct {
		name  string
		w     func(*Weights)
		req   Request
		cands []Candidate
		want  uint64
	}{
		// per_request_overrides_change_selection (bs 1, isl 4, shared hits 0..4).
		{"warm worker wins by default", nil, Request{ISL: 4, BlockSize: 1},
			overrideFixture(), 0},
		{"credit override 0 sends it cold", func(w *Weights) { w.OverlapScoreCredit = 0 }, Request{ISL: 4, BlockSize: 1},
			overrideFixture(), 1},
		{"prefill scale override 0 sends it cold", func(w *Weights) { w.PrefillLoadScale = 0 }, Request{ISL: 4, BlockSize: 1},
			overrideFixture(), 1},
		{"shared cache override 1 sends it cold", func(w *Weights) { w.SharedCacheMultiplier = 1 }, Request{ISL: 4, BlockSize: 1},
			overrideFixture(), 1},
		// test_shared_cache_hits_scoring: logits 1.0 vs 2.0.
		{"device plus shared hits beat shared hits alone", func(w *Weights) { w.SharedCacheMultiplier = 0.5 }, Request{ISL: 4, BlockSize: 1},
			[]Candidate{
				{Worker: key(0), Overlap: index.Overlap{Device: 2}, SharedBeyondDevice: 2, NoLoadEntry: true},
				{Worker: key(1), SharedBeyondDevice: 4, NoLoadEntry: true},
			}, 0},
		// test_prefill_load_scale_applies_after_overlap_credits: 2·(4−2)+3 = 7 < 2·4 = 8.
		{"prefill scale applies after the overlap credit", func(w *Weights) { w.PrefillLoadScale = 2 }, Request{ISL: 64, BlockSize: 16},
			[]Candidate{
				{Worker: key(0), Overlap: index.Overlap{Device: 2}, ActiveDecodeBlocks: 3},
				{Worker: key(1)},
			}, 0},
		// test_overlap_credit_above_one_can_prefer_colocated_worker: 9 vs 8, then 7 vs 8.
		{"credit 1 leaves a loaded warm worker", nil, Request{ISL: 128, BlockSize: 16}, warmColdFixture(), 1},
		{"credit 1.5 prefers the colocated worker", func(w *Weights) { w.OverlapScoreCredit = 1.5 }, Request{ISL: 128, BlockSize: 16},
			warmColdFixture(), 0},
		// test_overlap_credit_decay_can_prefer_less_loaded_cold_worker: 3 vs 4, then 4.71 vs 4.
		{"without decay the busy warm worker wins", nil, Request{ISL: 64, BlockSize: 16}, decayFixture(), 0},
		{"credit decay prefers the idle cold worker", func(w *Weights) { w.OverlapScoreCreditDecay = 1 }, Request{ISL: 64, BlockSize: 16},
			decayFixture(), 1},
		// test_overloaded_high_overlap_worker_is_skipped.
		{"overloaded high-overlap worker is skipped", nil, Request{ISL: 64, BlockSize: 16},
			[]Candidate{{Worker: key(0), Overlap: index.Overlap{Device: 4}, Overloaded: true}, {Worker: key(1)}}, 1},
		// test_required_taints_filter_out_incompatible_workers.
		{"required taints filter incompatible workers", nil, Request{ISL: 16, BlockSize: 16, RequiredTaints: []string{"mdc-b"}},
			[]Candidate{{Worker: key(10), Taints: []string{"mdc-a"}}, {Worker: key(20), Taints: []string{"mdc-b"}}}, 20},
		// test_preferred_taints_prefer_matching_worker: 101·e^-tanh(.85) < 91.
		{"preferred taint outweighs ten decode blocks", nil,
			Request{ISL: 16, BlockSize: 16, PreferredTaints: map[string]float64{"mdc-a": 0.85}},
			[]Candidate{
				{Worker: key(10), Taints: []string{"mdc-a"}, ActiveDecodeBlocks: 100},
				{Worker: key(20), Taints: []string{"mdc-b"}, ActiveDecodeBlocks: 90},
			}, 10},
		// test_negative_preferred_taints_avoid_matching_worker.
		{"negative preferred taint avoids the worker", nil,
			Request{ISL: 16, BlockSize: 16, PreferredTaints: map[string]float64{"mdc-a": -0.25}},
			[]Candidate{
				{Worker: key(10), Taints: []string{"mdc-a"}, ActiveDecodeBlocks: 90},
				{Worker: key(20), Taints: []string{"mdc-b"}, ActiveDecodeBlocks: 100},
			}, 20},
		{"allowed workers restrict the candidates", nil, Request{ISL: 16, BlockSize: 16, AllowedWorkers: []uint64{2}},
			[]Candidate{{Worker: key(1)}, {Worker: key(2), ActiveDecodeBlocks: 50}}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req
			req.Weights = DefaultWeights()
			if tc.w != nil {
				tc.w(&req.Weights)
			}
			if got := selectWorker(t, DefaultPolicy(), &req, tc.cands); got.Worker.WorkerID != tc.want {
				t.Errorf("chose worker %d (cost %v), want %d", got.Worker.WorkerID, got.Cost, tc.want)
			}
		})
	}
}

func overrideFixture() []Candidate {
	return []Candidate{
		{Worker: key(0), Overlap: index.Overlap{Device: 2}, SharedBeyondDevice: 2, ActiveDecodeBlocks: 1},
		{Worker: key(1), SharedBeyondDevice: 4, NoLoadEntry: true},
	}
}

func warmColdFixture() []Candidate {
	return []Candidate{
		{Worker: key(0), Overlap: index.Overlap{Device: 4}, ActiveDecodeBlocks: 5},
		{Worker: key(1), NoLoadEntry: true},
	}
}

func decayFixture() []Candidate {
	return []Candidate{
		{Worker: key(0), Overlap: index.Overlap{Device: 4}, ActivePrefillTokens: 48},
		{Worker: key(1), NoLoadEntry: true},
	}
}

// test_required_taints_switch_matching_worker_sets_by_label.
func TestRequiredTaintsRouteWithinTheirWorkerSet(t *testing.T) {
	var cands []Candidate
	for _, set := range []struct {
		taint        string
		quiet, noisy uint64
	}{{"mdc-a", 10, 11}, {"mdc-b", 20, 21}, {"mdc-c", 30, 31}} {
		cands = append(cands,
			Candidate{Worker: key(set.quiet), Taints: []string{set.taint}},
			Candidate{Worker: key(set.noisy), Taints: []string{set.taint}, ActiveDecodeBlocks: 400_000})
	}
	for taint, want := range map[string]uint64{"mdc-a": 10, "mdc-b": 20, "mdc-c": 30} {
		req := &Request{ISL: 16, BlockSize: 16, Weights: DefaultWeights(), RequiredTaints: []string{taint}}
		if got := selectWorker(t, DefaultPolicy(), req, cands); got.Worker.WorkerID != want {
			t.Errorf("required %s: chose %d, want %d", taint, got.Worker.WorkerID, want)
		}
	}
}

// default_policy_retains_eligible_affinity_and_falls_back_when_overloaded.
func TestAffinityTargetIsExclusiveWhileEligible(t *testing.T) {
	cands := []Candidate{
		{Worker: index.WorkerKey{WorkerID: 0, DPRank: 0}},
		{Worker: index.WorkerKey{WorkerID: 0, DPRank: 1}},
		{Worker: key(1), ActiveDecodeBlocks: 100},
	}
	for _, tc := range []struct {
		name       string
		target     Target
		overloaded bool
		exclusive  bool
		want       index.WorkerKey
		anyRank    bool
	}{
		{"loaded target rank still wins", Target{WorkerID: 1, DPRank: u32(0)}, false, true, key(1), false},
		{"target without rank ranks the worker's ranks", Target{WorkerID: 0}, false, true, key(0), true},
		{"overloaded target falls back to ranking", Target{WorkerID: 1}, true, true, key(0), true},
		{"unknown rank falls back to ranking", Target{WorkerID: 1, DPRank: u32(7)}, false, true, key(0), true},
		{"advisory affinity does not restrict", Target{WorkerID: 1}, false, false, key(0), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := slices.Clone(cands)
			cs[2].Overloaded = tc.overloaded
			req := &Request{ISL: 16, BlockSize: 16, Weights: DefaultWeights(), AffinityTarget: &tc.target}
			p := DefaultPolicy()
			p.ExclusiveAffinity = tc.exclusive
			got := selectWorker(t, p, req, cs)
			if got.Worker.WorkerID != tc.want.WorkerID || (!tc.anyRank && got.Worker != tc.want) {
				t.Errorf("chose %v, want %v", got.Worker, tc.want)
			}
		})
	}
}

func TestPinnedWorkerShortCircuitsRanking(t *testing.T) {
	cands := []Candidate{
		{Worker: key(0), ActiveDecodeBlocks: 500, Taints: []string{"zone-a"}},
		{Worker: key(1)},
	}
	req := &Request{ISL: 16, BlockSize: 16, Weights: DefaultWeights(), Pinned: &index.WorkerKey{WorkerID: 0},
		PreferredTaints: map[string]float64{"zone-a": 1}}
	got := selectWorker(t, DefaultPolicy(), req, cands)
	if got.Worker.WorkerID != 0 {
		t.Fatalf("chose %v, want the pinned worker 0", got.Worker)
	}
	// Dynamo's "Pinned formula" is the bare logit: no preferred-taint multiplier.
	if got.Cost != 501 {
		t.Errorf("pinned cost = %v, want 501", got.Cost)
	}
}

func TestSelectErrorsFollowDynamosClasses(t *testing.T) {
	pin := func(id uint64, rank uint32) *index.WorkerKey { return &index.WorkerKey{WorkerID: id, DPRank: rank} }
	two := func() []Candidate { return []Candidate{{Worker: key(0)}, {Worker: key(1)}} }
	for _, tc := range []struct {
		name   string
		req    Request
		cands  []Candidate
		policy func(*Policy)
		is     error
		text   string
	}{
		// test_all_eligible_workers_overloaded_returns_overload_error.
		{"all eligible overloaded", Request{}, []Candidate{{Worker: key(0), Overloaded: true}, {Worker: key(1), Overloaded: true}},
			nil, ErrAllOverloaded, "all eligible workers are overloaded"},
		// test_overloaded_pinned_worker_is_not_rerouted.
		{"pinned worker overloaded", Request{Pinned: pin(0, 0)}, []Candidate{{Worker: key(0), Overloaded: true}, {Worker: key(1)}},
			nil, ErrPinnedOverloaded, "pinned worker 0 is overloaded"},
		// queue.rs test_pinned_worker_conflict_with_allowed_ids_fails_early.
		{"pinned worker outside the allow list", Request{Pinned: pin(0, 0), AllowedWorkers: []uint64{1}}, two(),
			nil, ErrPinnedNotAllowed, "pinned worker 0 is not in allowed worker set"},
		{"pinned rank not registered", Request{Pinned: pin(0, 3)}, two(), nil, ErrNoEndpoints, ""},
		{"pinned worker lacks a required taint", Request{Pinned: pin(0, 0), RequiredTaints: []string{"x"}}, two(), nil, ErrNoEndpoints, ""},
		// test_required_taints_return_no_endpoints_when_no_worker_matches.
		{"no worker has the required taint", Request{RequiredTaints: []string{"mdc-b"}},
			[]Candidate{{Worker: key(10), Taints: []string{"mdc-a"}}}, nil, ErrNoEndpoints, "no endpoints available to route work"},
		// queue.rs test_disallowed_worker_ids_fail_without_queueing.
		{"allow list matches nobody", Request{AllowedWorkers: []uint64{999}}, two(), nil, ErrNoEndpoints, "no endpoints available to route work"},
		{"empty allow list allows nobody", Request{AllowedWorkers: []uint64{}}, two(), nil, ErrNoEndpoints, ""},
		{"no candidates", Request{}, nil, nil, ErrNoEndpoints, ""},
		{"overloaded and incompatible is still overloaded", Request{RequiredTaints: []string{"a"}},
			[]Candidate{{Worker: key(0), Taints: []string{"a"}, Overloaded: true}, {Worker: key(1)}}, nil, ErrAllOverloaded, ""},
		// Dynamo's custom-policy tests (services/selection/tests.rs): a
		// filter rejecting all → 503.
		{"policy filters reject everyone", Request{}, two(),
			func(p *Policy) { p.Filters = []Filter{rejectWorker(0), rejectWorker(1)} }, ErrAllFiltered,
			"all eligible workers were rejected by policy filters"},
		{"filters do not mask overload", Request{}, []Candidate{{Worker: key(0), Overloaded: true}, {Worker: key(1), Overloaded: true}},
			func(p *Policy) { p.Filters = []Filter{rejectWorker(0)} }, ErrAllOverloaded, ""},
		// Custom-policy tests: non-finite cost → 500 containing "non-finite".
		{"non-finite cost", Request{}, two(), func(p *Policy) { p.Scorer = constScorer(math.NaN()) }, ErrNonFiniteCost,
			"scorer 0 produced a non-finite cost for candidate row 0"},
		{"invalid picker row", Request{}, two(), func(p *Policy) { p.Picker = rowPicker(5) }, ErrInvalidPickerRow,
			"picker returned candidate row 5, but the candidate table contains 2 rows"},
		{"zero isl", Request{ISL: -1}, two(), nil, ErrInvalidRequest, "invalid scheduling request: isl_tokens must be greater than 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req
			if req.ISL == 0 {
				req.ISL = 16
			} else if req.ISL < 0 {
				req.ISL = 0
			}
			req.BlockSize = 16
			req.Weights = DefaultWeights()
			p := DefaultPolicy()
			if tc.policy != nil {
				tc.policy(&p)
			}
			_, err := p.Select(seeded(1), &req, tc.cands, nil)
			if !errors.Is(err, tc.is) {
				t.Fatalf("err = %v, want %v", err, tc.is)
			}
			if tc.text != "" && err.Error() != tc.text {
				t.Errorf("text = %q, want %q", err.Error(), tc.text)
			}
		})
	}
}

type rejectWorker uint64

func (r rejectWorker) Filter(_ *Request, c *Candidate) bool { return c.Worker.WorkerID != uint64(r) }

type constScorer float64

func (s constScorer) Score(*Context, *Candidate) (float64, error) { return float64(s), nil }

type rowPicker int

func (r rowPicker) Pick(*rand.Rand, *Context, []Scored) (int, error) { return int(r), nil }

// Dynamo's custom_worker_selection_policy test (services/selection/tests.rs):
// a custom filter, scorer = worker id, lowest-cost picker choose worker 2
// when the filter rejects worker 1.
func TestCustomPolicyComposesFilterScorerPicker(t *testing.T) {
	p := Policy{Filters: []Filter{rejectWorker(1)}, Scorer: idScorer{}, Picker: SoftmaxPicker{}}
	req := &Request{ISL: 4, BlockSize: 4, Weights: DefaultWeights()}
	got := selectWorker(t, p, req, []Candidate{{Worker: key(3)}, {Worker: key(1)}, {Worker: key(2)}})
	if got.Worker.WorkerID != 2 || got.Cost != 2 {
		t.Errorf("chose %v at %v, want worker 2 at cost 2", got.Worker, got.Cost)
	}
}

type idScorer struct{}

func (idScorer) Score(_ *Context, c *Candidate) (float64, error) {
	return float64(c.Worker.WorkerID), nil
}

func TestSelectReportsResponseValuesOfTheChosenRank(t *testing.T) {
	req := &Request{ISL: 40, BlockSize: 16, Weights: DefaultWeights(), TrackedBlocks: 2}
	cands := []Candidate{{Worker: key(0), Overlap: index.Overlap{Device: 1, Host: 1}, ActiveDecodeBlocks: 10, AdditionalBlocks: 1}}
	got := selectWorker(t, DefaultPolicy(), req, cands)
	if got.CachedTokens != 28 || got.EffectivePrefillTokens != 12 || got.PotentialDecodeBlocks != 12 {
		t.Errorf("cached %d effective %d potential %d, want 28 12 12", got.CachedTokens, got.EffectivePrefillTokens, got.PotentialDecodeBlocks)
	}
	req.Weights.TrackActiveBlocks = false
	if got := selectWorker(t, DefaultPolicy(), req, cands); got.PotentialDecodeBlocks != 3 {
		t.Errorf("untracked potential decode blocks = %d, want 3 (all request blocks)", got.PotentialDecodeBlocks)
	}
}

// unseeded_minimum_picker_only_selects_workers_tied_for_lowest_cost.
func TestArgminOnlyPicksWorkersTiedForLowestCost(t *testing.T) {
	w := DefaultWeights()
	w.OverlapScoreCredit, w.PrefillLoadScale, w.DecodeActiveRequestWeight = 0, 0, 1
	rnd := seeded(17)
	var s Scratch
	for _, best := range [][]uint64{{0, 1}, {2, 5}, {6, 7}} {
		cands := make([]Candidate, 8)
		for i := range cands {
			cands[i] = Candidate{Worker: key(uint64(i)), ActiveRequests: 10}
			if slices.Contains(best, uint64(i)) {
				cands[i].ActiveRequests = 0
			}
		}
		req := &Request{ISL: 16, BlockSize: 16, Weights: w}
		for range 32 {
			got, err := DefaultPolicy().Select(rnd, req, cands, &s)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(best, got.Worker.WorkerID) {
				t.Fatalf("chose %d, not one of the cheapest %v", got.Worker.WorkerID, best)
			}
		}
	}
}

// Zero-temperature ties are broken uniformly (reservoir sampling in
// selector/default.rs). With a fixed
// seed the counts are exact, so the test cannot flake; the expected counts are
// checked against n/3.
func TestZeroTemperatureTiesAreUniform(t *testing.T) {
	counts := pickCounts(t, 0, []float64{0, 0, 0}, 30_000, 42)
	want := []int{10_008, 10_046, 9_946}
	if !slices.Equal(counts, want) {
		t.Errorf("counts = %v, want %v", counts, want)
	}
	checkNear(t, counts, []float64{1, 1, 1})
}

// checkNear documents that the pinned counts agree with the analytic
// probabilities (weights normalised) to within 2% of the draws.
func checkNear(t *testing.T, counts []int, weights []float64) {
	t.Helper()
	total, sum := 0, 0.0
	for i := range counts {
		total += counts[i]
		sum += weights[i]
	}
	for i := range counts {
		expect := weights[i] / sum * float64(total)
		if math.Abs(float64(counts[i])-expect) > 0.02*float64(total) {
			t.Errorf("row %d: %d draws, expected about %.0f", i, counts[i], expect)
		}
	}
}

// Softmax at T=1 over costs 0, 5, 10: normalised 0, ½, 1, so
// p ∝ 1, e^-½, e^-1 = 0.506, 0.307, 0.186.
func TestSoftmaxSamplesNormalisedCosts(t *testing.T) {
	counts := pickCounts(t, 1, []float64{0, 5, 10}, 30_000, 42)
	want := []int{15_152, 9_330, 5_518}
	if !slices.Equal(counts, want) {
		t.Errorf("counts = %v, want %v", counts, want)
	}
	checkNear(t, counts, []float64{1, math.Exp(-0.5), math.Exp(-1)})
	// Lower temperature sharpens towards the minimum.
	counts = pickCounts(t, 0.1, []float64{0, 5, 10}, 30_000, 42)
	want = []int{29_800, 200, 0}
	if !slices.Equal(counts, want) {
		t.Errorf("T=0.1 counts = %v, want %v", counts, want)
	}
}

func pickCounts(t *testing.T, temp float64, costs []float64, n int, seed uint64) []int {
	t.Helper()
	w := DefaultWeights()
	w.Temperature = temp
	req := &Request{ISL: 16, BlockSize: 16, Weights: w}
	cands := make([]Candidate, len(costs))
	for i := range cands {
		cands[i].Worker = key(uint64(i))
	}
	p := Policy{Scorer: costByID(costs), Picker: SoftmaxPicker{}}
	rnd := seeded(seed)
	var s Scratch
	counts := make([]int, len(costs))
	for range n {
		got, err := p.Select(rnd, req, cands, &s)
		if err != nil {
			t.Fatal(err)
		}
		counts[got.Worker.WorkerID]++
	}
	return counts
}

type costByID []float64

func (c costByID) Score(_ *Context, cand *Candidate) (float64, error) {
	return c[cand.Worker.WorkerID], nil
}

func TestSoftmaxRowEdgeCases(t *testing.T) {
	rows := func(costs ...float64) []Scored {
		out := make([]Scored, len(costs))
		for i, c := range costs {
			out[i].Cost = c
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		rows   []Scored
		t      float64
		sample float64
		want   int
	}{
		// default.rs softmax_sample_orders_extreme_finite_costs.
		{"extreme finite costs still order", rows(-math.MaxFloat64, math.MaxFloat64), 1, 0.6, 0},
		{"extreme finite costs, upper sample", rows(-math.MaxFloat64, math.MaxFloat64), 1, 0.75, 1},
		{"equal costs are uniform: first third", rows(3, 3, 3), 1, 0.33, 0},
		{"equal costs are uniform: last third", rows(3, 3, 3), 1, 0.9, 2},
		{"sample 1 lands on the last row", rows(0, 1), 0.5, 1, 1},
		{"cheapest takes 1/(1+e^-1) at T=1", rows(0, 1), 1, 0.73, 0},
		{"just past it is the dearer row", rows(0, 1), 1, 0.74, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := softmaxRow(tc.rows, tc.t, tc.sample); got != tc.want {
				t.Errorf("row = %d, want %d", got, tc.want)
			}
		})
	}
}

// seeded_selector_is_stable_for_ties_and_temperature_sampling: the same seed
// gives the same sequence whatever order the catalog lists the workers in.
func TestSeededSelectionIsIndependentOfCandidateOrder(t *testing.T) {
	for _, temp := range []float64{0, 0.7} {
		w := DefaultWeights()
		w.Temperature = temp
		req := &Request{ISL: 16, BlockSize: 16, Weights: w}
		orders := [][]uint64{{30, 10, 20}, {20, 30, 10}}
		var seqs [2][]uint64
		for k, order := range orders {
			cands := make([]Candidate, len(order))
			for i, id := range order {
				cands[i].Worker = key(id)
			}
			rnd := seeded(42)
			var s Scratch
			for range 64 {
				got, err := DefaultPolicy().Select(rnd, req, cands, &s)
				if err != nil {
					t.Fatal(err)
				}
				seqs[k] = append(seqs[k], got.Worker.WorkerID)
			}
		}
		if !slices.Equal(seqs[0], seqs[1]) {
			t.Errorf("T=%v: sequences differ:\n%v\n%v", temp, seqs[0], seqs[1])
		}
		if seen := len(slices.Compact(slices.Sorted(slices.Values(seqs[0])))); seen != 3 {
			t.Errorf("T=%v: only %d distinct workers chosen over 64 tied picks", temp, seen)
		}
	}
}

func TestSelectWithScratchDoesNotAllocate(t *testing.T) {
	cands := benchCandidates(64)
	req := benchRequest(0)
	rnd := seeded(1)
	var s Scratch
	p := DefaultPolicy()
	if _, err := p.Select(rnd, req, cands, &s); err != nil {
		t.Fatal(err)
	}
	for _, temp := range []float64{0, 0.5} {
		req.Weights.Temperature = temp
		allocs := testing.AllocsPerRun(100, func() {
			if _, err := p.Select(rnd, req, cands, &s); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("T=%v: %v allocations per Select, want 0", temp, allocs)
		}
	}
}

// TestSelectRowsRanksTheEligibleRowsInPlace: SelectRows keeps, in place and
// in (worker id, dp rank) order, exactly the rows Select ranks — moving rows
// past the ones it drops, and falling back to the saturated rows, unmoved,
// when no rank has room — and leaves the choice to the same rows.
func TestSelectRowsRanksTheEligibleRowsInPlace(t *testing.T) {
	row := func(id uint64, mut func(*Candidate)) Scored {
		c := Candidate{Worker: index.WorkerKey{WorkerID: id}, ActiveDecodeBlocks: int(id)}
		if mut != nil {
			mut(&c)
		}
		return Scored{Candidate: c}
	}
	overloaded := func(c *Candidate) { c.Overloaded = true }
	saturated := func(c *Candidate) { c.Saturated = true }
	tainted := func(c *Candidate) { c.Taints = []string{"gpu"} }
	for _, tc := range []struct {
		name       string
		rows       []Scored
		req        Request
		wantRanked []uint64 // ranked rows' workers, in order
		wantChosen uint64
		wantErr    error
	}{
		{name: "all kept", rows: []Scored{row(3, nil), row(1, nil), row(2, nil)},
			wantRanked: []uint64{1, 2, 3}, wantChosen: 1},
		{name: "dropped rows are passed over", rows: []Scored{row(1, overloaded), row(2, saturated), row(3, nil), row(4, overloaded), row(5, nil)},
			wantRanked: []uint64{3, 5}, wantChosen: 3},
		{name: "no room: the saturated rows, none moved before", rows: []Scored{row(1, overloaded), row(4, saturated), row(2, saturated)},
			req: Request{ServeSaturated: true}, wantRanked: []uint64{2, 4}, wantChosen: 2},
		{name: "no room and saturated not served", rows: []Scored{row(1, saturated), row(2, overloaded)},
			wantErr: ErrAllOverloaded},
		{name: "required taints", rows: []Scored{row(1, nil), row(2, tainted), row(3, tainted)},
			req: Request{RequiredTaints: []string{"gpu"}}, wantRanked: []uint64{2, 3}, wantChosen: 2},
		{name: "pinned", rows: []Scored{row(1, nil), row(2, nil), row(3, nil)},
			req: Request{Pinned: &index.WorkerKey{WorkerID: 3}}, wantRanked: []uint64{3}, wantChosen: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req
			req.ISL, req.BlockSize = 16, 16
			req.Weights.PrefillLoadScale, req.Weights.TrackActiveBlocks = 1, true
			var s Scratch
			rows := append(s.Rows(len(tc.rows)), tc.rows...)
			got, err := DefaultPolicy().SelectRows(seeded(1), &req, rows, &s)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			var ranked []uint64
			for _, r := range s.scored {
				ranked = append(ranked, r.Worker.WorkerID)
			}
			if !slices.Equal(ranked, tc.wantRanked) || got.Worker.WorkerID != tc.wantChosen {
				t.Fatalf("ranked %v chose %d, want %v and %d", ranked, got.Worker.WorkerID, tc.wantRanked, tc.wantChosen)
			}
			// Select over the same candidates agrees.
			var cands []Candidate
			for _, r := range tc.rows {
				cands = append(cands, r.Candidate)
			}
			if again, err := DefaultPolicy().Select(seeded(1), &req, cands, nil); err != nil || again.Worker != got.Worker {
				t.Fatalf("Select chose %v (%v), SelectRows %v", again.Worker, err, got.Worker)
			}
		})
	}
}
