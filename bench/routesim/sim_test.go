package routesim

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kvselect/kvselect/bench/mooncake"
)

var (
	traceOnce sync.Once
	trace     []mooncake.Request
	traceErr  error
)

func loadTrace(t *testing.T, n int) []mooncake.Request {
	t.Helper()
	traceOnce.Do(func() { trace, traceErr = mooncake.LoadTrace("../testdata/mooncake/conversation_trace.jsonl.gz") })
	if traceErr != nil {
		t.Fatal(traceErr)
	}
	return trace[:min(n, len(trace))]
}

// TestTimingModel checks the simulation's arithmetic on a hand-made trace:
// two workers, round-robin, known lengths.
func TestTimingModel(t *testing.T) {
	cfg := Config{Workers: 2, Capacity: 100, Speedup: 1, PrefillPerToken: time.Millisecond,
		DecodePerToken: 10 * time.Millisecond, Seed: 1}
	w, err := NewWorld(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tr := []mooncake.Request{
		{Timestamp: 0, InputLength: 1024, OutputLength: 3, HashIDs: []uint64{1, 2}},      // w0: 1024 ms prefill
		{Timestamp: 0, InputLength: 512, OutputLength: 1, HashIDs: []uint64{7}},          // w1: 512 ms
		{Timestamp: 100, InputLength: 1536, OutputLength: 1, HashIDs: []uint64{1, 2, 3}}, // w0: 2 cached blocks, 512 uncached, queued until 1024
		{Timestamp: 2000, InputLength: 512, OutputLength: 1, HashIDs: []uint64{9}},       // w1: idle again
	}
	res, err := Run(context.Background(), w, tr, newPolicy(t, w, "round-robin"), nil)
	if err != nil {
		t.Fatal(err)
	}
	// TTFTs: 1024, 512, (1024-100)+512 = 1436, 512 ms. Sorted: 512 512 1024 1436.
	if res.TTFTP50Ms != 1024 || res.TTFTP90Ms != 1436 {
		t.Fatalf("TTFT p50 %v p90 %v, want 1024 and 1436", res.TTFTP50Ms, res.TTFTP90Ms)
	}
	if want := 2.0 / 7; res.HitRate != want {
		t.Fatalf("hit rate %v, want %v", res.HitRate, want)
	}
	// Last completion: request 4 at 2000 + 512 ms (one output token).
	if want := 4 / 2.512; res.Throughput < want-1e-9 || res.Throughput > want+1e-9 {
		t.Fatalf("throughput %v, want %v", res.Throughput, want)
	}
}

func TestDecodeInterference(t *testing.T) {
	cfg := Config{Workers: 1, Capacity: 100, Speedup: 1, PrefillPerToken: time.Millisecond,
		DecodePerToken: time.Second, DecodeInterference: 0.5, Seed: 1}
	w, err := NewWorld(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tr := []mooncake.Request{
		{Timestamp: 0, InputLength: 2000, OutputLength: 100, HashIDs: []uint64{1, 2, 3, 4}}, // TTFT 2000 ms, then decodes 2,000 context tokens
		{Timestamp: 5000, InputLength: 100, OutputLength: 1, HashIDs: []uint64{9}},          // prefill slowed by 1 + 0.5*2 = 2x
		{Timestamp: 6000, InputLength: 100, OutputLength: 1, HashIDs: []uint64{10}},         // the same
	}
	res, err := Run(context.Background(), w, tr, newPolicy(t, w, "round-robin"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.TTFTP50Ms != 200 || res.TTFTP90Ms != 2000 {
		t.Fatalf("TTFT p50 %v p90 %v, want 200 (slowed) and 2000", res.TTFTP50Ms, res.TTFTP90Ms)
	}
}

func newPolicy(t *testing.T, w *World, name string) *Service {
	t.Helper()
	p, err := NewPolicy(context.Background(), w, name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// longest-prefix reads the service's index, which the engines' KV events
// feed: it follows the caches exactly.
func TestLongestPrefixFollowsTheEnginesCaches(t *testing.T) {
	w, err := NewWorld(Config{Workers: 4, Capacity: 100, Speedup: 1, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	p := newPolicy(t, w, "longest-prefix")
	p.Admitted(ctx, nil, 2, w.engines[2].Process([]uint64{5, 6, 7}))
	p.Admitted(ctx, nil, 1, w.engines[1].Process([]uint64{5}))
	ids := []uint64{5, 6, 8}
	r := &Request{ID: "r", Trace: mooncake.Request{InputLength: 3 * TraceBlockTokens, OutputLength: 1, HashIDs: ids},
		Locals: mooncake.LocalHashes(ids)}
	got, err := p.Pick(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if got != 2 {
		t.Fatalf("longest-prefix picked %d, want 2 (two cached blocks)", got)
	}
	// Evictions reach the index too: once worker 2 drops its blocks, worker
	// 1's single block is the longest prefix.
	p.Done(ctx, r)
	p.Admitted(ctx, nil, 2, w.engines[2].Process(seq(100, 200)))
	if w.CachedPrefix(2, ids) != 0 {
		t.Fatal("worker 2 still caches the prefix; the test needs a bigger flood")
	}
	r.ID = "r2"
	if got, err := p.Pick(ctx, r); err != nil || got != 1 {
		t.Fatalf("after the eviction longest-prefix picked %d (%v), want 1", got, err)
	}
}

func seq(from, to uint64) []uint64 {
	var out []uint64
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

// TestPoliciesOnTraceSlice runs every policy on the first 1,500 requests:
// runs end with no active load in the service's view, KV-aware routing beats
// round-robin on hit rate, round-robin spreads evenly, and the figures are
// deterministic.
func TestPoliciesOnTraceSlice(t *testing.T) {
	tr := loadTrace(t, 1500)
	ctx := context.Background()
	cfg := DefaultConfig()
	cfg.Capacity = 2048
	hit := map[string]float64{}
	results := map[string]Result{}
	for _, name := range append(Policies(), "kv-cost") { // kv-cost twice: deterministic
		w, err := NewWorld(cfg)
		if err != nil {
			t.Fatal(err)
		}
		p := newPolicy(t, w, name)
		calls := 0
		res, err := Run(ctx, w, tr, p, func(done, total int) { calls++ })
		if err != nil {
			t.Fatal(err)
		}
		if calls < 2 || res.Policy != name || res.Requests != len(tr) || res.HitRate <= 0 || res.HitRate >= 1 || res.TTFTP90Ms < res.TTFTP50Ms {
			t.Fatalf("%s: implausible result %+v (progress calls %d)", name, res, calls)
		}
		for _, m := range p.Loads() {
			for _, l := range m.Loads {
				if l.PotentialPrefillTokens != 0 || l.PotentialDecodeBlocks != 0 || l.ActiveRequests != 0 {
					t.Fatalf("%s: load left after the run: %+v", name, l)
				}
			}
		}
		res.SelectP50Us, res.SelectP99Us = 0, 0 // wall clock
		if prev, ok := results[name]; ok && prev != res {
			t.Fatalf("%s: a second run differs:\n%+v\n%+v", name, prev, res)
		}
		results[name] = res
		hit[name] = res.HitRate
	}
	if hit["kv-cost"] < 1.5*hit["round-robin"] || hit[ApproxPolicy] <= hit["round-robin"] {
		t.Fatalf("KV-aware hit rates %v", hit)
	}
	if share := results["round-robin"].MaxShare; share != 188.0/1500 {
		t.Errorf("round-robin max worker share %v, want 188/1500", share)
	}
	if inf := InfiniteCacheHitRate(tr); inf < hit["longest-prefix"] {
		t.Fatalf("infinite cache %.3f below longest-prefix %.3f", inf, hit["longest-prefix"])
	}
}

func TestNewPolicyNames(t *testing.T) {
	for _, name := range Policies() {
		if !Known(name) {
			t.Errorf("default policy %q is not known", name)
		}
	}
	for _, name := range []string{"kvselect", "greedy-oracle", "", "kv-cost,random"} {
		if Known(name) {
			t.Errorf("%q is known", name)
		}
		w, _ := NewWorld(DefaultConfig())
		if _, err := NewPolicy(context.Background(), w, name); err == nil {
			t.Errorf("NewPolicy(%q) succeeded", name)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	for _, c := range []Config{
		{Workers: 0, Capacity: 1, Speedup: 1},
		{Workers: 1, Capacity: 0, Speedup: 1},
		{Workers: 1, Capacity: 1, Speedup: 0},
		{Workers: 1, Capacity: 1, Speedup: 1, PrefillPerToken: -1},
		{Workers: 1, Capacity: 1, Speedup: 1, DecodeInterference: -1},
	} {
		if _, err := NewWorld(c); err == nil {
			t.Errorf("config %+v accepted", c)
		}
	}
}

// Bypass traffic fills the engines but never the service's bookings; engine
// metrics, when on, reach the service's workers view.
func TestBypassAndEngineMetrics(t *testing.T) {
	tr := loadTrace(t, 300)
	tests := []struct {
		name          string
		bypass        float64
		engineMetrics bool
	}{
		{"no bypass, no metrics", 0, false},
		{"all bypass", 1, false},
		{"bypass with metrics", 0.3, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Bypass, cfg.EngineMetrics = tt.bypass, tt.engineMetrics
			w, err := NewWorld(cfg)
			if err != nil {
				t.Fatal(err)
			}
			p := newPolicy(t, w, "kv-cost")
			res, err := Run(context.Background(), w, tr, p, nil)
			if err != nil {
				t.Fatal(err)
			}
			if res.Bypassed+res.Requests != len(tr) {
				t.Fatalf("%d bypassed + %d routed != %d", res.Bypassed, res.Requests, len(tr))
			}
			switch {
			case tt.bypass == 0 && res.Bypassed != 0:
				t.Fatalf("%d bypassed without bypass", res.Bypassed)
			case tt.bypass == 1 && res.Requests != 0:
				t.Fatalf("%d routed with bypass 1", res.Requests)
			}
			// Every routed booking was freed; bypass ones were never booked.
			for _, ml := range p.Loads() {
				for _, l := range ml.Loads {
					if l.ActiveRequests != 0 {
						t.Fatalf("load left after the run: %+v", l)
					}
				}
			}
			// Only the first two workers took bypass traffic, and it went
			// through their engines (caches).
			for i := 2; i < cfg.Workers && tt.bypass == 1; i++ {
				if w.engines[i].Len() != 0 {
					t.Fatalf("worker %d cached %d blocks without routed traffic", i, w.engines[i].Len())
				}
			}
			if tt.bypass == 1 && w.engines[0].Len() == 0 {
				t.Fatal("bypass traffic left worker 0's cache empty")
			}
			metrics := 0
			for _, r := range p.Workers() {
				if r.EngineMetrics != nil {
					metrics++
				}
			}
			if want := map[bool]int{false: 0, true: cfg.Workers}[tt.engineMetrics]; metrics != want || (tt.engineMetrics && res.Scrapes == 0) {
				t.Fatalf("%d workers with engine metrics (%d scrapes), want %d", metrics, res.Scrapes, want)
			}
		})
	}
}

// Mid-run, a bypass request is visible in the engine's counts but not in
// the service's bookings.
func TestBypassNotBooked(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Bypass = 1
	w, err := NewWorld(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := newPolicy(t, w, "kv-cost")
	spy := &loadSpy{Service: p, w: w}
	if _, err := Run(context.Background(), w, loadTrace(t, 50), spy, nil); err != nil {
		t.Fatal(err)
	}
	if spy.engineBusy == 0 {
		t.Fatal("the engines never held a bypass request")
	}
	if spy.booked != 0 {
		t.Fatalf("the service booked %d requests of bypass traffic", spy.booked)
	}
}

// loadSpy samples the engines and the service's loads at every admission.
type loadSpy struct {
	*Service
	w                  *World
	engineBusy, booked int
}

func (s *loadSpy) Admitted(ctx context.Context, r *Request, worker int, events []mooncake.Event) {
	s.Service.Admitted(ctx, r, worker, events)
	for i := range s.w.Workers() {
		st := s.w.EngineState(i)
		s.engineBusy += st.Waiting + st.Running
	}
	for _, ml := range s.Loads() {
		for _, l := range ml.Loads {
			s.booked += int(l.ActiveRequests)
		}
	}
}
