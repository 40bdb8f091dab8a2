// Package scale measures how kvselect's cost grows with the fleet, in one
// process: real selection.Services fed through the real ingest path, and
// real replica meshes on loopback.
//
//   - The selection curve: fleets of 64 to 16,384 engine ranks, each rank's
//     simulated engine filling an LRU prefix cache with inference-perf
//     shared_prefix traffic (a system prompt per group of ranks, plus one hot
//     system prompt every rank serves now and then) and publishing what it
//     stores and evicts as vLLM's block pool does. Every batch is encoded by
//     mockworker/kvpublish (vLLM's msgspec bytes) and goes through the
//     decoder and index calls engines/kvlisten's writer lanes make. Then
//     SelectAndReserve is timed on one core (GOMAXPROCS=1): p50/p99 latency,
//     CPU per request, and the heap per rank and per indexed block.
//   - Ingest: the same engines go on serving at a stated request rate for a
//     few seconds; their batches (one per engine step) are decoded and
//     applied on one core, which gives the CPU per engine and the event rate
//     at which one core saturates.
//   - Replicas: 1 to 8 selection.Services, each with its replicas/mesh
//     (ZMQ PUB/SUB over loopback, every replica subscribed to every other),
//     take an even share of a fleet request rate; the meshes' message
//     counters and the process's CPU give messages per second and cores per
//     replica.
//
// What is not in process: the ZMQ sockets between engines and kvselect (the
// engines/kvlisten benchmarks measure them), the fronts (ext_proc, REST)
// and real engines. docs/scale.md has the method and the figures.
package scale

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"slices"
	"time"
)

// Config is one run of the three curves.
type Config struct {
	// Ranks are the fleet sizes of the selection curve.
	Ranks []int
	// RanksPerWorker is data_parallel_size of every worker (ranks are
	// registered as workers of this many ranks each, the catalog's unit).
	RanksPerWorker int
	// RanksPerGroup is how many ranks share one system prompt group.
	RanksPerGroup int
	BlockSize     int
	// CacheBlocks is each rank's prefix cache, in blocks.
	CacheBlocks int
	// The workload: system prompt and question lengths, questions per
	// group, output tokens, and the share of requests on the hot prompt.
	SystemTokens, QuestionTokens, QuestionsPerGroup, OutputTokens int
	HotShare                                                      float64
	// Requests are timed per fleet size, after Warmup; InFlight bookings
	// stay open while they run.
	Requests, Warmup, InFlight int

	// IngestEngines are the fleet sizes of the ingest runs, each engine
	// serving RequestRate requests per second for IngestSeconds, stepping
	// every StepInterval.
	IngestEngines []int
	RequestRate   float64
	IngestSeconds float64
	StepInterval  time.Duration

	// Replicas and FleetRates span the replica runs, ReplicaDuration each,
	// over fleets of ReplicaRanks ranks.
	Replicas        []int
	FleetRates      []float64
	ReplicaDuration time.Duration
	ReplicaRanks    int

	// Parts selects "selection", "ingest" and "replicas".
	Parts []string
	Seed  uint64
}

// Defaults is the full run (make scale).
func Defaults() Config {
	return Config{
		Ranks: []int{64, 256, 1024, 4096, 16384}, RanksPerWorker: 8, RanksPerGroup: 8, BlockSize: 16, CacheBlocks: 1024,
		SystemTokens: 1024, QuestionTokens: 1024, QuestionsPerGroup: 16, OutputTokens: 256, HotShare: 0.2,
		Requests: 2000, Warmup: 200, InFlight: 256,
		IngestEngines: []int{64, 256, 1024}, RequestRate: 10, IngestSeconds: 2, StepInterval: 25 * time.Millisecond,
		Replicas: []int{1, 2, 4, 8}, FleetRates: []float64{1000, 2000, 5000, 10000, 20000}, ReplicaDuration: 2 * time.Second,
		ReplicaRanks: 64,
		Parts:        []string{"selection", "ingest", "replicas"}, Seed: 1,
	}
}

// validate refuses settings the runs cannot use.
func (c Config) validate() error {
	for _, p := range c.Parts {
		if !slices.Contains([]string{"selection", "ingest", "replicas"}, p) {
			return fmt.Errorf("unknown part %q (want selection, ingest, replicas)", p)
		}
	}
	pos := func(name string, v int) error {
		if v <= 0 {
			return fmt.Errorf("%s must be positive, got %d", name, v)
		}
		return nil
	}
	for _, e := range []error{pos("ranks per worker", c.RanksPerWorker), pos("ranks per group", c.RanksPerGroup),
		pos("block size", c.BlockSize), pos("cache blocks", c.CacheBlocks), pos("requests", c.Requests),
		pos("in-flight bookings", c.InFlight), pos("replica ranks", c.ReplicaRanks), pos("questions per group", c.QuestionsPerGroup)} {
		if e != nil {
			return e
		}
	}
	if c.SystemTokens%c.BlockSize != 0 || c.QuestionTokens%c.BlockSize != 0 || c.SystemTokens <= 0 || c.QuestionTokens <= 0 {
		return fmt.Errorf("system and question tokens must be positive multiples of the block size %d", c.BlockSize)
	}
	if (c.SystemTokens+c.QuestionTokens)/c.BlockSize+c.OutputTokens/c.BlockSize > c.CacheBlocks {
		return fmt.Errorf("cache of %d blocks cannot hold one request", c.CacheBlocks)
	}
	for _, r := range slices.Concat(c.Ranks, c.IngestEngines, c.Replicas) {
		if r <= 0 {
			return fmt.Errorf("fleet sizes and replica counts must be positive, got %d", r)
		}
	}
	if c.HotShare < 0 || c.HotShare > 1 || !(c.RequestRate > 0) || !(c.IngestSeconds > 0) || c.StepInterval <= 0 || c.ReplicaDuration <= 0 {
		return fmt.Errorf("hot share in [0, 1], positive request rate, ingest seconds, step interval and replica duration, got %+v", c)
	}
	for _, r := range c.FleetRates {
		if !(r > 0) {
			return fmt.Errorf("fleet rates must be positive, got %v", r)
		}
	}
	return nil
}

// Report is a run's results.
type Report struct {
	Config     Config           `json:"config"`
	GoMaxProcs int              `json:"gomaxprocs"` // the replica runs'
	Selection  []SelectionPoint `json:"selection"`
	Ingest     []IngestPoint    `json:"ingest"`
	Replicas   []ReplicaPoint   `json:"replicas"`
}

// Run runs the selected parts, naming each step on progress.
func Run(ctx context.Context, c Config, progress io.Writer) (*Report, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	rep := &Report{Config: c, GoMaxProcs: runtime.GOMAXPROCS(0)}
	if slices.Contains(c.Parts, "selection") {
		for _, n := range c.Ranks {
			fmt.Fprintf(progress, "selection: %d ranks...\n", n)
			pt, err := selectionPoint(ctx, c, n)
			if err != nil {
				return rep, fmt.Errorf("selection at %d ranks: %w", n, err)
			}
			rep.Selection = append(rep.Selection, pt)
			if err := ctx.Err(); err != nil {
				return rep, err
			}
		}
	}
	if slices.Contains(c.Parts, "ingest") {
		for _, n := range c.IngestEngines {
			fmt.Fprintf(progress, "ingest: %d engines at %g requests/s...\n", n, c.RequestRate)
			pt, err := ingestPoint(ctx, c, n)
			if err != nil {
				return rep, fmt.Errorf("ingest at %d engines: %w", n, err)
			}
			rep.Ingest = append(rep.Ingest, pt)
			if err := ctx.Err(); err != nil {
				return rep, err
			}
		}
	}
	if slices.Contains(c.Parts, "replicas") {
		if err := runReplicas(ctx, c, rep, progress); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// runReplicas runs every replica count over the fleet rates, a count's
// higher rates skipped once one has not kept up; then splits each run's CPU
// into selection (one replica's CPU per request at that rate) and mesh.
func runReplicas(ctx context.Context, c Config, rep *Report, progress io.Writer) error {
	prompts := hashedPrompts(c, 256)
	for _, n := range c.Replicas {
		fmt.Fprintf(progress, "replicas: %d...\n", n)
		rs, err := newReplicaSet(ctx, c, n)
		if err != nil {
			return fmt.Errorf("%d replicas: %w", n, err)
		}
		for i, rate := range c.FleetRates {
			pt, err := rs.point(ctx, prompts, rate, c.ReplicaDuration, i)
			if err != nil {
				rs.close()
				return fmt.Errorf("%d replicas at %g requests/s: %w", n, rate, err)
			}
			fmt.Fprintf(progress, "  %g requests/s: %.0f served/s, %.2f cores per replica\n", rate, pt.Achieved, pt.CoresPerReplica)
			rep.Replicas = append(rep.Replicas, pt)
			if !pt.KeptUp {
				break
			}
		}
		rs.close()
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	// One replica's CPU per request at each rate: its selections cost the
	// same with peers, the rest is the mesh.
	alone := map[float64]float64{}
	for _, pt := range rep.Replicas {
		if pt.Replicas == 1 && pt.Served > 0 {
			alone[pt.Offered] = pt.CPU.Seconds() / float64(pt.Served)
		}
	}
	for i := range rep.Replicas {
		pt := &rep.Replicas[i]
		per, ok := alone[pt.Offered]
		if !ok || pt.Replicas == 1 {
			continue
		}
		mesh := max(0, pt.CPU.Seconds()-per*float64(pt.Served))
		pt.MeshCoresPerReplica = mesh / pt.Duration.Seconds() / float64(pt.Replicas)
		if pt.Received > 0 {
			pt.MeshMicrosPerReceived = mesh / float64(pt.Received) * 1e6
		}
	}
	return nil
}
