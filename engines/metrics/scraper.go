// Package metrics reads what the inference engines say about themselves:
// it scrapes each schedulable worker's Prometheus endpoint (vLLM, SGLang or
// TensorRT-LLM names, per data-parallel rank where the engine labels ranks)
// and hands the figures to the selection core, and optionally probes each
// worker's /health for the core's health checks. The core decides what the
// figures mean (selection/engine, selection/health); this package only
// fetches, parses and refuses what it cannot trust.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvselect/kvselect/selection"
)

// Core is what the scraper and the prober need of the selection service;
// *selection.Service implements it.
type Core interface {
	EngineTargets() []selection.EngineTarget
	ReportEngineMetrics(workerID uint64, snap selection.EngineSnapshot) bool
	ReportOutcome(workerID uint64, o selection.Outcome) (selection.HealthTransition, error)
}

// Defaults of Options.
const (
	DefaultInterval     = 200 * time.Millisecond
	DefaultTimeout      = 150 * time.Millisecond
	DefaultConcurrency  = 16
	DefaultMaxBodyBytes = 4 << 20
)

// Options configure a Scraper or a Prober. Zero values take the defaults.
type Options struct {
	// Interval between two rounds over the targets; each target is visited
	// once a round, the visits spread evenly over it.
	Interval time.Duration
	// Timeout bounds one request (connection, answer and body).
	Timeout time.Duration
	// Concurrency bounds the requests in flight.
	Concurrency int
	// MaxBodyBytes refuses larger metrics payloads.
	MaxBodyBytes int
	// Client is the HTTP client; a keep-alive client of its own when nil
	// (newClient).
	Client *fasthttp.Client
	// Clock stamps snapshots; time.Now when nil. It must be the core's clock.
	Clock  func() time.Time
	Logger *slog.Logger
}

func (o *Options) defaults() {
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Concurrency <= 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Client == nil {
		o.Client = newClient(*o)
	}
}

// rounds visits every target once per interval, with at most Concurrency
// visits in flight and never two of one worker (a worker still being
// visited is skipped and counted). The scraper and the prober share it.
//
// The interval is cut into slots of slotWidth, and each worker has a fixed
// slot (a hash of its id): a fleet is visited spread over the interval, not
// in one burst, and each worker once per interval. Starting a slot's visits
// together, rather than each at its own instant, wakes the process once per
// slot instead of once per worker, which is most of what an idle process
// pays for a visit.
type rounds struct {
	opts   Options
	core   Core
	visit  func(ctx context.Context, t selection.EngineTarget)
	busy   func() // a visit skipped because the last one still runs
	seed   maphash.Seed
	sem    chan struct{}
	mu     sync.Mutex
	active map[uint64]bool
}

// slotWidth is the spacing of visit starts within an interval.
const slotWidth = 25 * time.Millisecond

func newRounds(core Core, opts Options, visit func(context.Context, selection.EngineTarget), busy func()) *rounds {
	return &rounds{opts: opts, core: core, visit: visit, busy: busy, seed: maphash.MakeSeed(),
		sem: make(chan struct{}, opts.Concurrency), active: make(map[uint64]bool)}
}

// run blocks until ctx ends, then waits for the visits in flight.
func (r *rounds) run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	tick := time.NewTicker(r.opts.Interval)
	defer tick.Stop()
	wait := time.NewTimer(0)
	defer wait.Stop()
	slots := max(1, int(r.opts.Interval/slotWidth))
	bySlot := make([][]selection.EngineTarget, slots)
	for {
		start := time.Now()
		for i := range bySlot {
			bySlot[i] = bySlot[i][:0]
		}
		for _, t := range r.core.EngineTargets() {
			i := maphash.Comparable(r.seed, t.WorkerID) % uint64(slots)
			bySlot[i] = append(bySlot[i], t)
		}
		for i, group := range bySlot {
			if len(group) == 0 {
				continue
			}
			wait.Reset(time.Until(start.Add(time.Duration(i) * r.opts.Interval / time.Duration(slots))))
			select {
			case <-wait.C:
			case <-ctx.Done():
				return
			}
			for _, t := range group {
				r.start(ctx, &wg, t)
			}
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
	}
}

// start runs one visit in its own goroutine unless the worker's last one
// still runs.
func (r *rounds) start(ctx context.Context, wg *sync.WaitGroup, t selection.EngineTarget) {
	r.mu.Lock()
	if r.active[t.WorkerID] {
		r.mu.Unlock()
		r.busy()
		return
	}
	r.active[t.WorkerID] = true
	r.mu.Unlock()
	wg.Go(func() {
		defer func() { r.mu.Lock(); delete(r.active, t.WorkerID); r.mu.Unlock() }()
		select {
		case r.sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		defer func() { <-r.sem }()
		r.visit(ctx, t)
	})
}

// Scraper scrapes the engines' metrics endpoints into the core.
type Scraper struct {
	opts    Options
	core    Core
	m       *Metrics
	parsers sync.Pool // *parser
}

// NewScraper returns a scraper of core's targets; m receives its counters
// (NewMetrics), and may be shared with a Prober.
func NewScraper(core Core, m *Metrics, opts Options) *Scraper {
	opts.defaults()
	return &Scraper{opts: opts, core: core, m: m,
		parsers: sync.Pool{New: func() any { return newParser() }}}
}

// Run scrapes until ctx ends.
func (s *Scraper) Run(ctx context.Context) {
	newRounds(s.core, s.opts, func(ctx context.Context, t selection.EngineTarget) { s.ScrapeOnce(ctx, t) },
		func() { s.m.scrape("skipped_busy") }).run(ctx)
}

// ScrapeOnce scrapes one target and reports the result to the core; it
// returns the snapshot reported.
func (s *Scraper) ScrapeOnce(ctx context.Context, t selection.EngineTarget) selection.EngineSnapshot {
	start, asked := time.Now(), s.opts.Clock()
	ranks, reason, err := s.fetch(ctx, t)
	s.m.observe(time.Since(start))
	snap := selection.EngineSnapshot{At: s.opts.Clock(), Asked: asked, Ranks: ranks}
	if err != nil {
		snap.Ranks, snap.Err = nil, err.Error()
		s.opts.Logger.Debug("engine metrics: scrape failed", "worker_id", t.WorkerID, "url", t.URL, "reason", reason, "err", err)
	}
	s.m.scrape(reason)
	s.core.ReportEngineMetrics(t.WorkerID, snap)
	return snap
}

func (s *Scraper) fetch(ctx context.Context, t selection.EngineTarget) (map[uint32]selection.EngineRank, string, error) {
	d, ok := DialectFor(t.Engine)
	if !ok {
		return nil, "unknown_engine", fmt.Errorf("unknown engine %q", t.Engine)
	}
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	if err := get(ctx, s.opts.Client, t.URL, "text/plain;version=0.0.4", s.opts.Timeout, resp); err != nil {
		return nil, errReason(err), requestError(t.URL, err, s.opts.MaxBodyBytes)
	}
	if code := resp.StatusCode(); code != fasthttp.StatusOK {
		return nil, "http_status", fmt.Errorf("GET %s: status %d", t.URL, code)
	}
	if len(resp.Body()) > s.opts.MaxBodyBytes {
		// A client of the caller's may not enforce the limit itself.
		return nil, "too_large", fmt.Errorf("GET %s: %w: over %d bytes", t.URL, errTooLarge, s.opts.MaxBodyBytes)
	}
	dropped := Dropped{}
	p := s.parsers.Get().(*parser)
	ranks, err := d.parse(p, resp.Body(), t.Ranks, dropped)
	if cap(p.kept) <= 1<<20 {
		s.parsers.Put(p)
	}
	s.m.drop(dropped)
	if err != nil {
		var pe *ParseError
		if errors.As(err, &pe) {
			return nil, pe.Reason, fmt.Errorf("%s: %w", t.URL, err)
		}
		return nil, "parse_error", fmt.Errorf("%s: %w", t.URL, err)
	}
	return ranks, "ok", nil
}
