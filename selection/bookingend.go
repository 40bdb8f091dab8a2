package selection

// Bookings whose end nobody reports. A gateway that never sends the
// ext_proc response phase (NGINX Gateway Fabric's shim, an Envoy filter
// with response_header_mode SKIP) ends its stream right after the decision
// while the engine is still working: freeing the booking then leaves the
// loads blind. EndByEstimate keeps such a booking to an estimated end
// instead — an expiry time on its reservation row that the periodic upkeep
// (Maintain) acts on, marking the prefill complete at the estimated first
// token and freeing the booking at the estimated end, as a response path
// would have.

import (
	"cmp"
	"context"
	"math"
	"time"

	"github.com/kvselect/kvselect/selection/apierr"
	"github.com/kvselect/kvselect/selection/bookingend"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/latency"
	"github.com/kvselect/kvselect/selection/reservation"
)

// BookingEndKind says what a BookingEndEvent reports.
type BookingEndKind uint8

// Booking end kinds.
const (
	// BookingEndSet: a booking was given an estimated end; Estimated set.
	BookingEndSet BookingEndKind = iota
	// BookingEndedByEstimate: the upkeep freed a booking at its estimated
	// end; Estimated set.
	BookingEndedByEstimate
	// BookingEndSeen: a traced booking was freed by its caller (its end
	// was seen); Estimated is the lifetime its estimate would have been,
	// Actual the lifetime it had.
	BookingEndSeen
	// BookingEndedByEngine: a booking kept to its estimated end was freed
	// before it because its engine reported fewer requests than such
	// bookings on its rank (EngineCorrection); Estimated and Actual set.
	BookingEndedByEngine
	// BookingFirstTokenSeen: the engine stored the prompt of a booking
	// kept to an estimated end (prefillseen.go); Estimated is its
	// estimated time to first token, Actual the one seen.
	BookingFirstTokenSeen
	// BookingDecodeSeen: the engine stored a block of a booking's output
	// (reservation/decode.go) and its estimated end moved; Actual is the
	// output tokens its stored blocks hold.
	BookingDecodeSeen
)

// endBy says who ends a booking (free).
type endBy uint8

const (
	endByCaller   endBy = iota // Free: a caller saw the end
	endByEstimate              // the upkeep, at the estimated end
	endByEngine                // the engine's counts (endByEngineCounts)
)

// engineGrace is how long a booking may take to reach its engine's counts:
// the request's trip from the gateway, the engine's own work before it
// queues a request (an OpenAI server tokenizes the prompt first), and the
// scrape's duration (a snapshot is stamped when its answer was read). An
// estimated booking younger than this at a scrape is not compared with it,
// unless its engine already stored its prompt (prefillseen.go). Longer
// leaves finished requests booked for as long (behind NGINX at 60
// requests/s on llm-d-inference-sim, whose KV events come up to a second
// late: 0.5 s overcounted 16 requests on average, 0.15 s 7); shorter would
// end bookings the engine has not counted yet, such as a long prompt's
// still being tokenized.
const engineGrace = 250 * time.Millisecond

// BookingEndEvent is one booking end, for metrics (Config.OnBookingEnd).
// Lifetimes are in seconds from the booking.
type BookingEndEvent struct {
	Kind              BookingEndKind
	Model             string
	Estimated, Actual float64
	// Unseen, on BookingEndedByEstimate: the booking waited for a first
	// token its engine never reported, and was freed when it gave up;
	// UnseenBlock the same for a block of its output.
	Unseen, UnseenBlock bool
}

// EndByEstimate keeps booking id until its estimated end instead of
// freeing it: its caller will not see the response and cannot report the
// first token or the end. limit is the request's output limit (max_tokens;
// 0 none). The estimate (package bookingend) reads the latency model's
// predictions for the booking's rank as the decision made them, the
// request's expected output, and what the model's responses have been.
// It returns when the booking will be freed; 404 when the booking is gone,
// 409 when it has an estimated end already.
func (s *Service) EndByEstimate(ctx context.Context, id string, limit int) (time.Time, error) {
	r, err := s.resv.Booked(id)
	if err != nil {
		return time.Time{}, err
	}
	now := s.clock()
	est, start := s.estimate(r, limit, now)
	e := reservation.End{Start: start, PrefillAt: start.Add(est.TTFT), At: start.Add(est.Lifetime), Lifetime: est.Lifetime, TTFT: est.TTFT,
		Tokens: est.Tokens, Limit: limit, ITL: est.ITL, MaxLife: s.ends.Config().Max}
	e.Await = s.await(r, e)
	if !s.resv.SetEnd(id, r, e) {
		if _, err := s.resv.Booked(id); err != nil {
			return time.Time{}, err
		}
		return time.Time{}, apierr.New(KindConflict, "reservation %s already has an estimated end, or was moved meanwhile", id)
	}
	s.onBookingEnd(BookingEndEvent{Kind: BookingEndSet, Model: r.Part.Key().Model, Estimated: est.Lifetime.Seconds()})
	// Already due (a decision long ago, a zero estimate): act now rather
	// than at the next wake.
	if !e.PrefillAt.After(now) || !e.At.After(now) {
		s.endDue(ctx, now)
	}
	s.wakeEnds(e.PrefillAt) // never after e.At (bookingend.Estimate)
	return e.At, nil
}

// wakeEnds signals EndsChanged when at comes before the instant the ends
// loop sleeps until, or when that is unknown.
func (s *Service) wakeEnds(at time.Time) {
	if armed := s.endsArmed.Load(); armed != 0 && at.UnixNano() >= armed {
		return
	}
	select {
	case s.endsWake <- struct{}{}:
	default: // a wake is pending already
	}
}

// EndsChanged is signalled when a booking was given an estimated end due
// before the instant MaintainEnds last returned: a loop sleeping until that
// instant wakes and calls MaintainEnds again.
func (s *Service) EndsChanged() <-chan struct{} { return s.endsWake }

// estimate is r's estimated course and the time it counts from: the
// decision when the booking was traced, else now.
func (s *Service) estimate(r *reservation.Row, limit int, now time.Time) (bookingend.Estimate, time.Time) {
	model := r.Part.Key().Model
	req := bookingend.Request{Limit: limit}
	if r.Expected != nil {
		req.Expected = int(*r.Expected)
	}
	start := now
	if t := &r.Trace; t.Valid() {
		req.TTFT, req.ITL, start = t.PredictedTTFT, t.PredictedITL, t.Booked
		// The engine's own latest reading of its decode steps, when recent,
		// paces the decode instead: the prediction starts from a prior and
		// its first fits are unsteady (a few seconds of them behind a
		// gateway that shows no response), and a booking kept to an
		// estimated end carries its pace to the end.
		if itl, ok := s.latency.EngineITL(t.Key, now.Add(-engineITLFresh)); ok {
			req.ITL = itl
		}
	} else {
		// Untraced (a REST reservation made without a decision): the
		// model's pooled fit on an idle rank.
		c := s.latency.Pooled(model)
		req.TTFT, req.ITL = c.PredictTTFT(latency.Features{}), c.PredictITL(1)
	}
	return s.ends.Estimate(model, req), start
}

// engineITLFresh is how old an engine's inter-token reading may be to pace
// an estimated end: older, it describes another load.
const engineITLFresh = 10 * time.Second

// MaintainEnds does Maintain's share for bookings kept to an estimated end
// (EndByEstimate), alone: their prefill completes and they are freed once
// due. It returns the next instant something will be due (ok false: none
// is kept), which a server sleeps until, waking early on EndsChanged.
// Maintain's cadence (seconds) would keep each booking that much past its
// end, and behind a gateway that hides every response most requests last
// less than that: every millisecond a booking outlives its request is
// counted in the loads. It reads only what is due.
func (s *Service) MaintainEnds(ctx context.Context) (next time.Time, ok bool) {
	// Unknown while the next instant is read: an end set meanwhile
	// signals, so none is slept through.
	s.endsArmed.Store(0)
	s.endDue(ctx, s.clock())
	next, ok = s.resv.NextDue()
	if ok {
		s.endsArmed.Store(next.UnixNano())
	} else {
		s.endsArmed.Store(math.MaxInt64)
	}
	return next, ok
}

// endDue completes the prefills and frees the bookings whose estimated
// first token and end have come by now. A booking freed meanwhile is not
// found, which is fine.
func (s *Service) endDue(ctx context.Context, now time.Time) {
	prefill, ended := s.resv.Due(now)
	for _, id := range prefill {
		_ = s.ResponseBegan(ctx, id, false)
	}
	for _, id := range ended {
		_ = s.free(ctx, id, endByEstimate)
	}
}

// endByEngineCounts ends estimated bookings early by what rec's engine
// reported: the requests it runs and queues count every request on a rank,
// so a rank whose engine reports n of them while k > n estimated bookings
// there, old enough to have reached it, are kept has finished at least
// k − n of those. The oldest end first, as the oldest are the likeliest
// done. This is a lower bound whatever other traffic the engine serves
// (more requests only make n larger); bookings with a response path are
// left to it. An engine that does not label its ranks speaks for all of the
// worker's ranks together.
func (s *Service) endByEngineCounts(rec *catalog.Record, snap EngineSnapshot) {
	if snap.Err != "" || s.resv.Ending() == 0 {
		return
	}
	p := s.parts.Get(partitionOfRecord(rec))
	if p == nil {
		return
	}
	for rank, r := range snap.Ranks {
		n := r.Running + r.Waiting
		if !(n >= 0) || math.IsInf(n, 0) {
			continue // not a count: sanitized to 0 elsewhere, but 0 here would end everything
		}
		ranks := []uint32{rank}
		if rank == AllRanks {
			if len(snap.Ranks) > 1 {
				continue // per-rank figures too: those are compared
			}
			ranks = rec.Ranks()
		}
		ids := s.resv.EndingOn(p, rec.WorkerID, ranks, snap.At.Add(-engineGrace), cmp.Or(snap.Asked, snap.At))
		for _, id := range ids[:max(len(ids)-int(math.Ceil(n)), 0)] {
			_ = s.free(context.Background(), id, endByEngine) // not found: freed meanwhile
		}
	}
}

// endSeen learns from a booking freed by its caller: the output tokens its
// response streamed (when counted) and, when it was traced, how far its
// estimate would have been from the lifetime it had.
func (s *Service) endSeen(r *reservation.Row, now time.Time) {
	model := r.Part.Key().Model
	t := &r.Trace
	if !t.Valid() {
		return
	}
	est, start := s.estimate(r, 0, now)
	s.ends.Observe(model, t.Tokens())
	s.onBookingEnd(BookingEndEvent{Kind: BookingEndSeen, Model: model, Estimated: est.Lifetime.Seconds(),
		Actual: max(now.Sub(start), 0).Seconds()})
}

// EstimatedEnds counts the bookings being kept to an estimated end.
func (in *Inspector) EstimatedEnds() int { return in.s.resv.Ending() }
