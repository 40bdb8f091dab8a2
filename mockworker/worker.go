// Package mockworker is a simulated vLLM-like inference engine for demos,
// tests and benchmarks without GPUs. Each data-parallel rank has a fixed pool
// of KV blocks with prefix caching keyed by chained block hashes, reference
// counts held by running sequences, and LRU eviction of the cached blocks no
// sequence holds; every change to a pool is published as real vLLM KV events
// (mockworker/kvpublish) on the rank's ZMQ PUB socket, with a replay ring
// behind a ROUTER socket. Requests are scheduled per rank (a bounded number
// run at once, the rest wait in FIFO order) and paced by a timing model:
// prefill time per uncached prompt token, then decode time per output token
// that grows with the number of running sequences.
//
// The engine is served over an OpenAI-compatible HTTP API (Handler) and can
// be driven directly (Generate), so a benchmark can run many workers in one
// process. Register announces a worker to a kvselect REST API.
package mockworker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/kvselect/kvselect/mockworker/kvpublish"
)

// Errors Generate returns; the HTTP front maps them to status codes.
var (
	// ErrInvalidRequest: the request can never be served (bad tokens, too
	// long, an unknown rank). The wrapped message says why.
	ErrInvalidRequest = errors.New("invalid request")
	// ErrClosed: the worker is closed.
	ErrClosed = errors.New("mockworker: worker closed")
)

// Request is one generation request.
type Request struct {
	// Tokens is the prompt.
	Tokens []uint32
	// MaxTokens is the number of tokens to generate; the mock never stops
	// early, so every request finishes with reason "length".
	MaxTokens int
	// DPRank, when set, is the global data-parallel rank to run on; otherwise
	// the rank with the fewest running and waiting requests is chosen.
	DPRank *int
	// OnToken, when set, is called with each generated token as it is
	// produced (index 0 at the end of the prefill). An error aborts the request.
	OnToken func(i int, token uint32) error
	// RemotePrefill: a prefill worker computed the prompt (a disaggregated
	// request's decode side, kv_transfer_params.do_remote_prefill). Instead
	// of computing the prefill, the rank pulls the blocks it does not cache,
	// Config.KVTransferPerBlock each, without a prefill slot and without
	// stalling its running sequences; the pulled blocks enter its prefix
	// cache as computed ones would.
	RemotePrefill bool
	// RemoteDecode: the request is the prefill stage of a disaggregated
	// request (kv_transfer_params.do_remote_decode); it runs as usual and is
	// counted apart.
	RemoteDecode bool
}

// Result describes a finished request.
type Result struct {
	DPRank       int // global data-parallel rank that ran it
	PromptTokens int
	CachedTokens int // prompt tokens served from the prefix cache
	Output       []uint32
	FinishReason string
	Queued       time.Duration // from arrival to admission
	TTFT         time.Duration // from arrival to the first token
	Latency      time.Duration // from arrival to the last token
}

// Worker is a mock engine with one or more data-parallel ranks.
type Worker struct {
	cfg     Config
	log     *slog.Logger
	ranks   []*rank
	metrics *metrics
	faults  *faultState

	closeCtx context.Context
	closeFn  context.CancelFunc

	pdOnce   sync.Once
	pdClient *http.Client // calls to prefill workers (pd.go)

	mu      sync.Mutex
	started bool
	closed  bool
}

// rank is one data-parallel rank: its pool, its scheduler state and its
// publisher, all under mu so that events are published in the order the pool
// changed.
type rank struct {
	global int
	local  int

	// prefill holds one token per prefill in progress when PrefillSlots > 0.
	prefill chan struct{}
	// step is the engine step with Config.PrefillStallsDecode: a prefill
	// chunk holds it exclusively, a decode step shared (pd.go).
	step sync.RWMutex

	mu      sync.Mutex
	pool    *pool
	running int
	queue   []*waiter
	pub     *kvpublish.Publisher

	// Counters for /metrics.
	queries, hits        uint64 // prompt tokens looked up / found in the prefix cache
	promptToks, genToks  uint64
	finished, aborted    uint64
	computedPrefill      uint64 // prompt tokens this rank prefilled itself
	transferredBlocks    uint64 // KV blocks pulled from prefill workers
	remotePrefills       uint64 // requests whose prompt a prefill worker computed
	remoteDecodes        uint64 // prefill stages served for another worker's decode
	publishErrs          uint64
	lastPublishErrLogged time.Time
}

// waiter is a request in a rank's queue.
type waiter struct {
	prompt    []uint32
	maxOutput int
	admitted  chan struct{}
	s         *seq
	hit       int
}

// New builds a worker. It publishes no KV events until Start.
func New(cfg Config) (*Worker, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	w := &Worker{cfg: cfg, log: cfg.Logger.With("component", "mockworker", "worker_id", cfg.WorkerID)}
	w.closeCtx, w.closeFn = context.WithCancel(context.Background())
	for i := range cfg.DPSize {
		r := &rank{global: cfg.DPStartRank + i, local: i, pool: newPool(cfg.NumBlocks, cfg.BlockSize)}
		if cfg.PrefillSlots > 0 {
			r.prefill = make(chan struct{}, cfg.PrefillSlots)
		}
		w.ranks = append(w.ranks, r)
	}
	w.metrics = newMetrics(w)
	w.faults = newFaultState(cfg.Faults, cfg.FaultSeed, cfg.WorkerID, cfg.Clock.Now)
	return w, nil
}

// Config returns the worker's configuration with defaults filled in.
func (w *Worker) Config() Config { return w.cfg }

// Start binds every rank's KV event publisher (when Config.KVEventsEndpoint is
// set) or dials Config.KVEventsCollector with it. ctx bounds the sockets'
// lifetime; Close releases them earlier.
func (w *Worker) Start(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.closed:
		return ErrClosed
	case w.started:
		return errors.New("mockworker: already started")
	}
	if w.cfg.KVEventsEndpoint != "" || w.cfg.KVEventsCollector != "" {
		for _, r := range w.ranks {
			// Every rank dials the one collector; bound sockets are offset
			// per rank as vLLM offsets them.
			ep, connect := w.cfg.KVEventsCollector, true
			if ep == "" {
				ep, _ = OffsetEndpoint(w.cfg.KVEventsEndpoint, r.local) // validated in New
				connect = false
			}
			replay := ""
			if w.cfg.ReplayEndpoint != "" {
				replay, _ = OffsetEndpoint(w.cfg.ReplayEndpoint, r.local)
			}
			pub, err := kvpublish.New(ctx, kvpublish.Options{
				Endpoint:       ep,
				Connect:        connect,
				ReplayEndpoint: replay,
				Topic:          w.cfg.EventsTopic,
				RingSize:       w.cfg.ReplayRing,
				Shape:          w.cfg.EventShape,
				Logger:         w.log.With("dp_rank", r.global),
			})
			if err != nil {
				w.closePublishers()
				return fmt.Errorf("mockworker: dp rank %d: %w", r.global, err)
			}
			r.mu.Lock()
			r.pub = pub
			r.mu.Unlock()
		}
	}
	w.started = true
	return nil
}

// RankEndpoints are the dialable KV event addresses of one rank.
type RankEndpoints struct {
	DPRank int // global rank
	// KVEvents is the bound PUB socket, or the collector it dials when
	// Config.KVEventsCollector is set.
	KVEvents string
	Replay   string // "" without replay
}

// Endpoints lists every rank's event endpoints; empty before Start or
// without KV events.
func (w *Worker) Endpoints() []RankEndpoints {
	var out []RankEndpoints
	for _, r := range w.ranks {
		r.mu.Lock()
		if r.pub != nil {
			out = append(out, RankEndpoints{DPRank: r.global, KVEvents: r.pub.Endpoint(), Replay: r.pub.ReplayEndpoint()})
		}
		r.mu.Unlock()
	}
	return out
}

// Close aborts running requests and closes the publishers. It is safe to call
// more than once.
func (w *Worker) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	w.closed = true
	w.closeFn()
	return w.closePublishers()
}

func (w *Worker) closePublishers() error {
	var errs []error
	for _, r := range w.ranks {
		r.mu.Lock()
		if r.pub != nil {
			errs = append(errs, r.pub.Close())
			r.pub = nil
		}
		r.mu.Unlock()
	}
	return errors.Join(errs...)
}

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidRequest, fmt.Sprintf(format, a...))
}

// pick returns the rank a request runs on.
func (w *Worker) pick(dpRank *int) (*rank, error) {
	if dpRank != nil {
		i := *dpRank - w.cfg.DPStartRank
		if i < 0 || i >= len(w.ranks) {
			return nil, invalid("dp rank %d is not served here (ranks %d..%d)", *dpRank,
				w.cfg.DPStartRank, w.cfg.DPStartRank+len(w.ranks)-1)
		}
		return w.ranks[i], nil
	}
	// vLLM's DP coordinator sends a request to the least loaded engine.
	var best *rank
	bestLoad := 0
	for _, r := range w.ranks {
		r.mu.Lock()
		load := r.running + len(r.queue)
		r.mu.Unlock()
		if best == nil || load < bestLoad {
			best, bestLoad = r, load
		}
	}
	return best, nil
}

// Validate reports whether a request could ever be served, without running it.
func (w *Worker) Validate(req Request) error {
	switch {
	case len(req.Tokens) == 0:
		return invalid("the prompt is empty")
	case req.MaxTokens < 1:
		return invalid("max_tokens must be at least 1, got %d", req.MaxTokens)
	case len(req.Tokens)+req.MaxTokens > w.cfg.MaxModelLen:
		return invalid("this model's maximum context length is %d tokens; the request has %d prompt tokens and %d output tokens",
			w.cfg.MaxModelLen, len(req.Tokens), req.MaxTokens)
	}
	if n := w.ranks[0].pool.need(len(req.Tokens) + req.MaxTokens - 1); n > w.cfg.NumBlocks {
		return invalid("the request needs %d KV blocks, more than the %d a rank has", n, w.cfg.NumBlocks)
	}
	for _, t := range req.Tokens {
		if int(t) >= w.cfg.VocabSize {
			return invalid("token id %d is out of vocabulary (size %d)", t, w.cfg.VocabSize)
		}
	}
	if req.DPRank != nil {
		if _, err := w.pick(req.DPRank); err != nil {
			return err
		}
	}
	return nil
}

// Generate runs one request to completion: it waits for admission on its
// rank, sleeps the prefill time, then produces MaxTokens tokens one decode
// step apart, publishing the KV events of every block it caches. It returns
// early with ctx's error, or with OnToken's, releasing what the request held.
func (w *Worker) Generate(ctx context.Context, req Request) (Result, error) {
	if err := w.Validate(req); err != nil {
		return Result{}, err
	}
	r, err := w.pick(req.DPRank)
	if err != nil {
		return Result{}, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(w.closeCtx, func() { cancel(ErrClosed) })
	defer stop()
	if w.closeCtx.Err() != nil {
		return Result{}, ErrClosed
	}

	start := w.cfg.Clock.Now()
	wt, err := w.awaitAdmission(ctx, r, req)
	if err != nil {
		return Result{}, err
	}
	res := Result{DPRank: r.global, PromptTokens: len(req.Tokens), FinishReason: "length",
		CachedTokens: wt.hit, Queued: w.cfg.Clock.Now().Sub(start)}
	if err := w.prefill(ctx, r, req, len(req.Tokens)-wt.hit); err != nil {
		return w.abort(ctx, r, wt.s, &res, err)
	}
	if err := w.decode(ctx, r, wt.s, req, start, &res); err != nil {
		return w.abort(ctx, r, wt.s, &res, err)
	}
	res.Latency = w.cfg.Clock.Now().Sub(start)
	w.finish(r, wt.s, true, len(res.Output))
	w.metrics.observe(r, res)
	return res, nil
}

// awaitAdmission queues the request on r and waits until the rank admits
// it. A request whose ctx ends first leaves the queue (or, admitted
// meanwhile, releases what it was given) and gets ctx's cause.
func (w *Worker) awaitAdmission(ctx context.Context, r *rank, req Request) (*waiter, error) {
	wt := &waiter{prompt: slices.Clone(req.Tokens), maxOutput: req.MaxTokens, admitted: make(chan struct{})}
	r.mu.Lock()
	r.queue = append(r.queue, wt)
	w.admit(r)
	r.mu.Unlock()

	select {
	case <-wt.admitted:
		return wt, nil
	case <-ctx.Done():
	}
	r.mu.Lock()
	if wt.s == nil {
		if i := slices.Index(r.queue, wt); i >= 0 {
			r.queue = slices.Delete(r.queue, i, i+1)
		}
		r.aborted++
		w.admit(r) // the queue head may have changed
		r.mu.Unlock()
		return nil, context.Cause(ctx)
	}
	r.mu.Unlock() // admitted meanwhile: release
	w.finish(r, wt.s, false, 0)
	return nil, context.Cause(ctx)
}

// prefill computes the prompt's uncached tokens, in one of the rank's
// prefill slots when they are limited, or pulls their KV from the remote
// prefill worker.
func (w *Worker) prefill(ctx context.Context, r *rank, req Request, uncached int) error {
	if req.RemotePrefill {
		return w.pullKV(ctx, r, uncached)
	}
	if r.prefill != nil {
		select {
		case r.prefill <- struct{}{}:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		defer func() { <-r.prefill }()
	}
	return w.computePrefill(ctx, r, uncached, req.RemoteDecode)
}

// decode produces the request's output tokens into res, one decode step
// apart, caching the KV of each block it completes and handing every token
// to OnToken.
func (w *Worker) decode(ctx context.Context, r *rank, s *seq, req Request, start time.Time, res *Result) error {
	seed := promptDigest(req.Tokens)
	for i := range req.MaxTokens {
		tok := outputToken(seed, i, w.cfg.VocabSize)
		r.mu.Lock()
		if i == 0 {
			// The prefill computed the prompt's KV: cache its full blocks.
			r.pool.fill(s)
		} else {
			// The previous token's KV was computed by this step. The last
			// sampled token's never is, as in vLLM.
			r.pool.append(s, res.Output[i-1])
		}
		w.flush(r)
		running := r.running
		r.mu.Unlock()
		res.Output = append(res.Output, tok)
		if i == 0 {
			// Observed now, as vLLM does, not at the end: an endpoint picker
			// reading the histogram between scrapes sees first tokens when
			// they happen.
			res.TTFT = w.cfg.Clock.Now().Sub(start)
			w.metrics.firstToken(r, res.TTFT)
		}
		if req.OnToken != nil {
			if err := req.OnToken(i, tok); err != nil {
				return fmt.Errorf("mockworker: token consumer: %w", err)
			}
		}
		if i+1 == req.MaxTokens {
			break
		}
		itl := float64(w.cfg.DecodePerToken) * (1 + w.cfg.DecodeBatchSlowdown*float64(running-1)) / w.cfg.Speedup
		if err := w.decodeStep(ctx, r, time.Duration(itl)); err != nil {
			return err
		}
	}
	return nil
}

// abort releases what a request stopped early held, its output so far
// counted; the error is ctx's cause once ctx has ended, else err.
func (w *Worker) abort(ctx context.Context, r *rank, s *seq, res *Result, err error) (Result, error) {
	w.finish(r, s, false, len(res.Output))
	if ctx.Err() != nil {
		err = context.Cause(ctx)
	}
	return Result{}, err
}

// admit starts queued requests in FIFO order while the rank has a free slot
// and blocks for the queue head. Called with r.mu held.
func (w *Worker) admit(r *rank) {
	for len(r.queue) > 0 && r.running < w.cfg.MaxNumSeqs {
		wt := r.queue[0]
		s, hit, ok := r.pool.admit(wt.prompt, wt.maxOutput-1)
		if !ok {
			break // head-of-line blocking, as vLLM's FCFS scheduler
		}
		r.queue[0] = nil
		r.queue = r.queue[1:]
		r.running++
		r.queries += uint64(len(wt.prompt))
		r.hits += uint64(hit)
		r.promptToks += uint64(len(wt.prompt))
		wt.s, wt.hit = s, hit
		close(wt.admitted)
	}
	w.flush(r)
}

// finish releases a sequence and admits what now fits.
func (w *Worker) finish(r *rank, s *seq, ok bool, generated int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pool.release(s)
	r.running--
	r.genToks += uint64(generated)
	if ok {
		r.finished++
	} else {
		r.aborted++
	}
	w.admit(r)
}

// flush publishes the pool's pending events as one batch, stamped with the
// rank's global number as vLLM's publisher does. Called with r.mu held, so
// batches leave in the order the pool changed.
func (w *Worker) flush(r *rank) {
	evs := r.pool.takeEvents()
	if len(evs) == 0 || r.pub == nil {
		return
	}
	rank := r.global
	if _, err := r.pub.Publish(&rank, evs...); err != nil {
		r.publishErrs++
		if now := time.Now(); now.Sub(r.lastPublishErrLogged) > 10*time.Second {
			r.lastPublishErrLogged = now
			w.log.Warn("publishing kv events failed", "dp_rank", r.global, "err", err)
		}
	}
}

// ResetPrefixCache drops every cached block of every rank and publishes
// AllBlocksCleared, as vLLM's /reset_prefix_cache. It fails on a rank that
// runs requests, leaving the ranks already reset cleared.
func (w *Worker) ResetPrefixCache() error {
	for _, r := range w.ranks {
		r.mu.Lock()
		ok := r.pool.reset()
		w.flush(r)
		r.mu.Unlock()
		if !ok {
			return fmt.Errorf("mockworker: dp rank %d has running requests; prefix cache not reset", r.global)
		}
	}
	return nil
}

// CachedBlock is a block in a rank's prefix cache.
type CachedBlock struct {
	Hash      uint64 // engine block hash, as in the KV events
	Parent    uint64
	HasParent bool
	Tokens    []uint32
}

// CachedBlocks lists the prefix cache of a global dp rank: the ground truth
// the rank's KV event stream describes.
func (w *Worker) CachedBlocks(dpRank int) []CachedBlock {
	i := dpRank - w.cfg.DPStartRank
	if i < 0 || i >= len(w.ranks) {
		return nil
	}
	r := w.ranks[i]
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]CachedBlock, 0, len(r.pool.blocks))
	for _, b := range r.pool.blocks {
		out = append(out, CachedBlock{Hash: b.hash, Parent: b.parent, HasParent: b.hasParent, Tokens: slices.Clone(b.tokens)})
	}
	return out
}

// RankLoad is a snapshot of one rank's scheduler and pool.
type RankLoad struct {
	DPRank       int
	Running      int
	Waiting      int
	UsedBlocks   int // held by running requests
	CachedBlocks int // in the prefix cache (held or evictable)
	TotalBlocks  int
	// EvictedBlocks counts the cached blocks evicted to make room so far.
	EvictedBlocks uint64
	// NextEventSeq is the sequence number of the rank's next KV event batch.
	NextEventSeq uint64
}

// Loads returns a snapshot of every rank.
func (w *Worker) Loads() []RankLoad {
	out := make([]RankLoad, 0, len(w.ranks))
	for _, r := range w.ranks {
		r.mu.Lock()
		l := RankLoad{DPRank: r.global, Running: r.running, Waiting: len(r.queue),
			UsedBlocks: r.pool.used(), CachedBlocks: len(r.pool.blocks), TotalBlocks: r.pool.capacity,
			EvictedBlocks: r.pool.evictions}
		if r.pub != nil {
			l.NextEventSeq = r.pub.NextSeq()
		}
		r.mu.Unlock()
		out = append(out, l)
	}
	return out
}
