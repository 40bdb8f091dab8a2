package latency

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// histogramEngine books requests on one rank and reports them the way an
// engine's histograms do: per interval, how many first tokens and their
// summed TTFT, with no per-request attribution.
type histogramEngine struct {
	m   *Model
	k   Key
	now time.Time
	r   *rand.Rand
}

func newHistogramEngine(m *Model, seed uint64) *histogramEngine {
	h := &histogramEngine{m: m, k: Key{Model: "m", Worker: 1}, now: time.Unix(1_700_000_000, 0), r: rand.New(rand.NewPCG(seed, 7))}
	// The first scrape: the ledger starts with the histograms.
	h.m.ObserveEngine(h.k, EngineInterval{At: h.now})
	return h
}

// interval books n requests with random features and reports their TTFT
// from eng (times slow), returning the outcome.
func (h *histogramEngine) interval(n int, eng engine, slow float64) EngineOutcome {
	var sum float64
	for range n {
		f := randomFeatures(h.r)
		h.m.Booked(h.k, f, h.m.Coeffs(h.k).PredictTTFT(f), h.now)
		sum += slow * eng.ttft(f) * (1 + 0.05*h.r.NormFloat64())
	}
	h.now = h.now.Add(time.Second)
	return h.m.ObserveEngine(h.k, EngineInterval{FirstTokens: float64(n), TTFTSum: sum, Running: 3, At: h.now})
}

func TestEngineHistogramsCalibrateWithoutResponsePath(t *testing.T) {
	eng := engine{base: 0.004, perUncachedK: 0.020, perAheadK: 0.015, perQueued: 0.012, perRunning: 0.002, perPool: 0.008}
	m := NewModel(Config{})
	h := newHistogramEngine(m, 1)
	for i := range 600 {
		out := h.interval(1+i%4, eng, 1)
		if !out.Attributed || !out.FittedTTFT {
			t.Fatalf("interval %d: %+v, want attributed and fitted", i, out)
		}
	}
	c := m.Coeffs(h.k)
	if c.Source != "pooled" {
		t.Fatalf("source = %q, want pooled", c.Source)
	}
	r := rand.New(rand.NewPCG(9, 9))
	for range 50 {
		f := randomFeatures(r)
		if got, want := c.PredictTTFT(f), eng.ttft(f); RelativeError(got, want) > 0.15 {
			t.Fatalf("PredictTTFT(%+v) = %.4f, engine %.4f: fitted from interval means, want within 15%%", f, got, want)
		}
	}
	if v := m.View(); v.Errors.Observed != 600 {
		t.Fatalf("errors observed = %d, want the 600 intervals", v.Errors.Observed)
	}
}

func TestResponsePathIsPreferredToHistograms(t *testing.T) {
	eng := engine{base: 0.01, perUncachedK: 0.02}
	m := NewModel(Config{})
	h := newHistogramEngine(m, 2)
	m.ObserveTTFT(h.k, Features{Uncached: 100}, 0.012, 0.01)
	out := h.interval(2, eng, 1)
	if !out.Attributed || out.FittedTTFT {
		t.Fatalf("with a response path: %+v, want attributed (compared) and not fitted", out)
	}
	if got := m.View().Pooled["m"].TTFTObservations; got != 1 {
		t.Fatalf("TTFT observations = %d, want the response path's 1: the interval was fitted beside it", got)
	}
	// A minute without the response path: the histograms take over.
	h.now = h.now.Add(2 * time.Minute)
	if out := h.interval(2, eng, 1); !out.FittedTTFT {
		t.Fatalf("after the response path fell silent: %+v, want fitted", out)
	}
}

func TestUnattributedTrafficIsNotFitted(t *testing.T) {
	eng := engine{base: 0.01}
	m := NewModel(Config{})
	h := newHistogramEngine(m, 3)
	m.Booked(h.k, Features{}, 0.01, h.now)
	h.now = h.now.Add(time.Second)
	// Five first tokens for one booking: four came from elsewhere.
	out := m.ObserveEngine(h.k, EngineInterval{FirstTokens: 5, TTFTSum: 5, At: h.now})
	if !out.Unattributed || out.Attributed || out.FittedTTFT {
		t.Fatalf("more first tokens than bookings: %+v, want unattributed only", out)
	}
	if got := m.View().Pooled["m"].TTFTObservations; got != 0 {
		t.Fatalf("TTFT observations = %d after unattributed traffic, want 0", got)
	}
	// The ledger starts afresh: the next interval is attributed again.
	if out := h.interval(2, eng, 1); !out.Attributed {
		t.Fatalf("next interval: %+v, want attributed", out)
	}
}

func TestDriftResetsTheFit(t *testing.T) {
	eng := engine{base: 0.02, perUncachedK: 0.020, perAheadK: 0.015, perQueued: 0.012, perRunning: 0.002, perPool: 0.008}
	m := NewModel(Config{})
	h := newHistogramEngine(m, 4)
	for i := range 400 {
		if out := h.interval(8, eng, 1); out.DriftReset {
			t.Fatalf("interval %d of a steady engine confirmed a drift", i)
		}
	}
	// The engine becomes three times slower (new hardware, other settings).
	reset := -1
	for i := range 20 {
		if out := h.interval(8, eng, 3); out.DriftReset {
			reset = i
			break
		}
	}
	if reset < driftIntervals-1 {
		t.Fatalf("drift reset after %d slow intervals, want it confirmed after %d", reset+1, driftIntervals)
	}
	if got := m.Coeffs(h.k).DriftResets; got != 1 {
		t.Fatalf("DriftResets = %d, want 1", got)
	}
	// Reset, the fit follows the slower engine within tens of intervals,
	// where forgetting alone needs hundreds.
	for range 40 {
		h.interval(8, eng, 3)
	}
	f := Features{Uncached: 2000, PrefillAhead: 2000, Running: 4, PoolRequests: 4}
	if got, want := m.Coeffs(h.k).PredictTTFT(f), 3*eng.ttft(f); RelativeError(got, want) > 0.25 {
		t.Fatalf("40 intervals after the reset: PredictTTFT = %.4f, the slower engine %.4f", got, want)
	}
}

func TestLedgerBounds(t *testing.T) {
	m := NewModel(Config{})
	k := Key{Model: "m", Worker: 1}
	now := time.Unix(1_700_000_000, 0)
	m.Booked(k, Features{}, 0.01, now)
	if len(m.ledgers) != 0 {
		t.Fatal("a booking on a rank whose engine reports no histograms made a ledger")
	}
	m.ObserveEngine(k, EngineInterval{At: now})
	l := m.ledgers[k]
	for range ledgerCap + 10 {
		m.Booked(k, Features{}, 0.01, now)
	}
	if len(l.ring) != ledgerCap || l.n != ledgerCap {
		t.Fatalf("ledger holds %d of %d slots, want it bounded at %d", l.n, len(l.ring), ledgerCap)
	}
	if out := m.ObserveEngine(k, EngineInterval{FirstTokens: 1, TTFTSum: 0.01, At: now}); out.Attributed {
		t.Fatal("an interval after the ledger overflowed was attributed")
	}
	// Bookings the engine never accounts for age out.
	m.Booked(k, Features{}, 0.01, now)
	later := now.Add(2 * ledgerMaxAge)
	m.Booked(k, Features{Uncached: 1000}, 0.03, later)
	out := m.ObserveEngine(k, EngineInterval{FirstTokens: 1, TTFTSum: 0.03, At: later})
	if !out.Attributed || math.Abs(out.PredictedTTFT-0.03) > 1e-12 {
		t.Fatalf("after ageing: %+v, want the fresh booking attributed", out)
	}
	m.Forget(1)
	if len(m.ledgers) != 0 {
		t.Fatal("Forget left the worker's ledger")
	}
}

// EngineITL is the latest interval's mean gap, whatever the fit, while it is
// recent; an interval without output keeps the reading before it.
func TestEngineITLIsTheLatestReading(t *testing.T) {
	m := NewModel(Config{})
	k := Key{Model: "m", Worker: 1}
	now := time.Unix(1_700_000_000, 0)
	if _, ok := m.EngineITL(k, now.Add(-time.Hour)); ok {
		t.Fatal("a reading from an engine never observed")
	}
	m.ObserveEngine(k, EngineInterval{At: now})
	if _, ok := m.EngineITL(k, now.Add(-time.Hour)); ok {
		t.Fatal("a reading from an interval without output")
	}
	m.ObserveEngine(k, EngineInterval{Gaps: 400, ITLSum: 1.2, Running: 4, At: now.Add(200 * time.Millisecond)})
	m.ObserveEngine(k, EngineInterval{Running: 4, At: now.Add(400 * time.Millisecond)}) // no output: keeps 3 ms
	for _, tc := range []struct {
		since  time.Time
		want   float64
		wantOK bool
	}{
		{now, 0.003, true},
		{now.Add(200 * time.Millisecond), 0.003, true},
		{now.Add(201 * time.Millisecond), 0, false}, // older than asked for
	} {
		got, ok := m.EngineITL(k, tc.since)
		if ok != tc.wantOK || math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("EngineITL(since %v) = %v, %v; want %v, %v", tc.since.Sub(now), got, ok, tc.want, tc.wantOK)
		}
	}
	if p := m.Coeffs(k).PredictITL(4); math.Abs(p-0.003) < 1e-3 {
		t.Errorf("one interval moved the pooled prediction to %v: the reading is not the fit", p)
	}
}
