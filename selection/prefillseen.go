package selection

// First tokens read in the engines' KV events. An engine with prefix
// caching stores a prompt's blocks when it begins computing them: vLLM
// caches every full block, publishing BlockStored, when the scheduler
// allocates the step that computes it (vllm/v1/core/kv_cache_manager.py,
// KVCacheManager.allocate_slots), and that step samples the first token.
// So for a booking kept to an estimated end (bookingend.go) whose prompt's
// last full block is named by a hash the engine's events carry (the prompt
// was hashed from its token ids) and was not cached on its rank, that block
// arriving stored on the rank is its first token, give or take one step
// (depending on its version, vLLM publishes a step's events when it
// schedules the step or once it has processed the step's output):
//
//   - the end is the estimated decode after it (reservation.End): a
//     request that waited in the engine's queue ends that much later, one
//     the engine began sooner than estimated that much earlier;
//   - until it comes, a booking whose engine stores blocks is not freed at
//     its estimated end: a request still queued is still in flight. It waits
//     awaitFactor times its estimated lifetime (at least awaitFloor beyond
//     it, never past --booking-estimate-max) before giving up, counted as
//     first_token_unseen.
//
// A prompt whose last block was cached stores nothing and keeps its
// estimate.

import (
	"context"
	"time"

	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/partition"
	"github.com/kvselect/kvselect/selection/reservation"
)

const (
	// awaitFactor and awaitFloor bound how long past its estimated end a
	// booking waits for its engine to begin it: a queue several times a
	// request's own length is an overload the engine's counts also show
	// (endByEngineCounts), and lost events must not keep a booking for
	// minutes.
	awaitFactor = 4
	awaitFloor  = time.Second
	// storesRecent is how recently a rank must have stored a block for its
	// first tokens to be awaited: a rank that stores nothing (prefix
	// caching off, events not flowing) would never report one.
	storesRecent = time.Minute
)

// await is when a booking with estimate e gives up waiting for its first
// token, or zero when its engine will not report one.
func (s *Service) await(r *reservation.Row, e reservation.End) time.Time {
	if !r.StoreExpected || !s.resv.StoresWithin(r.Part, r.Worker, e.Start.Add(-storesRecent)) {
		return time.Time{}
	}
	wait := min(max(awaitFactor*e.Lifetime, e.Lifetime+awaitFloor), s.ends.Config().Max)
	return e.Start.Add(wait)
}

// storedSeen reads a batch of part's applied KV events for the prompts
// bookings wait for (RankAttachment.Applied), and notes which ranks store
// blocks. It runs on the listener's lane: one lock per Stored event, and
// the blocks are read only while a booking waits.
func (s *Service) storedSeen(key index.Partition, evs []index.Event) {
	p := s.parts.Get(key)
	if p == nil {
		return
	}
	now := s.clock()
	for i := range evs {
		ev := &evs[i]
		if ev.Kind != index.EventStored || ev.Tier != index.TierDevice || len(ev.Blocks) == 0 {
			continue
		}
		if pr, ok := s.resv.Decoded(p, ev, p.BlockSize(), now); ok {
			s.decodeSeen(p, pr)
		}
		for _, ft := range s.resv.Stored(p, ev.Worker, ev.Blocks, now) {
			s.firstTokenSeen(ft, now)
		}
	}
}

// decodeSeen acts on a booking's decode progress an engine reported: the
// ends loop wakes if the end came nearer.
func (s *Service) decodeSeen(p *partition.Partition, pr reservation.Progress) {
	s.wakeEnds(pr.Due)
	s.onBookingEnd(BookingEndEvent{Kind: BookingDecodeSeen, Model: p.Key().Model, Actual: float64(pr.Generated)})
}

// firstTokenSeen acts on a first token an engine reported: the prefill
// completes, as a response path would have said, unless the estimate had
// done so; the ends loop wakes if the end came nearer.
func (s *Service) firstTokenSeen(ft reservation.FirstToken, now time.Time) {
	if ft.Began {
		_ = s.ResponseBegan(context.Background(), ft.ID, false) // not found: freed meanwhile
	}
	s.wakeEnds(ft.Due)
	s.onBookingEnd(BookingEndEvent{Kind: BookingFirstTokenSeen, Model: ft.Part.Key().Model,
		Estimated: ft.TTFT.Seconds(), Actual: max(now.Sub(ft.Start), 0).Seconds()})
}
