package selection

import (
	"context"

	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/loads"
)

// RankEndpoint is a schedulable (worker, dp rank) with its worker's endpoint:
// the unit a gateway front addresses (GIE protocol 004 endpoints are the
// workers' ip:port; the rank travels in a request header).
type RankEndpoint struct {
	WorkerID uint64
	DPRank   uint32
	Endpoint string
}

// fallbacksOf turns the decision's ordered alternatives into endpoints.
func fallbacksOf(d *decision) []RankEndpoint {
	if len(d.alts) == 0 {
		return nil
	}
	ws := d.part.workers.Load()
	out := make([]RankEndpoint, 0, len(d.alts))
	for _, a := range d.alts {
		if rec, ok := ws.rank(a.Worker); ok {
			out = append(out, RankEndpoint{WorkerID: a.Worker.WorkerID, DPRank: a.Worker.DPRank, Endpoint: rec.EndpointOrEmpty()})
		}
	}
	return out
}

// Endpoints lists the schedulable ranks of a partition with their workers'
// endpoints, sorted by (worker_id, dp_rank): what a front needs to translate a
// gateway's endpoint addresses (a subset hint, a served endpoint) into worker
// ids. It reads the partition's published snapshot and takes no lock.
func (s *Service) Endpoints(key PartitionKey) []RankEndpoint {
	p := s.partition(partitionOf(key))
	if p == nil {
		return nil
	}
	ws := p.workers.Load()
	out := make([]RankEndpoint, 0, len(ws.ranks))
	for _, w := range ws.ranks {
		out = append(out, RankEndpoint{WorkerID: w.WorkerID, DPRank: w.DPRank, Endpoint: ws.byID[w.WorkerID].EndpointOrEmpty()})
	}
	return out
}

// Rebook moves a live booking to another schedulable rank of its partition,
// keeping its id, admission time, prompt blocks, remaining prefill and output
// blocks. The ext_proc front calls it when the gateway reports that a
// fallback endpoint served the request instead of the chosen one, so load is
// attributed to the rank that carries it. A session binding made by the
// booking stays where selection put it. Moving to the current rank is a
// successful no-op. Errors: 404 for an unknown booking or rank. The move is
// published to replica peers as a free plus an admission.
func (s *Service) Rebook(ctx context.Context, id string, to WorkerRank) (*ReservationResponse, error) {
	if s.shutting.Load() {
		return nil, errShuttingDown()
	}
	r, err := s.booked(id)
	if err != nil {
		return nil, err
	}
	p := r.part
	w := index.WorkerKey{WorkerID: to.WorkerID, DPRank: to.DPRank}
	rec, ok := p.workers.Load().rank(w)
	if !ok {
		return nil, newError(KindNotFound, "schedulable worker %d (dp_rank %d) not found for %s", to.WorkerID, to.DPRank, displayKey(p.key))
	}
	if w != r.worker {
		p.schedMu.Lock()
		prefill, err := p.loads.Move(id, w)
		p.schedMu.Unlock()
		if err != nil {
			return nil, loadsError(err)
		}
		s.resvMu.Lock()
		if cur, ok := s.resv[id]; ok && cur == r {
			moved := *r
			moved.worker = w
			s.resv[id] = &moved
		}
		s.resvMu.Unlock()
		p.wake()
		// Peers see the move as a free on the old rank and an admission on
		// the new one. The booking keeps no tracking hashes, so the peers'
		// mirror carries its request and remaining prefill, not its blocks.
		s.replicate(BookingFreed, p, id, r.worker)
		s.replicateAdd(p, &loads.Booking{RequestID: id, Worker: w, PrefillTokens: prefill, TrackPrefill: prefill > 0}, "")
	}
	return &ReservationResponse{SelectionID: id, ModelName: p.key.Model, RoutingGroup: p.key.RoutingGroup,
		WorkerID: w.WorkerID, DPRank: w.DPRank, Endpoint: rec.EndpointOrEmpty()}, nil
}
