package latency

// The engines' own latency histograms (vLLM's
// vllm:time_to_first_token_seconds and vllm:inter_token_latency_seconds,
// SGLang's and TensorRT-LLM's equivalents) are a second source of observed
// latency. Between two scrapes a rank's TTFT histogram grows by k first
// tokens and their summed TTFT; the model is linear, so the mean TTFT of
// those k requests is θ·x̄, x̄ the mean of their features. The bookings the
// service routed to the rank wait in a ledger in booking order, and an
// interval's k first tokens account for its k oldest (an engine starts
// prefills in arrival order, so the first to finish are mostly the first
// booked). That gives two uses:
//
//   - Calibration without a response path. A gateway that does not show
//     the picker the response (NGINX's shim answers the pick and streams
//     the response itself), or REST callers that never report
//     prefill_complete, leave the model with no TTFT of its own; then each
//     interval's (x̄, mean TTFT) is fitted like one request's observation.
//     While the response path reports first tokens from a rank, its
//     per-request observations are the better ones and the histograms are
//     not fitted (they would count the same requests twice).
//   - Drift. Each interval compares the engine's mean TTFT with the mean of
//     the predictions made for the same requests. The log of their ratio has
//     a baseline (it need not be 0: the response path measures from the
//     gateway, the engine from its own queue); when it leaves the baseline
//     by more than a factor of two for driftIntervals intervals in a row,
//     the engine has changed under the model (a restart with other
//     settings, new hardware, a new model version), and the pooled fit's
//     covariance is inflated (rls.reset): its coefficients stay, but the
//     next observations move them, instead of the few hundred requests
//     forgetting alone needs.
//
// An interval that holds more first tokens than the ledger has bookings is
// traffic the picker did not route (direct requests, another gateway): it
// cannot be attributed, so it is neither fitted nor compared, and the
// ledger starts afresh.

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// EngineInterval is what one rank's engine reported between two scrapes.
type EngineInterval struct {
	// FirstTokens and TTFTSum are the first tokens it produced and their
	// total time to first token in seconds.
	FirstTokens, TTFTSum float64
	// Gaps and ITLSum are the inter-token gaps it produced and their total
	// length in seconds.
	Gaps, ITLSum float64
	// Running is its running requests at the scrape.
	Running float64
	// At is when the scrape was taken.
	At time.Time
}

// EngineOutcome says what ObserveEngine made of an interval.
type EngineOutcome struct {
	// Attributed: the interval's first tokens were matched to bookings;
	// EngineTTFT and PredictedTTFT are then their mean observed by the
	// engine and their mean predicted at the decisions, in seconds.
	Attributed                bool
	EngineTTFT, PredictedTTFT float64
	// Unattributed: the engine produced first tokens for more requests than
	// were booked on the rank (traffic the picker did not route).
	Unattributed bool
	// FittedTTFT and FittedITL: the interval was fitted (no response path
	// from the rank).
	FittedTTFT, FittedITL bool
	// DriftReset: the interval confirmed a drift and the pooled fit's
	// covariance was inflated (rls.reset).
	DriftReset bool
}

const (
	// ledgerCap bounds the bookings a rank's ledger holds: past it the
	// oldest are dropped and the next interval is not attributed.
	ledgerCap = 256
	// ledgerMaxAge drops bookings the engine never accounted for (a request
	// that failed before its first token, a booking freed by its caller
	// unused): older than this, they are not waiting for a first token.
	ledgerMaxAge = time.Minute
	// responsePathWindow is how long after the response path's last
	// observation from a rank the histograms are not fitted.
	responsePathWindow = time.Minute
	// driftMinTokens is the fewest first tokens an interval needs to be
	// compared: a mean of fewer is too noisy to call a drift.
	driftMinTokens = 4
	// driftIntervals is how many intervals in a row must leave the baseline
	// to confirm a drift; driftFactor how far (a factor, either way).
	driftIntervals = 3
	driftFactor    = 2.0
	// driftBaselineRate is the weight of each new interval in the baseline
	// (an exponential average over about ten intervals).
	driftBaselineRate = 0.1
	// driftInflation is the share of the prior's variance a drift adds to
	// each coefficient's.
	driftInflation = 0.25
)

// booked is one booking waiting in a ledger for the engine's account.
type booked struct {
	x         [ttftDim]float64
	predicted float64
	at        int64 // unix nanoseconds
}

// ledger is one rank's bookings in booking order, and when the response
// path last reported from it. It exists only for ranks whose engine reports
// latency histograms, so a fleet without them pays no memory for it.
type ledger struct {
	mu                          sync.Mutex
	ring                        []booked // a circular buffer that grows to ledgerCap
	head, n                     int
	overflowed                  bool
	respondedTTFT, respondedITL atomic.Int64 // response-path observations, ever
	seenTTFT, seenITL           int64        // their values at the last interval
	lastTTFT, lastITL           time.Time    // when an interval last saw them grow
	// engineITL is the mean inter-token gap of the latest interval in which
	// the engine produced any (seconds), engineITLAt that interval's end.
	engineITL   float64
	engineITLAt time.Time
}

func (l *ledger) push(b booked) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n == ledgerCap {
		l.head = (l.head + 1) % ledgerCap
		l.n--
		l.overflowed = true
	}
	if l.n == len(l.ring) {
		// Full at its size: grow it, oldest first, so a rank pays for the
		// bookings it actually holds unaccounted.
		grown := make([]booked, min(max(2*len(l.ring), 8), ledgerCap))
		for i := range l.n {
			grown[i] = l.ring[(l.head+i)%len(l.ring)]
		}
		l.ring, l.head = grown, 0
	}
	l.ring[(l.head+l.n)%len(l.ring)] = b
	l.n++
}

// take removes the k oldest bookings (after dropping those older than
// ledgerMaxAge at now) and returns the mean of their features and
// predictions; ok is false when the ledger cannot account for k (fewer
// bookings, or some were dropped for room).
func (l *ledger) take(k int, now time.Time) (x [ttftDim]float64, predicted float64, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	cut := now.Add(-ledgerMaxAge).UnixNano()
	for l.n > 0 && l.ring[l.head].at < cut {
		l.head = (l.head + 1) % len(l.ring)
		l.n--
	}
	if l.overflowed || k > l.n {
		l.head, l.n, l.overflowed = 0, 0, false
		return x, 0, false
	}
	for range k {
		b := &l.ring[l.head]
		for i := range x {
			x[i] += b.x[i]
		}
		predicted += b.predicted
		l.head = (l.head + 1) % len(l.ring)
		l.n--
	}
	for i := range x {
		x[i] /= float64(k)
	}
	return x, predicted / float64(k), true
}

// silent reports, at an interval's end, whether the response path has
// reported a first token (ttft) or a response's end (itl) from the rank
// within responsePathWindow.
func (l *ledger) silent(at time.Time) (ttft, itl bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r := l.respondedTTFT.Load(); r != l.seenTTFT {
		l.seenTTFT, l.lastTTFT = r, at
	}
	if r := l.respondedITL.Load(); r != l.seenITL {
		l.seenITL, l.lastITL = r, at
	}
	quiet := func(last time.Time) bool { return last.IsZero() || at.Sub(last) > responsePathWindow }
	return quiet(l.lastTTFT), quiet(l.lastITL)
}

// drift follows the log ratio of the engine's mean TTFT to the predicted one.
type drift struct {
	baseline float64
	seen     int // intervals compared
	away     int // consecutive intervals away from the baseline
	resets   int
}

// check adds one interval's log ratio and reports a confirmed drift.
func (d *drift) check(logRatio float64) bool {
	if d.seen < driftIntervals {
		// The first intervals set the baseline: their mean.
		d.baseline += (logRatio - d.baseline) / float64(d.seen+1)
		d.seen++
		return false
	}
	d.seen++
	if math.Abs(logRatio-d.baseline) <= math.Log(driftFactor) {
		d.away = 0
		d.baseline += driftBaselineRate * (logRatio - d.baseline)
		return false
	}
	d.away++
	if d.away < driftIntervals {
		return false
	}
	d.away, d.baseline = 0, logRatio
	d.resets++
	return true
}

// reset makes the fit uncertain again after a drift: it adds driftInflation
// of the prior's variance to every coefficient's (P + c·I stays positive
// definite), so the next observations move the coefficients, while the
// coefficients and the noise estimate stay. A full reset to the prior's
// covariance would also widen every confidence bound to nothing, and the
// ranking, which prices the lower bounds, would ignore load until the fit
// had learnt again; the inflation keeps what the fit knows of which terms
// matter.
func (r *rls) reset() {
	for i := range r.d {
		r.p[i][i] = min(r.p[i][i]+driftInflation*r.maxP, r.maxP)
	}
}

// ledgerOf returns k's ledger; create makes it when missing.
func (m *Model) ledgerOf(k Key, create bool) *ledger {
	m.mu.RLock()
	l := m.ledgers[k]
	m.mu.RUnlock()
	if l != nil || !create {
		return l
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if l = m.ledgers[k]; l == nil {
		l = &ledger{}
		m.ledgers[k] = l
	}
	return l
}

// Booked enters a booking on k with features f and predicted TTFT
// (seconds) in k's ledger, when its engine reports latency histograms.
func (m *Model) Booked(k Key, f Features, predicted float64, at time.Time) {
	if l := m.ledgerOf(k, false); l != nil {
		l.push(booked{x: f.vector(), predicted: predicted, at: at.UnixNano()})
	}
}

// ObserveEngine reads one interval of k's engine histograms: it accounts
// its first tokens to k's oldest bookings, compares their mean TTFT with
// the predictions, and fits it (and the interval's mean ITL) when no
// response path reports from k. The engine's running requests raise k's
// estimated concurrency like the response path's do.
func (m *Model) ObserveEngine(k Key, iv EngineInterval) EngineOutcome {
	var out EngineOutcome
	l := m.ledgerOf(k, true)
	m.ObserveRunning(k, int(iv.Running))
	silentTTFT, silentITL := l.silent(iv.At)

	if n := int(iv.FirstTokens); n > 0 && float64(n) == iv.FirstTokens {
		x, predicted, ok := l.take(n, iv.At)
		if !ok {
			out.Unattributed = true
		} else {
			y := iv.TTFTSum / iv.FirstTokens
			out.Attributed, out.EngineTTFT, out.PredictedTTFT = true, y, predicted
			m.engineTTFT(k, n, x, y, predicted, silentTTFT, &out)
		}
	}
	if iv.Gaps > 0 {
		l.mu.Lock()
		l.engineITL, l.engineITLAt = iv.ITLSum/iv.Gaps, iv.At
		l.mu.Unlock()
	}
	if iv.Gaps > 0 && iv.Running > 0 && silentITL {
		x := [itlDim]float64{1, iv.Running}
		m.observe(k, x[:], iv.ITLSum/iv.Gaps, func(ft *fit) *rls { return &ft.itl }, nil)
		out.FittedITL = true
	}
	return out
}

// EngineITL is the mean inter-token latency (seconds) k's engine reported
// over its latest interval with any output, when that interval ended at or
// after since; ok is false otherwise (no latency histograms, or no output
// lately). It is a reading, not a prediction: what the engine's decode
// steps took just now, before any fit has learnt them.
func (m *Model) EngineITL(k Key, since time.Time) (itl float64, ok bool) {
	l := m.ledgerOf(k, false)
	if l == nil {
		return 0, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.engineITLAt.IsZero() || l.engineITLAt.Before(since) || !(l.engineITL >= 0) {
		return 0, false
	}
	return l.engineITL, true
}

// engineTTFT compares an attributed interval of n first tokens with its
// predictions, resets the pooled fit on a confirmed drift, and fits the
// interval when fit is set.
func (m *Model) engineTTFT(k Key, n int, x [ttftDim]float64, y, predicted float64, fit bool, out *EngineOutcome) {
	if !(y >= 0) || math.IsInf(y, 0) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	w, p := m.fitsOf(k)
	if n >= driftMinTokens && predicted > 0 && y > 0 && p.drift.check(math.Log(y/predicted)) {
		p.ttft.reset()
		out.DriftReset = true
	}
	if fit {
		w.ttft.update(x[:], y, m.cfg.Forgetting)
		p.ttft.update(x[:], y, m.cfg.Forgetting)
		m.errs.add(predicted, y)
		out.FittedTTFT = true
	}
	if out.DriftReset || fit {
		p.publish()
	}
}
