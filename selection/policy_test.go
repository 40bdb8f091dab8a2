package selection

import (
	"fmt"
	"sync"
	"testing"

	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/kvhash"
	"github.com/kvselect/kvselect/selection/routerconfig"
	"github.com/kvselect/kvselect/selection/scheduler"
)

var policyPrompt = []uint32{1, 2, 3, 4, 5, 6, 7, 8} // two blocks of four tokens

// kvService is a service fed by KV events, with workers 1 and 2 and the
// policy prompt cached on worker 1 in the given tier (applied straight to the
// index, as a listener would).
func kvService(t *testing.T, tier index.Tier, edit func(*routerconfig.Config)) *Service {
	t.Helper()
	s, _ := newService(t, func(c *routerconfig.Config) {
		c.UseKVEvents = true
		if edit != nil {
			edit(c)
		}
	})
	for _, id := range []uint64{1, 2} {
		r := workerRec(id)
		r.KVEventsEndpoint = ptr(fmt.Sprintf("tcp://127.0.0.1:555%d", id))
		mustUpsert(t, s, r)
	}
	locals := kvhash.LocalBlockHashes(policyPrompt, "", "", kvhash.BlockOptions{BlockSize: 4})
	ev := indexStored(1, locals)
	ev.Tier = tier
	if err := s.parts.Get(partitionOf(PartitionKey{ModelName: "model"})).Index().Apply(&ev); err != nil {
		t.Fatal(err)
	}
	return s
}

// costsWith is the default cost weights with edit applied.
func costsWith(edit func(*scheduler.CostWeights)) *scheduler.CostWeights {
	w := CostWeightsOf(routerconfig.Default())
	edit(&w)
	return &w
}

// creditOf is worker 1's router credit for the policy prompt.
func creditOf(t *testing.T, s *Service, o *routerconfig.Override) float64 {
	t.Helper()
	resp, err := s.Inspect().OverlapScores(bg, &PromptQuery{PartitionKey: PartitionKey{ModelName: "model"},
		PromptRequest: PromptRequest{TokenIDs: policyPrompt}, RouterConfigOverride: o})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range resp.Workers {
		if r.WorkerID == 1 {
			return r.RouterCreditBlocks
		}
	}
	t.Fatalf("worker 1 missing from %+v", resp)
	return 0
}

// Worker 1 caches the prompt and carries one booking of another prompt (no
// prefill, one decode block): with the device credit it costs 0 + 3 blocks
// against worker 2's 2 + 2, without it 2 + 3 against 4. So the overlap
// credit in force decides the choice.
func TestPolicyCostsSitBetweenRouterConfigAndOverride(t *testing.T) {
	noCredit := costsWith(func(w *scheduler.CostWeights) { w.OverlapScoreCredit = 0 })
	fullCredit := costsWith(func(w *scheduler.CostWeights) { w.OverlapScoreCredit = 1 })
	for _, tc := range []struct {
		name       string
		router     func(*routerconfig.Config)
		costs      *scheduler.CostWeights
		override   *routerconfig.Override
		wantWorker uint64
		wantCredit float64
	}{
		{"router config alone", nil, nil, nil, 1, 2},
		{"policy costs replace the router config", nil, noCredit, nil, 2, 0},
		{"policy costs win over a router config without credit",
			func(c *routerconfig.Config) { c.OverlapScoreCredit = 0 }, fullCredit, nil, 1, 2},
		{"override wins over policy costs", nil, noCredit, &routerconfig.Override{OverlapScoreCredit: ptr(1.0)}, 1, 2},
		{"override wins over the router config", nil, nil, &routerconfig.Override{OverlapScoreCredit: ptr(0.0)}, 2, 0},
		{"override of another weight keeps the policy credit", nil, noCredit, &routerconfig.Override{RouterTemperature: ptr(0.0)}, 2, 0},
		{"policy scales the credit", nil, costsWith(func(w *scheduler.CostWeights) { w.OverlapScoreCredit = 3 }), nil, 1, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := kvService(t, index.TierDevice, tc.router)
			if _, err := s.Reserve(bg, explicit("other", 1, 0)); err != nil {
				t.Fatal(err)
			}
			pol := scheduler.DefaultPolicy()
			pol.Costs = tc.costs
			if err := s.SetPolicy(pol); err != nil {
				t.Fatal(err)
			}
			for range 3 {
				req := selReq("", policyPrompt...)
				req.RouterConfigOverride = tc.override
				resp, err := s.Select(bg, req)
				if err != nil {
					t.Fatal(err)
				}
				if resp.WorkerID != tc.wantWorker {
					t.Fatalf("chose worker %d, want %d", resp.WorkerID, tc.wantWorker)
				}
			}
			if got := creditOf(t, s, tc.override); got != tc.wantCredit {
				t.Fatalf("router_credit_blocks = %v, want %v", got, tc.wantCredit)
			}
		})
	}
}

// The cache-hit weights reach the potential loads and the booked prefill: a
// host-tier prefix of two blocks counts 0.75 × 8 = 6 tokens by default, 2
// with a policy weight of 0.25.
func TestPolicyCostsReachPotentialLoadsAndBookedPrefill(t *testing.T) {
	for _, tc := range []struct {
		name        string
		costs       *scheduler.CostWeights
		wantPrefill uint64
	}{
		{"router config", nil, 8 - 6},
		{"policy host weight", costsWith(func(w *scheduler.CostWeights) { w.HostCacheHitWeight = 0.25 }), 8 - 2},
		{"policy host weight zero", costsWith(func(w *scheduler.CostWeights) { w.HostCacheHitWeight = 0 }), 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := kvService(t, index.TierHostPinned, nil)
			pol := scheduler.DefaultPolicy()
			pol.Costs = tc.costs
			if err := s.SetPolicy(pol); err != nil {
				t.Fatal(err)
			}
			pl, err := s.Inspect().PotentialLoads(bg, &PromptQuery{PartitionKey: PartitionKey{ModelName: "model"}, PromptRequest: PromptRequest{TokenIDs: policyPrompt}})
			if err != nil {
				t.Fatal(err)
			}
			if pl[0].WorkerID != 1 || pl[0].PotentialPrefillTokens != tc.wantPrefill {
				t.Fatalf("potential loads %+v, want worker 1 at %d prefill tokens", pl, tc.wantPrefill)
			}
			req := selReq("b", policyPrompt...)
			req.PinnedWorker = &WorkerRank{WorkerID: 1}
			resp, err := s.SelectAndReserve(bg, req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.EffectivePrefillTokens != tc.wantPrefill || loadsByWorker(s)[1].PotentialPrefillTokens != tc.wantPrefill {
				t.Fatalf("booked %d prefill tokens (loads %+v), want %d", resp.EffectivePrefillTokens, loadsByWorker(s), tc.wantPrefill)
			}
		})
	}
}

// preferWorker is a policy scorer that sends everything to one worker.
type preferWorker uint64

func (p preferWorker) Score(_ *scheduler.Context, c *scheduler.Candidate) (float64, error) {
	if c.Worker.WorkerID == uint64(p) {
		return 0, nil
	}
	return 1, nil
}

func preferring(worker uint64, costs *scheduler.CostWeights) scheduler.Policy {
	return scheduler.Policy{Scorer: preferWorker(worker), Picker: scheduler.SoftmaxPicker{}, ExclusiveAffinity: true, Costs: costs}
}

func TestSetPolicyTakesEffectForTheNextRequest(t *testing.T) {
	s := kvService(t, index.TierDevice, nil)
	choose := func() uint64 {
		t.Helper()
		resp, err := s.Select(bg, selReq("", policyPrompt...))
		if err != nil {
			t.Fatal(err)
		}
		return resp.WorkerID
	}
	if got := choose(); got != 1 {
		t.Fatalf("default policy chose %d, want the caching worker 1", got)
	}
	costs := costsWith(func(w *scheduler.CostWeights) { w.DecodeActiveRequestWeight = 2 })
	if err := s.SetPolicy(preferring(2, costs)); err != nil {
		t.Fatal(err)
	}
	if got := choose(); got != 2 {
		t.Fatalf("after SetPolicy chose %d, want 2", got)
	}
	costs.DecodeActiveRequestWeight = 7 // the service keeps its own copy
	if got := policyInForce(s); got.Costs == nil || got.Costs.DecodeActiveRequestWeight != 2 {
		t.Fatalf("Policy() = %+v, want the costs set", got)
	}
	got := policyInForce(s)
	got.Costs.DecodeActiveRequestWeight = 9
	if policyInForce(s).Costs.DecodeActiveRequestWeight != 2 {
		t.Fatal("editing Policy()'s result changed the service's policy")
	}

	for _, bad := range []struct {
		name string
		p    scheduler.Policy
		frag string
	}{
		{"no scorer", scheduler.Policy{Picker: scheduler.SoftmaxPicker{}}, "scorer and a picker"},
		{"no picker", scheduler.Policy{Scorer: scheduler.CostScorer{}}, "scorer and a picker"},
		{"negative temperature", preferring(1, costsWith(func(w *scheduler.CostWeights) { w.Temperature = -1 })), "router_temperature"},
		{"host weight above one", preferring(1, costsWith(func(w *scheduler.CostWeights) { w.HostCacheHitWeight = 2 })), "host_cache_hit_weight"},
	} {
		wantKind(t, s.SetPolicy(bad.p), KindBadRequest, bad.frag)
		if got := choose(); got != 2 {
			t.Fatalf("a refused policy (%s) changed the choice to %d", bad.name, got)
		}
	}
	if err := s.SetPolicy(scheduler.DefaultPolicy()); err != nil {
		t.Fatal(err)
	}
	if got := choose(); got != 1 || policyInForce(s).Costs != nil {
		t.Fatalf("back to the default policy: chose %d, costs %+v", got, policyInForce(s).Costs)
	}
}

func TestNewRefusesAnIncompletePolicy(t *testing.T) {
	rc := routerconfig.Default()
	rc.UseKVEvents = false
	p := scheduler.Policy{Scorer: scheduler.CostScorer{}}
	if _, err := New(Config{Router: rc, Policy: &p}); err == nil {
		t.Fatal("New accepted a policy without a picker")
	}
}

// Requests racing SetPolicy each run with one policy: worker 1's policy
// counts the host-tier prefix fully (no prefill left), worker 2's not at all
// (all 8 tokens), so a request mixing one's weights with the other's Select
// books a prefill that does not match its worker. Run with -race.
func TestSetPolicyConcurrentWithSelectAndReserve(t *testing.T) {
	s := kvService(t, index.TierHostPinned, nil)
	// Worker 2 holds the prefix in its host tier too, so the weight matters
	// whichever worker serves.
	locals := kvhash.LocalBlockHashes(policyPrompt, "", "", kvhash.BlockOptions{BlockSize: 4})
	ev := indexStored(2, locals)
	ev.Tier = index.TierHostPinned
	if err := s.parts.Get(partitionOf(PartitionKey{ModelName: "model"})).Index().Apply(&ev); err != nil {
		t.Fatal(err)
	}
	policies := []scheduler.Policy{
		preferring(1, costsWith(func(w *scheduler.CostWeights) { w.HostCacheHitWeight = 1 })),
		preferring(2, costsWith(func(w *scheduler.CostWeights) { w.HostCacheHitWeight = 0 })),
	}
	wantPrefill := map[uint64]uint64{1: 0, 2: 8}
	// The default policy is neither: install one before any request runs.
	if err := s.SetPolicy(policies[1]); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := s.SetPolicy(policies[i%2]); err != nil {
				t.Error(err)
				return
			}
		}
	})
	var served sync.Map
	sawBoth := func() bool {
		_, one := served.Load(uint64(1))
		_, two := served.Load(uint64(2))
		return one && two
	}
	var bookers sync.WaitGroup
	for g := range 4 {
		bookers.Go(func() {
			// At least 200 requests each, and on until both policies served
			// some: the setter may not have been scheduled yet.
			for i := 0; i < 200 || !sawBoth(); i++ {
				if i == 100_000 {
					t.Error("no request saw the other policy: SetPolicy never reached the requests")
					return
				}
				id := fmt.Sprintf("g%d-%d", g, i)
				resp, err := s.SelectAndReserve(bg, selReq(id, policyPrompt...))
				if err != nil {
					t.Error(err)
					return
				}
				if want := wantPrefill[resp.WorkerID]; resp.EffectivePrefillTokens != want {
					t.Errorf("%s: worker %d booked %d prefill tokens, want %d: weights and Select of different policies",
						id, resp.WorkerID, resp.EffectivePrefillTokens, want)
				}
				served.Store(resp.WorkerID, true)
				if err := s.Free(bg, id); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	bookers.Wait()
	close(stop)
	wg.Wait()
}

// policyInForce is a copy of the selection policy s runs with.
func policyInForce(s *Service) scheduler.Policy { return *clonePolicy(*s.policy.Load()) }
