package scheduler

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/latency"
)

// fitted is an engine the model has learnt: 20 ms per 1k uncached tokens,
// 20 ms per 1k tokens of prefill ahead, 15 ms per queued request, 2 ms
// per decoding request; ITL 5 ms + 1 ms per running request.
// The fit is sure of every effect: the ranking prices them whole.
var fitted = &latency.Coeffs{TTFT: [7]float64{0.002, 0.020, 0.020, 0.015, 0.002, 0.010, 0.050},
	TTFTLow: [7]float64{0.002, 0.020, 0.020, 0.015, 0.002, 0.010, 0.050}, ITL: [2]float64{0.005, 0.001}, Source: "pooled"}

func latencyRequest(isl int) *Request {
	return &Request{ISL: isl, BlockSize: 16, Weights: DefaultWeights()}
}

func loadedRank(id uint64, cachedBlocks uint32, active, prefilling, prefillTokens int) Candidate {
	return Candidate{Worker: index.WorkerKey{WorkerID: id}, Overlap: index.Overlap{Device: cachedBlocks},
		ActiveRequests: active, PrefillingRequests: prefilling, ActivePrefillTokens: prefillTokens, Latency: fitted}
}

func TestPredictedLatencyPicks(t *testing.T) {
	pol, err := New(PredictedLatencyPolicyName, nil)
	if err != nil {
		t.Fatal(err)
	}
	ms := func(v float64) float64 { return v / 1000 }
	tests := []struct {
		name  string
		req   *Request
		cands []Candidate
		want  uint64
	}{
		{
			name:  "idle ranks: the cached prefix wins",
			req:   latencyRequest(3200),
			cands: []Candidate{loadedRank(1, 0, 0, 0, 0), loadedRank(2, 150, 0, 0, 0), loadedRank(3, 20, 0, 0, 0)},
			want:  2,
		},
		{
			name: "a little load does not push a request off its cache",
			req:  latencyRequest(3200),
			// Rank 2 holds 2,400 of 3,200 tokens (48 ms saved) and decodes
			// four requests (8 ms): it still wins, where kv-cost would
			// charge its booked decode blocks.
			cands: []Candidate{loadedRank(1, 0, 0, 0, 0), loadedRank(2, 150, 4, 0, 0)},
			want:  2,
		},
		{
			name: "a deep queue outweighs the cache",
			req:  latencyRequest(3200),
			// Rank 2 has six requests waiting with 9,000 tokens to prefill.
			cands: []Candidate{loadedRank(1, 0, 1, 0, 0), loadedRank(2, 150, 8, 6, 9000)},
			want:  1,
		},
		{
			name: "equal TTFT: the lower predicted ITL",
			req:  latencyRequest(320),
			cands: []Candidate{
				{Worker: index.WorkerKey{WorkerID: 1}, ActiveRequests: 3, PrefillingRequests: 3, Latency: fitted},
				{Worker: index.WorkerKey{WorkerID: 2}, ActiveRequests: 1, PrefillingRequests: 1, ActivePrefillTokens: 1500, Latency: fitted},
			},
			// Both predict 53.4 ms (rank 1: 2 + 6.4 + 3 × 15; rank 2:
			// 2 + 6.4 + 30 + 15); rank 2 runs two requests fewer.
			want: 2,
		},
		{
			name: "equal TTFT: the cached prompt before the lower ITL",
			req:  latencyRequest(320),
			// Both predict 53.4 ms, as above, but rank 1 holds 16 of the
			// prompt's 320 tokens: the cache keeps the tie, the ITL does
			// not decide it.
			cands: []Candidate{
				{Worker: index.WorkerKey{WorkerID: 1}, Overlap: index.Overlap{Device: 1}, ActiveRequests: 3, PrefillingRequests: 3, Latency: fitted},
				{Worker: index.WorkerKey{WorkerID: 2}, ActiveRequests: 1, PrefillingRequests: 1, ActivePrefillTokens: 1500, Latency: fitted},
			},
			want: 1,
		},
		{
			name: "an objective: the tightest rank that meets it",
			req:  func() *Request { r := latencyRequest(3200); r.SLOTTFT = ms(100); return r }(),
			// Predicted: rank 1 ≈ 66 ms, rank 2 ≈ 18 ms, rank 3 ≈ 126 ms.
			// The margin (20 %) admits ≤ 80 ms: ranks 1 and 2; rank 1 is
			// the tighter fit and keeps rank 2 for tighter objectives.
			cands: []Candidate{loadedRank(1, 0, 0, 0, 0), loadedRank(2, 150, 0, 0, 0), loadedRank(3, 0, 0, 4, 0)},
			want:  1,
		},
		{
			name:  "an objective nobody meets, not sheddable: the fastest",
			req:   func() *Request { r := latencyRequest(3200); r.SLOTTFT = ms(5); return r }(),
			cands: []Candidate{loadedRank(1, 0, 0, 0, 0), loadedRank(2, 150, 0, 0, 0)},
			want:  2,
		},
		{
			name: "an ITL objective excludes a crowded rank",
			req:  func() *Request { r := latencyRequest(320); r.SLOTPOT = ms(8); return r }(),
			// Rank 1 is faster to first token but runs 9: ITL 15 ms.
			cands: []Candidate{
				{Worker: index.WorkerKey{WorkerID: 1}, Overlap: index.Overlap{Device: 20}, ActiveRequests: 9, Latency: fitted},
				{Worker: index.WorkerKey{WorkerID: 2}, ActiveRequests: 1, Latency: fitted},
			},
			want: 2,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := pol.Select(rand.New(rand.NewPCG(1, 1)), tc.req, tc.cands, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got.Worker.WorkerID != tc.want {
				t.Errorf("picked %d (predicted %.1f ms), want %d", got.Worker.WorkerID, got.Cost*1000, tc.want)
			}
		})
	}
}

func TestAnEffectTheFitCannotTellFromNoiseDoesNotRank(t *testing.T) {
	pol, _ := New(PredictedLatencyPolicyName, nil)
	unsure := *fitted
	unsure.TTFTLow[3] = -0.004 // queued requests: 15 ms ± more than 15 ms
	req := latencyRequest(3200)
	// Rank 2 holds the prefix behind six queued requests: priced at their
	// point estimate (90 ms) they outweigh the cache (48 ms); at their lower
	// bound they cost nothing and the cache wins.
	cands := []Candidate{loadedRank(1, 0, 0, 0, 0), loadedRank(2, 150, 6, 6, 0)}
	for i := range cands {
		cands[i].Latency = &unsure
	}
	got, err := pol.Select(rand.New(rand.NewPCG(1, 1)), req, cands, nil)
	if err != nil || got.Worker.WorkerID != 2 {
		t.Fatalf("picked %v (%v), want the cached rank 2", got.Worker, err)
	}
	// Its objective is still judged on the point estimate: 90 ms queued.
	req.SLOTTFT, req.Sheddable = 0.05, true
	if _, err := pol.Select(rand.New(rand.NewPCG(1, 1)), req, cands[1:], nil); !errors.Is(err, ErrSLOUnattainable) {
		t.Errorf("err = %v, want the objective judged on the point estimate", err)
	}
}

func TestPredictedLatencyShedsASheddableRequest(t *testing.T) {
	pol, _ := New(PredictedLatencyPolicyName, nil)
	req := latencyRequest(3200)
	req.SLOTTFT, req.Sheddable = 0.005, true
	_, err := pol.Select(rand.New(rand.NewPCG(1, 1)), req, []Candidate{loadedRank(1, 0, 0, 0, 0), loadedRank(2, 0, 5, 5, 20000)}, nil)
	var se *SLOError
	if !errors.As(err, &se) || !errors.Is(err, ErrSLOUnattainable) {
		t.Fatalf("err = %v, want an SLOError", err)
	}
	if se.RetryAfter != time.Second {
		t.Errorf("retry after %v, want 1s (the best prediction misses by well under a second)", se.RetryAfter)
	}
	// Met somewhere: served.
	req.SLOTTFT = 1
	if _, err := pol.Select(rand.New(rand.NewPCG(1, 1)), req, []Candidate{loadedRank(1, 0, 0, 0, 0)}, nil); err != nil {
		t.Errorf("a sheddable request whose objective is met was refused: %v", err)
	}
}

func TestLatencyFeaturesFuseEngineFigures(t *testing.T) {
	tests := []struct {
		name string
		c    Candidate
		want latency.Features
	}{
		{"concurrency unknown: requests without a first token queue", Candidate{ActiveRequests: 5, PrefillingRequests: 2, ActivePrefillTokens: 900},
			latency.Features{PoolRequests: 2.5, Uncached: 100, PrefillAhead: 900, Queued: 2, Running: 3}},
		{"below the concurrency nothing queues", Candidate{ActiveRequests: 3, PrefillingRequests: 2, Concurrency: 4},
			latency.Features{PoolRequests: 2.5, Uncached: 100, Running: 3}},
		{"past the concurrency the rest queue", Candidate{ActiveRequests: 7, PrefillingRequests: 4, Concurrency: 4},
			latency.Features{PoolRequests: 2.5, Uncached: 100, Queued: 3, Running: 4}},
		{"stale engine figures are ignored", Candidate{ActiveRequests: 1, EngineWaiting: 9, EngineRunning: 9},
			latency.Features{PoolRequests: 2.5, Uncached: 100, Running: 1}},
		{"the engine queues traffic nobody booked", Candidate{ActiveRequests: 2, PrefillingRequests: 1, EngineFresh: true, EngineWaiting: 4, EngineRunning: 6, EngineKVUsage: 0.7},
			latency.Features{PoolRequests: 2.5, Uncached: 100, Queued: 4, Running: 6, KVUsage: 0.7}},
		{"bookings ahead of a stale scrape win", Candidate{ActiveRequests: 8, PrefillingRequests: 5, Concurrency: 4, EngineFresh: true, EngineWaiting: 1, EngineRunning: 2},
			latency.Features{PoolRequests: 2.5, Uncached: 100, Queued: 4, Running: 4}},
		{"stale KV usage is ignored", Candidate{ActiveRequests: 1, EngineKVUsage: 0.99},
			latency.Features{PoolRequests: 2.5, Uncached: 100, Running: 1}},
	}
	for _, tc := range tests {
		if got := LatencyFeatures(&Request{PoolRequests: 2.5}, &tc.c, 100); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestPredictedLatencyParams(t *testing.T) {
	if _, err := New(PredictedLatencyPolicyName, Params{"tie_tolerance": 0.1, "slo_margin": 0.3}); err != nil {
		t.Errorf("valid parameters refused: %v", err)
	}
	for _, p := range []Params{{"slo_margin": 0.95}, {"tie_tolerance": -1}, {"temperature": 1}, {"slo_margin": "x"}} {
		if _, err := New(PredictedLatencyPolicyName, p); err == nil || !strings.Contains(err.Error(), "predicted-latency") {
			t.Errorf("%v: err = %v, want a refusal naming the policy", p, err)
		}
	}
}

func BenchmarkPredictedLatencySelect(b *testing.B) {
	pol, _ := New(PredictedLatencyPolicyName, nil)
	cands := make([]Candidate, 64)
	for i := range cands {
		cands[i] = loadedRank(uint64(i), uint32(i%7)*10, i%5, i%3, (i%3)*700)
	}
	req := latencyRequest(1500)
	rnd := rand.New(rand.NewPCG(1, 1))
	var s Scratch
	b.ReportAllocs()
	for b.Loop() {
		if _, err := pol.Select(rnd, req, cands, &s); err != nil {
			b.Fatal(err)
		}
	}
}
