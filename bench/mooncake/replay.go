package mooncake

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/kvselect/kvselect/bench/stats"
)

// Target is an index under benchmark. Worker ids are 0..Workers-1. The
// driver calls it from one goroutine.
type Target interface {
	// Name identifies the target in results.
	Name() string
	// Store applies a Stored event of worker.
	Store(worker int, parent uint64, hasParent bool, blocks []Block)
	// Remove applies a Removed event of worker.
	Remove(worker int, exts []uint64)
	// Match looks up a request's local block hashes and returns the number
	// of workers whose cached prefix overlaps it (overlap > 0).
	Match(locals []uint64) int
}

// Apply applies one event of worker to t.
func Apply(t Target, worker int, ev Event) {
	switch ev := ev.(type) {
	case Stored:
		t.Store(worker, ev.Parent, ev.HasParent, ev.Blocks)
	case Removed:
		t.Remove(worker, ev.Exts)
	default:
		panic(fmt.Sprintf("mooncake: unknown event %T", ev))
	}
}

// Assign is a policy assigning trace requests to workers.
//
// There is no KV-aware policy: it would need each worker's overlap, which
// Target.Match does not return, and it would make the event stream depend
// on the target under test.
type Assign int

const (
	// AssignRoundRobin sends request i to worker i mod Workers.
	AssignRoundRobin Assign = iota
	// AssignPrefixHash sends a request to the worker chosen by a hash of its
	// first Config.PrefixBlocks hash ids (session affinity). With one block
	// it degenerates on Mooncake's conversation trace, where every request
	// starts with block 0; the default of two keeps conversations together.
	AssignPrefixHash
	// AssignRandom sends each request to a uniformly random worker drawn
	// from a generator seeded with Config.Seed, as Dynamo's mooncake_bench
	// partitions its trace.
	AssignRandom
)

var assignNames = []string{"round-robin", "prefix-hash", "random"}

func (a Assign) String() string {
	if int(a) >= 0 && int(a) < len(assignNames) {
		return assignNames[a]
	}
	return fmt.Sprintf("Assign(%d)", int(a))
}

// ParseAssign parses a policy name as printed by Assign.String.
func ParseAssign(s string) (Assign, error) {
	if i := slices.Index(assignNames, s); i >= 0 {
		return Assign(i), nil
	}
	return 0, fmt.Errorf("mooncake: unknown assign policy %q (want one of %s)", s, strings.Join(assignNames, ", "))
}

// Config parameterizes a replay. Zero fields take the defaults noted.
type Config struct {
	Workers          int    // synthetic workers; default 64
	BlocksPerWorker  int    // engine block pool per worker; default 16384
	Assign           Assign // request placement; default round-robin
	PrefixBlocks     int    // ids hashed by AssignPrefixHash; default 2
	Seed             uint64 // seed of AssignRandom
	TraceDuplication int    // copies of the trace with disjoint ids; default 1
	MaxRequests      int    // cap on requests after duplication; 0 = all
	// BatchRemovals reports all blocks evicted for one request in a single
	// Removed event instead of one event per block (vLLM's granularity).
	BatchRemovals bool
}

// WithDefaults returns c with zero or negative fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Workers <= 0 {
		c.Workers = 64
	}
	if c.BlocksPerWorker <= 0 {
		c.BlocksPerWorker = 16384
	}
	if c.PrefixBlocks <= 0 {
		c.PrefixBlocks = 2
	}
	if c.TraceDuplication <= 0 {
		c.TraceDuplication = 1
	}
	if c.MaxRequests < 0 {
		c.MaxRequests = 0
	}
	return c
}

// step is one request of a prepared workload.
type step struct {
	worker int
	locals []uint64
	events []Event
}

// Workload is a trace with its engine events pre-generated, ready to be
// replayed against any number of targets.
type Workload struct {
	cfg     Config
	steps   []step
	engines []*Engine
	// counters independent of the target
	lookupBlocks, storeEvents, removeEvents, storedBlocks, removedBlocks int
}

// Prepare assigns the requests to workers and runs every worker's engine
// over its requests in trace order, recording the events. reqs is not
// modified.
func Prepare(cfg Config, reqs []Request) *Workload {
	cfg = cfg.WithDefaults()
	reqs = Duplicate(reqs, cfg.TraceDuplication)
	if cfg.MaxRequests > 0 && len(reqs) > cfg.MaxRequests {
		reqs = reqs[:cfg.MaxRequests]
	}
	w := &Workload{cfg: cfg, steps: make([]step, len(reqs)), engines: make([]*Engine, cfg.Workers)}
	for i := range w.engines {
		w.engines[i] = NewEngine(i, cfg.BlocksPerWorker, cfg.BatchRemovals)
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6d6f6f6e63616b65))
	for i, r := range reqs {
		var wk int
		switch cfg.Assign {
		case AssignPrefixHash:
			wk = prefixWorker(r.HashIDs, cfg.PrefixBlocks, cfg.Workers)
		case AssignRandom:
			wk = rng.IntN(cfg.Workers)
		default:
			wk = i % cfg.Workers
		}
		evs := w.engines[wk].Process(r.HashIDs)
		w.steps[i] = step{worker: wk, locals: LocalHashes(r.HashIDs), events: evs}
		w.lookupBlocks += len(r.HashIDs)
		for _, ev := range evs {
			switch ev := ev.(type) {
			case Stored:
				w.storeEvents++
				w.storedBlocks += len(ev.Blocks)
			case Removed:
				w.removeEvents++
				w.removedBlocks += len(ev.Exts)
			}
		}
	}
	return w
}

func prefixWorker(ids []uint64, k, workers int) int {
	h := uint64(workerSalt)
	for _, id := range ids[:min(k, len(ids))] {
		h = Mix64(h ^ LocalHash(id))
	}
	return int(h % uint64(workers))
}

// Config returns the configuration the workload was prepared with, defaults
// applied.
func (w *Workload) Config() Config { return w.cfg }

// Len returns the number of requests.
func (w *Workload) Len() int { return len(w.steps) }

// Engines returns the worker engines in their final state, after all
// requests; they must not be modified.
func (w *Workload) Engines() []*Engine { return w.engines }

// Request returns the worker, local hashes and events of request i.
func (w *Workload) Request(i int) (worker int, locals []uint64, events []Event) {
	s := w.steps[i]
	return s.worker, s.locals, s.events
}

// Result summarizes one replay.
type Result struct {
	Target string
	Config Config

	Requests      int // requests replayed
	Lookups       int // Match calls, one per request
	LookupBlocks  int // local hashes passed to Match
	StoreEvents   int
	RemoveEvents  int
	StoredBlocks  int
	RemovedBlocks int
	BlockEvents   int // StoredBlocks + RemovedBlocks

	Wall      time.Duration // the whole timed loop, timer overhead included
	MatchTime time.Duration // sum of the individually timed Match calls
	EventTime time.Duration // sum of the per-request event batches

	// OpsPerSec counts, as Dynamo does, one op per lookup and one per event:
	// (Lookups + StoreEvents + RemoveEvents) / Wall.
	OpsPerSec float64
	// BlockOpsPerSec is (LookupBlocks + StoredBlocks + RemovedBlocks) / Wall.
	// (Dynamo's block throughput leaves removed blocks out.)
	BlockOpsPerSec float64

	// Match latency percentiles (nearest rank) and maximum, in nanoseconds.
	LookupP50, LookupP90, LookupP99, LookupMax int64
	// EventNsPerBlock is EventTime / BlockEvents.
	EventNsPerBlock float64

	// MatchSum is the sum of Match results and MatchDigest an FNV-1a style
	// hash of their sequence (one 64-bit word per result): targets that
	// agree give equal values.
	MatchSum    int64
	MatchDigest uint64
}

// Replay prepares the workload (untimed) and replays it against t.
func Replay(cfg Config, reqs []Request, t Target) Result {
	return Prepare(cfg, reqs).Run(t)
}

// Run replays the workload against t, which should be empty: for each
// request in trace order it times one Match of the request's local hashes,
// then applies the request's events.
func (w *Workload) Run(t Target) Result {
	lat := make([]int64, len(w.steps))
	var matchSum int64
	var evTime time.Duration
	digest := uint64(fnvOffset)

	start := time.Now()
	for i := range w.steps {
		s := &w.steps[i]
		t0 := time.Now()
		m := t.Match(s.locals)
		t1 := time.Now()
		lat[i] = int64(t1.Sub(t0))
		if len(s.events) > 0 {
			for _, ev := range s.events {
				switch ev := ev.(type) {
				case Stored:
					t.Store(s.worker, ev.Parent, ev.HasParent, ev.Blocks)
				case Removed:
					t.Remove(s.worker, ev.Exts)
				}
			}
			evTime += time.Since(t1)
		}
		matchSum += int64(m)
		digest = (digest ^ uint64(m)) * fnvPrime
	}
	wall := time.Since(start)

	r := Result{
		Target:        t.Name(),
		Config:        w.cfg,
		Requests:      len(w.steps),
		Lookups:       len(w.steps),
		LookupBlocks:  w.lookupBlocks,
		StoreEvents:   w.storeEvents,
		RemoveEvents:  w.removeEvents,
		StoredBlocks:  w.storedBlocks,
		RemovedBlocks: w.removedBlocks,
		BlockEvents:   w.storedBlocks + w.removedBlocks,
		Wall:          wall,
		EventTime:     evTime,
		MatchSum:      matchSum,
		MatchDigest:   digest,
	}
	for _, l := range lat {
		r.MatchTime += time.Duration(l)
	}
	if secs := wall.Seconds(); secs > 0 {
		r.OpsPerSec = float64(r.Lookups+r.StoreEvents+r.RemoveEvents) / secs
		r.BlockOpsPerSec = float64(r.LookupBlocks+r.BlockEvents) / secs
	}
	if r.BlockEvents > 0 {
		r.EventNsPerBlock = float64(evTime.Nanoseconds()) / float64(r.BlockEvents)
	}
	slices.Sort(lat)
	r.LookupP50 = stats.SortedQuantile(lat, 0.50)
	r.LookupP90 = stats.SortedQuantile(lat, 0.90)
	r.LookupP99 = stats.SortedQuantile(lat, 0.99)
	if n := len(lat); n > 0 {
		r.LookupMax = lat[n-1]
	}
	return r
}

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// String formats the result as a short multi-line report.
func (r Result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d requests on %d workers x %d blocks (%s, dup %d)\n",
		r.Target, r.Requests, r.Config.Workers, r.Config.BlocksPerWorker, r.Config.Assign, r.Config.TraceDuplication)
	fmt.Fprintf(&b, "  events: %d stored (%d blocks), %d removed (%d blocks); lookup blocks %d\n",
		r.StoreEvents, r.StoredBlocks, r.RemoveEvents, r.RemovedBlocks, r.LookupBlocks)
	fmt.Fprintf(&b, "  wall %v: %.0f ops/s, %.0f block-ops/s\n", r.Wall.Round(time.Microsecond), r.OpsPerSec, r.BlockOpsPerSec)
	fmt.Fprintf(&b, "  match ns: p50 %d p90 %d p99 %d max %d; events %.1f ns/block\n",
		r.LookupP50, r.LookupP90, r.LookupP99, r.LookupMax, r.EventNsPerBlock)
	fmt.Fprintf(&b, "  match sum %d digest %016x", r.MatchSum, r.MatchDigest)
	return b.String()
}
