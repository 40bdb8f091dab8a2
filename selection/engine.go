package selection

import (
	"github.com/kvselect/kvselect/selection/engine"
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
// queue waits for a rank to stop being saturated are woken.
func (s *Service) ReportEngineMetrics(workerID uint64, snap EngineSnapshot) bool {
	rec, ok := s.cat.record(workerID)
	if !ok {
		return false
	}
	s.engines.Put(workerID, snap)
	if p := s.parts.Get(partitionOfRecord(rec)); p != nil {
		p.Wake()
	}
	return true
}
