// Package latency is the selection service's online latency model: for each
// worker, a prediction of the time to first token (TTFT) and the inter-token
// latency (ITL) a request would see there, fitted as requests complete from
// the latency the service observes (the ext_proc picker's first response
// byte, the REST lifecycle's prefill_complete, the response's end).
//
// The TTFT model is linear in what a rank holds when the request arrives:
//
//	TTFT = θ0 + θ1·uncached/1k + θ2·prefillAhead/1k + θ3·queued + θ4·running + θ5·poolRequests + θ6·kvUsage
//
// where uncached is the prompt tokens the rank would prefill for this
// request (its prompt less the rank's cached prefix), prefillAhead the
// prompt tokens of requests routed there that have not produced a first
// token, and queued and running split the rank's requests at the engine's
// concurrency — how many requests it runs at once (vLLM's max_num_seqs),
// learnt as the most requests seen decoding on it together: running ones
// share the batch with this request's prefill, queued ones hold it back
// until a slot frees. The split matters: an engine below its concurrency
// takes a request at once whatever it runs, so a cached prefix there is
// worth more than its load, and a linear price per request would spread
// requests off their prefixes. Each term is a cost the engine pays before or
// while this request prefills: its own prefill, the prefills queued before
// it, the wait behind a full batch, and the decode steps its prefill shares
// the batch with. poolRequests, the mean requests per rank of the whole pool,
// is a control: it is the same for every candidate of one decision, so it
// never changes a ranking, but without it a busy moment of the whole pool
// (slower engines everywhere, more load on every rank) would be learnt as
// the cost of the chosen rank's own load, and the picker would spread
// requests off their cached prefixes for nothing. The ITL model is θ0 + θ1·running. Coefficients are fitted by
// recursive least squares with exponential forgetting (RLS: constant time
// and memory per observation, no training phase) per served model — the
// worker class: an InferencePool's or a Dynamo deployment's workers of one
// model run the same engine on the same hardware — and predictions use that
// fit, starting from a documented prior (Prior). Each worker's own fit is
// kept beside it for the view, to show a worker that runs slower than its
// class; it does not steer predictions, because a fit from one worker's
// few, noisy observations makes identical workers look different and the
// picker then favours whichever looks fast by chance.
package latency

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Features is what a rank holds when a request arrives, as the TTFT model
// reads it. Counts exclude the request itself.
type Features struct {
	// Uncached is the prompt tokens the rank would prefill for the request.
	Uncached float64
	// PrefillAhead is the prompt tokens still to prefill of the requests
	// routed to the rank that have not produced a first token.
	PrefillAhead float64
	// Queued is the requests on the rank beyond its engine's concurrency
	// (waiting for a slot); Running the requests within it.
	Queued, Running float64
	// PoolRequests is the mean requests per rank over the pool's
	// candidates.
	PoolRequests float64
	// KVUsage is the rank's engine's reported KV-cache usage (0..1), 0 when
	// unknown or stale.
	KVUsage float64
}

// ttftDim is the TTFT model's dimension: a constant and the six features.
const ttftDim = 7

// itlDim is the ITL model's dimension: a constant and the running requests.
const itlDim = 2

// vector scales f to the model's units: token counts in thousands, so every
// coefficient is seconds per unit of a feature whose values are of order
// one, and the prior's covariance is one number for all of them.
func (f Features) vector() [ttftDim]float64 {
	return [ttftDim]float64{1, f.Uncached / 1000, f.PrefillAhead / 1000, f.Queued, f.Running, f.PoolRequests, f.KVUsage}
}

// Coeffs is one fitted model: immutable once published, read without locks.
type Coeffs struct {
	// TTFT holds θ0..θ6 in seconds per unit of (1, uncached k-tokens,
	// prefill-ahead k-tokens, queued requests, running requests, pool
	// requests per rank, KV-cache usage).
	TTFT [ttftDim]float64
	// TTFTLow is each TTFT coefficient at its lower 95 % confidence bound
	// (θ0 as fitted): what RankTTFT prices with.
	TTFTLow [ttftDim]float64
	// ITL holds θ0, θ1 in seconds per (1, running requests).
	ITL [itlDim]float64
	// TTFTObservations and ITLObservations count what was fitted into it.
	TTFTObservations, ITLObservations int
	// DriftResets counts the drifts the engines' histograms confirmed, each
	// of which inflated the fit's covariance (a pooled fit's only; engine.go).
	DriftResets int
	// Source says where the coefficients come from: "worker" (one worker's
	// own fit, for the view), "pooled" (the model's fit over all its
	// workers, which predictions use), "prior".
	Source string
}

// PredictTTFT is the predicted time to first token in seconds. Each
// coefficient counts at zero or above when predicting: more load never
// predicts a faster first token, whatever a noisy fit says.
func (c *Coeffs) PredictTTFT(f Features) float64 { return priced(&c.TTFT, f) }

// priced is f's TTFT with coefficients theta, each at zero or above.
func priced(theta *[ttftDim]float64, f Features) float64 {
	x := f.vector()
	var y float64
	for i, v := range x {
		y += max(theta[i], 0) * v
	}
	return y
}

// RankTTFT is the cost the predicted-latency policy ranks a rank by: the
// TTFT predicted with every coefficient at its lower confidence bound
// (TTFTLow, at zero or above). An effect the observations cannot tell from
// noise — load that seems to slow the engines only because the whole
// machine was busy at the time — then does not move a request off its
// cached prefix, while one they show clearly (a full batch queueing
// requests, the cost of an uncached token) counts almost whole.
func (c *Coeffs) RankTTFT(f Features) float64 { return priced(&c.TTFTLow, f) }

// PredictITL is the predicted inter-token latency in seconds of a request
// decoding beside running requests in all (itself included).
func (c *Coeffs) PredictITL(running float64) float64 {
	return max(c.ITL[0], 0) + max(c.ITL[1], 0)*running
}

// Prior is the model before any observation.
//
// The TTFT prior has kv-cost's shape (Dynamo's default cost, which charges
// a rank its uncached prompt blocks plus the prefill it has booked, one
// block of each at the same price, and the blocks of every request it
// runs): 25 µs per uncached token and the same per token of prefill ahead
// (a prefill rate of 40k tokens/s, a mid-size GPU's), 1.6 ms per running
// request (one batched decode step of about 64 tokens' worth), 25 ms per
// queued request (the wait for a slot behind a batch of short answers), and
// nothing for the pool, for KV usage or fixed. The ITL prior is 10 ms plus
// 1 ms per running request.
func Prior() Coeffs {
	ttft := [ttftDim]float64{0, 0.025, 0.025, 0.025, 0.0016, 0, 0}
	return Coeffs{TTFT: ttft, TTFTLow: ttft, ITL: [itlDim]float64{0.010, 0.001}, Source: "prior"}
}

// Config tunes the fit; the zero value takes the defaults.
type Config struct {
	// Forgetting is RLS's forgetting factor λ in (0, 1]: an observation
	// weighs λ^k after k newer ones, so the fit follows an engine whose
	// speed changes (default 0.995: a memory of about 200 requests).
	Forgetting float64
	// MinObservations is how many observations the pooled fit needs before
	// predictions use it instead of the prior (default 16).
	MinObservations int
	// PriorVariance is the prior's variance per coefficient, relative to
	// the observation noise (default 1: the prior weighs about as much as one
	// observation, so the first few requests move it).
	PriorVariance float64
}

func (c Config) withDefaults() Config {
	if !(c.Forgetting > 0 && c.Forgetting <= 1) {
		c.Forgetting = 0.995
	}
	if c.MinObservations <= 0 {
		c.MinObservations = 16
	}
	if !(c.PriorVariance > 0) {
		c.PriorVariance = 1
	}
	return c
}

// rls is one recursive-least-squares fit of dimension d ≤ ttftDim.
type rls struct {
	d     int
	theta [ttftDim]float64
	p     [ttftDim][ttftDim]float64
	n     int
	maxP  float64 // the bound of each variance: the prior's
	// sumE and sumW are the forgetting-weighted sum of squared prediction
	// errors and of weights: their ratio is the noise variance σ², which
	// with P gives each coefficient's standard error.
	sumE, sumW float64
}

func newRLS(d int, theta []float64, variance float64) rls {
	r := rls{d: d, maxP: variance}
	copy(r.theta[:], theta)
	for i := range d {
		r.p[i][i] = variance
	}
	return r
}

// update fits one observation y of x with forgetting factor lambda.
func (r *rls) update(x []float64, y, lambda float64) {
	d := r.d
	var px [ttftDim]float64
	for i := range d {
		for j := range d {
			px[i] += r.p[i][j] * x[j]
		}
	}
	den := lambda
	for i := range d {
		den += x[i] * px[i]
	}
	if !(den > 0) || math.IsInf(den, 0) {
		return
	}
	var pred float64
	for i := range d {
		pred += r.theta[i] * x[i]
	}
	e := y - pred
	for i := range d {
		r.theta[i] += px[i] / den * e
	}
	r.sumE = lambda*r.sumE + e*e
	r.sumW = lambda*r.sumW + 1
	for i := range d {
		for j := range d {
			r.p[i][j] = (r.p[i][j] - px[i]*px[j]/den) / lambda
		}
	}
	// Forgetting makes P grow along a feature the observations leave at
	// zero (no engine metrics, no queue yet): bound each variance at the
	// prior's, scaling its row and column (P stays positive semi-definite),
	// so that one idle feature neither winds up nor, bounded jointly, slows
	// the fit of the others.
	var scale [ttftDim]float64
	for i := range d {
		scale[i] = 1
		if v := r.p[i][i]; v > r.maxP {
			scale[i] = math.Sqrt(r.maxP / v)
		}
	}
	for i := range d {
		for j := range d {
			r.p[i][j] *= scale[i] * scale[j]
		}
	}
	r.n++
}

// lowerBounds writes into low each coefficient less confidenceZ standard
// errors (the constant's is its estimate): what the data can tell apart
// from noise.
func (r *rls) lowerBounds(low []float64) {
	copy(low, r.theta[:r.d])
	if r.sumW <= 0 {
		return
	}
	s2 := r.sumE / r.sumW
	for i := 1; i < r.d; i++ {
		low[i] = r.theta[i] - confidenceZ*math.Sqrt(max(s2*r.p[i][i], 0))
	}
}

// confidenceZ is the one-sided 95 % normal quantile: a cost the ranking
// counts only where the fit is that sure of it.
const confidenceZ = 1.645

// fit is one model's TTFT and ITL fits and, for a pooled fit, the
// coefficients last published.
type fit struct {
	ttft, itl rls
	pub       atomic.Pointer[Coeffs]
	// concurrency is the most requests seen decoding on the worker at once
	// (a worker's fit only): a lower bound of its engine's concurrency.
	concurrency atomic.Int64
	// drift compares the engines' histograms with the predictions (a
	// pooled fit's only; engine.go).
	drift drift
}

func newFit(prior Coeffs, variance float64) *fit {
	f := &fit{ttft: newRLS(ttftDim, prior.TTFT[:], variance), itl: newRLS(itlDim, prior.ITL[:], variance)}
	f.publish()
	return f
}

// coeffs is the current fit as coefficients; source "" is "prior" until
// the first observation. The caller holds the model's lock.
func (f *fit) coeffs(source string) *Coeffs {
	c := &Coeffs{TTFTObservations: f.ttft.n, ITLObservations: f.itl.n, DriftResets: f.drift.resets, Source: source}
	copy(c.TTFT[:], f.ttft.theta[:ttftDim])
	f.ttft.lowerBounds(c.TTFTLow[:])
	copy(c.ITL[:], f.itl.theta[:itlDim])
	if c.Source == "" || f.ttft.n+f.itl.n == 0 {
		c.Source = "prior"
	}
	return c
}

// publish makes a pooled fit readable to predictions without the lock (a
// worker's own fit is only read by View, under it).
func (f *fit) publish() { f.pub.Store(f.coeffs("pooled")) }

// Key names one engine's model: the served model, the worker and its
// data-parallel rank (each rank is an engine with its own batch).
type Key struct {
	Model  string
	Worker uint64
	Rank   uint32
}

// Model holds every worker's fit. It is safe for concurrent use: Coeffs is
// lock-free for readers of an existing worker (one read lock to find it),
// and the fits are updated under one mutex, a leaf.
type Model struct {
	cfg   Config
	prior Coeffs

	mu      sync.RWMutex
	workers map[Key]*fit
	pooled  map[string]*fit
	ledgers map[Key]*ledger // ranks whose engines report histograms (engine.go)
	errs    errorWindow
}

// NewModel is an empty model; every worker starts from Prior.
func NewModel(cfg Config) *Model {
	return &Model{cfg: cfg.withDefaults(), prior: Prior(), workers: map[Key]*fit{}, pooled: map[string]*fit{},
		ledgers: map[Key]*ledger{}}
}

// Coeffs is the model a prediction for k uses: its model's pooled fit once
// that has enough observations, else the prior.
func (m *Model) Coeffs(k Key) *Coeffs { return m.Pooled(k.Model) }

// Pooled is the model predictions for any worker of model use: its pooled
// fit once that has enough observations, else the prior.
func (m *Model) Pooled(model string) *Coeffs {
	m.mu.RLock()
	p := m.pooled[model]
	m.mu.RUnlock()
	return m.pick(p)
}

func (m *Model) pick(p *fit) *Coeffs {
	if p != nil {
		if c := p.pub.Load(); c.TTFTObservations >= m.cfg.MinObservations {
			return c
		}
	}
	return &m.prior
}

// fitsOf returns k's fit and its model's pooled fit, creating them.
func (m *Model) fitsOf(k Key) (w, p *fit) {
	w, p = m.workers[k], m.pooled[k.Model]
	if w == nil {
		w = newFit(m.prior, m.cfg.PriorVariance)
		m.workers[k] = w
	}
	if p == nil {
		p = newFit(m.prior, m.cfg.PriorVariance)
		m.pooled[k.Model] = p
	}
	return w, p
}

// ObserveTTFT fits an observed time to first token (seconds) of a request
// routed to k with features f, and records the error of the prediction made
// for it (predicted, seconds; negative when none was made).
func (m *Model) ObserveTTFT(k Key, f Features, observed, predicted float64) {
	x := f.vector()
	m.observe(k, x[:], observed, func(ft *fit) *rls { return &ft.ttft }, func() {
		if predicted >= 0 {
			m.errs.add(predicted, observed)
		}
		if l := m.ledgers[k]; l != nil {
			l.respondedTTFT.Add(1)
		}
	})
}

// ObserveRunning records that k had running requests decoding at once: the
// estimate of its engine's concurrency (Concurrency) is the most seen.
func (m *Model) ObserveRunning(k Key, running int) {
	if running <= 0 {
		return
	}
	m.mu.RLock()
	w := m.workers[k]
	m.mu.RUnlock()
	if w == nil {
		m.mu.Lock()
		w, _ = m.fitsOf(k)
		m.mu.Unlock()
	}
	for {
		cur := w.concurrency.Load()
		if int64(running) <= cur || w.concurrency.CompareAndSwap(cur, int64(running)) {
			return
		}
	}
}

// WorkerConcurrency is k's estimated concurrency (0: not seen yet).
func (m *Model) WorkerConcurrency(k Key) float64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if w := m.workers[k]; w != nil {
		return float64(w.concurrency.Load())
	}
	return 0
}

// Concurrency calls fn with the estimated concurrency of each rank of model
// (0: not seen yet), under one read lock: the per-decision lookup.
func (m *Model) Concurrency(model string, n int, rank func(i int) (worker uint64, rank uint32), fn func(i int, concurrency float64)) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for i := range n {
		c := 0.0
		wid, r := rank(i)
		if w := m.workers[Key{Model: model, Worker: wid, Rank: r}]; w != nil {
			c = float64(w.concurrency.Load())
		}
		fn(i, c)
	}
}

// ObserveITL fits an observed mean inter-token latency (seconds) of a
// request that decoded on k beside running requests in all.
func (m *Model) ObserveITL(k Key, running, observed float64) {
	x := [itlDim]float64{1, running}
	m.observe(k, x[:], observed, func(ft *fit) *rls { return &ft.itl }, func() {
		if l := m.ledgers[k]; l != nil {
			l.respondedITL.Add(1)
		}
	})
}

// observe fits observation y of x into the fit side picks, of k's worker
// and of its model, publishes the model's and runs then (when not nil)
// under the same lock; it does nothing when y is not a finite time.
func (m *Model) observe(k Key, x []float64, y float64, side func(*fit) *rls, then func()) {
	if !(y >= 0) || math.IsInf(y, 0) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	w, p := m.fitsOf(k)
	side(w).update(x, y, m.cfg.Forgetting)
	side(p).update(x, y, m.cfg.Forgetting)
	p.publish()
	if then != nil {
		then()
	}
}

// Forget drops a worker's fits (the worker left); a worker that comes back
// starts from its model's pooled fit.
func (m *Model) Forget(worker uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k := range m.workers {
		if k.Worker == worker {
			delete(m.workers, k)
		}
	}
	for k := range m.ledgers {
		if k.Worker == worker {
			delete(m.ledgers, k)
		}
	}
}

// WorkerView is one worker's model as the policy view shows it.
type WorkerView struct {
	Key
	Coeffs
	// Concurrency is the estimated concurrency of its engine (0: unknown).
	Concurrency int
}

// View is the whole model: each worker's fit and each served model's pooled
// fit, the coefficients predictions use for it, and the recent prediction
// error.
type View struct {
	Workers []WorkerView
	Pooled  map[string]Coeffs
	Prior   Coeffs
	Errors  ErrorSummary
}

// View returns a copy of the model.
func (m *Model) View() View {
	m.mu.RLock()
	defer m.mu.RUnlock()
	v := View{Pooled: make(map[string]Coeffs, len(m.pooled)), Prior: m.prior, Errors: m.errs.summary()}
	for k, f := range m.workers {
		v.Workers = append(v.Workers, WorkerView{Key: k, Coeffs: *f.coeffs("worker"), Concurrency: int(f.concurrency.Load())})
	}
	for name, f := range m.pooled {
		v.Pooled[name] = *f.pub.Load()
	}
	return v
}

// Seconds converts d to the model's unit.
func Seconds(d time.Duration) float64 { return d.Seconds() }
