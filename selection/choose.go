package selection

// How a selection decides: choose builds the scheduler's request (schedRequest),
// lets the partition's queue admit it or hold it while every worker is busy
// (enqueue, queueSays), and decides under the partition's scheduling lock
// (decide), which choose's loop takes again after each wait.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvselect/kvselect/selection/admission"
	"github.com/kvselect/kvselect/selection/affinity"
	"github.com/kvselect/kvselect/selection/apierr"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/engine"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/loads"
	"github.com/kvselect/kvselect/selection/partition"
	"github.com/kvselect/kvselect/selection/routerconfig"
	"github.com/kvselect/kvselect/selection/scheduler"
)

// decision is one selection's outcome, before it becomes a response.
type decision struct {
	part     *partition.Partition
	rec      *catalog.Record
	worker   index.WorkerKey
	overlaps []index.Overlap // the whole lookup, for the summary and hints
	scored   scheduler.Scored
	load     loads.Projection   // the chosen rank before this request
	alts     []scheduler.Scored // ordered fallbacks, when the request asked
	prompt   prompt
	booked   bool
	// rows is overlaps' array when it came from Service.rows: the caller
	// that is done with the decision gives it back (Service.release).
	rows *[]index.Overlap
	// What the pick weighed, for tracing and the decision log: how many
	// ranks were scored, the cheapest one it beat, and how long the
	// selection waited in the queue.
	candidates  int
	mostCached  int // the most any scored rank had cached (Scratch.MostCached)
	sreq        *scheduler.Request
	runnerUp    scheduler.Scored
	hasRunnerUp bool
	queueWait   time.Duration
}

// choose runs the request's policy: eligibility, cost, pick; with booking !=
// nil it books the chosen rank in the same critical section. With admit, the
// request may wait in the partition's queue while every worker is busy.
func (s *Service) choose(ctx context.Context, rq *prepared, req *SelectRequest,
	target *affinity.Target, booking *loads.Booking, admit bool) (*decision, error) {
	p := rq.part
	ps := pass{overlaps: rq.overlaps}
	if ps.overlaps == nil {
		ps.rows = s.rows.get()
		ps.overlaps = p.Match(rq.prompt.locals, rq.prompt.text, *ps.rows)
	}
	d, err := s.choosePasses(ctx, rq, req, target, booking, admit, &ps)
	if ps.rows != nil {
		if d != nil {
			*ps.rows, d.rows = ps.overlaps, ps.rows // the decision owns them now
		} else {
			s.rows.put(ps.rows)
		}
	}
	return d, err
}

// choosePasses is choose's loop: the queue's admission, then passes of decide
// until one decides, sleeping while the queue says wait.
func (s *Service) choosePasses(ctx context.Context, rq *prepared, req *SelectRequest,
	target *affinity.Target, booking *loads.Booking, admit bool, ps *pass) (*decision, error) {
	p := rq.part
	ps.enqueued = s.clock()
	ps.sreq = schedRequest(rq, req, target, &s.engineCfg)
	if admit && s.set.queueing {
		if err := s.enqueue(rq, req, ps); err != nil {
			return nil, err
		}
		if ps.ticket != nil {
			defer s.leaveQueue(p, ps.ticket)
		}
	}
	for {
		if err := s.gate.Admit(); err != nil {
			return nil, err
		}
		changed := p.Queue().Changed()
		d, v, err := s.decide(rq, req, booking, ps)
		switch {
		case err != nil:
			if errors.Is(err, scheduler.ErrSLOUnattainable) {
				s.onLatency(LatencyEvent{Kind: LatencyShed, Model: p.Key().Model})
			}
			return nil, err
		case v == mustShed:
			ev, err := p.Queue().ShedError(&ps.ar, rq.prompt.isl)
			s.onFlow(ev)
			return nil, err
		case v == mustWait:
			ps.refreshed = false
			select {
			case <-changed:
				continue
			case <-ctx.Done():
				return nil, apierr.Wrap(KindNotReady, fmt.Errorf("queued selection for %s: %w", partition.Name(p.Key()), ctx.Err()))
			}
		case v == mustRefresh:
			// Dequeue-time refresh, as Dynamo's queue does: the pass runs
			// again with the fresh overlap (the index is read outside the
			// scheduling lock), once: a refresh bound shorter than a pass
			// cannot loop.
			ps.overlaps = p.Match(rq.prompt.locals, rq.prompt.text, ps.recycled())
			ps.enqueued, ps.refreshed = s.clock(), true
			continue
		}
		if d.rec == nil {
			return nil, apierr.New(KindInternal, "selected worker %d is no longer schedulable", d.worker.WorkerID)
		}
		if ps.ticket != nil {
			ps.ticket.Dispatch()
		} else if ps.shed {
			s.onFlow(p.Queue().DispatchedUnqueued(&ps.ar, rq.prompt.isl))
		}
		return d, nil
	}
}

// pass is one selection's state across the passes of choose's loop. It holds
// no pointer to the caller's values (the prepared request, the booking):
// escape analysis would send them to the heap with it.
type pass struct {
	sreq     *scheduler.Request
	overlaps []index.Overlap
	rows     *[]index.Overlap // overlaps' array, when it is recycled (Service.rows)

	ar        admission.Request
	ticket    *admission.Waiter // queued; nil when not
	shed      bool              // a sheddable request under flow control: never queued
	enqueued  time.Time
	refreshed bool // overlaps refreshed since the last sleep
}

// recycled is the array a refreshed lookup may overwrite: the pass's own,
// never the caller's (prepared.overlaps).
func (ps *pass) recycled() []index.Overlap {
	if ps.rows == nil {
		return nil
	}
	return ps.overlaps
}

// verdict is the queue's word on a pass of decide.
type verdict uint8

const (
	mayGo       verdict = iota // decide now
	mustWait                   // not the queue's head, or no rank has room: sleep until the partition changes
	mustRefresh                // the wait made the overlaps stale: look them up again, then decide
	mustShed                   // a sheddable request while the partition is busy: turned away
)

// schedRequest is the scheduler's view of the request: a pure function of
// the prepared request, the request's constraints, the session's target and
// the engine configuration.
func schedRequest(rq *prepared, req *SelectRequest, target *affinity.Target, engineCfg *engine.Config) *scheduler.Request {
	pr, eff := rq.prompt, rq.eff
	sreq := &scheduler.Request{ISL: pr.isl, BlockSize: rq.part.BlockSize(), Weights: weightsOf(eff), ServeSaturated: !engineCfg.RejectSaturated}
	sreq.Weights.EngineWeights = engineCfg.Weights()
	if eff.TrackActiveBlocks {
		sreq.TrackedBlocks = len(pr.tracking)
	}
	if req != nil {
		sreq.SLOTTFT, sreq.SLOTPOT = req.sloTTFT, req.sloTPOT
		sreq.Sheddable = req.Priority != nil && *req.Priority < 0
		if req.PinnedWorker != nil {
			sreq.Pinned = &index.WorkerKey{WorkerID: req.PinnedWorker.WorkerID, DPRank: req.PinnedWorker.DPRank}
		}
		sreq.AllowedWorkers = req.AllowedWorkerIDs
		if rc := req.RoutingConstraints; rc != nil {
			sreq.RequiredTaints, sreq.PreferredTaints = rc.RequiredTaints, rc.PreferredTaints
		}
	}
	if target != nil {
		st := &scheduler.Target{WorkerID: target.WorkerID}
		if target.HasDPRank {
			r := target.DPRank
			st.DPRank = &r
		}
		sreq.AffinityTarget = st
	}
	return sreq
}

// admissionRequest is what the partition's queue knows of req.
func admissionRequest(req *SelectRequest) admission.Request {
	if req == nil {
		return admission.Request{}
	}
	return admission.Request{PriorityJump: req.PriorityJump, StrictPriority: req.StrictPriority, Priority: req.Priority,
		Tenant: req.Tenant, Bytes: req.RequestBytes, ExpectedOutputTokens: req.ExpectedOutputTokens}
}

// enqueue parks the selection in its partition's queue, or marks a sheddable
// one under flow control, which never waits. A flow controller's refusal
// (its limits) is the request's 429.
func (s *Service) enqueue(rq *prepared, req *SelectRequest, ps *pass) error {
	p, pr := rq.part, rq.prompt
	q := p.Queue()
	ps.ar = admissionRequest(req)
	if q.Sheddable(&ps.ar) {
		ps.shed = true
		return nil
	}
	w, ev, err := q.Enqueue(&ps.ar, pr.isl, bestCached(ps.overlaps, p.BlockSize(), rq.eff), ps.enqueued)
	if err != nil {
		s.onFlow(*ev)
		return err
	}
	ps.ticket = w
	return nil
}

// queueSays is the queue's word on a pass, under the scheduling lock with
// the pass's workers and load projection. A sheddable request is turned
// away while another waits or no rank has room (GIE's semantics: rejected at
// once rather than queued, and never passing one that waits). A queued one
// goes once it is the queue's head and some rank has room, unless its flow
// control TTL passed (Maintain took it out of the queue, or would); a long
// wait makes its enqueue-time overlap stale, so it is refreshed once it may
// go (Dynamo's dequeue-time refresh), whether or not it slept.
func (s *Service) queueSays(q *admission.Queue, ps *pass, ws *partition.Workers, projs []loads.Projection) (verdict, error) {
	threshold := s.router.QueueThreshold.Or(0) // read only when queueing is on
	switch {
	case ps.shed:
		if q.Len() > 0 || !ws.HasRoom(projs, threshold, &s.judge) {
			return mustShed, nil
		}
	case ps.ticket != nil:
		if err := q.CheckExpired(ps.ticket, s.clock()); err != nil {
			return mayGo, err
		}
		if !q.IsHead(ps.ticket) || !ws.HasRoom(projs, threshold, &s.judge) {
			return mustWait, nil
		}
		if !ps.refreshed && scheduler.OverlapRefreshDue(ps.enqueued, s.clock(), s.router.OverlapRefreshAfter) {
			return mustRefresh, nil
		}
	}
	return mayGo, nil
}

// decide is one pass of choose under the partition's scheduling lock: the
// queue's say, then the candidates, the policy and, with a booking, the
// booking, so that two bookings never decide on the same load snapshot.
func (s *Service) decide(rq *prepared, req *SelectRequest, booking *loads.Booking, ps *pass) (*decision, verdict, error) {
	p, pr := rq.part, rq.prompt
	st := p.Sched()
	st.Lock()
	defer st.Unlock()
	ws := p.Workers()
	if len(ws.Ranks) == 0 {
		return nil, mayGo, apierr.New(KindNotReady, "no schedulable workers for %s", partition.Name(p.Key()))
	}
	projs := p.Loads().Project(pr.tracking, st.Projections[:0])
	st.Projections = projs
	if v, err := s.queueSays(p.Queue(), ps, ws, projs); v != mayGo || err != nil {
		return nil, v, err
	}
	now := s.clock()
	cands, ejected := ws.Candidates(st.Scratch.Rows(len(projs)), projs, ps.overlaps, &s.judge, pr.lora, now)
	if len(cands) == 0 && ejected > 0 {
		return nil, mayGo, ws.EjectedError(p.Key(), &s.health, now)
	}
	ps.sreq.PoolRequests = meanRequests(cands)
	if rq.policy.PredictsLatency {
		s.fillLatency(p, cands)
	}
	chosen, err := rq.policy.SelectRows(st.Rand, ps.sreq, cands, &st.Scratch)
	if err != nil {
		if e := sloRefusal(err); e != nil {
			return nil, mayGo, e
		}
		return nil, mayGo, schedulerError(err)
	}
	if ejected >= 0 {
		s.health.Chosen(chosen.Worker.WorkerID, now) // a probation worker's trial
	}
	d := &decision{part: p, worker: chosen.Worker, overlaps: ps.overlaps, scored: chosen, prompt: pr,
		candidates: st.Scratch.Candidates(), mostCached: st.Scratch.MostCached(), sreq: ps.sreq}
	d.runnerUp, d.hasRunnerUp = st.Scratch.RunnerUp(chosen.Worker)
	if ps.ticket != nil {
		d.queueWait = now.Sub(ps.enqueued)
	}
	if req != nil && req.Fallbacks > 0 {
		d.alts = st.Scratch.Ranked(chosen.Worker, req.Fallbacks)
	}
	d.rec, _ = ws.Rank(chosen.Worker)
	// Projections come sorted by rank: a search, not a pass over every
	// rank's, which showed on a fleet of thousands.
	if i, ok := slices.BinarySearchFunc(projs, chosen.Worker, func(pj loads.Projection, w index.WorkerKey) int {
		return index.CompareWorkerKeys(pj.Worker, w)
	}); ok {
		d.load = projs[i]
	}
	if b := booking; b != nil {
		b.Worker = chosen.Worker
		if b.TrackPrefill {
			b.PrefillTokens = chosen.EffectivePrefillTokens
		}
		if err := p.Loads().Add(s.clock(), *b); err != nil {
			return nil, mayGo, partition.LoadsError(err)
		}
		d.booked = true
	}
	return d, mayGo, nil
}

// overlapRows recycles the overlap rows of decisions. A prompt every rank
// caches has a row per rank, 160 KiB at 4,096 ranks: allocated anew for
// each selection, the runtime zeroed it and faulted its pages in, 0.6 ms
// of such a request on a 4,096-rank fleet (kvbench scale's profile).
//
// out counts the arrays handed out and not given back: a path that drops a
// decision without releasing it leaves its array to the collector, which is
// correct but makes the next selection allocate again; the tests hold every
// path to zero.
type overlapRows struct {
	pool sync.Pool
	out  atomic.Int64
}

func (o *overlapRows) get() *[]index.Overlap {
	o.out.Add(1)
	if p, ok := o.pool.Get().(*[]index.Overlap); ok {
		return p
	}
	return new([]index.Overlap)
}

func (o *overlapRows) put(p *[]index.Overlap) {
	o.out.Add(-1)
	*p = (*p)[:0]
	o.pool.Put(p)
}

// release gives back what a decision recycles, once its caller has answered.
// A decision not released leaves its rows to the collector.
func (s *Service) release(d *decision) {
	if d.rows != nil {
		s.rows.put(d.rows)
		d.rows, d.overlaps = nil, nil
	}
}

// leaveQueue takes a selection out of its partition's queue when choose
// returns, and reports how it left flow control.
func (s *Service) leaveQueue(p *partition.Partition, w *admission.Waiter) {
	if ev, ok := p.Queue().Leave(w, s.clock); ok {
		s.onFlow(ev)
	}
}

// bestCached is the largest cached-token credit any rank offers, the WSPT
// queue key's "cached_tokens".
func bestCached(overlaps []index.Overlap, blockSize uint32, eff routerconfig.Config) int {
	best := 0
	for _, o := range overlaps {
		best = max(best, scheduler.CachedTokens(o, blockSize, eff.HostCacheHitWeight, eff.DiskCacheHitWeight))
	}
	return best
}

func weightsOf(c routerconfig.Config) scheduler.Weights {
	return scheduler.Weights{
		CostWeights:           CostWeightsOf(c),
		SharedCacheMultiplier: c.SharedCacheMultiplier,
		TrackPrefillTokens:    c.TrackPrefillTokens, TrackActiveBlocks: c.TrackActiveBlocks,
	}
}

// CostWeightsOf is the cost weights a router configuration sets: the values
// the kv-cost policy takes by default.
func CostWeightsOf(c routerconfig.Config) scheduler.CostWeights {
	return scheduler.CostWeights{
		OverlapScoreCredit: c.OverlapScoreCredit, OverlapScoreCreditDecay: c.OverlapScoreCreditDecay,
		PrefillLoadScale: c.PrefillLoadScale, DecodeActiveRequestWeight: c.DecodeActiveRequestWeight,
		HostCacheHitWeight: c.HostCacheHitWeight, DiskCacheHitWeight: c.DiskCacheHitWeight,
		Temperature: c.RouterTemperature,
	}
}

func schedulerError(err error) error {
	switch {
	case errors.Is(err, scheduler.ErrNoEndpoints), errors.Is(err, scheduler.ErrAllFiltered):
		return apierr.Wrap(KindUnavailable, err)
	case errors.Is(err, scheduler.ErrAllOverloaded), errors.Is(err, scheduler.ErrPinnedOverloaded):
		return apierr.Wrap(KindOverloaded, err)
	case errors.Is(err, scheduler.ErrPinnedNotAllowed), errors.Is(err, scheduler.ErrInvalidRequest):
		return apierr.Wrap(KindBadRequest, err)
	}
	return apierr.Wrap(KindInternal, err)
}
