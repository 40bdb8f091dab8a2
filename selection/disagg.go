package selection

import (
	"context"

	"github.com/kvselect/kvselect/selection/affinity"
	"github.com/kvselect/kvselect/selection/decisionlog"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/loads"
	"github.com/kvselect/kvselect/selection/partition"
	"github.com/kvselect/kvselect/selection/reservation"
	"github.com/kvselect/kvselect/selection/routerconfig"
	"github.com/kvselect/kvselect/selection/scheduler"
)

// Disaggregated prefill/decode. A model's prefill pool is a routing group of
// its own (Config.PrefillRoutingGroup), as in Dynamo's selection service,
// where a disaggregation coordinator selects against the prefill pool. A
// disaggregated request (SelectRequest.Disaggregated) names the decode group;
// the service chooses its decode worker as usual, decides with Dynamo's
// conditional disaggregation rules (scheduler.DisaggPolicy) whether the
// prompt is prefilled remotely, and if so chooses the prefill worker with the
// same KV- and load-aware selection over the prefill group.
//
// Bookings. A remote prefill is booked under "<selection id>.prefill" in the
// prefill group — prefill tokens and the prompt's blocks, one expected output
// token — and the decode booking carries no prefill tokens: the prompt is
// computed elsewhere and its KV arrives by transfer. The prefill booking is
// freed when the decode booking's prefill completes (the first response byte,
// or the caller's prefill_complete: the decode side has the KV, so the
// prefill worker is done with the request) or when the decode booking is
// freed, whichever is first. Both bookings are made or neither: the prefill
// booking is made first — Dynamo's prefill router also routes the prefill
// before the decode — and undone if the decode booking then fails. A local
// prefill is an ordinary booking. With conditional disaggregation off the
// decision does not depend on the decode worker, so the decode worker is
// chosen and booked in one pass; otherwise a first pass without booking (a
// peek) finds the decode worker the rules look at, and the booking pass is
// pinned to it.
//
// A prefill pool that cannot take a request (no schedulable worker left,
// every worker ejected or overloaded) never fails it: the decode worker
// prefills locally, the decision says why, and Config.OnPrefillPool hears of
// each change between usable and not.

// DefaultPrefillRoutingGroup is the routing group of prefill workers unless
// Config.PrefillRoutingGroup names another.
const DefaultPrefillRoutingGroup = "prefill"

// PrefillBookingSuffix makes a remote prefill's booking id from its decode
// booking's selection id.
const PrefillBookingSuffix = ".prefill"

// PrefillRoutingGroup is the routing group of every model's prefill pool.
func (s *Service) PrefillRoutingGroup() string { return s.set.prefillGroup }

// disaggPolicyOf is the conditional disaggregation configuration in c.
func disaggPolicyOf(c routerconfig.Config) scheduler.DisaggPolicy {
	return scheduler.DisaggPolicy{
		Conditional: c.ConditionalDisagg, Kind: c.ConditionalDisaggPolicy,
		EffISLThreshold: c.ConditionalDisaggEffISLThreshold, EffISLRatioThreshold: c.ConditionalDisaggEffISLRatioThreshold,
		DecodeGate: c.ConditionalDisaggDecodeBusyThreshold.IsSet(),
	}
}

// prefillBusyThreshold is the prefill-busy line of prefill_load: its own
// threshold, else the queue threshold (Dynamo's ConditionalDisaggThresholds).
func prefillBusyThreshold(c routerconfig.Config) *float64 {
	if v, ok := c.ConditionalDisaggPrefillBusyThreshold.Get(); ok {
		return &v
	}
	return optPtr(c.QueueThreshold)
}

// disaggOutcome is a disaggregated request's prefill decision and, for a
// remote prefill, the prefill worker's decision and booking.
type disaggOutcome struct {
	model   string
	counted bool // the model has a prefill pool (or had one)
	reason  string
	prefill *decision // nil: local prefill
	// Set when the prefill is booked: its id, and what recordRouting and the
	// replica observer need.
	prefillID string
	booking   *loads.Booking
}

// note counts the decision (for a model that has or had a prefill pool) and
// reports a pool usability change.
func (out *disaggOutcome) note(d *decisionlog.Disagg) {
	if out.counted {
		d.Record(out.model, out.reason)
	}
}

// undo frees a remote prefill booked for a request that then failed, and
// gives its id back to the reservation table.
func (out *disaggOutcome) undo(resv *reservation.Table) {
	if out.prefill == nil {
		return
	}
	_ = out.prefill.part.Loads().Free(out.prefillID)
	out.prefill.part.Wake()
	resv.Unclaim(out.prefillID)
	out.prefill = nil
}

// prefillPool returns the model's prefill partition in parts (nil when the
// model never had one) and whether it has schedulable workers now.
func prefillPool(parts *partition.Set, group, model string) (*partition.Partition, bool) {
	p := parts.Get(index.Partition{Model: model, RoutingGroup: group})
	return p, p != nil && len(p.Workers().Ranks) > 0
}

// prefillRequest is the selection request of a disaggregated request's
// prefill stage in the prefill routing group: the prompt, its priority and
// tenant; the decode side's worker constraints (allowed workers, pins,
// taints, affinity) are not the prefill pool's.
func prefillRequest(req *SelectRequest, group string) *SelectRequest {
	return &SelectRequest{
		PartitionKey:  PartitionKey{ModelName: req.ModelName, RoutingGroup: group},
		PromptRequest: req.PromptRequest, RouterConfigOverride: req.RouterConfigOverride,
		PriorityJump: req.PriorityJump, StrictPriority: req.StrictPriority, PolicyClass: req.PolicyClass,
		Priority: req.Priority, Tenant: req.Tenant, RequestBytes: req.RequestBytes, FromPicker: req.FromPicker,
		SLOTTFTMs: req.SLOTTFTMs, SLOTPOTMs: req.SLOTPOTMs, sloTTFT: req.sloTTFT, sloTPOT: req.sloTPOT,
	}
}

// disaggView sets the response's prefill fields; selectionID is the
// prefill's id to report (its booking, or its cached pending selection), nil
// for none.
func (s *Service) disaggView(out *disaggOutcome, resp *SelectResponse, selectionID *string) {
	resp.PrefillDecision = &PrefillDecision{Remote: out.prefill != nil, Reason: out.reason}
	resp.Prefill = PrefillField{Set: true}
	if d := out.prefill; d != nil {
		pv := s.response(d, nil)
		resp.Prefill.Selection = &PrefillSelection{
			SelectionID: selectionID, RoutingGroup: pv.RoutingGroup, WorkerID: pv.WorkerID, DPRank: pv.DPRank,
			Endpoint: pv.Endpoint, Overlap: pv.Overlap, EffectivePrefillTokens: pv.EffectivePrefillTokens,
		}
	}
}

// decideDisagg runs Dynamo's conditional rules for a request whose decode
// selection is peek: it probes the prefill pool when the policy reads its
// load (returning the probe's prepared prompt, which the caller reuses).
func (s *Service) decideDisagg(ctx context.Context, rq *prepared, req *SelectRequest, peek *decision) (remote bool, reason string, prq *prepared) {
	pol := disaggPolicyOf(rq.eff)
	in := scheduler.DisaggInput{
		PromptTokens: rq.prompt.isl,
		CachedTokens: rq.prompt.isl - peek.scored.EffectivePrefillTokens,
		DecodeBusy: scheduler.DecodeBusy(peek.scored.PotentialDecodeBlocks, peek.rec.TotalKVBlocks,
			optPtr(rq.eff.ConditionalDisaggDecodeBusyThreshold)),
	}
	preq := prefillRequest(req, s.set.prefillGroup)
	if pol.NeedsPrefillBusy() {
		if p, err := s.prepare(partitionOf(preq.PartitionKey), preq.RouterConfigOverride, &preq.PromptRequest, forSelection, preq.FromPicker); err == nil {
			prq = &p
			if pd, err := s.choose(ctx, prq, preq, nil, nil, false); err == nil {
				in.PrefillBusy = scheduler.PrefillBusy(pd.load.ActivePrefillTokens, pd.rec.MaxNumBatchedTokens, prefillBusyThreshold(rq.eff))
				s.release(pd)
			}
		}
	}
	remote, reason = pol.Decide(in)
	return remote, reason, prq
}

// chooseDisaggregated is choose for a disaggregated select_and_reserve: the
// decode worker, booked, and the outcome, whose remote prefill (if any) is
// booked too under id+PrefillBookingSuffix — claimed in the reservation table
// but not installed, which the caller does once the decode booking is sure.
// booking is the decode booking; a remote prefill takes its prefill tokens
// away.
func (s *Service) chooseDisaggregated(ctx context.Context, rq *prepared, req *SelectRequest,
	target *affinity.Target, booking *loads.Booking, id string) (*decision, *disaggOutcome, error) {
	out := &disaggOutcome{model: rq.part.Key().Model}
	pool, ok := prefillPool(s.parts, s.set.prefillGroup, out.model)
	out.counted = pool != nil
	if !ok {
		out.reason = scheduler.ReasonNoPrefillWorkers
		d, err := s.choose(ctx, rq, req, target, booking, true)
		return d, out, err
	}
	if !rq.eff.ConditionalDisagg {
		// Every request prefills remotely whatever its decode worker: no
		// decode peek, one decode pass.
		out.reason = scheduler.ReasonDisaggUnconditional
		if err := s.bookPrefill(ctx, out, req, nil, id); err != nil {
			return nil, nil, err
		}
		if out.prefill != nil {
			booking.TrackPrefill = false
		}
		d, err := s.choose(ctx, rq, req, target, booking, true)
		if err != nil {
			out.undo(&s.resv)
			return nil, nil, err
		}
		return d, out, nil
	}
	peek, err := s.choose(ctx, rq, req, target, nil, false)
	if err != nil {
		return nil, nil, err
	}
	// The decode pass reuses peek's overlap rows; the decision it returns
	// takes them over (and gives them back when released). Whatever it
	// does not take goes back here.
	defer s.release(peek)
	remote, reason, prq := s.decideDisagg(ctx, rq, req, peek)
	out.reason = reason
	if remote {
		if err := s.bookPrefill(ctx, out, req, prq, id); err != nil {
			return nil, nil, err
		}
	}
	// The decode booking goes to the worker the decision was made for.
	pinned := *req
	pinned.PinnedWorker = &WorkerRank{WorkerID: peek.worker.WorkerID, DPRank: peek.worker.DPRank}
	pinned.AffinityTarget, pinned.Fallbacks = nil, 0
	if out.prefill != nil {
		booking.TrackPrefill = false
	}
	drq := *rq
	drq.overlaps = peek.overlaps
	d, err := s.choose(ctx, &drq, &pinned, nil, booking, true)
	if err != nil {
		out.undo(&s.resv)
		return nil, nil, err
	}
	d.alts = peek.alts
	if d.rows == nil {
		// The decode pass read peek's rows (it matched anew only when peek
		// had none at all, and then owns its own).
		d.rows, peek.rows = peek.rows, nil
	}
	return d, out, nil
}

// bookPrefill books the remote prefill; a prefill pool that cannot take it
// turns the decision into a local prefill (ReasonPrefillUnavailable) rather
// than an error, unless the request itself is gone.
func (s *Service) bookPrefill(ctx context.Context, out *disaggOutcome, req *SelectRequest, prq *prepared, id string) error {
	preq := prefillRequest(req, s.set.prefillGroup)
	if prq == nil {
		p, err := s.prepare(partitionOf(preq.PartitionKey), preq.RouterConfigOverride, &preq.PromptRequest, forSelection, preq.FromPicker)
		if err != nil {
			out.reason = scheduler.ReasonPrefillUnavailable
			return nil
		}
		prq = &p
	}
	pid := id + PrefillBookingSuffix
	if err := s.resv.Claim(pid); err != nil {
		return err
	}
	one := uint32(1)
	b := &loads.Booking{RequestID: pid, TrackingHashes: prq.prompt.tracking, ISL: prq.prompt.isl,
		TrackPrefill: prq.eff.TrackPrefillTokens, ExpectedOutputTokens: &one}
	d, err := s.choose(ctx, prq, preq, nil, b, true)
	if err != nil {
		s.resv.Unclaim(pid)
		if ctx.Err() != nil {
			return err
		}
		out.reason = scheduler.ReasonPrefillUnavailable
		return nil
	}
	d.prompt = prq.prompt
	out.prefill, out.prefillID, out.booking = d, pid, b
	return nil
}

// installPrefill makes the booked remote prefill a reservation of its own,
// fed to the index and the replicas like any booking.
func (s *Service) installPrefill(out *disaggOutcome) {
	d := out.prefill
	s.recordRouting(d.part, d.worker, d.prompt)
	s.resv.Install(out.prefillID, &reservation.Row{Part: d.part, Worker: d.worker})
	s.repl.added(d.part, out.booking, d.prompt.lora)
}

// selectDisaggregated is Select for a disaggregated request: the decode
// selection, the decision, and for a remote prefill the prefill worker's
// selection — cached under the selection id + PrefillBookingSuffix in the
// prefill group when the request has an id, for a replay reservation there.
// Nothing is booked.
func (s *Service) selectDisaggregated(ctx context.Context, req *SelectRequest) (*SelectResponse, error) {
	plain := *req
	plain.Disaggregated = false
	resp, err := s.Select(ctx, &plain)
	if err != nil {
		return nil, err
	}
	out := &disaggOutcome{model: resp.ModelName}
	pool, ok := prefillPool(s.parts, s.set.prefillGroup, out.model)
	out.counted = pool != nil
	var prefillID *string
	if !ok {
		out.reason = scheduler.ReasonNoPrefillWorkers
	} else if out.reason, prefillID, err = s.peekPrefill(ctx, req, resp, out); err != nil {
		return nil, err
	}
	out.note(&s.disagg)
	s.disaggView(out, resp, prefillID)
	if out.prefill != nil {
		s.release(out.prefill)
	}
	return resp, nil
}

// peekPrefill decides for an unbooked disaggregated selection and, when the
// prefill is remote, selects (and caches, with an id) its prefill worker.
func (s *Service) peekPrefill(ctx context.Context, req *SelectRequest, resp *SelectResponse, out *disaggOutcome) (string, *string, error) {
	preq := prefillRequest(req, s.set.prefillGroup)
	prq, err := s.prepare(partitionOf(preq.PartitionKey), preq.RouterConfigOverride, &preq.PromptRequest, forSelection, preq.FromPicker)
	if err != nil {
		return scheduler.ReasonPrefillUnavailable, nil, nil
	}
	eff, err := effective(s.router, s.policy.Load(), req.RouterConfigOverride)
	if err != nil {
		return "", nil, err
	}
	pol := disaggPolicyOf(eff)
	in := scheduler.DisaggInput{PromptTokens: prq.prompt.isl,
		CachedTokens: prq.prompt.isl - int(resp.EffectivePrefillTokens), DecodeBusy: resp.DecodeBusy}
	var pd *decision
	defer func() {
		if pd != nil && out.prefill != pd {
			s.release(pd) // a probe only; the caller releases out.prefill
		}
	}()
	if pd, err = s.choose(ctx, &prq, preq, nil, nil, false); err != nil && ctx.Err() != nil {
		return "", nil, err
	}
	if err == nil && pol.NeedsPrefillBusy() {
		in.PrefillBusy = scheduler.PrefillBusy(pd.load.ActivePrefillTokens, pd.rec.MaxNumBatchedTokens, prefillBusyThreshold(eff))
	}
	remote, reason := pol.Decide(in)
	if !remote {
		return reason, nil, nil
	}
	if err != nil {
		return scheduler.ReasonPrefillUnavailable, nil, nil
	}
	if req.SelectionID == nil {
		out.prefill = pd
		return reason, nil, nil
	}
	// Cached exactly as a /select against the prefill group would cache it.
	id := *req.SelectionID + PrefillBookingSuffix
	preq.SelectionID = &id
	preq.PinnedWorker = &WorkerRank{WorkerID: pd.worker.WorkerID, DPRank: pd.worker.DPRank}
	if _, err := s.Select(ctx, preq); err != nil {
		return scheduler.ReasonPrefillUnavailable, nil, nil
	}
	out.prefill = pd
	return reason, &id, nil
}
