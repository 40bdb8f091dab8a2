package selection

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/kvselect/kvselect/selection/affinity"
	"github.com/kvselect/kvselect/selection/apierr"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/flow"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/kvhash"
	"github.com/kvselect/kvselect/selection/loads"
	"github.com/kvselect/kvselect/selection/pending"
	"github.com/kvselect/kvselect/selection/routerconfig"
	"github.com/kvselect/kvselect/selection/scheduler"
)

// InputTriggers are the values session_context.input_trigger accepts.
var InputTriggers = []string{"user_message", "tool_result", "other"}

// maxSessionIDBytes bounds session ids, as Dynamo's affinity table does.
const maxSessionIDBytes = 256

// decision is one selection's outcome, before it becomes a response.
type decision struct {
	part     *partition
	rec      *catalog.Record
	worker   index.WorkerKey
	overlaps []index.Overlap // the whole lookup, for the summary and hints
	scored   scheduler.Scored
	load     loads.Projection   // the chosen rank before this request
	alts     []scheduler.Scored // ordered fallbacks, when the request asked
	prompt   prompt
	booked   bool
	// What the pick weighed, for tracing and the decision log: how many
	// ranks were scored, the cheapest one it beat, and how long the
	// selection waited in the queue.
	candidates  int
	runnerUp    scheduler.Scored
	hasRunnerUp bool
	queueWait   time.Duration
}

// readyPartition is the admission check of every selection-like call: a
// service shutting down, no schedulable worker anywhere, or none in the
// partition are each a 503 with its own message.
func (s *Service) readyPartition(key index.Partition) (*partition, error) {
	if err := s.gate.Admit(); err != nil {
		return nil, err
	}
	p := s.partition(key)
	if p == nil || len(p.workers.Load().ranks) == 0 {
		if !s.anySchedulable() {
			return nil, apierr.New(KindNotReady, "no schedulable workers are available")
		}
		return nil, apierr.New(KindNotReady, "no schedulable workers for %s", displayKey(key))
	}
	return p, nil
}

func (s *Service) anySchedulable() bool {
	for _, p := range s.partitions() {
		if len(p.workers.Load().ranks) > 0 {
			return true
		}
	}
	return false
}

// prepared is what every prompt-carrying call resolves first.
type prepared struct {
	part *partition
	// policy is the selection policy this request runs with, loaded once so
	// that a concurrent SetPolicy cannot give it the weights of one policy
	// and the Select of another.
	policy *scheduler.Policy
	// eff is the effective router configuration: the service's, then the
	// policy's cost weights, then router_config_override. Everything the
	// request computes from weights reads them here.
	eff    routerconfig.Config
	prompt prompt
	// overlaps, when set, is the prompt's index lookup from an earlier pass
	// of the same request (a disaggregated request's peek), reused by choose.
	overlaps []index.Overlap
}

// promptFor resolves the ready partition, the policy, the effective router
// configuration and the normalized prompt.
func (s *Service) promptFor(key index.Partition, o *routerconfig.Override, req *PromptRequest, use promptUse) (prepared, error) {
	p, err := s.readyPartition(key)
	if err != nil {
		return prepared{}, err
	}
	pol := s.policy.Load()
	eff, err := s.effective(pol, o)
	if err != nil {
		return prepared{}, err
	}
	pr, err := s.normalize(p, req, eff.AssumeKVReuse, use)
	if err != nil {
		return prepared{}, err
	}
	return prepared{part: p, policy: pol, eff: eff, prompt: pr}, nil
}

func sessionOf(req *SelectRequest) (string, error) {
	sid := ""
	switch {
	case req.SessionContext != nil:
		sid = req.SessionContext.SessionID
		if t := req.SessionContext.InputTrigger; t != nil && !slices.Contains(InputTriggers, *t) {
			return "", apierr.New(KindBadRequest, "invalid input_trigger %q (want user_message, tool_result or other)", *t)
		}
	case req.SessionID != nil:
		sid = *req.SessionID
	}
	return sid, nil
}

// checkSessionID applies the affinity table's id limit. Without session
// affinity a session id is only policy input and any length is accepted.
func checkSessionID(p *partition, sid string) error {
	if p.affinity != nil && len(sid) > maxSessionIDBytes {
		return apierr.New(KindBadRequest, "session affinity ID must not exceed %d bytes", maxSessionIDBytes)
	}
	return nil
}

// Select picks a worker without booking load (POST /select). With a
// selection_id it caches the booking inputs for a later replay reservation.
func (s *Service) Select(ctx context.Context, req *SelectRequest) (*SelectResponse, error) {
	if err := s.checkRequest(req); err != nil {
		return nil, err
	}
	if req.Disaggregated {
		return s.selectDisaggregated(ctx, req)
	}
	key := partitionOf(req.PartitionKey)
	rq, err := s.promptFor(key, req.RouterConfigOverride, &req.PromptRequest, forSelection)
	if err != nil {
		return nil, err
	}
	p, eff, pr := rq.part, rq.eff, rq.prompt
	sid, err := sessionOf(req)
	if err == nil {
		err = checkSessionID(p, sid)
	}
	if err != nil {
		return nil, err
	}
	target := explicitTarget(req)
	if target == nil && sid != "" && p.affinity != nil && req.PinnedWorker == nil {
		if t, ok, err := p.affinity.Query(s.clock(), sid); err != nil {
			return nil, apierr.Wrap(KindBadRequest, err)
		} else if ok {
			target = &t
		}
	}
	d, err := s.choose(ctx, &rq, req, target, nil, !req.Advisory)
	if err != nil {
		return nil, err
	}
	resp := s.response(d, req.SelectionID)
	if req.Advisory {
		resp.WorkerLoad = s.workerLoad(d)
	} else {
		s.noteDecision(p, "select", resp)
	}
	if req.SelectionID != nil {
		e := pending.Entry{
			Worker: d.worker, TrackingHashes: pr.tracking, ISL: pr.isl,
			EffectivePrefillTokens: int(resp.EffectivePrefillTokens), ExpectedOutputTokens: req.ExpectedOutputTokens,
			TrackPrefill: eff.TrackPrefillTokens, LoraName: pr.lora, SessionID: sid,
		}
		if (p.ix.Config().Approximate || p.ix.Config().PredictedTTL > 0) && !pr.text {
			e.BlockHashes = pr.locals
		}
		switch {
		case pr.text:
			e.TextBlockHashes = pr.locals
		case pr.alsoText != nil:
			e.TextBlockHashes = pr.alsoText.locals
		}
		s.pending.Put(s.clock(), pending.Key{Partition: key, SelectionID: *req.SelectionID}, e)
	}
	return resp, nil
}

func explicitTarget(req *SelectRequest) *affinity.Target {
	a := req.AffinityTarget
	if a == nil {
		return nil
	}
	t := affinity.WorkerTarget(a.WorkerID)
	if a.DPRank != nil {
		t.DPRank, t.HasDPRank = *a.DPRank, true
	}
	return &t
}

// SelectAndReserve selects and atomically books load (POST /select_and_reserve).
func (s *Service) SelectAndReserve(ctx context.Context, req *SelectRequest) (*SelectResponse, error) {
	if err := s.checkRequest(req); err != nil {
		return nil, err
	}
	rq, err := s.promptFor(partitionOf(req.PartitionKey), req.RouterConfigOverride, &req.PromptRequest, forSelection)
	if err != nil {
		return nil, err
	}
	p, eff, pr := rq.part, rq.eff, rq.prompt
	sid, err := sessionOf(req)
	if err == nil {
		err = checkSessionID(p, sid)
	}
	if err != nil {
		return nil, err
	}
	id := deref(req.SelectionID, "")
	if id == "" {
		id = s.rnd.UUID()
	}
	if err := s.resv.claim(id); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			s.resv.unclaim(id)
		}
	}()
	target := explicitTarget(req)
	var hold *affinity.Hold
	if target == nil && req.PinnedWorker == nil && sid != "" && p.affinity != nil {
		if hold, target, err = s.holdSession(ctx, p, sid); err != nil {
			return nil, err
		}
	}
	booking := &loads.Booking{RequestID: id, TrackingHashes: pr.tracking, ISL: pr.isl,
		TrackPrefill: eff.TrackPrefillTokens, ExpectedOutputTokens: req.ExpectedOutputTokens}
	var d *decision
	var dis *disaggOutcome
	if req.Disaggregated {
		d, dis, err = s.chooseDisaggregated(ctx, &rq, req, target, booking, id)
	} else {
		d, err = s.choose(ctx, &rq, req, target, booking, true)
	}
	if err != nil {
		if hold != nil {
			hold.Abort(s.clock())
		}
		return nil, err
	}
	lease, err := s.commitSession(p, hold, d.worker, id)
	if err != nil {
		if dis != nil {
			s.undoPrefill(dis)
		}
		return nil, err
	}
	s.recordRouting(p, d.worker, pr)
	prefillID := ""
	if dis != nil && dis.prefill != nil {
		s.installPrefill(dis)
		prefillID = dis.prefillID
	}
	s.resv.installWithPrefill(id, p, d.worker, lease, prefillID)
	s.replicateAdd(p, booking, pr.lora)
	ok = true
	resp := s.response(d, &id)
	resp.SequenceHashes = toI64(pr.tracking)
	isl := uint64(pr.isl)
	resp.ISLTokens = &isl
	track := booking.TrackPrefill
	resp.TrackPrefillTokens = &track
	resp.KVHint = s.kvHint(d, id)
	if dis != nil {
		s.noteDisagg(dis)
		var pid *string
		if prefillID != "" {
			pid = &prefillID
		}
		s.disaggView(dis, resp, pid)
	}
	s.noteDecision(p, "select_and_reserve", resp)
	return resp, nil
}

// checkRequest refuses what no partition could serve: a disaggregated
// request aimed at the prefill group itself (the request names the decode
// side), and flow control fields out of bounds.
func (s *Service) checkRequest(req *SelectRequest) error {
	if req.Disaggregated && partitionOf(req.PartitionKey).RoutingGroup == s.set.prefillGroup {
		return apierr.New(KindBadRequest, "a disaggregated request names the decode routing group, not the prefill routing group %q", s.set.prefillGroup)
	}
	return checkFlowFields(req)
}

// holdSession acquires the session's binding before booking; a concurrent
// initializer of the same session is waited for, so that two first requests
// of one session do not bind it to two workers.
func (s *Service) holdSession(ctx context.Context, p *partition, sid string) (*affinity.Hold, *affinity.Target, error) {
	for {
		ws := p.workers.Load()
		hold, wait, err := p.affinity.Acquire(s.clock(), sid, s.sessionLive(ws))
		if err != nil {
			return nil, nil, apierr.Wrap(KindBadRequest, err)
		}
		if wait == nil {
			if t, bound := hold.Target(); bound {
				return hold, &t, nil
			}
			return hold, nil, nil
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, nil, apierr.Wrap(KindNotReady, fmt.Errorf("waiting for session %s: %w", sid, ctx.Err()))
		}
	}
}

// targetSchedulable is the liveness test affinity applies to bindings: the
// worker is schedulable in the partition and a ranked target's rank is inside its
// current range (so a DP shrink rebinds only the removed ranks).
func targetSchedulable(ws *workerSet, t affinity.Target) bool {
	r, ok := ws.byID[t.WorkerID]
	if !ok {
		return false
	}
	return !t.HasDPRank || r.HasRank(t.DPRank)
}

// sessionLive is the liveness test a session's binding gets when a request
// of the session is booked: targetSchedulable, and the worker not held out by
// the health check. An ejected worker is gone for its sessions as a deleted
// one is: they fail over to the worker the selection chose instead of
// failing with a Hard-mode conflict for as long as the ejection lasts (found
// by the soak run: session requests answered 400 while their worker was dead).
func (s *Service) sessionLive(ws *workerSet) func(affinity.Target) bool {
	excluded, _ := s.health.Excluded(s.clock(), s.engineCfg.Health.Base)
	return func(t affinity.Target) bool { return !excluded[t.WorkerID] && targetSchedulable(ws, t) }
}

// commitSession binds the session to the booked rank. A Hard-mode conflict frees
// the booking and fails the request with 400.
func (s *Service) commitSession(p *partition, hold *affinity.Hold, w index.WorkerKey, id string) (*affinity.Lease, error) {
	if hold == nil {
		return nil, nil
	}
	ws := p.workers.Load()
	lease, err := hold.Commit(s.clock(), affinity.RankTarget(w), s.sessionLive(ws))
	if err != nil {
		_ = p.loads.Free(id)
		p.wake()
		return nil, apierr.Wrap(KindBadRequest, err)
	}
	return lease, nil
}

// recordRouting feeds a booking into an approximate or predicted index: the request's
// public block hashes keyed by public sequence hashes, as Dynamo's approximate
// indexer learns from its own routing decisions. Hash-only requests without
// block hashes are not recorded: there is nothing to key the blocks by.
func (s *Service) recordRouting(p *partition, w index.WorkerKey, pr prompt) {
	if pr.alsoText != nil && len(pr.alsoText.locals) > 0 {
		p.recordText(s.clock(), w, *pr.alsoText)
	}
	if !pr.hashed || len(pr.locals) == 0 {
		return
	}
	if pr.text {
		p.recordText(s.clock(), w, pr)
		return
	}
	cfg := p.ix.Config()
	if !cfg.Approximate && cfg.PredictedTTL == 0 {
		return
	}
	_, _ = p.ix.RecordRouting(s.clock(), w, pr.locals, kvhash.SequenceHashes(pr.locals))
}

// choose runs the request's policy: eligibility, cost, pick; with booking !=
// nil it books the chosen rank in the same critical section.
func (s *Service) choose(ctx context.Context, rq *prepared, req *SelectRequest,
	target *affinity.Target, booking *loads.Booking, admit bool) (*decision, error) {
	p, pr, eff := rq.part, rq.prompt, rq.eff
	overlaps := rq.overlaps
	if overlaps == nil {
		overlaps = p.match(pr)
	}
	enqueued := s.clock()
	sreq := &scheduler.Request{ISL: pr.isl, BlockSize: p.blockSize, Weights: weightsOf(eff), ServeSaturated: !s.engineCfg.RejectSaturated}
	sreq.Weights.EngineWeights = s.engineWeights()
	if eff.TrackActiveBlocks {
		sreq.TrackedBlocks = len(pr.tracking)
	}
	if req != nil {
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
	var ticket *waiter
	shed := false // a sheddable request under flow control: never queued
	if admit && s.set.queueing {
		if p.flow != nil && flow.Sheddable(flowPriority(req)) {
			shed = true
		} else {
			t, err := p.enqueue(req, pr, bestCached(overlaps, p.blockSize, eff), enqueued)
			if err != nil {
				s.noteFlow(p.key, flowRequest(req, pr.isl, 0), FlowRejected, 0)
				return nil, err
			}
			ticket = t
			defer s.leaveQueue(p, ticket)
		}
	}
	threshold := s.router.QueueThreshold.Or(0) // read only when queueing is on
	refreshed := false                         // overlaps refreshed since the last sleep
	for {
		if err := s.gate.Admit(); err != nil {
			return nil, err
		}
		p.queueMu.Lock()
		changed := p.changed
		p.queueMu.Unlock()
		p.schedMu.Lock()
		ws := p.workers.Load()
		if len(ws.ranks) == 0 {
			p.schedMu.Unlock()
			return nil, apierr.New(KindNotReady, "no schedulable workers for %s", displayKey(p.key))
		}
		projs := p.loads.Project(pr.tracking, p.projBuf[:0])
		p.projBuf = projs
		if shed && (p.queued() > 0 || !hasRoom(ws, projs, threshold, s.rankSaturated)) {
			// GIE's semantics: a sheddable request is rejected at once
			// rather than queued, and never passes one that waits.
			p.schedMu.Unlock()
			fr := flowRequest(req, pr.isl, 0)
			s.noteFlow(p.key, fr, FlowShed, 0)
			return nil, flowError(FlowShed, p, fr, errFlowShed)
		}
		if ticket != nil && p.flowExpired(ticket, s.clock()) {
			// Its TTL passed: Maintain took it out of the queue, or would.
			p.schedMu.Unlock()
			ticket.expired = true
			return nil, flowError(FlowExpired, p, ticket.ticket.Request(), errFlowExpired)
		}
		if ticket != nil && !p.mayProceed(ticket, ws, projs, threshold, s.rankSaturated) {
			p.schedMu.Unlock()
			refreshed = false
			select {
			case <-changed:
				continue
			case <-ctx.Done():
				return nil, apierr.Wrap(KindNotReady, fmt.Errorf("queued selection for %s: %w", displayKey(p.key), ctx.Err()))
			}
		}
		if ticket != nil && !refreshed && scheduler.OverlapRefreshDue(enqueued, s.clock(), s.router.OverlapRefreshAfter) {
			// Dequeue-time refresh, as Dynamo's queue does: a long wait makes
			// the enqueue-time overlap stale. Checked once the request may
			// proceed, whether or not it slept, then the pass runs again
			// with the fresh overlap (the index is read outside schedMu),
			// once: a refresh bound shorter than a pass cannot loop.
			p.schedMu.Unlock()
			overlaps = p.match(pr)
			enqueued, refreshed = s.clock(), true
			continue
		}
		now := s.clock()
		cands, ejected := s.candidates(p.candBuf[:0], ws, projs, overlaps, pr.lora, now)
		p.candBuf = cands
		if len(cands) == 0 && ejected > 0 {
			p.schedMu.Unlock()
			return nil, s.allEjected(p, ws, now)
		}
		chosen, err := rq.policy.Select(p.rnd, sreq, cands, &p.scratch)
		if err != nil {
			p.schedMu.Unlock()
			return nil, schedulerError(err)
		}
		if ejected >= 0 {
			s.health.Chosen(chosen.Worker.WorkerID, now) // a probation worker's trial
		}
		d := &decision{part: p, worker: chosen.Worker, overlaps: overlaps, scored: chosen, prompt: pr,
			candidates: p.scratch.Candidates()}
		d.runnerUp, d.hasRunnerUp = p.scratch.RunnerUp(chosen.Worker)
		if ticket != nil {
			d.queueWait = now.Sub(enqueued)
		}
		if req != nil && req.Fallbacks > 0 {
			d.alts = p.scratch.Ranked(chosen.Worker, req.Fallbacks)
		}
		d.rec, _ = ws.rank(chosen.Worker)
		for _, pj := range projs {
			if pj.Worker == chosen.Worker {
				d.load = pj
			}
		}
		if booking != nil {
			booking.Worker = chosen.Worker
			if booking.TrackPrefill {
				booking.PrefillTokens = chosen.EffectivePrefillTokens
			}
			if err := p.loads.Add(s.clock(), *booking); err != nil {
				p.schedMu.Unlock()
				return nil, loadsError(err)
			}
			d.booked = true
		}
		p.schedMu.Unlock()
		if d.rec == nil {
			return nil, apierr.New(KindInternal, "selected worker %d is no longer schedulable", chosen.Worker.WorkerID)
		}
		if ticket != nil {
			ticket.dispatched = true
		} else if shed {
			s.noteFlow(p.key, flowRequest(req, pr.isl, 0), FlowDispatched, 0)
		}
		return d, nil
	}
}

// leaveQueue takes a selection out of its partition's queue when choose
// returns, and reports how it left flow control.
func (s *Service) leaveQueue(p *partition, w *waiter) {
	p.leave(w)
	ft := w.ticket
	if ft == nil {
		return
	}
	outcome := FlowAbandoned
	switch {
	case w.dispatched:
		outcome = FlowDispatched
	case w.expired:
		outcome = FlowExpired
	}
	s.noteFlow(p.key, ft.Request(), outcome, s.clock().Sub(ft.Enqueued()))
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

// candidates joins the schedulable ranks with their load projection,
// overlap and engine figures, leaves out ejected workers, and marks busy
// workers: as in Dynamo's busy rejection, a worker is overloaded only when all
// its ranks are over a configured threshold. ejected is the number of ranks
// left out by health ejection, or -1 when no worker has ever been ejected
// (the check was skipped).
func (s *Service) candidates(out []scheduler.Candidate, ws *workerSet, projs []loads.Projection, overlaps []index.Overlap,
	lora string, now time.Time) ([]scheduler.Candidate, int) {
	cfg := &s.engineCfg
	ejected := -1
	excluded, anyEjected := s.health.Excluded(now, cfg.Health.Base)
	if anyEjected {
		ejected = 0
	}
	for _, pj := range projs {
		rec, ok := ws.rank(pj.Worker)
		if !ok {
			continue
		}
		if excluded[pj.Worker.WorkerID] {
			ejected++
			continue
		}
		out = append(out, scheduler.Candidate{
			Worker: pj.Worker, ActivePrefillTokens: pj.ActivePrefillTokens, ActiveDecodeBlocks: pj.ActiveDecodeBlocks,
			ActiveRequests: pj.ActiveRequests, AdditionalBlocks: pj.AdditionalBlocks, Taints: rec.Taints,
			MaxNumBatchedTokens: rec.MaxNumBatchedTokens, Overlap: overlapOf(overlaps, pj.Worker),
		})
	}
	s.engines.Annotate(out, func(i int) int { return int(ws.byID[out[i].Worker.WorkerID].DPSize()) }, lora, now, cfg)
	if !s.busyRejection() {
		return out, ejected
	}
	busyRanks, ranks := map[uint64]int{}, map[uint64]int{}
	for i := range out {
		id := out[i].Worker.WorkerID
		ranks[id]++
		if s.rankBusy(&out[i], ws.byID[id]) {
			busyRanks[id]++
		}
	}
	for i := range out {
		id := out[i].Worker.WorkerID
		out[i].Overloaded = busyRanks[id] == ranks[id]
	}
	return out, ejected
}

// allEjected is the 503 of a partition whose every schedulable worker is
// ejected by the health checks: it names them, so the operator sees why.
func (s *Service) allEjected(p *partition, ws *workerSet, now time.Time) error {
	var why []string
	for _, id := range slices.Sorted(maps.Keys(ws.byID)) {
		if _, reason := s.health.View(id, now); reason != "" {
			why = append(why, fmt.Sprintf("worker %d %s", id, reason))
		}
		if len(why) == 8 {
			why = append(why, "...")
			break
		}
	}
	return apierr.New(KindUnavailable, "%s: every schedulable worker of %s is ejected by health checks or awaiting its trial (%s)",
		scheduler.ErrNoEndpoints, displayKey(p.key), strings.Join(why, "; "))
}

// rankSaturated reports a rank whose fresh engine figures are saturated.
func (s *Service) rankSaturated(w index.WorkerKey, rankCount int) bool {
	return s.engines.Saturated(w.WorkerID, w.DPRank, rankCount, s.clock(), &s.engineCfg)
}

func (s *Service) engineWeights() scheduler.EngineWeights {
	return s.engineCfg.Weights()
}

func (s *Service) busyRejection() bool {
	r := &s.router
	return r.ActiveDecodeBlocksThreshold.IsSet() || r.ActivePrefillTokensThreshold.IsSet() || r.ActivePrefillTokensThresholdFrac.IsSet()
}

// rankBusy applies the busy-rejection thresholds to one rank.
func (s *Service) rankBusy(c *scheduler.Candidate, rec *catalog.Record) bool {
	r := &s.router
	if t, ok := r.ActiveDecodeBlocksThreshold.Get(); ok && rec.TotalKVBlocks != nil && *rec.TotalKVBlocks > 0 &&
		float64(c.ActiveDecodeBlocks)/float64(*rec.TotalKVBlocks) > t {
		return true
	}
	if t, ok := r.ActivePrefillTokensThreshold.Get(); ok && c.ActivePrefillTokens > t {
		return true
	}
	if t, ok := r.ActivePrefillTokensThresholdFrac.Get(); ok &&
		float64(c.ActivePrefillTokens) > t*float64(scheduler.PrefillTokenCapacity(rec.MaxNumBatchedTokens)) {
		return true
	}
	return false
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

func loadsError(err error) error {
	switch {
	case errors.Is(err, loads.ErrWorkerNotFound), errors.Is(err, loads.ErrRequestNotFound):
		return apierr.Wrap(KindNotFound, err)
	case errors.Is(err, loads.ErrDuplicateRequest):
		return apierr.Wrap(KindConflict, err)
	}
	return apierr.Wrap(KindInternal, err)
}

// response assembles the selection fields of a SelectResponse.
func (s *Service) response(d *decision, selectionID *string) *SelectResponse {
	bs := uint64(d.part.blockSize)
	sum := OverlapSummary{DP: make(map[string]uint64)}
	for _, rank := range d.rec.Ranks() {
		o := overlapOf(d.overlaps, index.WorkerKey{WorkerID: d.worker.WorkerID, DPRank: rank})
		c := o.Cumulative()
		sum.GPU = max(sum.GPU, uint64(c.GPU)*bs)
		sum.CPU = max(sum.CPU, uint64(c.CPU)*bs)
		sum.Disk = max(sum.Disk, uint64(c.Disk)*bs)
		sum.DP[fmt.Sprint(rank)] = uint64(o.Device) * bs
	}
	sum.LongestMatched = max(sum.GPU, sum.CPU, sum.Disk)
	potential := uint64(d.scored.PotentialDecodeBlocks)
	resp := &SelectResponse{
		SelectionID: selectionID, ModelName: d.part.key.Model, RoutingGroup: d.part.key.RoutingGroup,
		WorkerID: d.worker.WorkerID, DPRank: d.worker.DPRank, Endpoint: d.rec.EndpointOrEmpty(),
		BlockSize: d.part.blockSize, Overlap: sum,
		EffectivePrefillTokens: uint64(d.scored.EffectivePrefillTokens),
		PotentialDecodeBlocks:  potential,
	}
	resp.Fallbacks = fallbacksOf(d)
	resp.Decision = DecisionDetail{
		Candidates: d.candidates, Cost: d.scored.Cost, ISLTokens: d.prompt.isl,
		CachedTokens: d.scored.CachedTokens, QueueWait: d.queueWait,
	}
	if d.hasRunnerUp {
		resp.Decision.RunnerUp = &RankCost{WorkerID: d.runnerUp.Worker.WorkerID, DPRank: d.runnerUp.Worker.DPRank, Cost: d.runnerUp.Cost}
	}
	resp.DecodeBusy = scheduler.DecodeBusy(int(potential), d.rec.TotalKVBlocks, optPtr(s.router.ConditionalDisaggDecodeBusyThreshold))
	return resp
}

func (s *Service) workerLoad(d *decision) *WorkerLoadView {
	return &WorkerLoadView{
		ActivePrefillTokens:  uint64(d.load.ActivePrefillTokens),
		PrefillTokenCapacity: d.rec.MaxNumBatchedTokens,
		TotalKVBlocks:        d.rec.TotalKVBlocks,
		PrefillBusy:          scheduler.PrefillBusy(d.load.ActivePrefillTokens, d.rec.MaxNumBatchedTokens, optPtr(s.router.ConditionalDisaggPrefillBusyThreshold)),
	}
}

func optPtr[T any](o routerconfig.Optional[T]) *T {
	if v, ok := o.Get(); ok {
		return &v
	}
	return nil
}
