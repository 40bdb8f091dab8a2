package selection

// The latency model's side of selection: candidates get their fitted model
// when the policy predicts latency, every traced booking remembers its
// features and predictions, and the response path's first token and end
// fit the model (package latency).

import (
	"errors"
	"math"
	"time"

	"github.com/kvselect/kvselect/selection/apierr"
	"github.com/kvselect/kvselect/selection/latency"
	"github.com/kvselect/kvselect/selection/partition"
	"github.com/kvselect/kvselect/selection/reservation"
	"github.com/kvselect/kvselect/selection/scheduler"
)

// LatencyEventKind says what a LatencyEvent reports.
type LatencyEventKind uint8

// Latency event kinds.
const (
	// LatencyFirstToken: a traced booking's first token; TTFT fields set.
	LatencyFirstToken LatencyEventKind = iota
	// LatencyEnd: a traced booking's end with a mean ITL; ITL fields set.
	LatencyEnd
	// LatencyShed: a sheddable request refused because no worker was
	// predicted to meet its objectives.
	LatencyShed
	// LatencyEngine: one scrape interval of an engine's latency histograms;
	// Engine says what the model made of it, and when its first tokens were
	// attributed to bookings, PredictedTTFT and ObservedTTFT are their means
	// as predicted and as the engine measured them.
	LatencyEngine
)

// LatencyEvent is one observation of the latency model, for metrics
// (Config.OnLatency). Times are in seconds.
type LatencyEvent struct {
	Kind  LatencyEventKind
	Model string
	// PredictedTTFT and ObservedTTFT (LatencyFirstToken); PredictedITL and
	// ObservedITL (LatencyEnd).
	PredictedTTFT, ObservedTTFT float64
	PredictedITL, ObservedITL   float64
	// SLO is the objective the event is judged against (0: none), and Met
	// whether the observation met it.
	SLO float64
	Met bool
	// Engine is the outcome of a LatencyEngine interval.
	Engine latency.EngineOutcome
}

// fillLatency gives every candidate its model's fitted latency model and
// its engine's estimated concurrency.
func (s *Service) fillLatency(p *partition.Partition, cands []scheduler.Scored) {
	model := p.Key().Model
	c := s.latency.Pooled(model)
	s.latency.Concurrency(model, len(cands), func(i int) (uint64, uint32) { return cands[i].Worker.WorkerID, cands[i].Worker.DPRank },
		func(i int, n float64) { cands[i].Latency, cands[i].Concurrency = c, n })
}

// meanRequests is the mean active requests per candidate rank.
func meanRequests(cands []scheduler.Scored) float64 {
	if len(cands) == 0 {
		return 0
	}
	n := 0
	for i := range cands {
		n += cands[i].ActiveRequests
	}
	return float64(n) / float64(len(cands))
}

// trace fills t, the trace a booking made by d starts with: the chosen
// rank's features and the model's predictions for them, whatever the policy.
func (s *Service) trace(t *latency.Trace, d *decision, now time.Time) {
	c := &d.scored.Candidate
	k := latency.Key{Model: d.part.Key().Model, Worker: c.Worker.WorkerID, Rank: c.Worker.DPRank}
	coeffs := c.Latency
	if coeffs == nil {
		// A policy that does not predict: the chosen rank's model alone,
		// so the fit reads the same features whatever the policy.
		coeffs = s.latency.Coeffs(k)
		c.Concurrency = s.latency.WorkerConcurrency(k)
	}
	t.Key, t.Booked = k, now
	sreq := d.sreq
	if sreq == nil {
		sreq = &scheduler.Request{}
	}
	t.Features = scheduler.LatencyFeatures(sreq, c, d.scored.EffectivePrefillTokens)
	t.Running = scheduler.Running(c)
	t.Decoding = max(c.ActiveRequests-c.PrefillingRequests, 0)
	t.PredictedTTFT = coeffs.PredictTTFT(t.Features)
	t.PredictedITL = coeffs.PredictITL(t.Running)
	t.SLOTTFT, t.SLOTPOT = sreq.SLOTTFT, sreq.SLOTPOT
	s.latency.Booked(k, t.Features, t.PredictedTTFT, now)
}

// firstToken fits a traced booking's first token, once.
func (s *Service) firstToken(r *reservation.Row) {
	t := &r.Trace
	ttft, ok := t.FirstToken(s.clock())
	if !ok {
		return
	}
	s.latency.ObserveTTFT(t.Key, t.Features, ttft, t.PredictedTTFT)
	s.latency.ObserveRunning(t.Key, t.Decoding)
	s.onLatency(LatencyEvent{Kind: LatencyFirstToken, Model: t.Key.Model, PredictedTTFT: t.PredictedTTFT,
		ObservedTTFT: ttft, SLO: t.SLOTTFT, Met: t.SLOTTFT <= 0 || ttft <= t.SLOTTFT})
}

// ended fits a traced booking's mean inter-token latency at its end.
func (s *Service) ended(r *reservation.Row) {
	t := &r.Trace
	itl, ok := t.MeanITL(s.clock())
	if !ok {
		return
	}
	s.latency.ObserveITL(t.Key, t.Running, itl)
	s.onLatency(LatencyEvent{Kind: LatencyEnd, Model: t.Key.Model, PredictedITL: t.PredictedITL,
		ObservedITL: itl, SLO: t.SLOTPOT, Met: t.SLOTPOT <= 0 || itl <= t.SLOTPOT})
}

// sloRefusal is the 429 of a shed request, with its Retry-After, or nil
// when err is not one. The caller reports the shed (LatencyShed) once it
// holds no lock.
func sloRefusal(err error) *apierr.Error {
	se, ok := errors.AsType[*scheduler.SLOError](err)
	if !ok {
		return nil
	}
	e := apierr.WithDetails(KindOverloaded, se.Error(), err, map[string]any{"retry_after_seconds": int(se.RetryAfter / time.Second)})
	e.RetryAfter = se.RetryAfter
	return e
}

// sloSeconds validates a request's objective in milliseconds: absent is 0,
// otherwise it must be a positive finite number.
func sloSeconds(field string, ms *float64) (float64, error) {
	if ms == nil {
		return 0, nil
	}
	if !(*ms > 0) || math.IsInf(*ms, 0) {
		return 0, apierr.New(KindBadRequest, "%s must be a positive number of milliseconds, got %v", field, *ms)
	}
	return *ms / 1000, nil
}

// LatencyModel is the latency model's coefficients and recent prediction
// error (GET /policy).
func (in *Inspector) LatencyModel() latency.View { return in.s.latency.View() }

// PrefillEstimate is the predicted time to prefill tokens prompt tokens on
// an idle engine of model: the pooled fit's per-token prefill cost (the
// prior's before any observation). The tokenizer's adaptive budget reads it
// as what exact ids can at best save.
func (in *Inspector) PrefillEstimate(model string, tokens int) time.Duration {
	c := in.s.latency.Pooled(model)
	s := c.PredictTTFT(latency.Features{Uncached: float64(tokens)}) - max(c.TTFT[0], 0)
	return time.Duration(s * float64(time.Second))
}
