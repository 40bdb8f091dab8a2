package selection

// The two selection calls, Select and SelectAndReserve: the prepared request,
// the session, the decision (choose.go) and what a caller is answered and
// what is recorded of it.

import (
	"context"
	"fmt"
	"time"

	"github.com/kvselect/kvselect/selection/affinity"
	"github.com/kvselect/kvselect/selection/apierr"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/kvhash"
	"github.com/kvselect/kvselect/selection/loads"
	"github.com/kvselect/kvselect/selection/partition"
	"github.com/kvselect/kvselect/selection/pending"
	"github.com/kvselect/kvselect/selection/reservation"
	"github.com/kvselect/kvselect/selection/routerconfig"
	"github.com/kvselect/kvselect/selection/scheduler"
)

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
	rq, err := s.prepare(key, req.RouterConfigOverride, &req.PromptRequest, forSelection, req.FromPicker)
	if err != nil {
		return nil, err
	}
	p := rq.part
	ss, err := sessionOf(req)
	if err == nil {
		err = checkSession(p, ss)
	}
	if err != nil {
		return nil, err
	}
	sid := ss.id
	target := explicitTarget(req)
	if target == nil && sid != "" && p.Affinity() != nil && req.PinnedWorker == nil {
		if t, ok, err := p.Affinity().Query(s.clock(), sid); err != nil {
			return nil, apierr.Wrap(KindBadRequest, err)
		} else if ok {
			target = &t
		} else {
			target = s.parentTarget(p, ss)
		}
	}
	d, err := s.choose(ctx, &rq, req, target, nil, !req.Advisory)
	if err != nil {
		return nil, err
	}
	resp := s.response(d, req.SelectionID)
	if req.Advisory {
		resp.WorkerLoad = d.workerLoad(optPtr(s.router.ConditionalDisaggPrefillBusyThreshold))
	} else {
		s.noteDecision(p, "select", resp)
	}
	if req.SelectionID != nil {
		e := pendingEntry(&rq, req, d, resp, sid)
		e.SessionFinal = ss.final
		s.pending.Put(s.clock(), pending.Key{Partition: key, SelectionID: *req.SelectionID}, e)
	}
	s.release(d)
	return resp, nil
}

// SelectAndReserve selects and atomically books load (POST /select_and_reserve).
func (s *Service) SelectAndReserve(ctx context.Context, req *SelectRequest) (*SelectResponse, error) {
	if err := s.checkRequest(req); err != nil {
		return nil, err
	}
	rq, err := s.prepare(partitionOf(req.PartitionKey), req.RouterConfigOverride, &req.PromptRequest, forSelection, req.FromPicker)
	if err != nil {
		return nil, err
	}
	p, eff, pr := rq.part, rq.eff, rq.prompt
	ss, err := sessionOf(req)
	if err == nil {
		err = checkSession(p, ss)
	}
	if err != nil {
		return nil, err
	}
	sid := ss.id
	id := deref(req.SelectionID, "")
	if id == "" {
		id = s.rnd.UUID()
	}
	if err := s.resv.Claim(id); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			s.resv.Unclaim(id)
		}
	}()
	target := explicitTarget(req)
	var hold *affinity.Hold
	if target == nil && req.PinnedWorker == nil && sid != "" && p.Affinity() != nil {
		if hold, target, err = s.holdSession(ctx, p, sid); err != nil {
			return nil, err
		}
		if target == nil {
			target = s.parentTarget(p, ss)
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
			dis.undo(&s.resv)
		}
		return nil, err
	}
	if ss.final {
		// Released with the booking (Free, expiry, a peer's free): the
		// binding ends when the request does, as Dynamo's frontend evicts
		// a final request's binding when its response stream ends.
		lease.EndOnRelease()
	}
	s.recordRouting(p, d.worker, pr)
	prefillID := ""
	if dis != nil && dis.prefill != nil {
		s.installPrefill(dis)
		prefillID = dis.prefillID
	}
	row := &reservation.Row{Part: p, Worker: d.worker, Lease: lease, Prefill: prefillID, Expected: booking.ExpectedOutputTokens}
	if s.watchFirstTokens {
		row.LastBlock, row.LastBlockKnown = pr.lastBlock()
		row.FirstDecodeBlock = pr.firstDecodeBlock(p.BlockSize())
	}
	// Cached on the rank, the last block is not stored again: no first
	// token will be reported.
	row.StoreExpected = row.LastBlockKnown && d.scored.CachedTokens < len(pr.locals)*int(p.BlockSize())
	s.trace(&row.Trace, d, s.clock())
	s.resv.Install(id, row)
	s.repl.added(p, booking, pr.lora)
	ok = true
	resp := s.bookedResponse(d, id, booking, !req.FromPicker)
	if dis != nil {
		dis.note(&s.disagg)
		var pid *string
		if prefillID != "" {
			pid = &prefillID
		}
		s.disaggView(dis, resp, pid)
		if dis.prefill != nil {
			s.release(dis.prefill)
		}
	}
	s.noteDecision(p, "select_and_reserve", resp)
	s.release(d)
	return resp, nil
}

// bookedResponse is select_and_reserve's answer: the selection, what its
// booking holds, and the KV transfer hint. The sequence hashes are for a
// caller that reads the JSON answer (withHashes); the picker never does, and
// at 1M tokens they are half a megabyte per request.
func (s *Service) bookedResponse(d *decision, id string, b *loads.Booking, withHashes bool) *SelectResponse {
	resp := s.response(d, &id)
	if withHashes {
		resp.SequenceHashes = toI64(d.prompt.tracking)
	}
	isl := uint64(d.prompt.isl)
	resp.ISLTokens = &isl
	track := b.TrackPrefill
	resp.TrackPrefillTokens = &track
	resp.KVHint = s.kvHint(d, id)
	return resp
}

// pendingEntry is what a /select with a selection_id caches for its replay
// reservation: the booking's inputs, and the block hashes an approximate or
// predicted index (or the text index) records when it is booked.
func pendingEntry(rq *prepared, req *SelectRequest, d *decision, resp *SelectResponse, sid string) pending.Entry {
	p, eff, pr := rq.part, rq.eff, rq.prompt
	e := pending.Entry{
		Worker: d.worker, TrackingHashes: pr.tracking, ISL: pr.isl,
		EffectivePrefillTokens: int(resp.EffectivePrefillTokens), ExpectedOutputTokens: req.ExpectedOutputTokens,
		TrackPrefill: eff.TrackPrefillTokens, LoraName: pr.lora, SessionID: sid,
	}
	if cfg := p.Index().Config(); (cfg.Approximate || cfg.PredictedTTL > 0) && !pr.text {
		e.BlockHashes = pr.locals
	}
	switch {
	case pr.text:
		e.TextBlockHashes = pr.locals
	case pr.alsoText != nil:
		e.TextBlockHashes = pr.alsoText.locals
	}
	return e
}

// holdSession acquires the session's binding before booking; a concurrent
// initializer of the same session is waited for, so that two first requests
// of one session do not bind it to two workers.
func (s *Service) holdSession(ctx context.Context, p *partition.Partition, sid string) (*affinity.Hold, *affinity.Target, error) {
	for {
		hold, wait, err := p.Affinity().Acquire(s.clock(), sid, p.Workers().SessionLive(&s.judge))
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

// commitSession binds the session to the booked rank. A Hard-mode conflict frees
// the booking and fails the request with 400.
func (s *Service) commitSession(p *partition.Partition, hold *affinity.Hold, w index.WorkerKey, id string) (*affinity.Lease, error) {
	if hold == nil {
		return nil, nil
	}
	lease, err := hold.Commit(s.clock(), affinity.RankTarget(w), p.Workers().SessionLive(&s.judge))
	if err != nil {
		_ = p.Loads().Free(id)
		p.Wake()
		return nil, apierr.Wrap(KindBadRequest, err)
	}
	return lease, nil
}

// recordRouting feeds a booking into an approximate or predicted index: the request's
// public block hashes keyed by public sequence hashes, as Dynamo's approximate
// indexer learns from its own routing decisions. Hash-only requests without
// block hashes are not recorded: there is nothing to key the blocks by.
func (s *Service) recordRouting(p *partition.Partition, w index.WorkerKey, pr prompt) {
	if pr.alsoText != nil && len(pr.alsoText.locals) > 0 {
		p.Text().Record(s.clock(), w, pr.alsoText.locals, pr.alsoText.tracking)
	}
	if !pr.hashed || len(pr.locals) == 0 {
		return
	}
	if pr.text {
		p.Text().Record(s.clock(), w, pr.locals, pr.tracking)
		return
	}
	cfg := p.Index().Config()
	if !cfg.Approximate && cfg.PredictedTTL == 0 {
		return
	}
	_, _ = p.Index().RecordRouting(s.clock(), w, pr.locals, kvhash.SequenceHashes(pr.locals))
}

// response assembles the selection fields of a SelectResponse.
func (s *Service) response(d *decision, selectionID *string) *SelectResponse {
	bs, key := uint64(d.part.BlockSize()), d.part.Key()
	sum := OverlapSummary{DP: make(map[string]uint64)}
	for _, rank := range d.rec.Ranks() {
		o := partition.OverlapOf(d.overlaps, index.WorkerKey{WorkerID: d.worker.WorkerID, DPRank: rank})
		c := o.Cumulative()
		sum.GPU = max(sum.GPU, uint64(c.GPU)*bs)
		sum.CPU = max(sum.CPU, uint64(c.CPU)*bs)
		sum.Disk = max(sum.Disk, uint64(c.Disk)*bs)
		sum.DP[fmt.Sprint(rank)] = uint64(o.Device) * bs
	}
	sum.LongestMatched = max(sum.GPU, sum.CPU, sum.Disk)
	potential := uint64(d.scored.PotentialDecodeBlocks)
	resp := &SelectResponse{
		SelectionID: selectionID, ModelName: key.Model, RoutingGroup: key.RoutingGroup,
		WorkerID: d.worker.WorkerID, DPRank: d.worker.DPRank, Endpoint: d.rec.EndpointOrEmpty(),
		BlockSize: d.part.BlockSize(), Overlap: sum,
		EffectivePrefillTokens: uint64(d.scored.EffectivePrefillTokens),
		PotentialDecodeBlocks:  potential,
	}
	resp.Fallbacks = fallbacksOf(d)
	resp.Decision = DecisionDetail{
		Candidates: d.candidates, Cost: d.scored.Cost, ISLTokens: d.prompt.isl,
		CachedTokens: d.scored.CachedTokens, BestCachedTokens: d.mostCached, QueueWait: d.queueWait,
	}
	if d.hasRunnerUp {
		resp.Decision.RunnerUp = &RankCost{WorkerID: d.runnerUp.Worker.WorkerID, DPRank: d.runnerUp.Worker.DPRank, Cost: d.runnerUp.Cost}
	}
	resp.DecodeBusy = scheduler.DecodeBusy(int(potential), d.rec.TotalKVBlocks, optPtr(s.router.ConditionalDisaggDecodeBusyThreshold))
	return resp
}

// workerLoad is an advisory selection's load probe of the chosen rank, busy
// past the prefill-busy threshold.
func (d *decision) workerLoad(prefillBusy *float64) *WorkerLoadView {
	return &WorkerLoadView{
		ActivePrefillTokens:  uint64(d.load.ActivePrefillTokens),
		PrefillTokenCapacity: d.rec.MaxNumBatchedTokens,
		TotalKVBlocks:        d.rec.TotalKVBlocks,
		PrefillBusy:          scheduler.PrefillBusy(d.load.ActivePrefillTokens, d.rec.MaxNumBatchedTokens, prefillBusy),
	}
}

func optPtr[T any](o routerconfig.Optional[T]) *T {
	if v, ok := o.Get(); ok {
		return &v
	}
	return nil
}

// fallbacksOf turns the decision's ordered alternatives into endpoints.
func fallbacksOf(d *decision) []RankEndpoint {
	if len(d.alts) == 0 {
		return nil
	}
	ws := d.part.Workers()
	out := make([]RankEndpoint, 0, len(d.alts))
	for _, a := range d.alts {
		if rec, ok := ws.Rank(a.Worker); ok {
			out = append(out, RankEndpoint{WorkerID: a.Worker.WorkerID, DPRank: a.Worker.DPRank, Endpoint: rec.EndpointOrEmpty()})
		}
	}
	return out
}

// noteDecision records a decision a caller received: its partition's
// routing-quality totals and the decision log.
func (s *Service) noteDecision(p *partition.Partition, op string, resp *SelectResponse) {
	d := &resp.Decision
	p.Routing().Observe(d.ISLTokens, d.CachedTokens, d.BestCachedTokens)
	if s.decisions == nil {
		return
	}
	r := DecisionRecord{
		Time: s.clock(), Op: op, SelectionID: deref(resp.SelectionID, ""),
		Model: resp.ModelName, RoutingGroup: resp.RoutingGroup,
		WorkerID: resp.WorkerID, DPRank: resp.DPRank, Endpoint: resp.Endpoint,
		ISLTokens: d.ISLTokens, CachedTokens: d.CachedTokens, BestCachedTokens: d.BestCachedTokens, Candidates: d.Candidates,
		Cost: d.Cost, RunnerUp: d.RunnerUp, QueueWaitMS: float64(d.QueueWait) / float64(time.Millisecond),
	}
	if pf := resp.Prefill.Selection; pf != nil {
		id := pf.WorkerID
		r.PrefillWorkerID = &id
	}
	s.decisions.Add(r)
}

// kvHint builds the KV transfer hint of a booking (Dynamo's
// lib/kv-router/src/kv_hints.rs): when another worker of the same hint role
// holds a strictly longer root-aligned device prefix and serves hints for its
// rank, tell the chosen worker to fetch that prefix.
func (s *Service) kvHint(d *decision, selectionID string) *KVHint {
	if !s.set.useKVEvents || d.part.Index().Config().PredictedTTL > 0 || !d.booked {
		return nil
	}
	role := deref(d.rec.RouterHintWorkerType, "")
	if role == "" {
		return nil
	}
	ws := d.part.Workers()
	own := partition.OverlapOf(d.overlaps, d.worker).Device
	var best index.Overlap
	var bestEP string
	for _, o := range d.overlaps {
		if o.Worker == d.worker || o.Device <= own {
			continue
		}
		src, ok := ws.Rank(o.Worker)
		if !ok || deref(src.RouterHintWorkerType, "") != role || deref(src.KVEventSourceMode, "") == catalog.StateAgentV2 {
			continue
		}
		ep := src.RouterHintSourceControlEndpoints[o.Worker.DPRank]
		if ep == "" {
			continue
		}
		if o.Device > best.Device || (o.Device == best.Device && (o.Worker.WorkerID < best.Worker.WorkerID ||
			(o.Worker.WorkerID == best.Worker.WorkerID && o.Worker.DPRank < best.Worker.DPRank))) {
			best, bestEP = o, ep
		}
	}
	if bestEP == "" || best.Device == 0 {
		return nil
	}
	// Entry i is request block i: the public sequence hash of the prefix.
	hashes := kvhash.SequenceHashes(d.prompt.locals[:best.Device])
	return &KVHint{ProtocolVersion: "0.1", MessageID: selectionID, Actions: []KVHintAction{{
		ActionID: "a1", ActionType: "kv.fetch", ActionVersion: "1.0",
		Payload: KVHintPayload{BlockHashes: hashes, SourceControlEndpoint: bestEP},
	}}}
}
