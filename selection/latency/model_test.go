package latency

import (
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// engine is a synthetic engine whose TTFT is linear in the features, with
// noise: what the fit must recover.
type engine struct {
	base, perUncachedK, perAheadK, perQueued, perRunning, perPool float64
}

func (e engine) ttft(f Features) float64 {
	return e.base + e.perUncachedK*f.Uncached/1000 + e.perAheadK*f.PrefillAhead/1000 + e.perQueued*f.Queued +
		e.perRunning*f.Running + e.perPool*f.PoolRequests
}

func randomFeatures(r *rand.Rand) Features {
	return Features{Uncached: float64(r.IntN(4000)), PrefillAhead: float64(r.IntN(8000)), Queued: float64(r.IntN(6)),
		Running: float64(r.IntN(12)), PoolRequests: float64(r.IntN(40)) / 4}
}

func TestFitRecoversALinearEngine(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	eng := engine{base: 0.004, perUncachedK: 0.020, perAheadK: 0.015, perQueued: 0.012, perRunning: 0.002, perPool: 0.008}
	m := NewModel(Config{})
	k := Key{Model: "m", Worker: 1}
	for range 2000 {
		f := randomFeatures(r)
		m.ObserveTTFT(k, f, eng.ttft(f)*(1+0.05*r.NormFloat64()), -1)
	}
	c := m.Coeffs(k)
	if c.Source != "pooled" {
		t.Fatalf("source = %q, want pooled", c.Source)
	}
	want := [ttftDim]float64{eng.base, eng.perUncachedK, eng.perAheadK, eng.perQueued, eng.perRunning, eng.perPool}
	for i, w := range want {
		if math.Abs(c.TTFT[i]-w) > 0.25*w+0.001 {
			t.Errorf("θ%d = %.4f, want %.4f ± 25%%", i, c.TTFT[i], w)
		}
	}
	// Predictions on unseen features within 15 % of the noiseless truth.
	for range 100 {
		f := randomFeatures(r)
		if got, want := c.PredictTTFT(f), eng.ttft(f); RelativeError(got, want) > 0.15 {
			t.Errorf("predict(%+v) = %.4f, want %.4f", f, got, want)
		}
	}
}

func TestFitFollowsAnEngineThatSlowsDown(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	fast := engine{base: 0.002, perUncachedK: 0.010, perAheadK: 0.010, perQueued: 0.005, perRunning: 0.001}
	slow := engine{base: 0.002, perUncachedK: 0.040, perAheadK: 0.040, perQueued: 0.020, perRunning: 0.004}
	m := NewModel(Config{})
	k := Key{Model: "m", Worker: 1}
	for _, eng := range []engine{fast, slow} {
		for range 1500 {
			f := randomFeatures(r)
			m.ObserveTTFT(k, f, eng.ttft(f), -1)
		}
	}
	f := Features{Uncached: 2000, PrefillAhead: 3000, Queued: 2, Running: 4}
	if got, want := m.Coeffs(k).PredictTTFT(f), slow.ttft(f); RelativeError(got, want) > 0.1 {
		t.Errorf("after the slowdown predict = %.4f, want %.4f (forgetting should follow the engine)", got, want)
	}
}

func TestColdStartUsesThePriorThenThePooledFit(t *testing.T) {
	m := NewModel(Config{MinObservations: 4})
	a, b := Key{Model: "m", Worker: 1}, Key{Model: "m", Worker: 2}
	if c := m.Coeffs(a); c.Source != "prior" || c.TTFT != Prior().TTFT {
		t.Fatalf("cold worker: %+v, want the prior", c)
	}
	f := Features{Uncached: 1000}
	for range 3 {
		m.ObserveTTFT(a, f, 0.5, -1)
	}
	if c := m.Coeffs(a); c.Source != "prior" {
		t.Errorf("below MinObservations predictions use %q, want prior", c.Source)
	}
	m.ObserveTTFT(a, f, 0.5, -1)
	if c := m.Coeffs(b); c.Source != "pooled" {
		t.Errorf("a new worker of the same model uses %q, want pooled", c.Source)
	}
	if c := m.Coeffs(Key{Model: "other", Worker: 2}); c.Source != "prior" {
		t.Errorf("a worker of another model uses %q, want prior", c.Source)
	}
	v := m.View()
	if len(v.Workers) != 1 || v.Workers[0].Source != "worker" || v.Workers[0].TTFTObservations != 4 {
		t.Errorf("the view's worker fits: %+v", v.Workers)
	}
	m.Forget(1)
	if v := m.View(); len(v.Workers) != 0 || v.Pooled["m"].TTFTObservations != 4 {
		t.Errorf("after Forget: %+v, want no worker fit and the pooled one kept", v)
	}
}

func TestPredictionNeverFallsWithLoad(t *testing.T) {
	c := Coeffs{TTFT: [ttftDim]float64{0.01, 0.02, -0.5, 0.01, -0.1, -1, -2}}
	light := Features{Uncached: 100}
	heavy := Features{Uncached: 100, PrefillAhead: 5000, Queued: 3, Running: 9, KVUsage: 0.9}
	if c.PredictTTFT(heavy) < c.PredictTTFT(light) {
		t.Errorf("negative coefficients made a loaded rank look faster: %v < %v", c.PredictTTFT(heavy), c.PredictTTFT(light))
	}
}

func TestObservationsRejectNonsense(t *testing.T) {
	m := NewModel(Config{MinObservations: 1})
	k := Key{Model: "m", Worker: 1}
	for _, y := range []float64{math.NaN(), math.Inf(1), -1} {
		m.ObserveTTFT(k, Features{Uncached: 10}, y, 0.1)
		m.ObserveITL(k, 2, y)
	}
	if c := m.Coeffs(k); c.Source != "prior" {
		t.Errorf("invalid observations were fitted: %+v", c)
	}
	if v := m.View(); v.Errors.Observed != 0 {
		t.Errorf("invalid observations were counted: %+v", v.Errors)
	}
}

func TestITLFit(t *testing.T) {
	m := NewModel(Config{})
	k := Key{Model: "m", Worker: 1}
	for i := range 500 {
		running := float64(1 + i%16)
		m.ObserveITL(k, running, 0.005+0.0005*running)
	}
	// The worker's own fit is used once its TTFT side has enough
	// observations; until then the prior's ITL answers.
	for range 20 {
		m.ObserveTTFT(k, Features{}, 0.01, -1)
	}
	c := m.Coeffs(k)
	if got := c.PredictITL(8); math.Abs(got-0.009) > 0.0005 {
		t.Errorf("ITL(8) = %v, want 0.009", got)
	}
}

func TestErrorSummary(t *testing.T) {
	m := NewModel(Config{})
	k := Key{Model: "m", Worker: 1}
	for i := range 3000 {
		pred := 0.1
		obs := 0.1
		if i%5 == 0 {
			obs = 0.05 // predicted twice the observed: relative error 1
		}
		m.ObserveTTFT(k, Features{}, obs, pred)
	}
	e := m.View().Errors
	if e.Observed != 3000 || e.Window != errorWindowSize {
		t.Fatalf("observed %d window %d, want 3000 and %d", e.Observed, e.Window, errorWindowSize)
	}
	if e.RelativeP50 != 0 || e.RelativeP90 != 1 || e.Ratio != 1 {
		t.Errorf("summary %+v, want p50 0, p90 1, ratio 1", e)
	}
}

func TestTraceLifecycle(t *testing.T) {
	var tr Trace
	if _, ok := tr.FirstToken(time.Now()); ok {
		t.Fatal("an empty trace observed a first token")
	}
	t0 := time.Unix(1000, 0)
	tr.Booked = t0
	if ttft, ok := tr.FirstToken(t0.Add(250 * time.Millisecond)); !ok || ttft != 0.25 {
		t.Fatalf("first token = %v %v, want 0.25 true", ttft, ok)
	}
	if _, ok := tr.FirstToken(t0.Add(time.Second)); ok {
		t.Error("a repeated first token was observed again")
	}
	if _, ok := tr.MeanITL(t0.Add(time.Second)); ok {
		t.Error("ITL without output tokens")
	}
	tr.Generated(5)
	tr.Generated(3) // out of order: the count never goes back
	if itl, ok := tr.MeanITL(t0.Add(250*time.Millisecond + 100*time.Millisecond)); !ok || math.Abs(itl-0.025) > 1e-9 {
		t.Errorf("mean ITL = %v %v, want 0.025 (100 ms over 4 tokens after the first)", itl, ok)
	}
}

func TestConcurrentUse(t *testing.T) {
	m := NewModel(Config{MinObservations: 2})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 9))
			for i := range 2000 {
				k := Key{Model: "m", Worker: uint64(i % 8)}
				f := randomFeatures(r)
				m.ObserveTTFT(k, f, 0.01+f.Uncached/1e5, 0.02)
				m.ObserveITL(k, f.Running+1, 0.01)
				_ = m.Coeffs(k).PredictTTFT(f)
				_ = m.Pooled("m")
				if i%500 == 0 {
					_ = m.View()
					m.Forget(uint64(g))
				}
			}
		})
	}
	wg.Wait()
}

func BenchmarkObserveTTFT(b *testing.B) {
	m := NewModel(Config{})
	k := Key{Model: "m", Worker: 1}
	f := Features{Uncached: 1200, PrefillAhead: 3000, Queued: 2, Running: 5}
	b.ReportAllocs()
	for b.Loop() {
		m.ObserveTTFT(k, f, 0.05, 0.05)
	}
}

func TestLowerBoundsSeparateEffectsFromNoise(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	m := NewModel(Config{})
	k := Key{Model: "m", Worker: 1}
	for range 1000 {
		f := randomFeatures(r)
		// TTFT is 30 ms per 1k uncached tokens and 20 ms per queued
		// request, plus noise of 50 ms that has nothing to do with the
		// running requests.
		m.ObserveTTFT(k, f, 0.03*f.Uncached/1000+0.02*f.Queued+0.05*math.Abs(r.NormFloat64()), -1)
	}
	c := m.Coeffs(k)
	if c.TTFTLow[1] < 0.02 || c.TTFTLow[3] < 0.01 {
		t.Errorf("clear effects lost at their lower bounds: %v", c.TTFTLow)
	}
	if c.TTFTLow[4] > 0.002 {
		t.Errorf("the running requests' noise counts %v at its lower bound, want about 0", c.TTFTLow[4])
	}
	for i := 1; i < ttftDim; i++ {
		if c.TTFTLow[i] > c.TTFT[i] {
			t.Errorf("θ%d: lower bound %v above the estimate %v", i, c.TTFTLow[i], c.TTFT[i])
		}
	}
}
