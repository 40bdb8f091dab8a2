package selection

import (
	"time"

	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/engine"
	"github.com/kvselect/kvselect/selection/latency"
)

// EngineConfig configures how engine metrics (ReportEngineMetrics) and
// health outcomes (ReportOutcome) enter selection; package engine describes
// what selection makes of the figures.
type EngineConfig = engine.Config

// The engine cost terms' defaults. They were chosen with kvbench route's
// bypass scenario (docs/benchmarks.md, "Engine metrics").
const (
	DefaultEngineRequestWeight  = engine.DefaultRequestWeight
	DefaultEngineKVUsageWeight  = engine.DefaultKVUsageWeight
	DefaultEngineLoRAMissWeight = engine.DefaultLoRAMissWeight
)

// DefaultEngineConfig returns the documented defaults.
func DefaultEngineConfig() EngineConfig { return engine.DefaultConfig() }

// EngineSnapshot is one scrape of a worker's engine.
type EngineSnapshot = engine.Snapshot

// AllRanks keys the figures of an engine that does not label its ranks.
const AllRanks = engine.AllRanks

// EngineRank is one rank's figures.
type EngineRank = engine.Rank

// EngineHistogram is a cumulative latency histogram's count and sum.
type EngineHistogram = engine.Histogram

// LoRAState is the adapters an engine has loaded (vLLM's
// vllm:lora_requests_info).
type LoRAState = engine.LoRAState

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
func (s *Service) EngineTargets() []EngineTarget { return s.cat.engineTargets() }

// ReportEngineMetrics records one scrape of a worker's engine. A report for a
// worker the catalog does not hold is dropped (the worker may have left while
// it was scraped); the answer says whether it was kept. Partitions whose
// queue waits for a rank to stop being saturated are woken, and bookings
// kept to an estimated end that the engine's counts show finished are
// freed (endByEngineCounts).
func (s *Service) ReportEngineMetrics(workerID uint64, snap EngineSnapshot) bool {
	rec, ok := s.cat.record(workerID)
	if !ok {
		return false
	}
	intervals := s.engines.Put(workerID, snap)
	if p := s.parts.Get(partitionOfRecord(rec)); p != nil {
		p.Wake()
	}
	s.engineLatency(rec, snap.At, intervals)
	s.endByEngineCounts(rec, snap)
	return true
}

// engineLatency hands the latency model what each rank's histograms gained
// (selection/latency's engine.go). An engine that does not label its ranks
// speaks for the worker: its figures are a rank's only when the worker has
// one, since the first tokens of several ranks cannot be told apart.
func (s *Service) engineLatency(rec *catalog.Record, at time.Time, intervals []engine.Interval) {
	ranks := rec.Ranks()
	for _, iv := range intervals {
		rank := iv.Rank
		if rank == AllRanks {
			if len(ranks) != 1 {
				continue
			}
			rank = ranks[0]
		}
		k := latency.Key{Model: rec.ModelName, Worker: rec.WorkerID, Rank: rank}
		out := s.latency.ObserveEngine(k, latency.EngineInterval{FirstTokens: iv.TTFT.Count, TTFTSum: iv.TTFT.Sum,
			Gaps: iv.ITL.Count, ITLSum: iv.ITL.Sum, Running: iv.Running, At: at})
		if out.Attributed || out.Unattributed || out.FittedITL {
			s.onLatency(LatencyEvent{Kind: LatencyEngine, Model: rec.ModelName, PredictedTTFT: out.PredictedTTFT,
				ObservedTTFT: out.EngineTTFT, Engine: out})
		}
	}
}
