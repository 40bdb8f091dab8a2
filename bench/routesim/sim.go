// Package routesim compares selection policies on a Mooncake trace with a
// discrete-event simulation: N simulated workers, each a fixed LRU pool of
// trace blocks (bench/mooncake's engine) and a serial prefill queue, fed by a
// policy that picks a worker for every request.
//
// Every policy is one of kvselect's own, registered in selection/scheduler
// (kv-cost, round-robin, random, least-loaded, longest-prefix, and any other
// a program registers), run exactly as the server runs it: an in-process
// selection.Service on the simulation's virtual clock, its index fed with
// the engines' KV events, its active loads booked, prefill-completed and
// freed at the simulated times. One more row, kv-cost-approx, is kv-cost
// without KV events (ApproxPolicy). So the load-aware policies see the loads
// kvselect booked, not the simulator's true queues, and the cache-aware ones
// see the engines' exact caches.
//
// The timing model is deliberately simple and documented in docs/benchmarks.md:
// a worker prefills one request at a time, FIFO, at PrefillPerToken for every
// prompt token not already cached; the first token follows the prefill
// (TTFT = queueing + prefill); decoding takes DecodePerToken per output token
// and runs beside later prefills. Cache state changes when a request is
// admitted, as if its blocks were pinned at once.
package routesim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/kvselect/kvselect/bench/eventq"
	"github.com/kvselect/kvselect/bench/mooncake"
	"github.com/kvselect/kvselect/bench/stats"
	"github.com/kvselect/kvselect/selection"
)

// TraceBlockTokens is how many tokens one Mooncake hash id stands for.
const TraceBlockTokens = 512

// Config is one simulation.
type Config struct {
	Workers  int // simulated workers (8)
	Capacity int // KV pool per worker, in trace blocks (16,384)
	// Speedup divides the trace's inter-arrival times: 2 replays it twice as
	// fast, doubling the offered load.
	Speedup float64
	// PrefillPerToken is the prefill cost of one uncached prompt token.
	PrefillPerToken time.Duration
	// DecodePerToken is the time per output token once the first is out.
	DecodePerToken time.Duration
	// DecodeInterference slows a prefill by this fraction for every 1,000
	// context tokens the worker is decoding when the prefill starts:
	// continuous batching shares every step between the decode batch, whose
	// attention cost grows with its context, and the prefill chunk.
	DecodeInterference float64
	// Requests limits the trace to its first n requests (0: all).
	Requests int
	Seed     uint64 // seeds the services' random and tie-breaking choices

	// Bypass is the fraction of requests (0..1) that skip kvselect and go
	// straight to one of the first BypassWorkers workers (uniformly, seeded):
	// direct traffic, a second gateway. They fill the engines' queues and
	// caches (and their KV events reach the index, as a real engine publishes
	// whatever it serves) but kvselect never books them.
	Bypass float64 `json:"bypass,omitempty"`
	// BypassWorkers is how many workers the bypass traffic lands on (0: 2,
	// at most Workers).
	BypassWorkers int `json:"bypass_workers,omitempty"`
	// EngineMetrics reports every engine's true waiting and running counts
	// and KV usage to the service (ReportEngineMetrics) every ScrapeInterval
	// of virtual time, so that the service's view lags the engines as a
	// Prometheus scrape's would.
	EngineMetrics bool `json:"engine_metrics,omitempty"`
	// ScrapeInterval is the virtual time between two scrapes (0: 200 ms).
	ScrapeInterval time.Duration `json:"scrape_interval,omitempty"`
	// Engine configures the engine terms of the service's cost (weights,
	// saturation thresholds); nil uses selection.DefaultEngineConfig().
	Engine *selection.EngineConfig `json:"engine,omitempty"`
	// RetryAfter is the virtual delay before a request the service refused
	// as overloaded (429: every worker saturated or busy) is offered again
	// (0: 100 ms). A refused request keeps its original arrival time, so its
	// TTFT includes the wait.
	RetryAfter time.Duration `json:"retry_after,omitempty"`
}

// Defaults of the bypass and engine-metrics knobs.
const (
	DefaultBypassWorkers  = 2
	DefaultScrapeInterval = 200 * time.Millisecond
	DefaultRetryAfter     = 100 * time.Millisecond
)

// withDefaults fills the zero knobs that mean "default".
func (c Config) withDefaults() Config {
	if c.BypassWorkers == 0 {
		c.BypassWorkers = min(DefaultBypassWorkers, max(c.Workers, 1))
	}
	if c.ScrapeInterval == 0 {
		c.ScrapeInterval = DefaultScrapeInterval
	}
	if c.RetryAfter == 0 {
		c.RetryAfter = DefaultRetryAfter
	}
	return c
}

// DefaultConfig is the configuration the documented figures use.
func DefaultConfig() Config {
	return Config{Workers: 8, Capacity: 16384, Speedup: 1, PrefillPerToken: 50 * time.Microsecond,
		DecodePerToken: 20 * time.Millisecond, DecodeInterference: 0.005, Seed: 1,
		BypassWorkers: DefaultBypassWorkers, ScrapeInterval: DefaultScrapeInterval, RetryAfter: DefaultRetryAfter}
}

func (c Config) validate() error {
	switch {
	case c.Workers < 1:
		return errors.New("routesim: workers must be at least 1")
	case c.Capacity < 1:
		return errors.New("routesim: capacity must be at least 1 block")
	case !(c.Speedup > 0):
		return errors.New("routesim: speedup must be positive")
	case c.PrefillPerToken < 0 || c.DecodePerToken < 0:
		return errors.New("routesim: negative per-token time")
	case c.DecodeInterference < 0:
		return errors.New("routesim: negative decode interference")
	case !(c.Bypass >= 0 && c.Bypass <= 1):
		return fmt.Errorf("routesim: bypass is a fraction in [0, 1], not %g", c.Bypass)
	case c.BypassWorkers < 0 || c.BypassWorkers > c.Workers:
		return fmt.Errorf("routesim: bypass workers must be in [1, %d], not %d", c.Workers, c.BypassWorkers)
	case c.ScrapeInterval < 0 || c.RetryAfter < 0:
		return errors.New("routesim: negative scrape interval or retry delay")
	}
	return nil
}

// Result is one policy's outcome.
type Result struct {
	Policy   string `json:"policy"`
	Workers  int    `json:"workers"`
	Capacity int    `json:"capacity_blocks"`
	Requests int    `json:"requests"`
	// HitRate is the share of prompt blocks already cached on the chosen
	// worker when the request arrived.
	HitRate float64 `json:"block_hit_rate"`
	// TTFT of the simulated requests (queueing + prefill), in milliseconds.
	TTFTP50Ms float64 `json:"ttft_p50_ms"`
	TTFTP90Ms float64 `json:"ttft_p90_ms"`
	TTFTP99Ms float64 `json:"ttft_p99_ms"`
	// Throughput is completed requests per simulated second (first arrival to
	// last completion).
	Throughput float64 `json:"throughput_rps"`
	// MaxShare is the largest share of requests one worker received (1/Workers
	// is perfectly even).
	MaxShare float64 `json:"max_worker_share"`
	// Selection latency of the policy's pick, wall clock, in microseconds.
	SelectP50Us float64 `json:"select_p50_us"`
	SelectP99Us float64 `json:"select_p99_us"`

	// The bypass scenario. Requests, HitRate, the TTFT quantiles above and
	// MaxShare count only the requests kvselect routed; Bypassed is how many
	// went straight to a worker, and the All figures cover both.
	Bypass        float64 `json:"bypass"`
	BypassWorkers int     `json:"bypass_workers,omitempty"`
	Bypassed      int     `json:"bypassed"`
	EngineMetrics bool    `json:"engine_metrics"`
	RequestWeight float64 `json:"engine_request_weight,omitempty"`
	KVUsageWeight float64 `json:"engine_kv_usage_weight,omitempty"`
	AllTTFTP50Ms  float64 `json:"all_ttft_p50_ms"`
	AllTTFTP90Ms  float64 `json:"all_ttft_p90_ms"`
	AllTTFTP99Ms  float64 `json:"all_ttft_p99_ms"`
	// Refusals counts the picks the service refused as overloaded (every
	// worker saturated or busy: 429); RefusedRequests the requests that were
	// refused at least once. Each was offered again after RetryAfter.
	Refusals        int `json:"refusals"`
	RefusedRequests int `json:"refused_requests"`
	// Scrapes is the number of engine-metrics rounds reported.
	Scrapes int `json:"scrapes,omitempty"`
}

// EngineState is what a scrape of one simulated engine reads: requests
// queued and not yet prefilling, requests prefilling or decoding, and the
// share of the KV pool the active requests hold (vLLM's kv_cache_usage_perc
// counts the blocks of running requests, not the cached-and-free ones).
type EngineState struct {
	Waiting, Running int
	KVUsage          float64
}

// EngineMetricsSink is a Policy that takes engine metrics: Run hands it
// every engine's state each ScrapeInterval when Config.EngineMetrics is on.
type EngineMetricsSink interface {
	ReportEngine(worker int, st EngineState)
}

// Policy picks a worker for each request and follows its lifecycle. *Service,
// a registered selection policy in a selection.Service, is the one the
// comparison runs.
type Policy interface {
	Name() string
	// Pick chooses a worker for r at simulated time now.
	Pick(ctx context.Context, r *Request) (int, error)
	// Admitted tells the policy what the engine did on admission: the events it
	// published (stored and evicted blocks).
	Admitted(ctx context.Context, r *Request, worker int, events []mooncake.Event)
	// FirstToken and Done report the request's prefill end and completion.
	FirstToken(ctx context.Context, r *Request)
	Done(ctx context.Context, r *Request)
}

// Request is one trace request inside the simulation.
type Request struct {
	ID      string
	Seq     int
	Arrival time.Duration // simulated time since the start
	Trace   mooncake.Request
	Locals  []uint64 // content hashes of the trace blocks (mooncake.LocalHashes)
	// Bypass marks a request that went straight to a worker: the policy
	// never picked, booked or freed it.
	Bypass bool
}

// World is the simulated fleet: the engines' caches and the workers' queues,
// the ground truth the simulation measures against.
type World struct {
	cfg     Config
	engines []*mooncake.Engine
	workers []workerState
	now     time.Duration
}

type workerState struct {
	prefillFree time.Duration // when the prefill queue drains
	active      int           // admitted, not finished
	decodeCtx   int           // context tokens of requests past their first token
	queuedTok   int           // uncached prompt tokens admitted and not yet prefilled
	assigned    int           // requests the policy routed here
	waiting     int           // admitted, prefill not started
	running     int           // prefilling or decoding
	heldBlocks  int           // KV blocks of the admitted requests
}

// EngineState is worker i's engine as a scrape would read it now.
func (w *World) EngineState(i int) EngineState {
	ws := &w.workers[i]
	return EngineState{Waiting: ws.waiting, Running: ws.running,
		KVUsage: min(float64(ws.heldBlocks)/float64(w.engines[i].Capacity()), 1)}
}

// requestBlocks is how many KV blocks a request holds while it runs: its
// prompt's and its output's.
func requestBlocks(r *Request) int {
	return len(r.Trace.HashIDs) + (r.Trace.OutputLength+TraceBlockTokens-1)/TraceBlockTokens
}

// Now is the current simulated time.
func (w *World) Now() time.Duration { return w.now }

// Workers is the number of simulated workers.
func (w *World) Workers() int { return len(w.engines) }

// CachedPrefix is how many leading blocks of ids worker i holds right now.
func (w *World) CachedPrefix(i int, ids []uint64) int {
	exts := mooncake.ChainExts(i, ids)
	n := 0
	for _, e := range exts {
		if !w.engines[i].Cached(e) {
			break
		}
		n++
	}
	return n
}

// event is a timed lifecycle step.
type event struct {
	at     time.Duration
	kind   int // firstToken, done or prefillStart
	req    *Request
	worker int
	tok    int
}

const (
	firstToken = iota
	done
	prefillStart
)

// NewWorld builds the fleet for cfg.
func NewWorld(cfg Config) (*World, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	w := &World{cfg: cfg, engines: make([]*mooncake.Engine, cfg.Workers), workers: make([]workerState, cfg.Workers)}
	for i := range w.engines {
		w.engines[i] = mooncake.NewEngine(i, cfg.Capacity, true)
	}
	return w, nil
}

// Run replays trace through policy p over world w. progress, when set, is
// called every few hundred requests.
//
// With cfg.Bypass a seeded share of the requests goes straight to one of the
// first cfg.BypassWorkers engines; with cfg.EngineMetrics the engines' states
// reach p (an EngineMetricsSink) every cfg.ScrapeInterval. A pick the service
// refuses as overloaded is offered again cfg.RetryAfter later.
func Run(ctx context.Context, w *World, trace []mooncake.Request, p Policy, progress func(done, total int)) (Result, error) {
	cfg := w.cfg
	if cfg.Requests > 0 && cfg.Requests < len(trace) {
		trace = trace[:cfg.Requests]
	}
	rp := newReplay(ctx, w, p, len(trace))
	if len(trace) == 0 {
		return rp.res, errors.New("routesim: empty trace")
	}
	if cfg.EngineMetrics {
		if rp.sink == nil {
			return rp.res, fmt.Errorf("routesim: %s takes no engine metrics", p.Name())
		}
		ec := selection.DefaultEngineConfig()
		if cfg.Engine != nil {
			ec = *cfg.Engine
		}
		rp.res.RequestWeight, rp.res.KVUsageWeight = ec.RequestWeight, ec.KVUsageWeight
	}
	if err := rp.feed(trace, progress); err != nil {
		return rp.res, err
	}
	rp.drain(1<<62 - 1)
	if progress != nil {
		progress(len(trace), len(trace))
	}
	rp.summarize(len(trace))
	return rp.res, nil
}

// replay is one Run in progress: the world and the policy it drives, the
// lifecycle events still to happen and the figures gathered so far.
type replay struct {
	ctx  context.Context
	w    *World
	cfg  Config
	p    Policy
	sink EngineMetricsSink // p, when it takes engine metrics
	res  Result

	pending    eventq.Queue[event]
	retries    eventq.Queue[event] // refused requests, by the time they are offered again
	ttfts      []time.Duration     // of the requests kvselect routed
	allTTFTs   []time.Duration     // of every request, bypass included
	selects    []time.Duration     // wall-clock time of each Pick
	hit, all   int                 // cached and total prompt blocks of the routed requests
	last       time.Duration       // the last completion
	nextScrape time.Duration
	refused    map[int]bool // requests refused at least once, by Seq
	bypassRand *rand.Rand
}

func newReplay(ctx context.Context, w *World, p Policy, requests int) *replay {
	cfg := w.cfg
	rp := &replay{ctx: ctx, w: w, cfg: cfg, p: p,
		res: Result{Policy: p.Name(), Workers: cfg.Workers, Capacity: cfg.Capacity, Bypass: cfg.Bypass,
			EngineMetrics: cfg.EngineMetrics},
		ttfts:      make([]time.Duration, 0, requests),
		allTTFTs:   make([]time.Duration, 0, requests),
		selects:    make([]time.Duration, 0, requests),
		refused:    map[int]bool{},
		bypassRand: rand.New(rand.NewPCG(cfg.Seed, 0xb7a55)),
	}
	if cfg.Bypass > 0 {
		rp.res.BypassWorkers = cfg.BypassWorkers
	}
	rp.sink, _ = p.(EngineMetricsSink)
	return rp
}

// feed offers every trace request at its arrival time, and every refused one
// again when its retry is due, running the lifecycle events due before each.
func (rp *replay) feed(trace []mooncake.Request, progress func(done, total int)) error {
	t0 := trace[0].Timestamp
	for i := 0; i < len(trace) || rp.retries.Len() > 0; {
		if i%256 == 0 && i < len(trace) {
			if err := rp.ctx.Err(); err != nil {
				return err
			}
			if progress != nil {
				progress(i, len(trace))
			}
		}
		var arrival time.Duration
		if i < len(trace) {
			arrival = time.Duration(float64(time.Duration(trace[i].Timestamp-t0)*time.Millisecond) / rp.cfg.Speedup)
		}
		// A retry due no later than the next arrival goes first.
		if retryAt, ok := rp.retries.Next(); ok && (i == len(trace) || retryAt <= arrival) {
			e := rp.retries.Pop()
			rp.drain(e.at)
			rp.w.now = e.at
			if err := rp.route(e.req); err != nil {
				return err
			}
			continue
		}
		tr := trace[i]
		rp.drain(arrival)
		rp.w.now = arrival
		r := &Request{ID: fmt.Sprintf("r%d", i), Seq: i, Arrival: arrival, Trace: tr, Locals: mooncake.LocalHashes(tr.HashIDs)}
		i++
		if rp.cfg.Bypass > 0 && rp.bypassRand.Float64() < rp.cfg.Bypass {
			r.Bypass = true
			rp.admit(r, rp.bypassRand.IntN(rp.cfg.BypassWorkers))
			continue
		}
		if err := rp.route(r); err != nil {
			return err
		}
	}
	return nil
}

// schedule queues e at its time.
func schedule(q *eventq.Queue[event], e event) { q.Push(e.at, e) }

// scrape reports every engine's state to the policy.
func (rp *replay) scrape() {
	for i := range rp.w.workers {
		rp.sink.ReportEngine(i, rp.w.EngineState(i))
	}
	rp.res.Scrapes++
}

// drain applies every lifecycle event and scrape due by until.
func (rp *replay) drain(until time.Duration) {
	for rp.step(until) {
	}
}

// step applies the next lifecycle event or scrape due by until and says
// whether there was one. Scrapes stop once no event is pending, so the
// final drain ends.
func (rp *replay) step(until time.Duration) bool {
	next, queued := rp.pending.Next()
	evDue := queued && next <= until
	if rp.cfg.EngineMetrics && rp.nextScrape <= until && (!evDue || rp.nextScrape < next) &&
		(rp.pending.Len() > 0 || until < 1<<62-1) {
		rp.w.now = rp.nextScrape
		rp.scrape()
		rp.nextScrape += rp.cfg.ScrapeInterval
		return true
	}
	if !evDue {
		return false
	}
	e := rp.pending.Pop()
	rp.w.now = e.at
	ws := &rp.w.workers[e.worker]
	switch e.kind {
	case prefillStart:
		ws.waiting--
		ws.running++
	case firstToken:
		ws.queuedTok -= e.tok
		ws.decodeCtx += e.req.Trace.InputLength
		if !e.req.Bypass {
			rp.p.FirstToken(rp.ctx, e.req)
		}
	case done:
		ws.active--
		ws.running--
		ws.heldBlocks -= requestBlocks(e.req)
		ws.decodeCtx -= e.req.Trace.InputLength
		if !e.req.Bypass {
			rp.p.Done(rp.ctx, e.req)
		}
		rp.last = max(rp.last, e.at)
	}
	return true
}

// route offers r to the policy at the current time; a refusal as
// overloaded schedules a retry.
func (rp *replay) route(r *Request) error {
	start := time.Now()
	wi, err := rp.p.Pick(rp.ctx, r)
	rp.selects = append(rp.selects, time.Since(start))
	if err != nil {
		if selection.KindOf(err) == selection.KindOverloaded {
			rp.res.Refusals++
			rp.refused[r.Seq] = true
			schedule(&rp.retries, event{at: rp.w.now + rp.cfg.RetryAfter, req: r})
			return nil
		}
		return fmt.Errorf("routesim: %s: request %d: %w", rp.p.Name(), r.Seq, err)
	}
	if wi < 0 || wi >= rp.cfg.Workers {
		return fmt.Errorf("routesim: %s picked worker %d of %d", rp.p.Name(), wi, rp.cfg.Workers)
	}
	rp.admit(r, wi)
	return nil
}

// admit puts r on worker wi at the current time: cache, queue, events.
func (rp *replay) admit(r *Request, wi int) {
	w, cfg, tr := rp.w, rp.cfg, r.Trace
	now := w.now
	cached := w.CachedPrefix(wi, tr.HashIDs)
	events := w.engines[wi].Process(tr.HashIDs)
	rp.p.Admitted(rp.ctx, r, wi, events)
	uncached := max(tr.InputLength-cached*TraceBlockTokens, 1)
	ws := &w.workers[wi]
	begin := max(now, ws.prefillFree)
	slow := 1 + cfg.DecodeInterference*float64(ws.decodeCtx)/1000
	ft := begin + time.Duration(float64(time.Duration(uncached)*cfg.PrefillPerToken)*slow)
	ws.prefillFree = ft
	ws.active++
	ws.queuedTok += uncached
	ws.heldBlocks += requestBlocks(r)
	if begin > now {
		ws.waiting++
		schedule(&rp.pending, event{at: begin, kind: prefillStart, req: r, worker: wi})
	} else {
		ws.running++
	}
	rp.allTTFTs = append(rp.allTTFTs, ft-r.Arrival)
	if r.Bypass {
		rp.res.Bypassed++
	} else {
		ws.assigned++
		rp.hit += cached
		rp.all += len(tr.HashIDs)
		rp.ttfts = append(rp.ttfts, ft-r.Arrival)
	}
	schedule(&rp.pending, event{at: ft, kind: firstToken, req: r, worker: wi, tok: uncached})
	schedule(&rp.pending, event{at: ft + time.Duration(max(tr.OutputLength-1, 0))*cfg.DecodePerToken, kind: done, req: r, worker: wi})
}

// summarize turns the gathered figures of a replay of n trace requests into
// the result's rates and quantiles.
func (rp *replay) summarize(n int) {
	res := &rp.res
	res.Requests = len(rp.ttfts)
	res.RefusedRequests = len(rp.refused)
	res.HitRate = float64(rp.hit) / float64(max(rp.all, 1))
	slices.Sort(rp.ttfts)
	slices.Sort(rp.allTTFTs)
	slices.Sort(rp.selects)
	res.TTFTP50Ms = ms(stats.SortedQuantile(rp.ttfts, 0.50))
	res.TTFTP90Ms = ms(stats.SortedQuantile(rp.ttfts, 0.90))
	res.TTFTP99Ms = ms(stats.SortedQuantile(rp.ttfts, 0.99))
	res.AllTTFTP50Ms = ms(stats.SortedQuantile(rp.allTTFTs, 0.50))
	res.AllTTFTP90Ms = ms(stats.SortedQuantile(rp.allTTFTs, 0.90))
	res.AllTTFTP99Ms = ms(stats.SortedQuantile(rp.allTTFTs, 0.99))
	res.SelectP50Us = us(stats.SortedQuantile(rp.selects, 0.50))
	res.SelectP99Us = us(stats.SortedQuantile(rp.selects, 0.99))
	if rp.last > 0 {
		res.Throughput = float64(n) / rp.last.Seconds()
	}
	for _, ws := range rp.w.workers {
		res.MaxShare = max(res.MaxShare, float64(ws.assigned)/float64(max(len(rp.ttfts), 1)))
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// InfiniteCacheHitRate is the block hit rate of one cache that never evicts
// and sees every request: the ceiling any routing could reach.
func InfiniteCacheHitRate(trace []mooncake.Request) float64 {
	seen := map[uint64]struct{}{}
	hit, all := 0, 0
	for _, r := range trace {
		// Prefix semantics: a block counts as a hit while its whole prefix was
		// seen (trace hash ids are already prefix-chained per conversation).
		prefix := true
		for _, id := range r.HashIDs {
			_, ok := seen[id]
			if ok && prefix {
				hit++
			} else {
				prefix = false
			}
			seen[id] = struct{}{}
		}
		all += len(r.HashIDs)
	}
	return float64(hit) / float64(max(all, 1))
}
