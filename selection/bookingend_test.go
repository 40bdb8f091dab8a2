package selection

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/reservation"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

// endRecorder collects the booking end events.
type endRecorder struct {
	mu     sync.Mutex
	events []BookingEndEvent
}

func (r *endRecorder) record(e BookingEndEvent) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func (r *endRecorder) count(k BookingEndKind) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if e.Kind == k {
			n++
		}
	}
	return n
}

func newEndService(t *testing.T) (*Service, *fakeClock, *endRecorder) {
	t.Helper()
	rc := routerconfig.Default()
	rc.UseKVEvents = false
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	rec := &endRecorder{}
	s, err := New(Config{Router: rc, Clock: clock.Now, Rand: rand.New(rand.NewPCG(1, 2)), OnBookingEnd: rec.record, KeepsEstimatedEnds: true})
	if err != nil {
		t.Fatal(err)
	}
	mustUpsert(t, s, workerRec(1))
	return s, clock, rec
}

// TestEstimatedEndKeepsBookingsUntilTheirEnd runs with the upkeep's whole
// Maintain and with MaintainEnds, the finer tick a server runs while it keeps
// bookings to estimated ends: either completes the prefill and frees them.
func TestEstimatedEndKeepsBookingsUntilTheirEnd(t *testing.T) {
	for _, tc := range []struct {
		name     string
		maintain func(*Service)
	}{
		{"Maintain", func(s *Service) { s.Maintain(bg) }},
		{"MaintainEnds", func(s *Service) { s.MaintainEnds(bg) }},
	} {
		t.Run(tc.name, func(t *testing.T) { estimatedEndsKept(t, tc.maintain) })
	}
}

func estimatedEndsKept(t *testing.T, maintain func(*Service)) {
	s, clock, rec := newEndService(t)
	const n = 4
	// Each decision's predictions see the bookings before it: the ends
	// differ, first and last bound them.
	var first, last time.Time
	for i := range n {
		req := selReq(fmt.Sprintf("e%d", i), 1, 2, 3, 4, 5, 6, 7, 8)
		req.ExpectedOutputTokens = ptr(uint32(200))
		if _, err := s.SelectAndReserve(bg, req); err != nil {
			t.Fatal(err)
		}
		end, err := s.EndByEstimate(bg, *req.SelectionID, 0)
		if err != nil {
			t.Fatal(err)
		}
		if first.IsZero() || end.Before(first) {
			first = end
		}
		if end.After(last) {
			last = end
		}
	}
	if l := loadOf(t, s); l.ActiveRequests != n || l.PotentialPrefillTokens == 0 {
		t.Fatalf("loads right after the decisions = %+v, want %d active, prefilling", l, n)
	}
	e, ok := s.resv.EndOf("e0")
	if !ok || !e.PrefillAt.Before(e.At) || !e.At.After(clock.Now()) {
		t.Fatalf("estimated end = %+v, %v; want a first token before a future end", e, ok)
	}
	_, err := s.EndByEstimate(bg, "e0", 0)
	wantKind(t, err, KindConflict, "already has an estimated end")

	// Past the estimated first token: the prefill load goes, the requests stay.
	clock.Add(e.PrefillAt.Sub(clock.Now()))
	maintain(s)
	if l := loadOf(t, s); l.ActiveRequests != n || l.PotentialPrefillTokens != 0 {
		t.Fatalf("loads after the estimated first tokens = %+v, want %d active, none prefilling", l, n)
	}
	// Just before the end nothing is freed; at it, everything is.
	clock.Add(first.Sub(clock.Now()) - time.Millisecond)
	maintain(s)
	if l := loadOf(t, s); l.ActiveRequests != n {
		t.Fatalf("loads before the estimated end = %+v", l)
	}
	clock.Add(last.Sub(clock.Now()))
	maintain(s)
	if l := loadOf(t, s); l.ActiveRequests != 0 || l.PotentialDecodeBlocks != 0 {
		t.Fatalf("loads after the estimated end = %+v, want none", l)
	}
	if s.Inspect().EstimatedEnds() != 0 || rec.count(BookingEndSet) != n || rec.count(BookingEndedByEstimate) != n {
		t.Fatalf("%d still ending, events %+v", s.Inspect().EstimatedEnds(), rec.events)
	}
	wantKind(t, s.Free(bg, "e0"), KindNotFound, "reservation e0 not found")
}

func TestEstimatedEndFreedEarlierByItsCaller(t *testing.T) {
	s, _, rec := newEndService(t)
	if _, err := s.SelectAndReserve(bg, selReq("x", 1, 2, 3, 4)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.EndByEstimate(bg, "x", 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Free(bg, "x"); err != nil {
		t.Fatal(err)
	}
	if s.Inspect().EstimatedEnds() != 0 || rec.count(BookingEndSeen) != 0 {
		t.Fatalf("a freed estimated booking left %d ends, %d seen events (its length is unknown)", s.Inspect().EstimatedEnds(), rec.count(BookingEndSeen))
	}
	_, err := s.EndByEstimate(bg, "gone", 0)
	wantKind(t, err, KindNotFound, "reservation gone not found")
}

func TestEstimatedEndLearnsTheModelsLengths(t *testing.T) {
	s, clock, rec := newEndService(t)
	// Seen ends: responses of 1000 tokens, counted by the response path.
	for i := range 8 {
		id := fmt.Sprintf("seen%d", i)
		if _, err := s.SelectAndReserve(bg, selReq(id, 1, 2, 3, 4)); err != nil {
			t.Fatal(err)
		}
		clock.Add(time.Second)
		if _, err := s.OutputTokens(bg, id, 1000); err != nil {
			t.Fatal(err)
		}
		if err := s.Free(bg, id); err != nil {
			t.Fatal(err)
		}
	}
	if rec.count(BookingEndSeen) != 8 {
		t.Fatalf("seen events = %d, want 8", rec.count(BookingEndSeen))
	}
	if got, ok := s.ends.Learnt("model"); !ok || got != 1000 {
		t.Fatalf("learnt = %v, %v; want 1000", got, ok)
	}
	if _, err := s.SelectAndReserve(bg, selReq("long", 1, 2, 3, 4)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SelectAndReserve(bg, selReq("short", 1, 2, 3, 4)); err != nil {
		t.Fatal(err)
	}
	long, _ := s.EndByEstimate(bg, "long", 0)
	short, _ := s.EndByEstimate(bg, "short", 10) // max_tokens 10
	if !short.Before(long) {
		t.Fatalf("end with a 10-token limit %v not before the learnt 1000-token end %v", short, long)
	}
}

// An engine that runs fewer requests than the bookings kept to an estimate
// on its rank ends the oldest of those early; younger ones (not yet in its
// counts) and bookings whose end a caller will report stay.
func TestEngineCountsEndTheOldestEstimatedBookings(t *testing.T) {
	s, clock, rec := newEndService(t)
	book := func(id string, estimated bool) {
		t.Helper()
		if _, err := s.SelectAndReserve(bg, selReq(id, 1, 2, 3, 4)); err != nil {
			t.Fatal(err)
		}
		if estimated {
			if _, err := s.EndByEstimate(bg, id, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	book("old1", true)
	clock.Add(time.Second)
	book("old2", true)
	clock.Add(time.Second)
	book("old3", true)
	book("followed", false)
	clock.Add(3 * time.Second)
	book("young", true) // booked after the scrape's grace: not in its counts yet
	report := func(running, waiting float64) {
		t.Helper()
		if !s.ReportEngineMetrics(1, EngineSnapshot{At: clock.Now(), Ranks: map[uint32]EngineRank{AllRanks: {Running: running, Waiting: waiting}}}) {
			t.Fatal("report dropped")
		}
	}
	report(2, 1) // 3 ≥ the 3 old estimated bookings: nothing to end
	if got := loadOf(t, s).ActiveRequests; got != 5 {
		t.Fatalf("active = %d after a report that accounts for every booking, want 5", got)
	}
	report(1, 0) // one request runs: at least two of the three old ones are done
	for id, want := range map[string]bool{"old1": false, "old2": false, "old3": true, "followed": true, "young": true} {
		if _, err := s.resv.Booked(id); (err == nil) != want {
			t.Errorf("%s booked = %v, want %v", id, err == nil, want)
		}
	}
	if rec.count(BookingEndedByEngine) != 2 {
		t.Fatalf("ended by engine = %d, want 2", rec.count(BookingEndedByEngine))
	}
	if !s.ReportEngineMetrics(1, EngineSnapshot{At: clock.Now(), Err: "status 500"}) || s.Inspect().EstimatedEnds() != 2 {
		t.Fatalf("a failed scrape ended bookings: %d left", s.Inspect().EstimatedEnds())
	}
}

// storedEvent is a batch of one Stored event of worker's rank 0 holding
// blocks (public hashes; the engine's own hashes are the same numbers).
func storedEvent(worker uint64, blocks ...uint64) []index.Event {
	ev := index.Event{Worker: index.WorkerKey{WorkerID: worker}, Kind: index.EventStored}
	for _, b := range blocks {
		ev.Blocks = append(ev.Blocks, index.Block{Ext: b, Local: b})
	}
	return []index.Event{ev}
}

// bookEstimated books id for tokens and keeps it to its estimated end.
func bookEstimated(t *testing.T, s *Service, id string, tokens ...uint32) (*reservation.Row, reservation.End) {
	t.Helper()
	req := selReq(id, tokens...)
	req.ExpectedOutputTokens = ptr(uint32(100))
	if _, err := s.SelectAndReserve(bg, req); err != nil {
		t.Fatal(err)
	}
	if _, err := s.EndByEstimate(bg, id, 0); err != nil {
		t.Fatal(err)
	}
	row, err := s.resv.Booked(id)
	if err != nil || !row.LastBlockKnown {
		t.Fatalf("row %+v, %v: want its last block known (a token prompt)", row, err)
	}
	e, _ := s.resv.EndOf(id)
	return row, e
}

// TestStoredLastBlockMovesTheEstimatedEnd: the engine storing a booking's
// last prompt block is its first token: later or earlier than estimated,
// the end moves as much. A block stored on another rank, another block, or
// another model's, says nothing.
func TestStoredLastBlockMovesTheEstimatedEnd(t *testing.T) {
	for _, tc := range []struct {
		name string
		// shift is when the block is stored, from the estimated first
		// token; acted is whether the upkeep acted on that estimate first.
		shift time.Duration
		acted bool
	}{
		{"late, after the estimated first token was acted on", 300 * time.Millisecond, true},
		{"late, before the upkeep woke", 300 * time.Millisecond, false},
		{"early", -5 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, clock, rec := newEndService(t)
			row, est := bookEstimated(t, s, "w", 1, 2, 3, 4, 5, 6, 7, 8)
			if tc.acted {
				clock.Add(est.PrefillAt.Sub(clock.Now()))
				s.MaintainEnds(bg)
			}
			seenAt := est.PrefillAt.Add(tc.shift)
			clock.Add(seenAt.Sub(clock.Now()))
			part := row.Part.Key()
			s.storedSeen(part, storedEvent(2, row.LastBlock))                            // another worker
			s.storedSeen(part, storedEvent(1, row.LastBlock^1))                          // another block
			s.storedSeen(index.Partition{Model: "other"}, storedEvent(1, row.LastBlock)) // another model
			if got, _ := s.resv.EndOf("w"); !got.At.Equal(est.At) || rec.count(BookingFirstTokenSeen) != 0 {
				t.Fatalf("end moved to %v by a block that is not the booking's (estimated %v)", got.At, est.At)
			}
			s.storedSeen(part, storedEvent(1, row.LastBlock-1, row.LastBlock))
			got, _ := s.resv.EndOf("w")
			want := est
			want.PrefillAt, want.At = seenAt, seenAt.Add(est.At.Sub(est.PrefillAt))
			if !got.At.Equal(want.At) || !got.PrefillAt.Equal(want.PrefillAt) || rec.count(BookingFirstTokenSeen) != 1 {
				t.Fatalf("after the block was stored: end %+v, want first token %v and end %v (%d seen)", got, want.PrefillAt, want.At, rec.count(BookingFirstTokenSeen))
			}
			if l := loadOf(t, s); l.PotentialPrefillTokens != 0 || l.ActiveRequests != 1 {
				t.Fatalf("loads once the first token was seen = %+v, want the prefill complete, still active", l)
			}
			// Stored again (another request's prompt): the end stays.
			clock.Add(time.Millisecond)
			s.storedSeen(part, storedEvent(1, row.LastBlock))
			if again, _ := s.resv.EndOf("w"); !again.At.Equal(got.At) {
				t.Fatalf("a second store moved the end again: %v, was %v", again.At, got.At)
			}
			if next, ok := s.MaintainEnds(bg); !ok || next.After(got.At) {
				t.Fatalf("next due = %v, %v; want no later than the end %v", next, ok, got.At)
			}
			clock.Add(got.At.Sub(clock.Now()))
			s.MaintainEnds(bg)
			if s.Inspect().EstimatedEnds() != 0 || s.resv.Watching() {
				t.Fatalf("at the end: %d ends left, watching %v", s.Inspect().EstimatedEnds(), s.resv.Watching())
			}
		})
	}
}

// TestAwaitedFirstTokenKeepsTheBooking: on a rank whose engine stores
// blocks, a booking whose last block is not cached there is kept past its
// estimated end until its engine begins it, or until it gives up waiting.
func TestAwaitedFirstTokenKeepsTheBooking(t *testing.T) {
	s, clock, rec := newEndService(t)
	// Without a store from the rank first, nothing is awaited.
	coldRow, cold := bookEstimated(t, s, "cold", 101, 102, 103, 104)
	if !cold.Await.IsZero() {
		t.Fatalf("awaits a first token from a rank that never stored a block: %+v", cold)
	}
	s.storedSeen(coldRow.Part.Key(), storedEvent(1, 999)) // the rank's events flow
	row, est := bookEstimated(t, s, "queued", 1, 2, 3, 4, 5, 6, 7, 8)
	if est.Await.IsZero() || !est.Await.After(est.At) || est.Await.Sub(est.Start) > s.ends.Config().Max {
		t.Fatalf("end %+v: want the first token awaited past the estimated end, within the cap", est)
	}
	// The estimated end passes: the request is still queued, so kept.
	clock.Add(est.At.Sub(clock.Now()) + time.Millisecond)
	s.MaintainEnds(bg)
	if _, err := s.resv.Booked("queued"); err != nil {
		t.Fatal("freed at its estimated end while its first token was awaited")
	}
	if _, err := s.resv.Booked("cold"); err == nil {
		t.Fatal("the unawaited booking outlived its estimated end")
	}
	// The engine begins it late: the end is the decode estimate from then.
	seen := clock.Now().Add(2 * time.Second)
	clock.Add(seen.Sub(clock.Now()))
	s.storedSeen(row.Part.Key(), storedEvent(1, row.LastBlock))
	got, _ := s.resv.EndOf("queued")
	if want := seen.Add(est.At.Sub(est.PrefillAt)); !got.At.Equal(want) {
		t.Fatalf("end after the late first token = %v, want %v", got.At, want)
	}
	if next, _ := s.MaintainEnds(bg); !next.Equal(got.At) {
		t.Fatalf("next due %v, want the moved end %v", next, got.At)
	}

	// Never begun (events lost): freed when it gives up waiting.
	_, lost := bookEstimated(t, s, "lost", 11, 12, 13, 14, 15, 16, 17, 18)
	if lost.Await.IsZero() {
		t.Fatal("no first token awaited on a rank whose events flow")
	}
	clock.Add(lost.Await.Sub(clock.Now()) - time.Millisecond)
	s.MaintainEnds(bg)
	if _, err := s.resv.Booked("lost"); err != nil {
		t.Fatal("gave up before its wait was over")
	}
	clock.Add(time.Millisecond)
	s.MaintainEnds(bg)
	if _, err := s.resv.Booked("lost"); err == nil {
		t.Fatal("still kept once its wait was over")
	}
	var unseen []bool
	for _, e := range rec.events {
		if e.Kind == BookingEndedByEstimate {
			unseen = append(unseen, e.Unseen)
		}
	}
	// cold at its estimate, queued at its moved end, lost when it gave up.
	if !slices.Equal(unseen, []bool{false, false, true}) {
		t.Fatalf("ends by estimate, unseen: %v; want only the lost one", unseen)
	}
}

// TestStoredBeforeTheHangUp: an engine may begin a request before its
// gateway's stream ends; the store is kept for the estimate, which then
// awaits nothing.
func TestStoredBeforeTheHangUp(t *testing.T) {
	s, clock, _ := newEndService(t)
	req := selReq("early", 1, 2, 3, 4, 5, 6, 7, 8)
	if _, err := s.SelectAndReserve(bg, req); err != nil {
		t.Fatal(err)
	}
	row, _ := s.resv.Booked("early")
	s.storedSeen(row.Part.Key(), storedEvent(1, 999))
	s.storedSeen(row.Part.Key(), storedEvent(1, row.LastBlock))
	if _, err := s.EndByEstimate(bg, "early", 0); err != nil {
		t.Fatal(err)
	}
	e, _ := s.resv.EndOf("early")
	if e.Await.IsZero() {
		t.Fatalf("end %+v: want a first token expected (the rank stores blocks)", e)
	}
	clock.Add(e.At.Sub(clock.Now()))
	s.MaintainEnds(bg)
	if _, err := s.resv.Booked("early"); err == nil {
		t.Fatal("a booking its engine began already was kept past its estimated end, waiting for its first token")
	}
}

func TestWatchesAreDroppedWithTheirBookings(t *testing.T) {
	s, _, _ := newEndService(t)
	for i := range 3 {
		// Same prompt, same rank: one block, three bookings on it.
		if _, err := s.SelectAndReserve(bg, selReq(fmt.Sprintf("d%d", i), 1, 2, 3, 4)); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.resv.Watches(); n != 3 {
		t.Fatalf("%d watches, want 3", n)
	}
	if err := s.Free(bg, "d1"); err != nil {
		t.Fatal(err)
	}
	if n := s.resv.Watches(); n != 2 {
		t.Fatalf("after a free: %d watches, want 2", n)
	}
	// Expired rather than freed: the watch goes too.
	s.resv.Release("d0", s.clock())
	if err := s.Free(bg, "d2"); err != nil {
		t.Fatal(err)
	}
	if s.resv.Watching() || s.resv.Watches() != 0 {
		t.Fatalf("%d watches left after every booking went", s.resv.Watches())
	}
}

func TestTextPromptsAreNotWatched(t *testing.T) {
	s, _, _ := newEndService(t)
	req := &SelectRequest{PartitionKey: PartitionKey{ModelName: "model"}, PromptRequest: PromptRequest{PromptText: strings.Repeat("a text prompt hashed by its characters, not its tokens. ", 20)}}
	req.SelectionID = ptr("t")
	if _, err := s.SelectAndReserve(bg, req); err != nil {
		t.Fatal(err)
	}
	if s.resv.Watching() {
		t.Fatal("a text prompt's booking waits for a block hash no engine event carries")
	}
}

// TestEngineCountsSeeABookingWhosePromptWasStored: a booking younger than
// the scrape's grace is compared with the engine's counts once the engine
// stored its prompt, since it has reached the engine: by counts asked for
// after that, not by a scrape sent before it and answered after.
func TestEngineCountsSeeABookingWhosePromptWasStored(t *testing.T) {
	s, clock, _ := newEndService(t)
	for _, id := range []string{"stored", "unseen"} {
		req := selReq(id, 1, 2, 3, 4, 5, 6, 7, 8)
		if id == "unseen" {
			req = selReq(id, 9, 10, 11, 12)
		}
		if _, err := s.SelectAndReserve(bg, req); err != nil {
			t.Fatal(err)
		}
		if _, err := s.EndByEstimate(bg, id, 0); err != nil {
			t.Fatal(err)
		}
	}
	row, _ := s.resv.Booked("stored")
	asked := s.clock()
	clock.Add(time.Millisecond)
	s.storedSeen(row.Part.Key(), []index.Event{{Worker: row.Worker, Kind: index.EventStored,
		Blocks: []index.Block{{Ext: 1, Local: row.LastBlock}}}})
	clock.Add(time.Millisecond)
	s.ReportEngineMetrics(1, EngineSnapshot{At: s.clock(), Asked: asked, Ranks: map[uint32]EngineRank{AllRanks: {}}})
	if _, err := s.resv.Booked("stored"); err != nil {
		t.Fatal("counts asked for before the prompt was stored ended its booking")
	}
	if !s.ReportEngineMetrics(1, EngineSnapshot{At: s.clock(), Ranks: map[uint32]EngineRank{AllRanks: {}}}) {
		t.Fatal("report dropped")
	}
	for id, want := range map[string]bool{"stored": false, "unseen": true} {
		if _, err := s.resv.Booked(id); (err == nil) != want {
			t.Errorf("%s booked = %v after the engine reported none running, want %v", id, err == nil, want)
		}
	}
}

// TestNoWatchesWithoutEstimatedEnds: a service whose fronts never keep a
// booking to an estimated end gives no booking a watch.
func TestNoWatchesWithoutEstimatedEnds(t *testing.T) {
	rc := routerconfig.Default()
	rc.UseKVEvents = false
	s, err := New(Config{Router: rc, Rand: rand.New(rand.NewPCG(1, 2))})
	if err != nil {
		t.Fatal(err)
	}
	mustUpsert(t, s, workerRec(1))
	if _, err := s.SelectAndReserve(bg, selReq("n", 1, 2, 3, 4, 5, 6, 7, 8)); err != nil {
		t.Fatal(err)
	}
	if s.resv.Watching() {
		t.Fatal("a booking watches for a first token no front will use")
	}
}

// TestOutputBlocksMoveTheEstimatedEnd: after the first token, the blocks of
// output its engine stores, each chained to the one before, give the
// decode's pace; the end moves to the output left at that pace.
func TestOutputBlocksMoveTheEstimatedEnd(t *testing.T) {
	s, clock, rec := newEndService(t)
	// 9 tokens in blocks of 4: two full blocks and 1 token past them, so
	// 3 output tokens complete the first block of output.
	req := selReq("w", 1, 2, 3, 4, 5, 6, 7, 8, 9)
	req.ExpectedOutputTokens = ptr(uint32(100))
	if _, err := s.SelectAndReserve(bg, req); err != nil {
		t.Fatal(err)
	}
	if _, err := s.EndByEstimate(bg, "w", 20); err != nil { // max_tokens 20
		t.Fatal(err)
	}
	row, _ := s.resv.Booked("w")
	if row.FirstDecodeBlock != 3 {
		t.Fatalf("first output block completes after %d tokens, want 3", row.FirstDecodeBlock)
	}
	est, _ := s.resv.EndOf("w")
	if est.Tokens != 20 || est.Limit != 20 {
		t.Fatalf("estimate assumed %d tokens, limit %d; want 20 and 20 (the limit bounds the expectation)", est.Tokens, est.Limit)
	}
	part := row.Part.Key()
	first := est.PrefillAt
	clock.Add(first.Sub(clock.Now()))
	s.storedSeen(part, storedEvent(1, row.LastBlock))
	output := func(parent uint64, blocks ...uint64) []index.Event {
		evs := storedEvent(1, blocks...)
		evs[0].Parent, evs[0].HasParent = parent, true
		return evs
	}
	// 3 tokens: too few to pace, the end stays.
	clock.Add(30 * time.Millisecond)
	before, _ := s.resv.EndOf("w")
	s.storedSeen(part, output(row.LastBlock, 1000))
	if got, _ := s.resv.EndOf("w"); !got.At.Equal(before.At) || rec.count(BookingDecodeSeen) != 1 {
		t.Fatalf("end %v after 3 tokens (was %v), %d output blocks seen", got.At, before.At, rec.count(BookingDecodeSeen))
	}
	s.storedSeen(part, output(row.LastBlock^1, 2000)) // chained to another block
	// 7 tokens 70 ms after the first: 10 ms each, 8 sampled, 12 left.
	clock.Add(first.Add(70 * time.Millisecond).Sub(clock.Now()))
	s.storedSeen(part, output(1000, 1001))
	want := first.Add(190 * time.Millisecond)
	if got, _ := s.resv.EndOf("w"); !got.At.Equal(want) || rec.count(BookingDecodeSeen) != 2 {
		t.Fatalf("end at %v from the first token, want 190ms; %d output blocks seen", got.At.Sub(first), rec.count(BookingDecodeSeen))
	}
	// The next block should come before then: the booking waits for it.
	clock.Add(want.Sub(clock.Now()))
	s.MaintainEnds(bg)
	if s.Inspect().EstimatedEnds() != 1 {
		t.Fatal("freed at its paced end while its next output block was due")
	}
	// The blocks come at the same pace; the last one (19 computed, 20
	// sampled: the limit) ends it now.
	for i, ms := range []int{110, 150, 190} {
		clock.Add(first.Add(time.Duration(ms) * time.Millisecond).Sub(clock.Now()))
		s.storedSeen(part, output(uint64(1001+i), uint64(1002+i)))
		if got, _ := s.resv.EndOf("w"); !got.At.Equal(want) {
			t.Fatalf("end at %v after the block at %d ms, want 190ms", got.At.Sub(first), ms)
		}
	}
	s.MaintainEnds(bg)
	if s.Inspect().EstimatedEnds() != 0 || s.resv.Watching() {
		t.Fatalf("at the paced end: %d ends left, watching %v", s.Inspect().EstimatedEnds(), s.resv.Watching())
	}
	if n := rec.count(BookingDecodeSeen); n != 5 {
		t.Fatalf("%d output blocks seen, want 5", n)
	}
}

// TestEnginesITLPacesTheEstimatedEnd: once the booking's engine has reported
// its decode steps, an estimated end is paced by that reading rather than by
// the latency model's prior, and a reading older than engineITLFresh is not
// used.
func TestEnginesITLPacesTheEstimatedEnd(t *testing.T) {
	s, clock, _ := newEndService(t)
	report := func(count, sum float64) {
		t.Helper()
		snap := EngineSnapshot{At: clock.Now(), Ranks: map[uint32]EngineRank{AllRanks: {Running: 4,
			ITL: EngineHistogram{Count: count, Sum: sum, Reported: true}}}}
		if !s.ReportEngineMetrics(1, snap) {
			t.Fatal("report dropped")
		}
	}
	book := func(id string) reservation.End {
		t.Helper()
		req := selReq(id, 1, 2, 3, 4)
		req.ExpectedOutputTokens = ptr(uint32(100))
		if _, err := s.SelectAndReserve(bg, req); err != nil {
			t.Fatal(err)
		}
		if _, err := s.EndByEstimate(bg, id, 0); err != nil {
			t.Fatal(err)
		}
		e, _ := s.resv.EndOf(id)
		return e
	}
	prior := book("before")
	if prior.ITL < 10*time.Millisecond {
		t.Fatalf("ITL before any reading = %v, want the prior's (10 ms and up)", prior.ITL)
	}
	report(0, 0)
	clock.Add(200 * time.Millisecond)
	report(400, 1.2) // 400 gaps of 3 ms
	e := book("paced")
	if e.ITL != 3*time.Millisecond || e.Lifetime-e.TTFT != 300*time.Millisecond {
		t.Fatalf("estimate after the engine's reading = ITL %v, decode %v; want 3ms, 300ms", e.ITL, e.Lifetime-e.TTFT)
	}
	clock.Add(engineITLFresh + time.Millisecond)
	if stale := book("stale"); stale.ITL < 10*time.Millisecond {
		t.Fatalf("ITL with a stale reading = %v, want the prediction's (10 ms and up)", stale.ITL)
	}
}
