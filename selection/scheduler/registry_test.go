package scheduler

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvselect/kvselect/selection/index"
)

// builtins are the policies this package registers.
var builtins = []string{"kv-cost", "least-loaded", "longest-prefix", "predicted-latency", "random", "round-robin"}

// registerForTest registers f as name for the duration of the test, so the
// package registry is as the program sees it again afterwards (and -count=2
// does not register twice).
func registerForTest(t *testing.T, name string, f Factory) {
	t.Helper()
	Register(name, f)
	t.Cleanup(func() {
		registry.Lock()
		defer registry.Unlock()
		delete(registry.m, name)
	})
}

func TestRegisterPanicsOnMisuse(t *testing.T) {
	ok := func(Params) (Policy, error) { return DefaultPolicy(), nil }
	for _, tc := range []struct {
		name   string
		policy string
		f      Factory
		want   string
	}{
		{"duplicate name", DefaultPolicyName, ok, "registered twice"},
		{"empty name", "", ok, "invalid policy name"},
		{"leading space", " mine", ok, "invalid policy name"},
		{"trailing space", "mine ", ok, "invalid policy name"},
		{"inner space", "my policy", ok, "invalid policy name"},
		{"comma", "a,b", ok, "invalid policy name"},
		{"control character", "mine\n", ok, "invalid policy name"},
		{"nil factory", "mine", nil, "nil factory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				r := recover()
				if r == nil {
					t.Fatalf("Register(%q) did not panic", tc.policy)
				}
				if msg := fmt.Sprint(r); !strings.Contains(msg, tc.want) {
					t.Errorf("panic %q, want it to mention %q", msg, tc.want)
				}
			}()
			Register(tc.policy, tc.f)
		})
	}
	if slices.Contains(Names(), "mine") {
		t.Error("a rejected registration left its name behind")
	}
}

func TestNamesAreSortedAndHoldTheBuiltins(t *testing.T) {
	if got := Names(); !slices.Equal(got, builtins) {
		t.Fatalf("Names() = %v, want %v", got, builtins)
	}
	registerForTest(t, "a-first", func(Params) (Policy, error) { return DefaultPolicy(), nil })
	got := Names()
	if !slices.IsSorted(got) || got[0] != "a-first" || len(got) != len(builtins)+1 {
		t.Errorf("Names() after registering a-first = %v", got)
	}
}

func TestNewUnknownPolicyListsTheRegisteredOnes(t *testing.T) {
	_, err := New("kv-costs", nil)
	if err == nil {
		t.Fatal("New accepted an unknown policy")
	}
	for _, want := range append([]string{`"kv-costs"`}, builtins...) {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}

func TestNewRejectsBadParametersNamingAllOfThem(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy string
		params Params
		want   []string
	}{
		{"kv-cost: unknown, out of range and wrong type at once", "kv-cost",
			Params{"bogus": 1.0, "router_temperature": -0.5, "host_cache_hit_weight": 1.5, "overlap_score_credit": "high"},
			[]string{"policy kv-cost", `unknown parameter "bogus"`, "router_temperature: -0.5 is outside",
				"host_cache_hit_weight: 1.5 is outside [0, 1]", "overlap_score_credit: high is not a number"}},
		{"kv-cost: the unknown-parameter error lists the known ones", "kv-cost", Params{"temperature": 0.1},
			append([]string{`unknown parameter "temperature"`}, CostParamNames()...)},
		{"kv-cost: NaN is out of range", "kv-cost", Params{"prefill_load_scale": math.NaN()},
			[]string{"prefill_load_scale: NaN is outside"}},
		{"round-robin takes none", "round-robin", Params{"step": 2.0}, []string{"policy round-robin", `unknown parameter "step": the policy takes none`}},
		{"random takes none", "random", Params{"seed": 1.0}, []string{"policy random", `unknown parameter "seed"`}},
		{"least-loaded takes none", "least-loaded", Params{"a": 1.0, "b": 2.0},
			[]string{"policy least-loaded", `unknown parameter "a"`, `unknown parameter "b"`}},
		{"longest-prefix takes none", "longest-prefix", Params{"tiers": true}, []string{"policy longest-prefix", `unknown parameter "tiers"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.policy, tc.params)
			if err == nil {
				t.Fatalf("New(%s, %v) accepted", tc.policy, tc.params)
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
		})
	}
}

func TestNewChecksWhatTheFactoryReturns(t *testing.T) {
	boom := errors.New("boom")
	registerForTest(t, "test-failing", func(Params) (Policy, error) { return Policy{}, boom })
	registerForTest(t, "test-incomplete", func(Params) (Policy, error) { return Policy{Scorer: CostScorer{}}, nil })
	if _, err := New("test-failing", nil); !errors.Is(err, boom) || !strings.Contains(err.Error(), "policy test-failing") {
		t.Errorf("factory error = %v, want boom wrapped with the policy name", err)
	}
	if _, err := New("test-incomplete", nil); err == nil || !strings.Contains(err.Error(), "without scorer or picker") {
		t.Errorf("policy without a picker: err = %v", err)
	}
}

func TestKVCostParameters(t *testing.T) {
	def := DefaultWeights().CostWeights
	for _, tc := range []struct {
		name   string
		params Params
		want   *CostWeights // nil: the caller's router configuration applies
	}{
		{"no parameters keep the router configuration's weights", nil, nil},
		{"empty parameters too", Params{}, nil},
		{"some parameters replace Dynamo's defaults", Params{"router_temperature": 0.5, "overlap_score_credit": 2},
			&CostWeights{OverlapScoreCredit: 2, PrefillLoadScale: def.PrefillLoadScale,
				HostCacheHitWeight: def.HostCacheHitWeight, DiskCacheHitWeight: def.DiskCacheHitWeight, Temperature: 0.5}},
		{"a zero is a value, not an absence", Params{"host_cache_hit_weight": 0.0},
			&CostWeights{OverlapScoreCredit: 1, PrefillLoadScale: 1, DiskCacheHitWeight: 0.25}},
		{"every parameter round-trips through CostParams",
			CostParams(CostWeights{OverlapScoreCredit: 1.5, OverlapScoreCreditDecay: 0.25, PrefillLoadScale: 3,
				DecodeActiveRequestWeight: 4, HostCacheHitWeight: 0.5, DiskCacheHitWeight: 0.125, Temperature: 0.7}),
			&CostWeights{OverlapScoreCredit: 1.5, OverlapScoreCreditDecay: 0.25, PrefillLoadScale: 3,
				DecodeActiveRequestWeight: 4, HostCacheHitWeight: 0.5, DiskCacheHitWeight: 0.125, Temperature: 0.7}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(DefaultPolicyName, tc.params)
			if err != nil {
				t.Fatal(err)
			}
			if p.Scorer != (CostScorer{}) || p.Picker != (SoftmaxPicker{}) || !p.ExclusiveAffinity || len(p.Filters) != 0 {
				t.Errorf("kv-cost is not Dynamo's default policy: %+v", p)
			}
			switch {
			case tc.want == nil && p.Costs != nil:
				t.Errorf("Costs = %+v, want nil", *p.Costs)
			case tc.want != nil && (p.Costs == nil || *p.Costs != *tc.want):
				t.Errorf("Costs = %v, want %+v", p.Costs, *tc.want)
			}
		})
	}
}

func TestCostParamNamesMatchCostParams(t *testing.T) {
	names := CostParamNames()
	if len(names) != 7 || names[len(names)-1] != "router_temperature" {
		t.Errorf("CostParamNames() = %v", names)
	}
	var keys []string
	for k := range CostParams(CostWeights{}) {
		keys = append(keys, k)
	}
	if !slices.Equal(slices.Sorted(slices.Values(keys)), slices.Sorted(slices.Values(names))) {
		t.Errorf("CostParams keys %v, names %v", keys, names)
	}
}

// Host eligibility is Select's, not the policy's: every registered policy
// honours allow lists, required taints, busy rejection, pinned workers and an
// exclusive affinity target alike.
func TestEveryPolicyKeepsHostEligibility(t *testing.T) {
	fleet := func() []Candidate {
		return []Candidate{
			{Worker: key(1), Taints: []string{"a"}},
			{Worker: key(2), Overlap: index.Overlap{Device: 3}},
			{Worker: key(3), Taints: []string{"a"}, ActivePrefillTokens: 900, ActiveRequests: 9},
			{Worker: key(4), Overlap: index.Overlap{Device: 4}, Overloaded: true},
		}
	}
	target := func(id uint64) *Target { return &Target{WorkerID: id} }
	for _, name := range Names() {
		p, err := New(name, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name    string
			req     Request
			allowed []uint64 // the workers the pick may land on
			err     error
		}{
			{"allow list", Request{AllowedWorkers: []uint64{3}}, []uint64{3}, nil},
			{"required taints", Request{RequiredTaints: []string{"a"}}, []uint64{1, 3}, nil},
			{"busy rejection", Request{}, []uint64{1, 2, 3}, nil},
			{"pinned worker", Request{Pinned: &index.WorkerKey{WorkerID: 3}}, []uint64{3}, nil},
			{"pinned overloaded worker", Request{Pinned: &index.WorkerKey{WorkerID: 4}}, nil, ErrPinnedOverloaded},
			{"exclusive affinity target", Request{AffinityTarget: target(3)}, []uint64{3}, nil},
			{"overloaded affinity target is ignored", Request{AffinityTarget: target(4)}, []uint64{1, 2, 3}, nil},
			{"only overloaded ranks", Request{AllowedWorkers: []uint64{4}}, nil, ErrAllOverloaded},
			{"nothing eligible", Request{RequiredTaints: []string{"b"}}, nil, ErrNoEndpoints},
		} {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				req := tc.req
				req.ISL, req.BlockSize, req.Weights = 64, 16, DefaultWeights()
				var s Scratch
				rnd := seeded(5)
				for range 16 {
					got, err := p.Select(rnd, &req, fleet(), &s)
					if tc.err != nil {
						if !errors.Is(err, tc.err) {
							t.Fatalf("err = %v, want %v", err, tc.err)
						}
						return
					}
					if err != nil {
						t.Fatal(err)
					}
					if !slices.Contains(tc.allowed, got.Worker.WorkerID) {
						t.Fatalf("chose worker %d, want one of %v", got.Worker.WorkerID, tc.allowed)
					}
				}
			})
		}
	}
}

// One Policy value serves every partition of a service, each partition with
// its own Scratch and random source under its own lock: concurrent Selects
// through one value must not share state (run with -race), and each
// partition must see the choices it would see alone.
func TestEveryPolicyServesPartitionsConcurrently(t *testing.T) {
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			p, err := New(name, nil)
			if err != nil {
				t.Fatal(err)
			}
			run := func(seed uint64) []index.WorkerKey {
				req := &Request{ISL: 64, BlockSize: 16, Weights: DefaultWeights()}
				cands := benchCandidates(16)
				rnd, s := rand.New(rand.NewPCG(seed, 1)), new(Scratch)
				var out []index.WorkerKey
				for range 200 {
					got, err := p.Select(rnd, req, cands, s)
					if err != nil {
						t.Error(err)
						return nil
					}
					out = append(out, got.Worker)
				}
				return out
			}
			alone := [4][]index.WorkerKey{}
			for i := range alone {
				alone[i] = run(uint64(i))
			}
			var together [4][]index.WorkerKey
			var wg sync.WaitGroup
			for i := range together {
				wg.Add(1)
				go func() {
					defer wg.Done()
					together[i] = run(uint64(i))
				}()
			}
			wg.Wait()
			for i := range alone {
				if !slices.Equal(alone[i], together[i]) {
					t.Errorf("partition %d chose differently beside the others", i)
				}
			}
		})
	}
}
