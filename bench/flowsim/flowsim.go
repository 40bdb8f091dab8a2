// Package flowsim measures flow control (selection/flow) in a discrete-event
// simulation on a virtual clock: tenants with very different prompts share a
// saturated pool, and the question is what each tenant waits and what its
// time to first token becomes with each ordering of the waiting requests.
//
// The ordering and the admission are kvselect's own: the waiting requests
// are held by a real flow.Controller (FIFO, count or cost fairness), and a
// request leaves the queue only as the controller's head and only when some
// worker is not busy by scheduler.Busy — Dynamo's queue threshold test
// (active prefill tokens > threshold × max_num_batched_tokens), with a
// request's prompt counted as active prefill from its dispatch until its
// first token. "off", today's queue without flow control, is Dynamo's
// default fcfs policy: one queue in arrival order, which is what the
// controller's FIFO does. Sheddable requests (negative priority) are
// rejected when they would wait; waiting requests expire after the TTL.
//
// The engine model is vLLM's continuous batching with chunked prefill: a
// worker runs one step at a time; a step carries every decoding sequence's
// next token and up to ChunkTokens prompt tokens of the sequences still
// prefilling, oldest first, and lasts DecodeStep + PrefillPerToken × its
// prompt tokens. A sequence's first token comes at the end of the step
// that finishes its prompt; it then decodes OutputTokens − 1 more tokens,
// one per step. Prompts are uncached: the tenants share no prefixes.
package flowsim

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"time"

	"github.com/kvselect/kvselect/bench/eventq"
	"github.com/kvselect/kvselect/bench/stats"
	"github.com/kvselect/kvselect/selection/flow"
	"github.com/kvselect/kvselect/selection/scheduler"
)

// Class is one stream of traffic: a tenant at a priority.
type Class struct {
	Tenant       string
	Priority     int
	Rate         float64 // requests per second, Poisson
	PromptTokens int
	OutputTokens int
}

// Config is the pool, the engine model and the traffic.
type Config struct {
	Workers             int
	MaxNumBatchedTokens int     // vLLM's max_num_batched_tokens: the prefill chunk and the busy test's capacity
	QueueThreshold      float64 // DYN_ROUTER_QUEUE_THRESHOLD
	PrefillPerToken     time.Duration
	DecodeStep          time.Duration
	TTL                 time.Duration
	// Duration is how long requests arrive; the run goes on until every
	// admitted request has finished or expired.
	Duration time.Duration
	Classes  []Class
	Seed     uint64
}

// DefaultConfig is the scenario: tenant A sends ten times B's
// requests with prompts sixteen times longer, on four workers, offered a
// little more than the pool can serve; a third, sheddable class arrives
// throughout.
func DefaultConfig() Config {
	return Config{
		Workers:             4,
		MaxNumBatchedTokens: 2048,
		QueueThreshold:      1,
		PrefillPerToken:     50 * time.Microsecond,
		DecodeStep:          10 * time.Millisecond,
		TTL:                 flow.DefaultTTL,
		Duration:            120 * time.Second,
		Classes: []Class{
			{Tenant: "A", Rate: 8.5, PromptTokens: 8192, OutputTokens: 64},
			{Tenant: "B", Rate: 0.85, PromptTokens: 512, OutputTokens: 64},
			{Tenant: "batch", Priority: -1, Rate: 0.5, PromptTokens: 512, OutputTokens: 64},
		},
		Seed: 1,
	}
}

// Modes are the orderings compared: off is Dynamo's fcfs queue.
var Modes = []string{"off", "count", "cost"}

// TenantResult is one class's outcome.
type TenantResult struct {
	Tenant   string `json:"tenant"`
	Priority int    `json:"priority"`
	Sent     int    `json:"sent"`
	Finished int    `json:"finished"`
	Expired  int    `json:"expired"`
	Shed     int    `json:"shed"`
	// Milliseconds, over the finished requests.
	WaitP50 float64 `json:"wait_p50_ms"`
	WaitP90 float64 `json:"wait_p90_ms"`
	WaitMax float64 `json:"wait_max_ms"`
	TTFTP50 float64 `json:"ttft_p50_ms"`
	TTFTP90 float64 `json:"ttft_p90_ms"`
}

// Result is one run.
type Result struct {
	Mode string `json:"mode"`
	// Utilisation is the workers' busy time (in steps) over the arrival
	// window, divided by workers × window.
	Utilisation float64        `json:"utilisation"`
	Tenants     []TenantResult `json:"tenants"`
}

// Tenant returns the result of the named class.
func (r Result) Tenant(name string) TenantResult {
	for _, t := range r.Tenants {
		if t.Tenant == name {
			return t
		}
	}
	return TenantResult{}
}

type request struct {
	class    int
	arrival  time.Duration
	prefill  int // prompt tokens left to prefill
	output   int // tokens left to generate
	ticket   *flow.Ticket
	wait     time.Duration
	firstTok time.Duration
	worker   *worker
	shed     bool // rejected at arrival (sheddable, pool saturated)
	expired  bool // waited the TTL
}

type worker struct {
	id        int
	seqs      []*request // running, dispatch order
	active    int        // prompt tokens of sequences before their first token
	stepping  bool
	busyTotal time.Duration
}

type event struct {
	at     time.Duration
	worker *worker  // step end
	req    *request // arrival
	tokens int      // the step's prompt tokens
}

// Validate reports a configuration that cannot run.
func (c Config) Validate() error {
	var errs []error
	if c.Workers <= 0 || c.MaxNumBatchedTokens <= 0 {
		errs = append(errs, errors.New("workers and max_num_batched_tokens must be positive"))
	}
	if c.QueueThreshold < 0 || c.PrefillPerToken < 0 || c.DecodeStep <= 0 || c.TTL <= 0 || c.Duration <= 0 {
		errs = append(errs, errors.New("threshold, times and durations must be positive"))
	}
	if len(c.Classes) == 0 {
		errs = append(errs, errors.New("no traffic classes"))
	}
	for _, cl := range c.Classes {
		if cl.Rate < 0 || cl.PromptTokens <= 0 || cl.OutputTokens <= 0 || cl.Tenant == "" {
			errs = append(errs, fmt.Errorf("class %q: want a tenant, a non-negative rate, positive prompt and output tokens", cl.Tenant))
		}
	}
	return errors.Join(errs...)
}

// Run simulates mode (off, count or cost) and returns each class's figures.
// It fails when a request is neither finished, expired nor shed at the end,
// or when a worker's active prefill is left non-zero: bookkeeping that
// leaks.
func Run(ctx context.Context, c Config, mode string) (Result, error) {
	if err := c.Validate(); err != nil {
		return Result{}, err
	}
	fairness := flow.FairnessFIFO
	if mode != "off" {
		f, err := flow.ParseFairness(mode)
		if err != nil {
			return Result{}, err
		}
		fairness = f
	}
	s := &sim{cfg: c, ctl: flow.New(flow.Config{Fairness: fairness, TTL: c.TTL}), waiting: make(map[*flow.Ticket]*request)}
	mnbt := uint64(c.MaxNumBatchedTokens)
	s.mnbt = &mnbt
	for i := range c.Workers {
		s.workers = append(s.workers, &worker{id: i})
	}
	for _, a := range Arrivals(c) {
		cl := c.Classes[a.Class]
		r := &request{class: a.Class, arrival: a.At, prefill: cl.PromptTokens, output: cl.OutputTokens}
		s.reqs = append(s.reqs, r)
		s.push(event{at: a.At, req: r})
	}
	for n := 0; s.q.Len() > 0; n++ {
		if n%4096 == 0 && ctx.Err() != nil {
			return Result{}, ctx.Err()
		}
		ev := s.q.Pop()
		s.now = ev.at
		s.expire()
		if ev.req != nil {
			s.arrive(ev.req)
		} else {
			s.stepDone(ev.worker, ev.tokens)
		}
		s.admit()
	}
	return s.result(mode)
}

// Arrival is one request of the traffic: its class and arrival time.
type Arrival struct {
	Class int
	At    time.Duration
}

// Arrivals is c's traffic, class by class in time order: Poisson arrivals
// over c.Duration, a random stream per tenant, so a class's arrivals are the
// same whatever the other classes are (Alone compares like with like).
func Arrivals(c Config) []Arrival {
	var out []Arrival
	for ci, cl := range c.Classes {
		if cl.Rate <= 0 {
			continue
		}
		h := fnv.New64a()
		h.Write([]byte(cl.Tenant))
		rng := rand.New(rand.NewPCG(c.Seed, h.Sum64()))
		for at := time.Duration(0); ; {
			at += time.Duration(rng.ExpFloat64() / cl.Rate * float64(time.Second))
			if at >= c.Duration {
				break
			}
			out = append(out, Arrival{Class: ci, At: at})
		}
	}
	return out
}

// Outcome is one request's fate, to summarize with Summarize.
type Outcome struct {
	Class         int
	Finished      bool
	Expired, Shed bool
	Wait, TTFT    time.Duration
}

// Summarize turns outcomes into per-class results; a request neither
// finished, expired nor shed is an error.
func Summarize(c Config, outs []Outcome) ([]TenantResult, error) {
	var res []TenantResult
	for ci, cl := range c.Classes {
		tr := TenantResult{Tenant: cl.Tenant, Priority: cl.Priority}
		var waits, ttfts []time.Duration
		for _, o := range outs {
			if o.Class != ci {
				continue
			}
			tr.Sent++
			switch {
			case o.Shed:
				tr.Shed++
			case o.Expired:
				tr.Expired++
			case o.Finished:
				tr.Finished++
				waits = append(waits, o.Wait)
				ttfts = append(ttfts, o.TTFT)
			default:
				return nil, fmt.Errorf("a %s request neither finished, expired nor was shed", cl.Tenant)
			}
		}
		tr.WaitP50, tr.WaitP90 = ms(stats.Quantile(waits, 0.5)), ms(stats.Quantile(waits, 0.9))
		tr.WaitMax = ms(stats.Quantile(waits, 1))
		tr.TTFTP50, tr.TTFTP90 = ms(stats.Quantile(ttfts, 0.5)), ms(stats.Quantile(ttfts, 0.9))
		res = append(res, tr)
	}
	return res, nil
}

type sim struct {
	cfg     Config
	ctl     *flow.Controller
	mnbt    *uint64
	workers []*worker
	reqs    []*request
	q       eventq.Queue[event]
	now     time.Duration
	waiting map[*flow.Ticket]*request
}

// epoch anchors the virtual clock for the controller, which takes times.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func (s *sim) push(e event) { s.q.Push(e.at, e) }

// room is the least loaded worker that is not busy, nil when all are.
func (s *sim) room() *worker {
	var best *worker
	for _, w := range s.workers {
		if scheduler.Busy(w.active, s.mnbt, s.cfg.QueueThreshold) {
			continue
		}
		if best == nil || w.active < best.active || w.active == best.active && len(w.seqs) < len(best.seqs) {
			best = w
		}
	}
	return best
}

func (s *sim) arrive(r *request) {
	cl := s.cfg.Classes[r.class]
	if s.ctl.Len() == 0 {
		if w := s.room(); w != nil {
			s.dispatch(r, w)
			return
		}
	}
	if flow.Sheddable(cl.Priority) {
		r.shed = true
		return
	}
	t, err := s.ctl.Push(epoch.Add(s.now), flow.Request{Priority: cl.Priority, Tenant: cl.Tenant,
		Cost: int64(cl.PromptTokens + cl.OutputTokens), ISL: cl.PromptTokens})
	if err != nil { // no byte or tenant limits here
		panic(err)
	}
	r.ticket = t
	s.waiting[t] = r
}

// expire takes out the requests that waited the TTL.
func (s *sim) expire() {
	if s.ctl.Expire(epoch.Add(s.now)) == 0 {
		return
	}
	for t, r := range s.waiting {
		if t.Expired() {
			delete(s.waiting, t)
			r.expired = true
		}
	}
}

// admit lets the head of the queue go while a worker has room.
func (s *sim) admit() {
	for {
		t := s.ctl.Head()
		if t == nil {
			return
		}
		w := s.room()
		if w == nil {
			return
		}
		s.ctl.Dispatch(t)
		r := s.waiting[t]
		delete(s.waiting, t)
		s.dispatch(r, w)
	}
}

func (s *sim) dispatch(r *request, w *worker) {
	r.wait = s.now - r.arrival
	r.worker = w
	w.seqs = append(w.seqs, r)
	w.active += r.prefill
	if !w.stepping {
		s.step(w)
	}
}

// step starts w's next step: every decoding sequence's token and up to a
// chunk of prompt tokens, oldest sequence first.
func (s *sim) step(w *worker) {
	if len(w.seqs) == 0 {
		w.stepping = false
		return
	}
	w.stepping = true
	budget := s.cfg.MaxNumBatchedTokens
	tokens := 0
	for _, r := range w.seqs {
		if r.prefill > 0 && budget > 0 {
			n := min(r.prefill, budget)
			budget -= n
			tokens += n
		}
	}
	d := s.cfg.DecodeStep + time.Duration(tokens)*s.cfg.PrefillPerToken
	w.busyTotal += max(0, min(s.now+d, s.cfg.Duration)-min(s.now, s.cfg.Duration))
	s.push(event{at: s.now + d, worker: w, tokens: tokens})
}

// stepDone applies the step's work: the chunk's prompt tokens (the same
// oldest-first split as step), a token for every sequence that was
// decoding, the first token of every prompt finished.
func (s *sim) stepDone(w *worker, tokens int) {
	keep := w.seqs[:0]
	for _, r := range w.seqs {
		switch {
		case r.prefill > 0 && tokens > 0:
			n := min(r.prefill, tokens)
			tokens -= n
			r.prefill -= n
			if r.prefill == 0 {
				r.firstTok = s.now
				r.output--
				w.active -= s.cfg.Classes[r.class].PromptTokens
			}
		case r.prefill == 0:
			r.output--
		}
		if r.prefill > 0 || r.output > 0 {
			keep = append(keep, r)
		}
	}
	clear(w.seqs[len(keep):])
	w.seqs = keep
	s.step(w)
}

func (s *sim) result(mode string) (Result, error) {
	res := Result{Mode: mode}
	var busy time.Duration
	for _, w := range s.workers {
		busy += w.busyTotal
		if w.active != 0 || len(w.seqs) != 0 {
			return res, fmt.Errorf("worker %d ends with %d active prefill tokens and %d sequences", w.id, w.active, len(w.seqs))
		}
	}
	if s.ctl.Len() != 0 {
		return res, fmt.Errorf("%d requests left in the queue", s.ctl.Len())
	}
	res.Utilisation = math.Round(float64(busy)/float64(time.Duration(len(s.workers))*s.cfg.Duration)*1000) / 1000
	outs := make([]Outcome, 0, len(s.reqs))
	for _, r := range s.reqs {
		outs = append(outs, Outcome{Class: r.class, Shed: r.shed, Expired: r.expired,
			Finished: r.worker != nil && r.output == 0, Wait: r.wait, TTFT: r.firstTok - r.arrival})
	}
	var err error
	res.Tenants, err = Summarize(s.cfg, outs)
	return res, err
}

func ms(d time.Duration) float64 { return math.Round(float64(d.Microseconds())/10) / 100 }

// Alone is c with only the named class's traffic: its unloaded reference.
func (c Config) Alone(tenant string) Config {
	out := c
	out.Classes = nil
	for _, cl := range c.Classes {
		if cl.Tenant == tenant {
			out.Classes = append(out.Classes, cl)
		}
	}
	return out
}
