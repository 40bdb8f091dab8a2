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
	"container/heap"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvselect/kvselect/bench/mooncake"
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
}

// DefaultConfig is the configuration the documented figures use.
func DefaultConfig() Config {
	return Config{Workers: 8, Capacity: 16384, Speedup: 1, PrefillPerToken: 50 * time.Microsecond,
		DecodePerToken: 20 * time.Millisecond, DecodeInterference: 0.005, Seed: 1}
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
	assigned    int
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
	kind   int // firstToken or done
	req    *Request
	worker int
	tok    int
	seq    int // insertion order, for a stable heap
}

const (
	firstToken = iota
	done
)

type eventHeap []event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// NewWorld builds the fleet for cfg.
func NewWorld(cfg Config) (*World, error) {
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
func Run(ctx context.Context, w *World, trace []mooncake.Request, p Policy, progress func(done, total int)) (Result, error) {
	cfg := w.cfg
	if cfg.Requests > 0 && cfg.Requests < len(trace) {
		trace = trace[:cfg.Requests]
	}
	res := Result{Policy: p.Name(), Workers: cfg.Workers, Capacity: cfg.Capacity, Requests: len(trace)}
	if len(trace) == 0 {
		return res, errors.New("routesim: empty trace")
	}
	var (
		pending  eventHeap
		seq      int
		ttfts    = make([]time.Duration, 0, len(trace))
		selects  = make([]time.Duration, 0, len(trace))
		hit, all int
		last     time.Duration
	)
	push := func(e event) {
		e.seq = seq
		seq++
		heap.Push(&pending, e)
	}
	drain := func(until time.Duration) {
		for pending.Len() > 0 && pending[0].at <= until {
			e := heap.Pop(&pending).(event)
			w.now = e.at
			ws := &w.workers[e.worker]
			switch e.kind {
			case firstToken:
				ws.queuedTok -= e.tok
				ws.decodeCtx += e.req.Trace.InputLength
				p.FirstToken(ctx, e.req)
			case done:
				ws.active--
				ws.decodeCtx -= e.req.Trace.InputLength
				p.Done(ctx, e.req)
				last = max(last, e.at)
			}
		}
	}
	t0 := trace[0].Timestamp
	for i := range trace {
		if i%256 == 0 {
			if err := ctx.Err(); err != nil {
				return res, err
			}
			if progress != nil {
				progress(i, len(trace))
			}
		}
		tr := trace[i]
		arrival := time.Duration(float64(time.Duration(tr.Timestamp-t0)*time.Millisecond) / cfg.Speedup)
		drain(arrival)
		w.now = arrival
		r := &Request{ID: fmt.Sprintf("r%d", i), Seq: i, Arrival: arrival, Trace: tr, Locals: mooncake.LocalHashes(tr.HashIDs)}
		start := time.Now()
		wi, err := p.Pick(ctx, r)
		selects = append(selects, time.Since(start))
		if err != nil {
			return res, fmt.Errorf("routesim: %s: request %d: %w", p.Name(), i, err)
		}
		if wi < 0 || wi >= cfg.Workers {
			return res, fmt.Errorf("routesim: %s picked worker %d of %d", p.Name(), wi, cfg.Workers)
		}
		cached := w.CachedPrefix(wi, tr.HashIDs)
		events := w.engines[wi].Process(tr.HashIDs)
		p.Admitted(ctx, r, wi, events)
		hit += cached
		all += len(tr.HashIDs)

		uncached := max(tr.InputLength-cached*TraceBlockTokens, 1)
		ws := &w.workers[wi]
		begin := max(arrival, ws.prefillFree)
		slow := 1 + cfg.DecodeInterference*float64(ws.decodeCtx)/1000
		ft := begin + time.Duration(float64(time.Duration(uncached)*cfg.PrefillPerToken)*slow)
		ws.prefillFree = ft
		ws.active++
		ws.queuedTok += uncached
		ws.assigned++
		ttfts = append(ttfts, ft-arrival)
		push(event{at: ft, kind: firstToken, req: r, worker: wi, tok: uncached})
		push(event{at: ft + time.Duration(max(tr.OutputLength-1, 0))*cfg.DecodePerToken, kind: done, req: r, worker: wi})
	}
	drain(1<<62 - 1)
	if progress != nil {
		progress(len(trace), len(trace))
	}
	res.HitRate = float64(hit) / float64(max(all, 1))
	slices.Sort(ttfts)
	slices.Sort(selects)
	res.TTFTP50Ms = ms(quantile(ttfts, 0.50))
	res.TTFTP90Ms = ms(quantile(ttfts, 0.90))
	res.TTFTP99Ms = ms(quantile(ttfts, 0.99))
	res.SelectP50Us = us(quantile(selects, 0.50))
	res.SelectP99Us = us(quantile(selects, 0.99))
	if last > 0 {
		res.Throughput = float64(len(trace)) / last.Seconds()
	}
	for _, ws := range w.workers {
		res.MaxShare = max(res.MaxShare, float64(ws.assigned)/float64(len(trace)))
	}
	return res, nil
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(int(q*float64(len(sorted))), len(sorted)-1)]
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
