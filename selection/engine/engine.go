// Package engine keeps what the inference engines say about themselves and
// decides what selection makes of it. An adapter (engines/metrics) scrapes
// each worker's Prometheus endpoint and hands the figures to
// selection.Service.ReportEngineMetrics, which stores them in a Table;
// selection fuses them with its own bookings:
//
//   - Requests the engine holds that no replica booked (direct traffic, a
//     second gateway, requests in flight across a restart) cost a rank
//     Config.RequestWeight blocks each. The rule that keeps a request from
//     being counted twice: the engine's waiting + running count every request
//     it holds, including the booked ones that reached it, so the unbooked
//     ones are max(0, waiting + running − booked requests on the rank). A
//     booking not yet at the engine only lowers that estimate, never raises
//     it, so the term never charges a booked request a second time.
//   - KV-cache usage costs Config.KVUsageWeight blocks per unit of usage.
//   - A rank whose waiting queue or KV usage is at a saturation threshold is
//     saturated (GIE's detector, its thresholds). The two act differently
//     on a rank while the partition has room: a rank whose queue is at the
//     threshold is skipped like a busy-rejected rank, since its engine is
//     not admitting what it already holds; a rank only at the KV usage
//     threshold stays a candidate, ranked by cost, because its blocks are
//     held by running requests that a prefix hit shares, so the rank that
//     caches a prompt is often still the cheapest place for it (kvbench
//     text measured skipping such ranks: prefix-cache hit rate 72 % → 48 %,
//     p90 TTFT 1.3 s → 2.5 s under eviction pressure). GIE uses KV usage the
//     same way, to judge the pool, not to filter endpoints. The partition is
//     saturated when every rank is, by either threshold; then every rank
//     counts as saturated. When every eligible rank is saturated, the queue
//     (when queueing is on) holds the request until one has room, as it
//     does for busy ranks: saturated and busy are one concept with two
//     sources. Without the queue the request is still routed, to the
//     cheapest saturated rank, where the engine queues it: GIE's semantics
//     for a saturated pool, which rejects only sheddable requests.
//     RejectSaturated answers 429 instead, like the busy thresholds do.
//   - A request naming a LoRA adapter is charged LoRAMissWeight blocks on a
//     rank that has not loaded it but has a free adapter slot, twice that on
//     a rank with no free slot; a preference, never a filter.
//
// Figures older than Config.StaleAfter are not used at all: the rank is
// then judged on bookings alone, as without scraping.
package engine

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/health"
	"github.com/kvselect/kvselect/selection/scheduler"
)

// Config configures how engine metrics and health outcomes enter selection.
// The zero value uses engine metrics with GIE's saturation thresholds and the
// documented defaults (DefaultConfig).
type Config struct {
	// StaleAfter bounds the age of the figures selection uses (default 2 s).
	StaleAfter time.Duration
	// QueueDepthThreshold saturates a rank whose engine has at least this
	// many waiting requests (default 5, GIE's); < 0 disables.
	QueueDepthThreshold int
	// KVCacheUtilThreshold saturates a rank whose KV usage is at least this
	// fraction (default 0.8, GIE's); < 0 disables.
	KVCacheUtilThreshold float64
	// RejectSaturated answers 429 (all eligible workers are overloaded) when
	// every eligible rank is saturated and queueing is off, instead of
	// routing to the cheapest saturated rank (the default).
	RejectSaturated bool
	// Weights of the engine terms in the cost, in blocks; see above.
	// Negative values are refused; DefaultConfig has the defaults.
	RequestWeight, KVUsageWeight, LoRAMissWeight float64
	// Health is the ejection policy.
	Health health.Config
}

// The engine cost terms' defaults. They were chosen with kvbench route's
// bypass scenario (docs/benchmarks.md, "Engine metrics").
const (
	DefaultRequestWeight  = 16
	DefaultKVUsageWeight  = 0
	DefaultLoRAMissWeight = 8
)

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{
		StaleAfter: 2 * time.Second, QueueDepthThreshold: 5, KVCacheUtilThreshold: 0.8,
		RequestWeight: DefaultRequestWeight, KVUsageWeight: DefaultKVUsageWeight,
		LoRAMissWeight: DefaultLoRAMissWeight,
		Health:         health.DefaultConfig(),
	}
}

// Validate refuses a staleness bound that is not positive, a utilisation
// threshold above 1, weights that are negative or infinite, and an invalid
// ejection policy.
func (c *Config) Validate() error {
	switch {
	case c.StaleAfter <= 0:
		return fmt.Errorf("the staleness bound must be positive, not %s", c.StaleAfter)
	case c.KVCacheUtilThreshold > 1:
		return fmt.Errorf("the KV cache utilisation threshold is a fraction up to 1, not %g", c.KVCacheUtilThreshold)
	case !finiteNonNegative(c.RequestWeight), !finiteNonNegative(c.KVUsageWeight), !finiteNonNegative(c.LoRAMissWeight):
		return fmt.Errorf("engine cost weights must be finite and non-negative (request %g, kv usage %g, lora miss %g)",
			c.RequestWeight, c.KVUsageWeight, c.LoRAMissWeight)
	}
	return c.Health.Validate()
}

func finiteNonNegative(f float64) bool { return f >= 0 && !math.IsInf(f, 0) }

// Weights are the engine terms' weights as the cost function takes them.
func (c *Config) Weights() scheduler.EngineWeights {
	return scheduler.EngineWeights{UnbookedRequest: c.RequestWeight, KVUsage: c.KVUsageWeight, LoRAMiss: c.LoRAMissWeight}
}

// Saturated applies the saturation thresholds to one rank's figures.
func (c *Config) Saturated(r Rank) bool {
	return c.queueSaturated(r) || c.kvFull(r)
}

// queueSaturated: the rank's waiting queue is at the threshold.
func (c *Config) queueSaturated(r Rank) bool {
	return c.QueueDepthThreshold >= 0 && r.Waiting >= float64(c.QueueDepthThreshold) && r.Waiting > 0
}

// kvFull: the rank's KV usage is at the threshold.
func (c *Config) kvFull(r Rank) bool {
	return c.KVCacheUtilThreshold >= 0 && r.HasKVUsage && r.KVUsage >= c.KVCacheUtilThreshold
}

// Snapshot is one scrape of a worker's engine.
type Snapshot struct {
	// At is when the scrape was taken, on the service's clock; Asked, when
	// set, when it was sent: the figures are from between the two (zero:
	// At).
	At, Asked time.Time
	// Err is non-empty when the scrape failed; the figures are then ignored
	// and the last good ones age until they are stale.
	Err string
	// Ranks holds the figures per global data-parallel rank. An engine that
	// does not label ranks reports one entry under AllRanks, which applies
	// to every rank of the worker (its counts divided evenly).
	Ranks map[uint32]Rank
}

// AllRanks keys the figures of an engine that does not label its ranks.
const AllRanks uint32 = math.MaxUint32

// Rank is one rank's figures. Adapters drop values that are not finite or
// are negative (HasKVUsage false, counts zero) before reporting.
type Rank struct {
	Waiting, Running float64
	KVUsage          float64
	HasKVUsage       bool
	// LoRA is nil when the engine reports no adapter information.
	LoRA *LoRAState
	// TTFT and ITL are the engine's cumulative latency histograms (zero
	// when it exports none): the latency model reads their growth between
	// two scrapes (Interval).
	TTFT, ITL Histogram
}

// Histogram is a cumulative Prometheus histogram's count and sum (seconds);
// Reported is false when the engine does not export it.
type Histogram struct {
	Count, Sum float64
	Reported   bool
}

// Interval is what one rank's engine reported between two successful
// scrapes: the growth of its latency histograms and its running requests at
// the second.
type Interval struct {
	Rank uint32
	// TTFT and ITL are the first tokens and the inter-token gaps the engine
	// produced in the interval and their total seconds. A histogram that
	// went backwards (the engine restarted) gives none: the new reading is
	// the next interval's start. Span is 0 on a rank's first scrape.
	TTFT, ITL Histogram
	// Running is the engine's running requests at the scrape.
	Running float64
	// Span is the interval's length.
	Span time.Duration
}

// since is h's growth since prev; ok is false (and the growth zero) when it
// did not grow or went backwards.
func (h Histogram) since(prev Histogram) (Histogram, bool) {
	d := Histogram{Count: h.Count - prev.Count, Sum: h.Sum - prev.Sum, Reported: true}
	if !h.Reported || !prev.Reported || !(d.Count > 0 && d.Sum >= 0) {
		return Histogram{}, false
	}
	return d, true
}

// LoRAState is the adapters an engine has loaded (vLLM's
// vllm:lora_requests_info).
type LoRAState struct {
	Running, Waiting []string
	MaxLoRA          int
}

// Table holds the latest snapshot of each worker's engine. The zero value is
// an empty table, safe for concurrent use; its lock is a leaf.
type Table struct {
	mu sync.RWMutex
	by map[uint64]*entry
}

type entry struct {
	good    Snapshot // the last successful scrape
	hasGood bool
	lastErr string // the last scrape's error, "" when it succeeded
}

// Put records one scrape of a worker's engine and returns, for each rank
// whose engine exports latency histograms, what they gained since the
// previous successful scrape (nothing on the first).
func (t *Table) Put(workerID uint64, snap Snapshot) []Interval {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.by == nil {
		t.by = make(map[uint64]*entry)
	}
	e := t.by[workerID]
	if e == nil {
		e = &entry{}
		t.by[workerID] = e
	}
	e.lastErr = snap.Err
	if snap.Err != "" {
		return nil
	}
	snap = sanitized(snap)
	var out []Interval
	for rank, r := range snap.Ranks {
		if !r.TTFT.Reported && !r.ITL.Reported {
			continue
		}
		iv := Interval{Rank: rank, Running: r.Running}
		if prev, ok := e.good.Ranks[rank]; e.hasGood && ok {
			iv.Span = snap.At.Sub(e.good.At)
			iv.TTFT, _ = r.TTFT.since(prev.TTFT)
			iv.ITL, _ = r.ITL.since(prev.ITL)
		}
		out = append(out, iv)
	}
	slices.SortFunc(out, func(a, b Interval) int { return cmp.Compare(a.Rank, b.Rank) })
	e.good, e.hasGood = snap, true
	return out
}

// sanitized drops values that are not finite or are negative, which the
// adapters already refuse, so that no report can turn a cost into NaN.
func sanitized(snap Snapshot) Snapshot {
	ok := func(f float64) bool { return f >= 0 && !math.IsInf(f, 0) && !math.IsNaN(f) }
	okHist := func(h Histogram) bool { return ok(h.Count) && ok(h.Sum) }
	clean := true
	for _, r := range snap.Ranks {
		if !ok(r.Waiting) || !ok(r.Running) || (r.HasKVUsage && !ok(r.KVUsage)) || !okHist(r.TTFT) || !okHist(r.ITL) {
			clean = false
		}
	}
	if clean {
		return snap
	}
	out := snap
	out.Ranks = make(map[uint32]Rank, len(snap.Ranks))
	for k, r := range snap.Ranks {
		if !ok(r.Waiting) {
			r.Waiting = 0
		}
		if !ok(r.Running) {
			r.Running = 0
		}
		if r.HasKVUsage && !ok(r.KVUsage) {
			r.KVUsage, r.HasKVUsage = 0, false
		}
		if !okHist(r.TTFT) {
			r.TTFT = Histogram{}
		}
		if !okHist(r.ITL) {
			r.ITL = Histogram{}
		}
		// A dropped histogram is reported as absent: the next good reading
		// starts a new interval rather than one spanning the bad value.
		out.Ranks[k] = r
	}
	return out
}

// Forget drops a worker's figures (it left the catalog).
func (t *Table) Forget(workerID uint64) {
	t.mu.Lock()
	delete(t.by, workerID)
	t.mu.Unlock()
}

// Saturated reports a rank whose fresh figures at now are saturated by cfg's
// thresholds. rankCount is the worker's number of ranks, by which
// whole-worker counts are divided.
func (t *Table) Saturated(workerID uint64, rank uint32, rankCount int, now time.Time, cfg *Config) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	r, ok := t.rankLocked(workerID, rank, rankCount, now, cfg.StaleAfter)
	return ok && cfg.Saturated(r)
}

// rankLocked returns the rank's fresh figures, with t.mu held for reading;
// ok is false when there are none (never scraped, last good scrape stale,
// rank not reported).
func (t *Table) rankLocked(workerID uint64, rank uint32, rankCount int, now time.Time, staleAfter time.Duration) (Rank, bool) {
	e := t.by[workerID]
	if e == nil || !e.hasGood || now.Sub(e.good.At) > staleAfter {
		return Rank{}, false
	}
	if r, ok := e.good.Ranks[rank]; ok {
		return r, true
	}
	r, ok := e.good.Ranks[AllRanks]
	if !ok {
		return Rank{}, false
	}
	if rankCount > 1 {
		r.Waiting /= float64(rankCount)
		r.Running /= float64(rankCount)
	}
	return r, true
}

// Annotate fills the engine fields of cands from the fresh figures at now
// (EngineFresh, EngineWaiting, EngineRunning, EngineKVUsage, Saturated,
// LoRAFit for the request's adapter lora), reading every rank under one
// lock. rankCount(i) is the number of ranks of cands[i]'s worker. A rank
// whose queue is at the threshold is saturated; when every rank is saturated
// by one threshold or the other, the partition is, and every rank counts as
// saturated. Without any scrape it leaves cands alone.
func (t *Table) Annotate(cands []scheduler.Scored, rankCount func(i int) int, lora string, now time.Time, cfg *Config) {
	t.mu.RLock()
	if len(t.by) == 0 {
		t.mu.RUnlock()
		return
	}
	poolSat := true // every rank so far saturated by one threshold or the other
	for i := range cands {
		c := &cands[i].Candidate
		er, ok := t.rankLocked(c.Worker.WorkerID, c.Worker.DPRank, rankCount(i), now, cfg.StaleAfter)
		if !ok {
			poolSat = false
			continue
		}
		c.EngineFresh = true
		c.EngineWaiting, c.EngineRunning = er.Waiting, er.Running
		if er.HasKVUsage {
			c.EngineKVUsage = er.KVUsage
		}
		c.Saturated = cfg.queueSaturated(er)
		poolSat = poolSat && (c.Saturated || cfg.kvFull(er))
		c.LoRAFit = loraFit(er.LoRA, lora)
	}
	t.mu.RUnlock()
	if poolSat && len(cands) > 0 {
		for i := range cands {
			cands[i].Saturated = true
		}
	}
}

// View is GET /workers' engine_metrics of one worker; nil when the worker
// was never scraped.
func (t *Table) View(rec *catalog.Record, now time.Time, cfg *Config) *catalog.EngineMetricsView {
	t.mu.RLock()
	defer t.mu.RUnlock()
	e := t.by[rec.WorkerID]
	if e == nil {
		return nil
	}
	v := &catalog.EngineMetricsView{Error: e.lastErr, Stale: true}
	if !e.hasGood {
		return v
	}
	age := now.Sub(e.good.At)
	ms := age.Milliseconds()
	v.AgeMS = &ms
	v.Stale = age > cfg.StaleAfter
	for rank, r := range e.good.Ranks {
		addRank(v, rank, r, cfg.Saturated(r))
	}
	if v.Stale {
		v.Saturated = false
	}
	return v
}

// addRank adds one rank's figures to a worker's view.
func addRank(v *catalog.EngineMetricsView, rank uint32, r Rank, sat bool) {
	v.Waiting += r.Waiting
	v.Running += r.Running
	if r.HasKVUsage && (v.KVUsage == nil || r.KVUsage > *v.KVUsage) {
		u := r.KVUsage
		v.KVUsage = &u
	}
	v.Saturated = v.Saturated || sat
	if r.LoRA != nil {
		if v.LoRA == nil {
			v.LoRA = &catalog.LoRAView{Running: []string{}, Waiting: []string{}}
		}
		v.LoRA.Running = appendNew(v.LoRA.Running, r.LoRA.Running)
		v.LoRA.Waiting = appendNew(v.LoRA.Waiting, r.LoRA.Waiting)
		v.LoRA.MaxLoRA = max(v.LoRA.MaxLoRA, r.LoRA.MaxLoRA)
	}
	if rank == AllRanks {
		return
	}
	if v.Ranks == nil {
		v.Ranks = make(map[uint32]catalog.EngineRankView)
	}
	rv := catalog.EngineRankView{Waiting: r.Waiting, Running: r.Running, Saturated: sat}
	if r.HasKVUsage {
		u := r.KVUsage
		rv.KVUsage = &u
	}
	v.Ranks[rank] = rv
}

func appendNew(dst, src []string) []string {
	for _, s := range src {
		if !slices.Contains(dst, s) {
			dst = append(dst, s)
		}
	}
	return dst
}

// loraFit is how a rank suits a request's LoRA adapter.
func loraFit(l *LoRAState, adapter string) int {
	if l == nil || adapter == "" {
		return 0
	}
	if slices.Contains(l.Running, adapter) || slices.Contains(l.Waiting, adapter) {
		return 0
	}
	loaded := len(l.Running)
	for _, a := range l.Waiting {
		if !slices.Contains(l.Running, a) {
			loaded++
		}
	}
	if l.MaxLoRA > 0 && loaded < l.MaxLoRA {
		return 1 // a free slot: the adapter must be loaded first
	}
	return 2 // no free slot: another adapter must be swapped out
}

// Stats counts the scraped workers whose figures are fresh at now and those
// whose last good scrape is stale or missing (selection then relies on its
// bookings alone for them).
func (t *Table) Stats(now time.Time, staleAfter time.Duration) (fresh, stale int) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, e := range t.by {
		if e.hasGood && now.Sub(e.good.At) <= staleAfter {
			fresh++
		} else {
			stale++
		}
	}
	return fresh, stale
}
