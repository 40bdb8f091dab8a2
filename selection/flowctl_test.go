package selection

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/flow"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

// flowService is a one-worker service with flow control, busy once more
// than 4 prefill tokens are booked (budget 0.5 × 8), and the flow events it
// reported.
func flowService(t *testing.T, fc flow.Config, realClock bool) (*Service, *flowEvents) {
	s, ev, _ := flowServiceClock(t, fc, realClock)
	return s, ev
}

// flowServiceClock is flowService with its fake clock (nil with the real one).
func flowServiceClock(t *testing.T, fc flow.Config, realClock bool) (*Service, *flowEvents, *fakeClock) {
	t.Helper()
	rc := routerconfig.Default()
	rc.UseKVEvents = false
	rc.QueueThreshold = routerconfig.Some(0.5)
	ev := &flowEvents{}
	cfg := Config{Router: rc, Flow: &fc, OnFlow: ev.add}
	var clock *fakeClock
	if !realClock {
		clock = &fakeClock{t: time.Unix(1_700_000_000, 0)}
		cfg.Clock = clock.Now
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := workerRec(1)
	r.MaxNumBatchedTokens = ptr(uint64(8))
	if rec := mustUpsert(t, s, r); rec.Lifecycle != catalog.Schedulable {
		t.Fatalf("worker = %+v", rec)
	}
	return s, ev, clock
}

type flowEvents struct {
	mu  sync.Mutex
	evs []FlowEvent
}

func (f *flowEvents) add(e FlowEvent) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.evs = append(f.evs, e)
}

// count returns how many events had outcome.
func (f *flowEvents) count(outcome string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, e := range f.evs {
		if e.Outcome == outcome {
			n++
		}
	}
	return n
}

func flowQueued(s *Service) int {
	n := 0
	for _, p := range s.Inspect().FlowState() {
		n += p.Queued
	}
	return n
}

// tokens returns n distinct tokens starting at base, so that no two
// requests share a cached prefix.
func tokens(base, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(base + i)
	}
	return out
}

type waitingReq struct {
	name     string
	tenant   string
	priority int
	tokens   int
}

// dispatchOrder queues reqs one after the other behind a busy worker, then
// frees one prefill at a time and returns the order they got the worker in.
func dispatchOrder(t *testing.T, s *Service, reqs []waitingReq) string {
	t.Helper()
	if _, err := s.SelectAndReserve(bg, selReq("blocker", tokens(1_000_000, 8)...)); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, len(reqs))
	for i, w := range reqs {
		req := selReq(w.name, tokens(1000*(i+1), w.tokens)...)
		req.Tenant, req.Priority = w.tenant, &w.priority
		go func() {
			if _, err := s.SelectAndReserve(bg, req); err != nil {
				t.Errorf("%s: %v", w.name, err)
				got <- "error"
				return
			}
			got <- w.name
		}()
		waitFor(t, w.name+" queued", func() bool { return flowQueued(s) == i+1 })
	}
	var order []string
	prev := "blocker"
	for range reqs {
		if err := s.PrefillComplete(bg, prev); err != nil {
			t.Fatal(err)
		}
		prev = <-got
		order = append(order, prev)
	}
	return strings.Join(order, " ")
}

// The same waiting requests leave in the order each fairness prescribes:
// the priority-5 request first, then in band 0 tenant a's 64-token prompts
// against tenant b's 5-token prompts.
func TestFlowControlOrdersWaitingRequests(t *testing.T) {
	reqs := []waitingReq{
		{"A1", "a", 0, 64}, {"A2", "a", 0, 64}, {"A3", "a", 0, 64},
		{"B1", "b", 0, 5}, {"B2", "b", 0, 5}, {"H", "a", 5, 5},
	}
	for _, tc := range []struct {
		f    flow.Fairness
		want string
	}{
		{flow.FairnessCost, "H A1 B1 B2 A2 A3"},
		{flow.FairnessCount, "H A1 B1 A2 B2 A3"},
		{flow.FairnessFIFO, "H A1 A2 A3 B1 B2"},
	} {
		t.Run(tc.f.String(), func(t *testing.T) {
			s, ev := flowService(t, flow.Config{Fairness: tc.f}, false)
			if got := dispatchOrder(t, s, reqs); got != tc.want {
				t.Errorf("order %s, want %s", got, tc.want)
			}
			if n := ev.count(FlowDispatched); n != len(reqs)+1 { // the blocker too, with no wait
				t.Errorf("%d dispatched events, want %d", n, len(reqs)+1)
			}
		})
	}
}

// A sheddable request is rejected at once while the worker is busy or
// anything waits, and passes when neither.
func TestFlowControlShedsSheddable(t *testing.T) {
	s, ev := flowService(t, flow.Config{}, false)
	neg := -1
	shed := selReq("", tokens(1, 5)...)
	shed.Priority = &neg
	if _, err := s.SelectAndReserve(bg, shed); err != nil {
		t.Fatalf("sheddable on an idle pool: %v", err)
	}
	_, err := s.SelectAndReserve(bg, shed) // the first one's 5 tokens made the worker busy
	wantKind(t, err, KindOverloaded, "sheddable request (priority -1) rejected")
	var fe *Error
	if !asError(err, &fe) || fe.Details["flow_outcome"] != FlowShed {
		t.Errorf("details %+v", fe)
	}
	if flowQueued(s) != 0 || ev.count(FlowShed) != 1 {
		t.Errorf("queued %d, shed events %d", flowQueued(s), ev.count(FlowShed))
	}
}

func asError(err error, out **Error) bool {
	e, ok := err.(*Error)
	*out = e
	return ok
}

// A request waits at most the TTL: Maintain takes it out of the queue (and
// a request woken after its TTL leaves by itself); one whose client leaves
// goes at once; neither holds a booking or a place in the queue afterwards.
func TestFlowControlTTLAndAbandon(t *testing.T) {
	s, ev, clock := flowServiceClock(t, flow.Config{TTL: 10 * time.Second}, false)
	if _, err := s.SelectAndReserve(bg, selReq("blocker", tokens(1, 8)...)); err != nil {
		t.Fatal(err)
	}
	late := make(chan error, 2)
	for i, id := range []string{"late1", "late2"} {
		go func() {
			_, err := s.SelectAndReserve(bg, selReq(id, tokens(100*(i+1), 5)...))
			late <- err
		}()
		waitFor(t, id+" queued", func() bool { return flowQueued(s) == i+1 })
	}
	clock.Add(9 * time.Second)
	s.Maintain(bg)
	if flowQueued(s) != 2 {
		t.Fatal("Maintain expired requests before their TTL")
	}
	clock.Add(time.Second)
	s.Maintain(bg)
	for range 2 {
		wantKind(t, <-late, KindOverloaded, "waited the flow control queue TTL")
	}

	ctx, cancel := context.WithCancel(bg)
	done := make(chan error, 1)
	go func() {
		_, err := s.SelectAndReserve(ctx, selReq("gone", tokens(200, 5)...))
		done <- err
	}()
	waitFor(t, "gone queued", func() bool { return flowQueued(s) == 1 })
	cancel()
	wantKind(t, <-done, KindNotReady, "context canceled")
	if flowQueued(s) != 0 || ev.count(FlowExpired) != 2 || ev.count(FlowAbandoned) != 1 {
		t.Errorf("queued %d, expired %d, abandoned %d", flowQueued(s), ev.count(FlowExpired), ev.count(FlowAbandoned))
	}
	if l := loadOf(t, s); l.ActiveRequests != 1 {
		t.Errorf("%d bookings, want the blocker's alone", l.ActiveRequests)
	}
}

// Over the byte limit: 429 at once, nothing queued.
func TestFlowControlByteLimit(t *testing.T) {
	s, ev := flowService(t, flow.Config{MaxBytes: 1000}, false)
	if _, err := s.SelectAndReserve(bg, selReq("blocker", tokens(1, 8)...)); err != nil {
		t.Fatal(err)
	}
	big := selReq("big", tokens(100, 5)...)
	big.RequestBytes = 1001
	_, err := s.SelectAndReserve(bg, big)
	wantKind(t, err, KindOverloaded, "the queue is full")
	if flowQueued(s) != 0 || ev.count(FlowRejected) != 1 {
		t.Errorf("queued %d, rejected %d", flowQueued(s), ev.count(FlowRejected))
	}
	// The id is free again: the refused request booked nothing.
	if err := s.Free(bg, "big"); KindOf(err) != KindNotFound {
		t.Errorf("free of the refused request: %v", err)
	}
}

// Priorities and tenants are checked on every request, flow control on or
// off.
func TestFlowFieldsAreValidated(t *testing.T) {
	s, _ := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	for _, tc := range []struct {
		edit func(*SelectRequest)
		frag string
	}{
		{func(r *SelectRequest) { p := flow.MaxPriority + 1; r.Priority = &p }, "out of range"},
		{func(r *SelectRequest) { p := flow.MinPriority - 1; r.Priority = &p }, "out of range"},
		{func(r *SelectRequest) { r.Tenant = strings.Repeat("t", flow.MaxTenantLen+1) }, "257 bytes long"},
		{func(r *SelectRequest) { r.Tenant = "a\nb" }, "control character"},
		{func(r *SelectRequest) { r.Tenant = "\xff" }, "not valid UTF-8"},
	} {
		req := selReq("", 1, 2, 3, 4)
		tc.edit(req)
		_, err := s.Select(bg, req)
		wantKind(t, err, KindBadRequest, tc.frag)
		_, err = s.SelectAndReserve(bg, req)
		wantKind(t, err, KindBadRequest, tc.frag)
	}
	req := selReq("", 1, 2, 3, 4)
	p := flow.MaxPriority
	req.Priority, req.Tenant = &p, strings.Repeat("t", flow.MaxTenantLen)
	if _, err := s.Select(bg, req); err != nil {
		t.Errorf("the bounds themselves: %v", err)
	}
}

func TestFlowControlNeedsQueueing(t *testing.T) {
	rc := routerconfig.Default()
	if _, err := New(Config{Router: rc, Flow: &flow.Config{}}); err == nil || !strings.Contains(err.Error(), "router_queue_threshold") {
		t.Errorf("flow control without queueing: %v", err)
	}
	rc.QueueThreshold = routerconfig.Some(1.0)
	if _, err := New(Config{Router: rc, Flow: &flow.Config{TTL: -1}}); err == nil || !strings.Contains(err.Error(), "TTL") {
		t.Errorf("invalid flow config: %v", err)
	}
}

// Many tenants' requests queue and abandon at random while a worker frees
// and books: afterwards no queue entry, booking or waiter is left, and
// every request is accounted for exactly once.
func TestFlowControlChurnLeavesNothing(t *testing.T) {
	s, ev := flowService(t, flow.Config{TTL: time.Minute, MaxTenants: 8}, true)
	var wg sync.WaitGroup
	const n = 300
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(bg, time.Duration(i%7)*time.Millisecond)
			defer cancel()
			req := selReq(fmt.Sprint("r", i), tokens(10*i, 5)...)
			req.Tenant = fmt.Sprint("t", i%13)
			if _, err := s.SelectAndReserve(ctx, req); err == nil {
				_ = s.Free(bg, *req.SelectionID)
			}
		}()
	}
	wg.Wait()
	if q := flowQueued(s); q != 0 {
		t.Errorf("%d left queued", q)
	}
	if l := loadOf(t, s); l.ActiveRequests != 0 {
		t.Errorf("%d bookings left", l.ActiveRequests)
	}
	total := 0
	for _, o := range []string{FlowDispatched, FlowExpired, FlowShed, FlowRejected, FlowAbandoned} {
		total += ev.count(o)
	}
	if total != n {
		t.Errorf("%d flow events for %d requests", total, n)
	}
}
