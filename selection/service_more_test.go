package selection

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/kvhash"
	"github.com/kvselect/kvselect/selection/routerconfig"
	"github.com/kvselect/kvselect/selection/scheduler"
)

// waitFor polls cond until it holds; the bound is generous and only guards
// against a hang, nothing is timed.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func pendingCount(s *Service) uint64 {
	ls := s.Inspect().Loads(nil, nil)
	if len(ls) == 0 {
		return 0
	}
	return ls[0].PendingCount
}

func queuedService(t *testing.T) *Service {
	s, _ := newService(t, func(c *routerconfig.Config) { c.QueueThreshold = routerconfig.Some(0.5) })
	r := workerRec(1)
	r.MaxNumBatchedTokens = ptr(uint64(8))
	if rec := mustUpsert(t, s, r); rec.Lifecycle != catalog.Schedulable {
		t.Fatalf("worker = %+v", rec)
	}
	return s
}

func TestQueueWaitsWhileEveryWorkerIsBusy(t *testing.T) {
	s := queuedService(t)
	// 8 prefill tokens on a worker whose budget is 0.5 × 8: busy.
	if _, err := s.SelectAndReserve(bg, selReq("first", 1, 2, 3, 4, 5, 6, 7, 8)); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.SelectAndReserve(bg, selReq("second", 9, 9, 9, 9))
		done <- err
	}()
	waitFor(t, "the second selection to queue", func() bool { return pendingCount(s) == 1 })
	if got := s.Inspect().Loads(nil, nil)[0].PendingISLTokens; got != 4 {
		t.Fatalf("pending_isl_tokens = %d, want 4", got)
	}
	select {
	case err := <-done:
		t.Fatalf("selection went through while every worker was busy: %v", err)
	default:
	}
	// Advisory selects never queue.
	adv := selReq("", 1, 2, 3, 4)
	adv.Advisory = true
	if _, err := s.Select(bg, adv); err != nil {
		t.Fatal(err)
	}
	if err := s.PrefillComplete(bg, "first"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("queued selection: %v", err)
	}
	if pendingCount(s) != 0 {
		t.Fatal("queue not drained")
	}
}

func TestQueueOrderAndCancellation(t *testing.T) {
	s := queuedService(t)
	if _, err := s.SelectAndReserve(bg, selReq("busy", 1, 2, 3, 4, 5, 6, 7, 8)); err != nil {
		t.Fatal(err)
	}
	// A waiter whose context ends leaves the queue with an error.
	ctx, cancel := context.WithCancel(bg)
	cancelled := make(chan error, 1)
	go func() { _, err := s.SelectAndReserve(ctx, selReq("gone", 1, 1, 1, 1)); cancelled <- err }()
	waitFor(t, "the waiter to queue", func() bool { return pendingCount(s) == 1 })
	cancel()
	if err := <-cancelled; err == nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	waitFor(t, "the cancelled waiter to leave", func() bool { return pendingCount(s) == 0 })
	if s.resv.Has("gone") {
		t.Fatal("a cancelled selection kept its reservation id")
	}
	// Strict priority goes first: low queues before high, high books first.
	order := make(chan string, 2)
	for _, c := range []struct {
		id     string
		strict uint32
	}{{"low", 0}, {"high", 5}} {
		req := selReq(c.id, 2, 2, 2, 2, 2, 2, 2, 2)
		req.StrictPriority = c.strict
		want := pendingCount(s) + 1
		go func() {
			if _, err := s.SelectAndReserve(bg, req); err == nil {
				order <- req.PartitionKey.ModelName + ":" + *req.SelectionID
			}
		}()
		waitFor(t, c.id+" to queue", func() bool { return pendingCount(s) == want })
	}
	s.Free(bg, "busy")
	if first := <-order; first != "model:high" {
		t.Fatalf("first booked = %s, want the strict-priority waiter", first)
	}
	s.Free(bg, "high")
	if second := <-order; second != "model:low" {
		t.Fatalf("second = %s", second)
	}
}

func TestQueuedSelectionFailsOnShutdown(t *testing.T) {
	s := queuedService(t)
	s.SelectAndReserve(bg, selReq("busy", 1, 2, 3, 4, 5, 6, 7, 8))
	done := make(chan error, 1)
	go func() { _, err := s.SelectAndReserve(bg, selReq("w", 3, 3, 3, 3)); done <- err }()
	waitFor(t, "queue", func() bool { return pendingCount(s) == 1 })
	s.Shutdown()
	wantKind(t, <-done, KindNotReady, "shutting down")
}

func TestMaintainReclaimsStaleBookings(t *testing.T) {
	s, clock := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	if _, err := s.SelectAndReserve(bg, selReq("old", 1, 2, 3, 4)); err != nil {
		t.Fatal(err)
	}
	clock.Add(299 * time.Second)
	s.Maintain(bg)
	if loadOf(t, s).ActiveRequests != 1 {
		t.Fatal("reclaimed before the expiry")
	}
	// Progress does not refresh the age (absolute from admission).
	s.OutputBlock(bg, "old", nil)
	clock.Add(2 * time.Second)
	s.Maintain(bg)
	if l := loadOf(t, s); l.ActiveRequests != 0 || l.PotentialDecodeBlocks != 0 {
		t.Fatalf("stale booking kept: %+v", l)
	}
	wantKind(t, s.Free(bg, "old"), KindNotFound, "reservation old not found")
	// The approximate index forgets the recorded decision after router_ttl_secs.
	resp, _ := s.Select(bg, selReq("", 1, 2, 3, 4))
	if resp.Overlap.LongestMatched != 0 {
		t.Fatalf("recorded decision outlived its TTL: %+v", resp.Overlap)
	}
}

func TestTwoPhaseSelectBindsSessionOnReservation(t *testing.T) {
	s, _ := newService(t, func(c *routerconfig.Config) { c.SessionAffinityTTL = routerconfig.Some(time.Minute) })
	mustUpsert(t, s, workerRec(1))
	mustUpsert(t, s, workerRec(2))
	req := selReq("two-phase", 1, 2, 3, 4)
	req.SessionContext = &SessionContext{SessionID: "sess", AgentHeaders: map[string][]string{"x-request-class": {"subagent"}}}
	sel, err := s.Select(bg, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reserve(bg, replay("two-phase", "model")); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		r := selReq("", uint32(100+i), 5, 6, 7)
		r.SessionID = ptr("sess")
		got, err := s.Select(bg, r)
		if err != nil || got.WorkerID != sel.WorkerID {
			t.Fatalf("select %d: worker %d, session bound to %d (%v)", i, got.WorkerID, sel.WorkerID, err)
		}
	}
	bad := selReq("", 1, 2, 3, 4)
	bad.SessionContext = &SessionContext{SessionID: "x", InputTrigger: ptr("typing")}
	_, err = s.Select(bg, bad)
	wantKind(t, err, KindBadRequest, "input_trigger")
}

func TestHardModeRejectsDispatchAwayFromBinding(t *testing.T) {
	s, _ := newService(t, func(c *routerconfig.Config) { c.SessionAffinityTTL = routerconfig.Some(time.Minute) })
	mustUpsert(t, s, workerRec(1))
	mustUpsert(t, s, workerRec(2))
	first := selReq("a", 1, 2, 3, 4)
	first.SessionID = ptr("sess")
	first.PinnedWorker = nil
	r1, err := s.SelectAndReserve(bg, first)
	if err != nil {
		t.Fatal(err)
	}
	// Only the other worker is allowed: the booking lands there and the Hard
	// binding refuses it; the booking is freed.
	other := uint64(3) - r1.WorkerID
	second := selReq("b", 1, 2, 3, 4)
	second.SessionID = ptr("sess")
	second.AllowedWorkerIDs = []uint64{other}
	_, err = s.SelectAndReserve(bg, second)
	wantKind(t, err, KindBadRequest, "session sess is bound to worker")
	if l := s.Inspect().Loads(nil, nil)[0].Loads; l[0].ActiveRequests+l[1].ActiveRequests != 1 {
		t.Fatalf("the refused booking was not freed: %+v", l)
	}
	wantKind(t, s.Free(bg, "b"), KindNotFound, "reservation b not found")
}

// lowestIDScorer is a custom policy: the cost is the worker id.
type lowestIDScorer struct{}

func (lowestIDScorer) Score(_ *scheduler.Context, c *scheduler.Candidate) (float64, error) {
	return float64(c.Worker.WorkerID), nil
}

type rejectWorker uint64

func (r rejectWorker) Filter(_ *scheduler.Request, c *scheduler.Candidate) bool {
	return c.Worker.WorkerID != uint64(r)
}

func TestCustomPolicySeam(t *testing.T) {
	rc := routerconfig.Default()
	rc.UseKVEvents = false
	p := scheduler.DefaultPolicy()
	p.Scorer = lowestIDScorer{}
	p.Filters = []scheduler.Filter{rejectWorker(1)}
	s, err := New(Config{Router: rc, Rand: rand.New(rand.NewPCG(3, 3)), Policy: &p})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []uint64{3, 1, 2} {
		mustUpsert(t, s, workerRec(id))
	}
	resp, err := s.Select(bg, selReq("", 1, 2, 3, 4))
	if err != nil || resp.WorkerID != 2 {
		t.Fatalf("custom policy chose %+v (%v), want worker 2", resp, err)
	}
	p.Filters = []scheduler.Filter{rejectWorker(1), rejectWorker(2), rejectWorker(3)}
	all, _ := New(Config{Router: rc, Policy: &p})
	mustUpsert(t, all, workerRec(1))
	_, err = all.SelectAndReserve(bg, selReq("z", 1, 2, 3, 4))
	if KindOf(err) != KindUnavailable {
		t.Fatalf("all filtered: %v (kind %v), want unavailable", err, KindOf(err))
	}
	if l := loadOf(t, all); l.ActiveRequests != 0 {
		t.Fatal("a rejected selection booked load")
	}
}

func TestKVHintNeedsSameRoleNonAgentSource(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(*catalog.Record)
		hints bool
	}{
		{"same role", func(*catalog.Record) {}, true},
		{"state agent source", func(r *catalog.Record) { r.KVEventSourceMode = ptr(catalog.StateAgentV2) }, false},
		{"other role", func(r *catalog.Record) { r.RouterHintWorkerType = ptr("prefill") }, false},
		{"no endpoint for the rank", func(r *catalog.Record) { r.RouterHintSourceControlEndpoints = map[uint32]string{1: "tcp://x:1"} }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newService(t, func(c *routerconfig.Config) { c.UseKVEvents = true })
			for _, id := range []uint64{1, 2} {
				r := workerRec(id)
				r.KVEventsEndpoint = ptr("tcp://127.0.0.1:5557")
				r.RouterHintWorkerType = ptr("decode")
				r.RouterHintSourceControlEndpoints = map[uint32]string{0: "tcp://w:5600"}
				if id == 1 {
					tc.edit(&r)
				}
				mustUpsert(t, s, r)
			}
			locals := kvhash.LocalBlockHashes([]uint32{1, 2, 3, 4}, "", "", kvhash.BlockOptions{BlockSize: 4})
			ev := indexStored(1, locals)
			s.parts.Get(index.Partition{Model: "model", RoutingGroup: "default"}).Index().Apply(&ev)
			req := selReq("h", 1, 2, 3, 4)
			req.PinnedWorker = &WorkerRank{WorkerID: 2}
			resp, err := s.SelectAndReserve(bg, req)
			if err != nil {
				t.Fatal(err)
			}
			if (resp.KVHint != nil) != tc.hints {
				t.Fatalf("hint = %+v, want hint %v", resp.KVHint, tc.hints)
			}
		})
	}
}

func TestDPRanksAreCandidates(t *testing.T) {
	s, _ := newService(t, nil)
	r := workerRec(5)
	r.DataParallelSize = ptr(uint32(4))
	mustUpsert(t, s, r)
	seen := map[uint32]bool{}
	for i := range 40 {
		resp, err := s.SelectAndReserve(bg, selReq(itoa(i), uint32(i), 1, 1, 1))
		if err != nil {
			t.Fatal(err)
		}
		seen[resp.DPRank] = true
		if len(resp.Overlap.DP) != 4 {
			t.Fatalf("dp map lists %d ranks, want all 4: %+v", len(resp.Overlap.DP), resp.Overlap)
		}
	}
	if len(seen) != 4 {
		t.Fatalf("load-aware selection used ranks %v, want all four", seen)
	}
}

// TestQueuedSelectionRefreshesOverlap: a selection that waited past
// DYN_ROUTER_OVERLAP_REFRESH_AFTER_SECS re-reads the index when it leaves the
// queue, so blocks cached meanwhile count (a behaviour Dynamo's
// lib/kv-router/src/services/selection/core/tests.rs checks).
func TestQueuedSelectionRefreshesOverlap(t *testing.T) {
	s, clock := newService(t, func(c *routerconfig.Config) {
		c.UseKVEvents = true
		c.QueueThreshold = routerconfig.Some(0.5)
	})
	for _, id := range []uint64{1, 2} {
		r := workerRec(id)
		r.MaxNumBatchedTokens = ptr(uint64(8))
		r.KVEventsEndpoint = ptr("tcp://127.0.0.1:5557")
		mustUpsert(t, s, r)
	}
	prompt := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	for _, pin := range []uint64{1, 2} {
		req := selReq("busy-"+itoa(int(pin)), 9, 9, 9, 9, 9, 9, 9, uint32(pin))
		req.PinnedWorker = &WorkerRank{WorkerID: pin}
		if _, err := s.SelectAndReserve(bg, req); err != nil {
			t.Fatal(err)
		}
	}
	type result struct {
		resp *SelectResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		r, err := s.SelectAndReserve(bg, selReq("waiter", prompt...))
		done <- result{r, err}
	}()
	waitFor(t, "queue", func() bool { return pendingCount(s) == 1 })
	// While it waits, worker 2 caches the whole prompt; time passes the refresh bound.
	locals := kvhash.LocalBlockHashes(prompt, "", "", kvhash.BlockOptions{BlockSize: 4})
	ev := indexStored(2, locals)
	if err := s.parts.Get(index.Partition{Model: "model", RoutingGroup: "default"}).Index().Apply(&ev); err != nil {
		t.Fatal(err)
	}
	clock.Add(11 * time.Second)
	// Free the cached worker first: whenever the waiter wakes, worker 2 is the
	// cheaper rank only if the refreshed overlap credits its cached prompt.
	s.Free(bg, "busy-2")
	s.Free(bg, "busy-1")
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.resp.WorkerID != 2 || r.resp.EffectivePrefillTokens != 0 || r.resp.Overlap.GPU != 8 || r.resp.Overlap.DP["0"] != 8 {
		t.Fatalf("queued selection used stale overlap: %+v", r.resp)
	}
}

// TestShrunkRankForgetsItsBlocks: a rank that leaves its worker's range takes
// its recorded blocks along, so /overlap_scores no longer reports it.
func TestShrunkRankForgetsItsBlocks(t *testing.T) {
	s, _ := newService(t, nil)
	r := workerRec(1)
	r.DataParallelSize = ptr(uint32(2))
	mustUpsert(t, s, r)
	req := selReq("x", 1, 2, 3, 4)
	req.PinnedWorker = &WorkerRank{WorkerID: 1, DPRank: 1}
	if _, err := s.SelectAndReserve(bg, req); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PatchWorker(bg, 1, catalog.Patch{DataParallelSize: ptr(uint32(1))}); err != nil {
		t.Fatal(err)
	}
	ov, err := s.Inspect().OverlapScores(bg, &PromptQuery{PartitionKey: PartitionKey{ModelName: "model"}, PromptRequest: PromptRequest{TokenIDs: []uint32{1, 2, 3, 4}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(ov.Workers) != 1 || ov.Workers[0].DPRank != 0 || ov.Workers[0].DeviceBlocks != 0 {
		t.Fatalf("rows after the shrink = %+v", ov.Workers)
	}
	wantKind(t, s.Free(bg, "x"), KindNotFound, "reservation x not found")
}

// recordingListeners is a Listeners adapter that records the calls.
type recordingListeners struct {
	mu      sync.Mutex
	calls   []string
	failFor string // an endpoint whose Attach fails
}

func (l *recordingListeners) Attach(a RankAttachment) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if a.Endpoints.KVEvents == l.failFor {
		return errors.New("connect refused")
	}
	if a.Index == nil || a.BlockSize != 4 {
		return errors.New("attachment without index or block size")
	}
	l.calls = append(l.calls, fmt.Sprintf("attach %d/%d %s", a.Worker.WorkerID, a.Worker.DPRank, a.Endpoints.KVEvents))
	return nil
}

func (l *recordingListeners) Detach(p index.Partition, w index.WorkerKey) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, fmt.Sprintf("detach %d/%d", w.WorkerID, w.DPRank))
}

func (l *recordingListeners) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.calls
	l.calls = nil
	slices.Sort(out)
	return out
}

// TestListenerReconciliationRankByRank: an unchanged rank keeps its listener and
// its blocks, a changed rank is detached, purged and attached afresh, a removed
// rank is detached and purged, a failed attach rolls back (the "Worker
// Restarts" rules of Dynamo's standalone selection service docs).
func TestListenerReconciliationRankByRank(t *testing.T) {
	rc := routerconfig.Default()
	l := &recordingListeners{}
	s, err := New(Config{Router: rc, Rand: rand.New(rand.NewPCG(9, 9)), Listeners: l})
	if err != nil {
		t.Fatal(err)
	}
	rec := workerRec(1)
	rec.DataParallelSize = ptr(uint32(2))
	rec.KVEventsEndpoints = map[uint32]string{0: "tcp://w:5557", 1: "tcp://w:5558"}
	mustUpsert(t, s, rec)
	if got := l.take(); !slices.Equal(got, []string{"attach 1/0 tcp://w:5557", "attach 1/1 tcp://w:5558"}) {
		t.Fatalf("first upsert: %v", got)
	}
	p := s.parts.Get(index.Partition{Model: "model", RoutingGroup: "default"})
	for rank := range uint32(2) {
		ev := indexStored(1, []uint64{100 + uint64(rank)})
		ev.Worker.DPRank = rank
		if err := p.Index().Apply(&ev); err != nil {
			t.Fatal(err)
		}
	}
	held := func(rank uint32) bool {
		for _, o := range p.Index().Match([]uint64{100 + uint64(rank)}, false, nil) {
			if o.Worker.DPRank == rank {
				return true
			}
		}
		return false
	}
	// A capacity update keeps every listener and every block.
	rec.TotalKVBlocks = ptr(uint64(4096))
	mustUpsert(t, s, rec)
	if got := l.take(); len(got) != 0 || !held(0) || !held(1) {
		t.Fatalf("unchanged update: calls %v, blocks %v %v", got, held(0), held(1))
	}
	// A new endpoint for rank 1 re-attaches it with a fresh view.
	rec.KVEventsEndpoints = map[uint32]string{0: "tcp://w:5557", 1: "tcp://w:6558"}
	mustUpsert(t, s, rec)
	if got := l.take(); !slices.Equal(got, []string{"attach 1/1 tcp://w:6558", "detach 1/1"}) || !held(0) || held(1) {
		t.Fatalf("changed rank: calls %v, blocks %v %v", got, held(0), held(1))
	}
	// Shrinking to one rank detaches the other.
	if _, err := s.PatchWorker(bg, 1, catalog.Patch{DataParallelSize: ptr(uint32(1))}); err != nil {
		t.Fatal(err)
	}
	if got := l.take(); !slices.Equal(got, []string{"detach 1/1"}) {
		t.Fatalf("shrink: %v", got)
	}
	// A failing attach rolls back and leaves the worker incomplete.
	l.failFor = "tcp://w:7557"
	rec.DataParallelSize = ptr(uint32(1))
	rec.KVEventsEndpoints = map[uint32]string{0: "tcp://w:7557"}
	out := mustUpsert(t, s, rec)
	if out.Lifecycle != catalog.Incomplete || !strings.Contains(out.NotSchedulableReasons[0], "reconciliation failed: attach dp_rank 0: connect refused") {
		t.Fatalf("failed attach: %+v", out)
	}
	if got := l.take(); !slices.Equal(got, []string{"detach 1/0"}) || held(0) {
		t.Fatalf("rollback: calls %v, rank 0 blocks kept %v", got, held(0))
	}
	l.failFor = ""
	mustUpsert(t, s, rec)
	l.take()
	if _, err := s.DeleteWorker(bg, 1); err != nil {
		t.Fatal(err)
	}
	if got := l.take(); !slices.Equal(got, []string{"detach 1/0"}) {
		t.Fatalf("delete: %v", got)
	}
}

// TestCollectorFedWorkers: with an events collector, a worker without KV
// event endpoints is schedulable and its ranks are attached with an empty
// KVEvents endpoint and the keys its topic is matched by; an explicit
// endpoint keeps subscribe mode, and changing the endpoint (the topic's
// host:port) attaches the rank afresh. Without a collector the same record
// stays incomplete.
func TestCollectorFedWorkers(t *testing.T) {
	for _, collector := range []bool{true, false} {
		t.Run(fmt.Sprintf("collector=%v", collector), func(t *testing.T) {
			l := &recordingListeners{failFor: "tcp://nowhere:1"}
			s, err := New(Config{Router: routerconfig.Default(), Rand: rand.New(rand.NewPCG(9, 9)), Listeners: l, EventsCollector: collector})
			if err != nil {
				t.Fatal(err)
			}
			rec := workerRec(1)
			rec.KVEventsEndpoint = nil
			rec.Endpoint = ptr("http://10.0.0.7:8000")
			got := mustUpsert(t, s, rec)
			if !collector {
				if got.Lifecycle != catalog.Incomplete || len(l.take()) != 0 {
					t.Fatalf("without a collector: %s %v", got.Lifecycle, got.NotSchedulableReasons)
				}
				return
			}
			if got.Lifecycle != catalog.Schedulable {
				t.Fatalf("lifecycle %s, reasons %v", got.Lifecycle, got.NotSchedulableReasons)
			}
			if calls := l.take(); !slices.Equal(calls, []string{"attach 1/0 "}) {
				t.Fatalf("attach calls %v", calls)
			}
			rec.Endpoint = ptr("http://10.0.0.8:8000")
			mustUpsert(t, s, rec)
			if calls := l.take(); !slices.Equal(calls, []string{"attach 1/0 ", "detach 1/0"}) {
				t.Fatalf("a moved endpoint: %v", calls)
			}
			rec.KVEventsEndpoint = ptr("tcp://10.0.0.8:5557")
			mustUpsert(t, s, rec)
			if calls := l.take(); !slices.Equal(calls, []string{"attach 1/0 tcp://10.0.0.8:5557", "detach 1/0"}) {
				t.Fatalf("an explicit endpoint: %v", calls)
			}
		})
	}
}
