package selection

import (
	"context"

	"github.com/kvselect/kvselect/selection/affinity"
	"github.com/kvselect/kvselect/selection/apierr"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/kvhash"
	"github.com/kvselect/kvselect/selection/loads"
	"github.com/kvselect/kvselect/selection/partition"
	"github.com/kvselect/kvselect/selection/pending"
	"github.com/kvselect/kvselect/selection/reservation"
)

// Reserve books a reservation (POST /reservations): the explicit form when
// worker_id is present, else a replay of the cached /select.
func (s *Service) Reserve(ctx context.Context, req *ReservationRequest) (*ReservationResponse, error) {
	if req.SelectionID == nil {
		return nil, apierr.New(KindBadRequest, "missing field `selection_id`")
	}
	if err := s.gate.Admit(); err != nil {
		return nil, err
	}
	key := partitionOf(req.PartitionKey)
	if req.WorkerID != nil {
		return s.reserveExplicit(ctx, key, req)
	}
	return s.reserveReplay(ctx, key, *req.SelectionID)
}

func (s *Service) reserveExplicit(ctx context.Context, key index.Partition, req *ReservationRequest) (*ReservationResponse, error) {
	id := *req.SelectionID
	s.pending.Discard(pending.Key{Partition: key, SelectionID: id})
	rq, err := s.prepare(key, req.RouterConfigOverride, &req.PromptRequest, forReservation, false)
	if err != nil {
		return nil, err
	}
	p, eff, pr := rq.part, rq.eff, rq.prompt
	if e := req.EffectivePrefillTokens; e != nil && *e > uint64(pr.isl) {
		return nil, apierr.New(KindBadRequest, "effective_prefill_tokens (%d) must not exceed isl_tokens (%d)", *e, pr.isl)
	}
	ws := p.Workers()
	rec, ok := ws.ByID[*req.WorkerID]
	if !ok {
		return nil, apierr.New(KindNotFound, "schedulable worker %d not found for %s", *req.WorkerID, partition.Name(key))
	}
	w := index.WorkerKey{WorkerID: *req.WorkerID, DPRank: deref(req.DPRank, 0)}
	// Prefill is tracked as the request says; else whenever it states its
	// effective prefill; else as the effective configuration says.
	track := eff.TrackPrefillTokens
	if req.EffectivePrefillTokens != nil {
		track = true
	}
	if req.TrackPrefillTokens != nil {
		track = *req.TrackPrefillTokens
	}
	prefill := 0
	if req.EffectivePrefillTokens != nil {
		prefill = int(*req.EffectivePrefillTokens)
	} else if track {
		prefill = pr.isl
	}
	if err := s.resv.Claim(id); err != nil {
		return nil, err
	}
	b := loads.Booking{RequestID: id, Worker: w, TrackingHashes: pr.tracking, ISL: pr.isl, PrefillTokens: prefill,
		TrackPrefill: track, ExpectedOutputTokens: req.ExpectedOutputTokens}
	if err := p.Book(s.clock, b); err != nil {
		s.resv.Unclaim(id)
		return nil, err
	}
	s.recordRouting(p, w, pr)
	// Its last block is watched, but without a lookup whether the rank
	// holds it, no first token is awaited (Row.StoreExpected).
	row := &reservation.Row{Part: p, Worker: w, Expected: req.ExpectedOutputTokens}
	if s.watchFirstTokens {
		row.LastBlock, row.LastBlockKnown = pr.lastBlock()
		row.FirstDecodeBlock = pr.firstDecodeBlock(p.BlockSize())
	}
	s.resv.Install(id, row)
	s.repl.added(p, &b, pr.lora)
	return &ReservationResponse{SelectionID: id, ModelName: key.Model, RoutingGroup: key.RoutingGroup,
		WorkerID: w.WorkerID, DPRank: w.DPRank, Endpoint: rec.EndpointOrEmpty()}, nil
}

func (s *Service) reserveReplay(ctx context.Context, key index.Partition, id string) (*ReservationResponse, error) {
	pk := pending.Key{Partition: key, SelectionID: id}
	e, gen, ok := s.pending.Peek(s.clock(), pk)
	if !ok {
		return nil, apierr.New(KindNotFound, "no pending selection %s for %s (expired, already used, or never selected)", id, partition.Name(key))
	}
	p, err := s.readyPartition(key)
	if err != nil {
		return nil, err
	}
	ws := p.Workers()
	rec, ok := ws.Rank(e.Worker)
	if !ok {
		return nil, apierr.New(KindNotFound, "schedulable worker %d (dp_rank %d) not found for %s", e.Worker.WorkerID, e.Worker.DPRank, partition.Name(key))
	}
	if err := s.resv.Claim(id); err != nil {
		return nil, err
	}
	booked := false
	defer func() {
		if !booked {
			s.resv.Unclaim(id)
		}
	}()
	var hold *affinity.Hold
	if e.SessionID != "" && p.Affinity() != nil {
		if hold, _, err = s.holdSession(ctx, p, e.SessionID); err != nil {
			return nil, err
		}
	}
	prefill := 0
	if e.TrackPrefill {
		prefill = e.EffectivePrefillTokens
	}
	b := loads.Booking{RequestID: id, Worker: e.Worker, TrackingHashes: e.TrackingHashes, ISL: e.ISL,
		PrefillTokens: prefill, TrackPrefill: e.TrackPrefill, ExpectedOutputTokens: e.ExpectedOutputTokens}
	if err := p.Book(s.clock, b); err != nil {
		if hold != nil {
			hold.Abort(s.clock())
		}
		return nil, err
	}
	lease, err := s.commitSession(p, hold, e.Worker, id)
	if err != nil {
		// The session moved elsewhere: this cached selection can never book.
		s.pending.Consume(pk, gen)
		return nil, err
	}
	if e.SessionFinal {
		lease.EndOnRelease()
	}
	replayed := prompt{locals: e.BlockHashes, hashed: e.BlockHashes != nil}
	if len(e.TextBlockHashes) > 0 {
		replayed.alsoText = &prompt{locals: e.TextBlockHashes, tracking: kvhash.SequenceHashes(e.TextBlockHashes)}
	}
	s.recordRouting(p, e.Worker, replayed)
	s.resv.Install(id, &reservation.Row{Part: p, Worker: e.Worker, Lease: lease, Expected: e.ExpectedOutputTokens})
	s.repl.added(p, &b, e.LoraName)
	booked = true
	s.pending.Consume(pk, gen)
	return &ReservationResponse{SelectionID: id, ModelName: key.Model, RoutingGroup: key.RoutingGroup,
		WorkerID: e.Worker.WorkerID, DPRank: e.Worker.DPRank, Endpoint: rec.EndpointOrEmpty()}, nil
}

// PrefillComplete clears the booking's active prefill load: the response's
// first token came (POST /reservations/{id}/prefill_complete). Its time is
// the booking's observed TTFT, which the latency model fits.
func (s *Service) PrefillComplete(ctx context.Context, id string) error {
	return s.ResponseBegan(ctx, id, true)
}

// ResponseBegan is PrefillComplete for a caller that sees the response
// begin and knows whether its first byte is the first token: a streamed
// response's is, a whole JSON answer's first byte comes with its last
// token, so firstToken false clears the prefill without fitting a TTFT.
func (s *Service) ResponseBegan(ctx context.Context, id string, firstToken bool) error {
	r, err := s.resv.Booked(id)
	if err != nil {
		return err
	}
	if err := r.Part.Loads().PrefillComplete(id); err != nil {
		s.resv.Release(id, s.clock())
		return apierr.New(KindNotFound, "reservation %s not found", id)
	}
	r.Part.Wake()
	if firstToken {
		s.firstToken(r)
	}
	// Re-published on a repeated call, as Dynamo does.
	s.repl.changed(BookingPrefillCompleted, r.Part, id, r.Worker)
	if r.Prefill != "" {
		_ = s.Free(ctx, r.Prefill) // not found: freed already, or expired
	}
	return nil
}

// OutputBlock adds one output block to the booking's decode load (local only).
func (s *Service) OutputBlock(ctx context.Context, id string, decayFraction *float64) error {
	if f := decayFraction; f != nil && !(*f >= 0 && *f <= 1) {
		return apierr.New(KindBadRequest, "decay_fraction must be between 0.0 and 1.0")
	}
	r, err := s.resv.Booked(id)
	if err != nil {
		return err
	}
	if err := r.Part.Loads().AddOutputBlock(id, decayFraction); err != nil {
		s.resv.Release(id, s.clock())
		return apierr.New(KindNotFound, "reservation %s not found", id)
	}
	return nil
}

// OutputTokens reports that the booking's response has streamed generated
// output tokens in total (the ext_proc picker counts them in the SSE stream it
// relays). The booking grows by one output block per whole block_size tokens
// not counted before, each weighted toward the booking's expected output
// length as Dynamo's frontend weights its output blocks; it returns how many
// blocks were added. Output blocks stay local, as with OutputBlock. Errors:
// 400 for a negative count, 404 when the booking is gone.
func (s *Service) OutputTokens(ctx context.Context, id string, generated int) (added int, err error) {
	if generated < 0 {
		return 0, apierr.New(KindBadRequest, "output token count must not be negative, got %d", generated)
	}
	r, err := s.resv.Booked(id)
	if err != nil {
		return 0, err
	}
	added, err = r.Part.Loads().AddStreamedOutput(id, generated)
	if err != nil {
		s.resv.Release(id, s.clock())
		return 0, apierr.New(KindNotFound, "reservation %s not found", id)
	}
	r.Trace.Generated(generated)
	return added, nil
}

// Free releases the booking, its reservation row and session lease.
func (s *Service) Free(ctx context.Context, id string) error { return s.free(ctx, id, endByCaller) }

// free is Free by a caller, or the end of a booking kept to an estimated
// end (EndByEstimate) by that estimate or by its engine's counts: nothing is
// learnt from those, whose true end nobody saw.
func (s *Service) free(ctx context.Context, id string, by endBy) error {
	r, err := s.resv.Booked(id)
	if err != nil {
		return err
	}
	now := s.clock()
	end, estimated := s.resv.EndOf(id)
	ferr := r.Part.Loads().Free(id)
	s.resv.Release(id, now)
	r.Part.Wake()
	if r.Prefill != "" {
		_ = s.Free(ctx, r.Prefill) // not found: freed already, or expired
	}
	if ferr != nil {
		return apierr.New(KindNotFound, "reservation %s not found", id)
	}
	s.ended(r)
	switch {
	case by == endByEstimate:
		s.onBookingEnd(BookingEndEvent{Kind: BookingEndedByEstimate, Model: r.Part.Key().Model, Estimated: end.Lifetime.Seconds(),
			Unseen: end.Awaited(), UnseenBlock: end.BlockAwaited()})
	case by == endByEngine:
		s.onBookingEnd(BookingEndEvent{Kind: BookingEndedByEngine, Model: r.Part.Key().Model, Estimated: end.Lifetime.Seconds(),
			Actual: max(now.Sub(end.Start), 0).Seconds()})
	case !estimated:
		// A booking kept to an estimate and freed by its caller after all
		// says nothing of its true length: its response was not followed.
		s.endSeen(r, now)
	}
	s.repl.changed(BookingFreed, r.Part, id, r.Worker)
	return nil
}
