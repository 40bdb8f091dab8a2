package scheduler

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/kvselect/kvselect/selection/latency"
)

// PredictedLatencyPolicyName is the latency-predicting policy's name.
const PredictedLatencyPolicyName = "predicted-latency"

func init() { Register(PredictedLatencyPolicyName, newPredictedLatency) }

// LatencyFeatures is what the latency model reads of candidate c for req,
// which would prefill uncached tokens there. The rank's requests split at
// its engine's estimated concurrency (Candidate.Concurrency) into running
// and queued; before the concurrency is known, the requests without a first
// token count as queued. It fuses the service's own bookings (exact and
// immediate) with the engine's reported figures when they are fresh and
// show more: requests the service did not route (another picker, a
// restart, a gateway that hides the response) count up to the engine's
// waiting and running figures, and its KV-cache usage is read as it is.
func LatencyFeatures(req *Request, c *Candidate, uncached int) latency.Features {
	f := latency.Features{
		PoolRequests: req.PoolRequests,
		Uncached:     float64(uncached),
		PrefillAhead: float64(c.ActivePrefillTokens),
	}
	active := float64(c.ActiveRequests)
	if s := c.Concurrency; s > 0 {
		f.Queued, f.Running = max(active-s, 0), min(active, s)
	} else {
		f.Queued = float64(c.PrefillingRequests)
		f.Running = max(active-f.Queued, 0)
	}
	if c.EngineFresh {
		f.Queued = max(f.Queued, c.EngineWaiting)
		f.Running = max(f.Running, c.EngineRunning)
		f.KVUsage = min(max(c.EngineKVUsage, 0), 1)
	}
	return f
}

// Running is the requests the request would decode beside on c, itself
// included: the ITL model's input.
func Running(c *Candidate) float64 {
	n := float64(c.ActiveRequests)
	if c.EngineFresh {
		n = max(n, c.EngineWaiting+c.EngineRunning)
	}
	return n + 1
}

// UncachedTokens is the prompt tokens c would prefill for the request: the
// prompt less the rank's device-resident prefix (lower tiers count at
// their cache-hit weights, as in the selection response's cached tokens).
func UncachedTokens(ctx *Context, c *Candidate) int {
	req := ctx.Request
	w := &req.Weights
	return EffectivePrefillTokens(req.ISL, CachedTokens(c.Overlap, req.BlockSize, w.HostCacheHitWeight, w.DiskCacheHitWeight))
}

// prior is what a candidate without a fitted model predicts with; never
// written after init.
var prior = latency.Prior()

func coeffsOf(c *Candidate) *latency.Coeffs {
	if c.Latency != nil {
		return c.Latency
	}
	return &prior
}

// LatencyScorer's cost is the candidate's time to first token in seconds
// as the ranking prices it (latency.Coeffs.RankTTFT: each effect at its
// lower confidence bound).
type LatencyScorer struct{}

// Score implements Scorer.
func (LatencyScorer) Score(ctx *Context, c *Candidate) (float64, error) {
	return coeffsOf(c).RankTTFT(LatencyFeatures(ctx.Request, c, UncachedTokens(ctx, c))), nil
}

// predictedTTFT is the candidate's predicted time to first token in
// seconds (the fit's point estimate): what the objectives are judged by.
func predictedTTFT(ctx *Context, c *Candidate) float64 {
	return coeffsOf(c).PredictTTFT(LatencyFeatures(ctx.Request, c, UncachedTokens(ctx, c)))
}

// LatencyPicker chooses among rows scored by LatencyScorer.
//
// Without objectives: the lowest ranked TTFT (the scorer's cost); rows
// within TieTolerance of it (relative, at least 1 ms) count as tied, and
// among them the fewest uncached prompt tokens win, then the lowest
// predicted inter-token latency, then a uniform draw.
//
// With objectives (Request.SLOTTFT / SLOTPOT): a row meets them when its
// predicted TTFT (the point estimate) is at most (1 − Margin) × SLOTTFT and
// its predicted ITL at most SLOTPOT. Among the rows that meet them the one
// with the highest predicted TTFT wins — the tightest fit, which leaves the
// ranks with the most headroom to requests whose objectives need it (the
// "least headroom" placement of llm-d's SLO-aware scheduling). When none
// meets them, a sheddable request is refused (*SLOError, 429 with
// Retry-After) and any other is ranked as without objectives.
type LatencyPicker struct {
	TieTolerance float64
	Margin       float64
}

// Pick implements Picker.
func (p LatencyPicker) Pick(rnd *rand.Rand, ctx *Context, scored []Scored) (int, error) {
	req := ctx.Request
	if req.SLOTTFT > 0 || req.SLOTPOT > 0 {
		if row, ok := p.tightestFit(ctx, scored); ok {
			return row, nil
		}
		if req.Sheddable {
			return -1, &SLOError{RetryAfter: retryAfter(ctx, scored, req.SLOTTFT)}
		}
	}
	return p.fastest(rnd, ctx, scored), nil
}

func (p LatencyPicker) meets(req *Request, ttft float64, s *Scored) bool {
	if req.SLOTTFT > 0 && ttft > (1-p.Margin)*req.SLOTTFT {
		return false
	}
	return req.SLOTPOT <= 0 || coeffsOf(&s.Candidate).PredictITL(Running(&s.Candidate)) <= req.SLOTPOT
}

func (p LatencyPicker) tightestFit(ctx *Context, scored []Scored) (int, bool) {
	best, bestTTFT := -1, 0.0
	for i := range scored {
		ttft := predictedTTFT(ctx, &scored[i].Candidate)
		if p.meets(ctx.Request, ttft, &scored[i]) && (best < 0 || ttft > bestTTFT) {
			best, bestTTFT = i, ttft
		}
	}
	return best, best >= 0
}

// fastest is the lowest ranked TTFT; among the rows tied with it, the
// fewest uncached tokens, then the lowest predicted ITL, then a draw.
//
// The cache comes before the ITL because a tie means the model cannot tell
// the rows' TTFT apart — on a light load, or while its confidence bounds are
// wide — and then the rank that holds the prompt is the one that keeps it
// hot for the request's successors (the next turn of a conversation extends
// this prompt), where the lower ITL would spread a conversation over ranks
// that each cache a part of it. Load still moves a request: a rank's
// running and queued requests raise its predicted TTFT out of the tie.
func (p LatencyPicker) fastest(rnd *rand.Rand, ctx *Context, scored []Scored) int {
	lo := math.Inf(1)
	for i := range scored {
		lo = min(lo, scored[i].Cost)
	}
	limit := lo + max(lo*p.TieTolerance, 0.001)
	fewest := math.MaxInt
	for i := range scored {
		if scored[i].Cost <= limit {
			fewest = min(fewest, UncachedTokens(ctx, &scored[i].Candidate))
		}
	}
	return argminBy(rnd, scored, func(s *Scored) (float64, bool) {
		if s.Cost > limit || UncachedTokens(ctx, &s.Candidate) != fewest {
			return 0, false
		}
		return coeffsOf(&s.Candidate).PredictITL(Running(&s.Candidate)), true
	})
}

// retryAfter is how long a refused request should wait: the time the best
// candidate's prediction runs over the objective, at least one second.
func retryAfter(ctx *Context, scored []Scored, slo float64) time.Duration {
	lo := math.Inf(1)
	for i := range scored {
		lo = min(lo, predictedTTFT(ctx, &scored[i].Candidate))
	}
	over := lo - slo
	if slo <= 0 || !(over > 1) {
		return time.Second
	}
	return time.Duration(math.Ceil(over)) * time.Second
}

// SLOError refuses a sheddable request whose objectives no candidate is
// predicted to meet.
type SLOError struct {
	RetryAfter time.Duration
}

func (e *SLOError) Error() string {
	return fmt.Sprintf("%v; retry after %v", ErrSLOUnattainable, e.RetryAfter)
}

func (e *SLOError) Unwrap() error { return ErrSLOUnattainable }

// newPredictedLatency is the latency-predicting policy: the scorer predicts
// each rank's TTFT from the latency model the service fits online, the
// picker applies the objectives and the ITL tie-break. Parameters:
// tie_tolerance (relative TTFT difference counted as a tie, default 0.05)
// and slo_margin (the share of a TTFT objective kept as a safety margin
// for the prediction's error, default 0.2).
func newPredictedLatency(p Params) (Policy, error) {
	pk := LatencyPicker{TieTolerance: 0.05, Margin: 0.2}
	r := readParams(p)
	if v, ok := r.float("tie_tolerance", 0, 1); ok {
		pk.TieTolerance = v
	}
	if v, ok := r.float("slo_margin", 0, 0.9); ok {
		pk.Margin = v
	}
	if err := r.err(); err != nil {
		return Policy{}, err
	}
	return Policy{Scorer: LatencyScorer{}, Picker: pk, ExclusiveAffinity: true, PredictsLatency: true}, nil
}
