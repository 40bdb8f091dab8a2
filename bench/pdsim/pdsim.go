// Package pdsim compares aggregated serving with disaggregated prefill/decode
// (always-remote and conditional) in a discrete-event simulation on a virtual
// clock, routed by kvselect's own selection.Service: every request is a
// disaggregated select_and_reserve, its prefill completion and free are
// reported at the simulated times, and the service's approximate index learns
// the caches from its own routing, as a gateway without KV events does.
//
// The engine model is vLLM's continuous batching with chunked prefill, step by
// step. A worker runs one step at a time: a chunk of at most ChunkTokens
// tokens of the prompt at the head of its prefill queue (PrefillPerToken
// each), plus one token for every sequence it is decoding (DecodePerToken per
// step). So a step that carries a prefill chunk is longer for every running
// sequence: a long prompt prefilled on a decoding worker makes its streams'
// inter-token latency spike, which is what disaggregation avoids. A prefill
// worker only prefills. A remote prefill's KV then moves to the decode worker,
// TransferPerBlock for each block the decode worker does not cache, and the
// decode worker's next step produces the first token. Caches hold every block
// a worker computed or received (no eviction: the runs are short).
package pdsim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/kvselect/kvselect/bench/eventq"
	"github.com/kvselect/kvselect/bench/stats"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/kvhash"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

// Config is the traffic and the engine model.
type Config struct {
	// Sessions of Turns requests each: the first prompt has FirstTokens
	// tokens, every later turn repeats the whole conversation so far (the
	// previous prompt and its output) and adds FollowUpTokens, so it is
	// mostly cached where the previous turn ran.
	Sessions, Turns             int
	FirstTokens, FollowUpTokens int
	OutputTokens                int
	BlockSize                   int
	// Rate is the open-loop arrival rate of sessions per second (Poisson);
	// a session's turns follow each other ThinkTime apart.
	Rate      float64
	ThinkTime time.Duration

	PrefillPerToken, DecodePerToken, TransferPerBlock time.Duration
	ChunkTokens                                       int // vLLM's max_num_batched_tokens
	Seed                                              uint64

	// EffISLThreshold and EffISLRatioThreshold are conditional
	// disaggregation's isl_bounding thresholds
	// (DYN_ROUTER_CONDITIONAL_DISAGG_EFF_ISL_*); 0 keeps Dynamo's 2048 and 0.7.
	EffISLThreshold      int     `json:"eff_isl_threshold,omitempty"`
	EffISLRatioThreshold float64 `json:"eff_isl_ratio_threshold,omitempty"`
}

// DefaultConfig is the configuration docs/disaggregation.md reports:
// 8k-token first prompts, 200-token outputs, two follow-ups of 300 tokens,
// 7.2 requests/s on six workers; 50 µs per prefill token (20k tokens/s), 10 ms
// per decode step, 100 µs per transferred 16-token block, 512-token chunks
// (vLLM's max_num_batched_tokens with chunked prefill in its V0 default).
func DefaultConfig() Config {
	return Config{Sessions: 120, Turns: 3, FirstTokens: 8192, FollowUpTokens: 300, OutputTokens: 200, BlockSize: 16,
		Rate: 2.4, ThinkTime: 4 * time.Second,
		PrefillPerToken: 50 * time.Microsecond, DecodePerToken: 10 * time.Millisecond, TransferPerBlock: 100 * time.Microsecond,
		ChunkTokens: 512, Seed: 1}
}

func (c Config) validate() error {
	switch {
	case c.Sessions < 1 || c.Turns < 1:
		return errors.New("pdsim: sessions and turns must be at least 1")
	case c.FirstTokens < 1 || c.FollowUpTokens < 0 || c.OutputTokens < 1:
		return errors.New("pdsim: prompt and output lengths must be positive")
	case c.BlockSize < 1 || c.ChunkTokens < 1:
		return errors.New("pdsim: block size and chunk must be positive")
	case !(c.Rate > 0) || math.IsInf(c.Rate, 0):
		return errors.New("pdsim: rate must be a positive number")
	case c.ThinkTime < 0 || c.PrefillPerToken < 0 || c.DecodePerToken <= 0 || c.TransferPerBlock < 0:
		return errors.New("pdsim: times must not be negative (and decode time positive)")
	case c.EffISLThreshold < 0 || !(c.EffISLRatioThreshold >= 0 && c.EffISLRatioThreshold <= 1):
		return errors.New("pdsim: the isl_bounding thresholds must be >= 0 tokens and a fraction in [0, 1]")
	}
	return nil
}

// Setup is one fleet: Prefill prefill workers and Decode decode workers, or,
// with Prefill 0, Decode aggregated workers. Conditional turns on Dynamo's
// conditional disaggregation (isl_bounding, its default thresholds).
type Setup struct {
	Name            string `json:"name"`
	Prefill, Decode int
	Conditional     bool `json:"conditional"`
}

// Setups are the three fleets of the comparison, all with prefill+decode
// workers in total.
func Setups(prefill, decode int) []Setup {
	return []Setup{
		{Name: "aggregated", Decode: prefill + decode},
		{Name: "always-remote P/D", Prefill: prefill, Decode: decode},
		{Name: "conditional P/D", Prefill: prefill, Decode: decode, Conditional: true},
	}
}

// Result is one setup's outcome. ITL is every gap between two consecutive
// tokens of a request, over all requests.
type Result struct {
	Setup           Setup   `json:"setup"`
	Requests        int     `json:"requests"`
	TTFTP50Ms       float64 `json:"ttft_p50_ms"`
	TTFTP90Ms       float64 `json:"ttft_p90_ms"`
	TTFTP99Ms       float64 `json:"ttft_p99_ms"`
	ITLP50Ms        float64 `json:"itl_p50_ms"`
	ITLP90Ms        float64 `json:"itl_p90_ms"`
	ITLP99Ms        float64 `json:"itl_p99_ms"`
	OutputTokensPS  float64 `json:"output_tokens_per_s"`
	RequestsPS      float64 `json:"requests_per_s"`
	RemotePrefills  int     `json:"remote_prefills"`
	LocalPrefills   int     `json:"local_prefills"`
	TransferBlocks  int     `json:"transfer_blocks"`
	DecodePrefilled int     `json:"decode_prefilled_tokens"` // prompt tokens decode/aggregated workers computed
	MakespanS       float64 `json:"makespan_s"`
}

const model = "pd"

// request is one turn.
type request struct {
	id       string
	arrival  time.Duration
	blocks   []uint64 // content hashes of the prompt's blocks
	tokens   int
	decode   int // worker index
	prefill  int // worker index, -1 for local
	left     int // prompt tokens still to prefill where it is queued
	emitted  int
	last     time.Duration // when its previous token came out
	ttft     time.Duration
	finished bool
}

// worker is one simulated engine.
type worker struct {
	id        uint64
	prefiller bool
	cache     map[uint64]bool
	queue     []*request // prefill FIFO
	running   []*request // decoding
	busy      bool
}

type world struct {
	cfg     Config
	setup   Setup
	svc     *selection.Service
	start   time.Time
	now     time.Duration
	workers []*worker
	byID    map[uint64]int
	events  eventq.Queue[event]
	ttfts   []time.Duration
	itls    []time.Duration
	res     Result
}

// Run simulates one setup over the configuration's traffic.
func Run(ctx context.Context, cfg Config, s Setup) (Result, error) {
	if err := cfg.validate(); err != nil {
		return Result{}, err
	}
	if s.Decode < 1 || s.Prefill < 0 {
		return Result{}, fmt.Errorf("pdsim: setup %q needs decode workers", s.Name)
	}
	w := &world{cfg: cfg, setup: s, start: time.Unix(1_800_000_000, 0), byID: map[uint64]int{}}
	rc := routerconfig.Default()
	rc.UseKVEvents = false // the index learns from the service's own routing
	rc.ConditionalDisagg = s.Conditional
	if cfg.EffISLThreshold > 0 {
		rc.ConditionalDisaggEffISLThreshold = cfg.EffISLThreshold
	}
	if cfg.EffISLRatioThreshold > 0 {
		rc.ConditionalDisaggEffISLRatioThreshold = cfg.EffISLRatioThreshold
	}
	svc, err := selection.New(selection.Config{Router: rc, Clock: func() time.Time { return w.start.Add(w.now) },
		Rand: rand.New(rand.NewPCG(cfg.Seed, 77))})
	if err != nil {
		return Result{}, err
	}
	w.svc = svc
	add := func(prefiller bool) error {
		id := uint64(len(w.workers) + 1)
		role := catalog.RoleBoth
		if prefiller {
			role = catalog.RolePrefill
		} else if s.Prefill > 0 {
			role = catalog.RoleDecode
		}
		rec := catalog.Record{WorkerID: id, ModelName: model, Role: &role, Endpoint: ptr(fmt.Sprintf("http://w%d:8000", id)),
			BlockSize: ptr(uint32(cfg.BlockSize))}
		if out, err := svc.UpsertWorker(ctx, rec); err != nil || out.Lifecycle != catalog.Schedulable {
			return fmt.Errorf("pdsim: worker %d: %v %v", id, err, out)
		}
		w.byID[id] = len(w.workers)
		w.workers = append(w.workers, &worker{id: id, prefiller: prefiller, cache: map[uint64]bool{}})
		return nil
	}
	for range s.Prefill {
		if err := add(true); err != nil {
			return Result{}, err
		}
	}
	for range s.Decode {
		if err := add(false); err != nil {
			return Result{}, err
		}
	}
	w.res.Setup = s
	for _, r := range w.traffic() {
		w.schedule(event{at: r.arrival, kind: evArrive, req: r})
	}
	for w.events.Len() > 0 {
		if err := ctx.Err(); err != nil {
			return Result{}, err
		}
		ev := w.events.Pop()
		w.now = ev.at
		var err error
		switch ev.kind {
		case evArrive:
			err = w.arrive(ctx, ev.req)
		case evStep:
			err = w.stepDone(ctx, ev.worker, ev.chunk)
		case evTransferred:
			w.transferred(ev.req)
		}
		if err != nil {
			return Result{}, err
		}
	}
	return w.result()
}

// traffic builds the sessions' turns, deterministic for the seed.
func (w *world) traffic() []*request {
	c := w.cfg
	rnd := rand.New(rand.NewPCG(c.Seed, 1))
	var out []*request
	at := time.Duration(0)
	for s := range c.Sessions {
		at += time.Duration(rnd.ExpFloat64() / c.Rate * float64(time.Second))
		tokens := c.FirstTokens
		for turn := range c.Turns {
			if turn > 0 {
				tokens += c.OutputTokens + c.FollowUpTokens
			}
			blocks := make([]uint64, tokens/c.BlockSize)
			for i := range blocks {
				// The session's conversation is one growing text: block i
				// of every turn has the same content.
				blocks[i] = xxh3.HashString(fmt.Sprintf("%d/%d/%d", c.Seed, s, i))
			}
			out = append(out, &request{id: fmt.Sprintf("s%d-t%d", s, turn), arrival: at + time.Duration(turn)*c.ThinkTime,
				blocks: blocks, tokens: tokens, prefill: -1})
		}
	}
	slices.SortStableFunc(out, func(a, b *request) int { return cmpDur(a.arrival, b.arrival) })
	return out
}

func (w *world) arrive(ctx context.Context, r *request) error {
	locals, sq := kvhash.WireHashes(r.blocks)
	isl := uint64(r.tokens)
	osl := uint32(w.cfg.OutputTokens)
	resp, err := w.svc.SelectAndReserve(ctx, &selection.SelectRequest{
		PartitionKey:  selection.PartitionKey{ModelName: model},
		PromptRequest: selection.PromptRequest{BlockHashes: locals, SequenceHashes: sq, ISLTokens: &isl},
		SelectionID:   &r.id, ExpectedOutputTokens: &osl, Disaggregated: true,
	})
	if err != nil {
		return fmt.Errorf("pdsim: %s: %w", r.id, err)
	}
	r.decode = w.byID[resp.WorkerID]
	target := w.workers[r.decode]
	if pf := resp.Prefill.Selection; pf != nil {
		r.prefill = w.byID[pf.WorkerID]
		target = w.workers[r.prefill]
		w.res.RemotePrefills++
	} else {
		w.res.LocalPrefills++
	}
	r.left = r.tokens - w.cachedTokens(target, r)
	if r.prefill < 0 {
		w.res.DecodePrefilled += r.left
	}
	target.queue = append(target.queue, r)
	w.kick(target)
	return nil
}

// cachedTokens is the prompt's cached prefix on wk; as in vLLM the last
// prompt token is always computed.
func (w *world) cachedTokens(wk *worker, r *request) int {
	n := 0
	for _, b := range r.blocks {
		if !wk.cache[b] {
			break
		}
		n++
	}
	return min(n*w.cfg.BlockSize, r.tokens-1)
}

// kick starts a step on an idle worker with work.
func (w *world) kick(wk *worker) {
	if wk.busy || (len(wk.queue) == 0 && len(wk.running) == 0) {
		return
	}
	chunk := 0
	var d time.Duration
	if len(wk.queue) > 0 {
		chunk = min(wk.queue[0].left, w.cfg.ChunkTokens)
		d += time.Duration(chunk) * w.cfg.PrefillPerToken
	}
	if len(wk.running) > 0 {
		d += w.cfg.DecodePerToken
	}
	wk.busy = true
	w.schedule(event{at: w.now + d, kind: evStep, worker: w.byID[wk.id], chunk: chunk})
}

func (w *world) stepDone(ctx context.Context, i, chunk int) error {
	wk := w.workers[i]
	wk.busy = false
	// Every running sequence got a token this step.
	kept := wk.running[:0]
	for _, r := range wk.running {
		if err := w.token(ctx, r); err != nil {
			return err
		}
		if !r.finished {
			kept = append(kept, r)
		}
	}
	clear(wk.running[len(kept):])
	wk.running = kept
	if len(wk.queue) > 0 && chunk > 0 {
		head := wk.queue[0]
		head.left -= chunk
		if head.left <= 0 {
			wk.queue = wk.queue[1:]
			for _, b := range head.blocks {
				wk.cache[b] = true
			}
			if head.prefill >= 0 {
				// Remote: the decode worker pulls what it does not cache.
				dec := w.workers[head.decode]
				moved := 0
				for _, b := range head.blocks {
					if !dec.cache[b] {
						moved++
					}
				}
				w.res.TransferBlocks += moved
				w.schedule(event{at: w.now + time.Duration(moved)*w.cfg.TransferPerBlock, kind: evTransferred, req: head})
			} else {
				// Local: the step that finished the prefill produced the
				// first token.
				if err := w.token(ctx, head); err != nil {
					return err
				}
				if !head.finished {
					wk.running = append(wk.running, head)
				}
			}
		}
	}
	w.kick(wk)
	return nil
}

// transferred: the decode worker has the KV; its next step produces the
// first token.
func (w *world) transferred(r *request) {
	dec := w.workers[r.decode]
	for _, b := range r.blocks {
		dec.cache[b] = true
	}
	dec.running = append(dec.running, r)
	w.kick(dec)
}

// token records one output token of r, reporting the first to the service
// and freeing the booking after the last.
func (w *world) token(ctx context.Context, r *request) error {
	if r.emitted == 0 {
		r.ttft = w.now - r.arrival
		w.ttfts = append(w.ttfts, r.ttft)
		if err := w.svc.PrefillComplete(ctx, r.id); err != nil {
			return fmt.Errorf("pdsim: prefill complete %s: %w", r.id, err)
		}
	} else {
		w.itls = append(w.itls, w.now-r.last)
	}
	r.last = w.now
	r.emitted++
	if r.emitted == w.cfg.OutputTokens {
		r.finished = true
		w.res.Requests++
		if err := w.svc.Free(ctx, r.id); err != nil {
			return fmt.Errorf("pdsim: free %s: %w", r.id, err)
		}
	}
	return nil
}

func (w *world) result() (Result, error) {
	res := w.res
	for _, ml := range w.svc.Inspect().Loads(nil, nil) {
		for _, l := range ml.Loads {
			if l.ActiveRequests != 0 || l.PotentialPrefillTokens != 0 || l.PotentialDecodeBlocks != 0 {
				return res, fmt.Errorf("pdsim: load left on worker %d (%s) after the run: %+v", l.WorkerID, ml.RoutingGroup, l)
			}
		}
	}
	res.TTFTP50Ms, res.TTFTP90Ms, res.TTFTP99Ms = ms(stats.Quantile(w.ttfts, 0.5)), ms(stats.Quantile(w.ttfts, 0.9)), ms(stats.Quantile(w.ttfts, 0.99))
	res.ITLP50Ms, res.ITLP90Ms, res.ITLP99Ms = ms(stats.Quantile(w.itls, 0.5)), ms(stats.Quantile(w.itls, 0.9)), ms(stats.Quantile(w.itls, 0.99))
	res.MakespanS = w.now.Seconds()
	if w.now > 0 {
		res.OutputTokensPS = float64(res.Requests*w.cfg.OutputTokens) / w.now.Seconds()
		res.RequestsPS = float64(res.Requests) / w.now.Seconds()
	}
	return res, nil
}

func ms(d time.Duration) float64 { return math.Round(float64(d.Microseconds())/10) / 100 }

func ptr[T any](v T) *T { return &v }

func cmpDur(a, b time.Duration) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// The event queue: a binary heap by time, ties in insertion order so runs are
// deterministic.
type eventKind int

const (
	evArrive eventKind = iota
	evStep
	evTransferred
)

type event struct {
	at     time.Duration
	kind   eventKind
	req    *request
	worker int
	chunk  int
}

// schedule puts e on the agenda at its time.
func (w *world) schedule(e event) { w.events.Push(e.at, e) }
