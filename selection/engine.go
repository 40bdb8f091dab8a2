package selection

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/index"
)

// What the engines say about themselves. An adapter (engines/metrics)
// scrapes each worker's Prometheus endpoint and hands the figures to
// ReportEngineMetrics; selection fuses them with its own bookings:
//
//   - Requests the engine holds that no replica booked (direct traffic, a
//     second gateway, requests in flight across a restart) cost a rank
//     EngineRequestWeight blocks each. The rule that keeps a request from
//     being counted twice: the engine's waiting + running count every request
//     it holds, including the booked ones that reached it, so the unbooked
//     ones are max(0, waiting + running − booked requests on the rank). A
//     booking not yet at the engine only lowers that estimate, never raises
//     it, so the term never charges a booked request a second time.
//   - KV-cache usage costs EngineKVUsageWeight blocks per unit of usage.
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
// Figures older than EngineConfig.StaleAfter are not used at all: the rank is
// then judged on bookings alone, as without scraping.

// EngineConfig configures how engine metrics and health outcomes enter
// selection. The zero value uses engine metrics with GIE's saturation
// thresholds and the documented defaults (DefaultEngineConfig).
type EngineConfig struct {
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
	// Negative values are refused; DefaultEngineConfig has the defaults.
	RequestWeight, KVUsageWeight, LoRAMissWeight float64
	// Health is the ejection policy.
	Health HealthConfig
}

// The engine cost terms' defaults. They were chosen with kvbench route's
// bypass scenario (docs/benchmarks.md, "Engine metrics").
const (
	DefaultEngineRequestWeight  = 16
	DefaultEngineKVUsageWeight  = 0
	DefaultEngineLoRAMissWeight = 8
)

// DefaultEngineConfig returns the documented defaults.
func DefaultEngineConfig() EngineConfig {
	return EngineConfig{
		StaleAfter: 2 * time.Second, QueueDepthThreshold: 5, KVCacheUtilThreshold: 0.8,
		RequestWeight: DefaultEngineRequestWeight, KVUsageWeight: DefaultEngineKVUsageWeight,
		LoRAMissWeight: DefaultEngineLoRAMissWeight,
		Health:         DefaultHealthConfig(),
	}
}

func (c *EngineConfig) validate() error {
	switch {
	case c.StaleAfter <= 0:
		return fmt.Errorf("the staleness bound must be positive, not %s", c.StaleAfter)
	case c.KVCacheUtilThreshold > 1:
		return fmt.Errorf("the KV cache utilisation threshold is a fraction up to 1, not %g", c.KVCacheUtilThreshold)
	case !finiteNonNegative(c.RequestWeight), !finiteNonNegative(c.KVUsageWeight), !finiteNonNegative(c.LoRAMissWeight):
		return fmt.Errorf("engine cost weights must be finite and non-negative (request %g, kv usage %g, lora miss %g)",
			c.RequestWeight, c.KVUsageWeight, c.LoRAMissWeight)
	case c.Health.EjectAfter < 0:
		return fmt.Errorf("eject-after must be 0 (off) or positive, not %d", c.Health.EjectAfter)
	case c.Health.EjectAfter > 0 && (c.Health.Base <= 0 || c.Health.Max < c.Health.Base || c.Health.Window <= 0):
		return fmt.Errorf("ejection times must be positive with the maximum at least the base (window %s, base %s, max %s)",
			c.Health.Window, c.Health.Base, c.Health.Max)
	}
	return nil
}

func finiteNonNegative(f float64) bool { return f >= 0 && !math.IsInf(f, 0) }

// EngineSnapshot is one scrape of a worker's engine.
type EngineSnapshot struct {
	// At is when the scrape was taken, on the service's clock.
	At time.Time
	// Err is non-empty when the scrape failed; the figures are then ignored
	// and the last good ones age until they are stale.
	Err string
	// Ranks holds the figures per global data-parallel rank. An engine that
	// does not label ranks reports one entry under AllRanks, which applies
	// to every rank of the worker (its counts divided evenly).
	Ranks map[uint32]EngineRank
}

// AllRanks keys the figures of an engine that does not label its ranks.
const AllRanks uint32 = math.MaxUint32

// EngineRank is one rank's figures. Adapters drop values that are not
// finite or are negative (HasKVUsage false, counts zero) before reporting.
type EngineRank struct {
	Waiting, Running float64
	KVUsage          float64
	HasKVUsage       bool
	// LoRA is nil when the engine reports no adapter information.
	LoRA *LoRAState
}

// LoRAState is the adapters an engine has loaded (vLLM's
// vllm:lora_requests_info).
type LoRAState struct {
	Running, Waiting []string
	MaxLoRA          int
}

// EngineTarget is one schedulable worker whose engine can be scraped.
type EngineTarget struct {
	WorkerID uint64
	// URL is the metrics URL (metrics_endpoint, else <endpoint>/metrics).
	URL string
	// HealthURL is <endpoint's server>/health, for the active health probe.
	HealthURL string
	// Engine is the engine dialect: vllm, sglang or trtllm.
	Engine string
	Ranks  []uint32
}

// EngineTargets lists the schedulable workers with an HTTP endpoint, in
// worker-id order: what an engine-metrics adapter scrapes.
func (s *Service) EngineTargets() []EngineTarget {
	s.mu.RLock()
	out := make([]EngineTarget, 0, len(s.catalog))
	for _, r := range s.catalog {
		if r.Lifecycle != catalog.Schedulable {
			continue
		}
		u, ok := r.MetricsURL()
		if !ok {
			continue
		}
		t := EngineTarget{WorkerID: r.WorkerID, URL: u, Engine: r.EngineName(), Ranks: r.Ranks()}
		if h, ok := (&catalog.Record{Endpoint: r.Endpoint}).MetricsURL(); ok {
			t.HealthURL = h[:len(h)-len("/metrics")] + "/health"
		}
		out = append(out, t)
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b EngineTarget) int {
		switch {
		case a.WorkerID < b.WorkerID:
			return -1
		case a.WorkerID > b.WorkerID:
			return 1
		}
		return 0
	})
	return out
}

// ReportEngineMetrics records one scrape of a worker's engine. A report for a
// worker the catalog does not hold is dropped (the worker may have left while
// it was scraped); the answer says whether it was kept. Partitions whose
// queue waits for a rank to stop being saturated are woken.
func (s *Service) ReportEngineMetrics(workerID uint64, snap EngineSnapshot) bool {
	rec, ok := s.record(workerID)
	if !ok {
		return false
	}
	s.engines.put(workerID, snap)
	if p := s.partition(index.Partition{Model: rec.ModelName, RoutingGroup: rec.RoutingGroup}); p != nil {
		p.wake()
	}
	return true
}

// engineTable holds the latest snapshot of each worker's engine. A leaf lock.
type engineTable struct {
	mu sync.RWMutex
	by map[uint64]*engineEntry
}

type engineEntry struct {
	good    EngineSnapshot // the last successful scrape
	hasGood bool
	lastErr string // the last scrape's error, "" when it succeeded
}

func (t *engineTable) put(workerID uint64, snap EngineSnapshot) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.by == nil {
		t.by = make(map[uint64]*engineEntry)
	}
	e := t.by[workerID]
	if e == nil {
		e = &engineEntry{}
		t.by[workerID] = e
	}
	e.lastErr = snap.Err
	if snap.Err == "" {
		e.good, e.hasGood = sanitized(snap), true
	}
}

// sanitized drops values that are not finite or are negative, which the
// adapters already refuse, so that no report can turn a cost into NaN.
func sanitized(snap EngineSnapshot) EngineSnapshot {
	ok := func(f float64) bool { return f >= 0 && !math.IsInf(f, 0) && !math.IsNaN(f) }
	clean := true
	for _, r := range snap.Ranks {
		if !ok(r.Waiting) || !ok(r.Running) || (r.HasKVUsage && !ok(r.KVUsage)) {
			clean = false
		}
	}
	if clean {
		return snap
	}
	out := snap
	out.Ranks = make(map[uint32]EngineRank, len(snap.Ranks))
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
		out.Ranks[k] = r
	}
	return out
}

func (t *engineTable) forget(workerID uint64) {
	t.mu.Lock()
	delete(t.by, workerID)
	t.mu.Unlock()
}

// rank returns the rank's fresh figures; ok is false when there are none
// (never scraped, last good scrape stale, rank not reported). rankCount is
// the worker's number of ranks, by which whole-worker counts are divided.
func (t *engineTable) rank(workerID uint64, rank uint32, rankCount int, now time.Time, staleAfter time.Duration) (EngineRank, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.rankLocked(workerID, rank, rankCount, now, staleAfter)
}

// rankLocked is rank with t.mu held for reading: selection reads every rank
// of a partition under one lock.
func (t *engineTable) rankLocked(workerID uint64, rank uint32, rankCount int, now time.Time, staleAfter time.Duration) (EngineRank, bool) {
	e := t.by[workerID]
	if e == nil || !e.hasGood || now.Sub(e.good.At) > staleAfter {
		return EngineRank{}, false
	}
	if r, ok := e.good.Ranks[rank]; ok {
		return r, true
	}
	r, ok := e.good.Ranks[AllRanks]
	if !ok {
		return EngineRank{}, false
	}
	if rankCount > 1 {
		r.Waiting /= float64(rankCount)
		r.Running /= float64(rankCount)
	}
	return r, true
}

// view is GET /workers' engine_metrics of one worker; nil when the worker
// was never scraped.
func (t *engineTable) view(rec *catalog.Record, now time.Time, cfg *EngineConfig) *catalog.EngineMetricsView {
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
		v.Waiting += r.Waiting
		v.Running += r.Running
		if r.HasKVUsage && (v.KVUsage == nil || r.KVUsage > *v.KVUsage) {
			u := r.KVUsage
			v.KVUsage = &u
		}
		sat := cfg.saturated(r)
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
			continue
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
	if v.Stale {
		v.Saturated = false
	}
	return v
}

func appendNew(dst, src []string) []string {
	for _, s := range src {
		if !slices.Contains(dst, s) {
			dst = append(dst, s)
		}
	}
	return dst
}

// saturated applies the saturation thresholds to one rank's figures.
func (c *EngineConfig) saturated(r EngineRank) bool {
	return c.queueSaturated(r) || c.kvFull(r)
}

// queueSaturated: the rank's waiting queue is at the threshold.
func (c *EngineConfig) queueSaturated(r EngineRank) bool {
	return c.QueueDepthThreshold >= 0 && r.Waiting >= float64(c.QueueDepthThreshold) && r.Waiting > 0
}

// kvFull: the rank's KV usage is at the threshold.
func (c *EngineConfig) kvFull(r EngineRank) bool {
	return c.KVCacheUtilThreshold >= 0 && r.HasKVUsage && r.KVUsage >= c.KVCacheUtilThreshold
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

// EngineStats counts the scraped workers whose figures are fresh and those
// whose last good scrape is stale or missing (selection then relies on its
// bookings alone for them).
func (s *Service) EngineStats() (fresh, stale int) {
	now := s.clock()
	t := &s.engines
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, e := range t.by {
		if e.hasGood && now.Sub(e.good.At) <= s.engineCfg.StaleAfter {
			fresh++
		} else {
			stale++
		}
	}
	return fresh, stale
}
