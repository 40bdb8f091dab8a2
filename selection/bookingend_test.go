package selection

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

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
	s, err := New(Config{Router: rc, Clock: clock.Now, Rand: rand.New(rand.NewPCG(1, 2)), OnBookingEnd: rec.record})
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
