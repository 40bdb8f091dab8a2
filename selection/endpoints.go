package selection

import (
	"context"
	"fmt"
	"strings"

	"github.com/kvselect/kvselect/selection/apierr"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/loads"
	"github.com/kvselect/kvselect/selection/partition"
)

// RankEndpoint is a schedulable (worker, dp rank) with its worker's endpoint:
// the unit a gateway front addresses (GIE protocol 004 endpoints are the
// workers' ip:port; the rank travels in a request header).
type RankEndpoint struct {
	WorkerID uint64
	DPRank   uint32
	Endpoint string
}

// RebookServed attributes a live booking to the rank at addr, the host:port a
// gateway reports as having served the request (GIE protocol 004's served
// endpoint) when it differs from the one selection chose; addresses compare
// as catalog.Address writes a worker's endpoint. The rank is, in order:
//
//   - the booking's own rank, when its worker is at addr (nothing moves);
//   - the first of preferred whose worker is at addr: the fallbacks the front
//     offered in order, each a rank selection ranked for this request;
//   - the one schedulable rank of the partition at addr.
//
// An address several ranks share — a data-parallel worker's, or one endpoint
// registered for several workers — names no rank: the booking stays where it
// is and the call fails with 409 (KindConflict) naming them. An address no
// schedulable worker has is a 404, as is an unknown booking. The move itself
// is rebook's.
func (s *Service) RebookServed(ctx context.Context, id, addr string, preferred []WorkerRank) (*ReservationResponse, error) {
	r, err := s.resv.Booked(id)
	if err != nil {
		return nil, err
	}
	p := r.Part
	ws := p.Workers()
	at := func(workerID uint64) bool {
		rec, ok := ws.ByID[workerID]
		return ok && catalog.Address(rec.EndpointOrEmpty()) == addr
	}
	to, found := WorkerRank{WorkerID: r.Worker.WorkerID, DPRank: r.Worker.DPRank}, at(r.Worker.WorkerID)
	for _, w := range preferred {
		if found {
			break
		}
		if _, ok := ws.Rank(index.WorkerKey{WorkerID: w.WorkerID, DPRank: w.DPRank}); ok && at(w.WorkerID) {
			to, found = w, true
		}
	}
	if !found {
		var ranks []index.WorkerKey
		for _, w := range ws.Ranks {
			if at(w.WorkerID) {
				ranks = append(ranks, w)
			}
		}
		switch len(ranks) {
		case 0:
			return nil, apierr.New(KindNotFound, "no schedulable worker of %s is at %s", partition.Name(p.Key()), addr)
		case 1:
			to = WorkerRank{WorkerID: ranks[0].WorkerID, DPRank: ranks[0].DPRank}
		default:
			return nil, apierr.New(KindConflict, "%s is the address of %d ranks of %s (%s): the served rank is ambiguous, booking %s stays on worker %d dp_rank %d",
				addr, len(ranks), partition.Name(p.Key()), rankList(ranks), id, r.Worker.WorkerID, r.Worker.DPRank)
		}
	}
	return s.rebook(ctx, id, to)
}

// rankList writes ranks as "worker 1 dp_rank 0, worker 1 dp_rank 1", at most
// eight of them.
func rankList(ranks []index.WorkerKey) string {
	var b strings.Builder
	for i, w := range ranks {
		if i == 8 {
			fmt.Fprintf(&b, ", … %d more", len(ranks)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "worker %d dp_rank %d", w.WorkerID, w.DPRank)
	}
	return b.String()
}

// rebook moves a live booking to another schedulable rank of its partition,
// keeping its id, admission time, prompt blocks, remaining prefill and output
// blocks. The ext_proc front calls it when the gateway reports that a
// fallback endpoint served the request instead of the chosen one, so load is
// attributed to the rank that carries it. A session binding made by the
// booking stays where selection put it. Moving to the current rank is a
// successful no-op. Errors: 404 for an unknown booking or rank. The move is
// published to replica peers as a free plus an admission.
func (s *Service) rebook(ctx context.Context, id string, to WorkerRank) (*ReservationResponse, error) {
	if err := s.gate.Admit(); err != nil {
		return nil, err
	}
	r, err := s.resv.Booked(id)
	if err != nil {
		return nil, err
	}
	p := r.Part
	w := index.WorkerKey{WorkerID: to.WorkerID, DPRank: to.DPRank}
	rec, ok := p.Workers().Rank(w)
	if !ok {
		return nil, apierr.New(KindNotFound, "schedulable worker %d (dp_rank %d) not found for %s", to.WorkerID, to.DPRank, partition.Name(p.Key()))
	}
	if w != r.Worker {
		prefill, err := p.Move(id, w)
		if err != nil {
			return nil, err
		}
		// A free racing this move may have dropped the row (and a new booking
		// may reuse the id); only the row read above follows the load.
		s.resv.Move(id, r, w)
		p.Wake()
		// Peers see the move as a free on the old rank and an admission on
		// the new one. The booking keeps no tracking hashes, so the peers'
		// mirror carries its request and remaining prefill, not its blocks.
		s.repl.changed(BookingFreed, p, id, r.Worker)
		s.repl.added(p, &loads.Booking{RequestID: id, Worker: w, PrefillTokens: prefill, TrackPrefill: prefill > 0}, "")
	}
	return &ReservationResponse{SelectionID: id, ModelName: p.Key().Model, RoutingGroup: p.Key().RoutingGroup,
		WorkerID: w.WorkerID, DPRank: w.DPRank, Endpoint: rec.EndpointOrEmpty()}, nil
}
