package selection

import (
	"context"
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
)

// fakeClock is the injected time source of every test: TTLs move only when the
// test says so.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

var bg = context.Background()

// newService mirrors the setup of Dynamo's HTTP tests
// (lib/kv-router/src/services/selection/tests.rs): approximate index
// (use_kv_events=false), no queue threshold.
func newService(t testing.TB, edit func(*routerconfig.Config)) (*Service, *fakeClock) {
	t.Helper()
	rc := routerconfig.Default()
	rc.UseKVEvents = false
	if edit != nil {
		edit(&rc)
	}
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	s, err := New(Config{Router: rc, Clock: clock.Now, Rand: rand.New(rand.NewPCG(1, 2))})
	if err != nil {
		t.Fatal(err)
	}
	return s, clock
}

func ptr[T any](v T) *T { return &v }

func workerRec(id uint64) catalog.Record {
	return catalog.Record{WorkerID: id, ModelName: "model", Endpoint: ptr("http://worker-" + string(rune('0'+id)) + ":8000"), BlockSize: ptr(uint32(4))}
}

func mustUpsert(t testing.TB, s *Service, r catalog.Record) *catalog.Record {
	t.Helper()
	out, err := s.UpsertWorker(bg, r)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func wantKind(t testing.TB, err error, k Kind, frag string) {
	t.Helper()
	if err == nil || KindOf(err) != k || !strings.Contains(err.Error(), frag) {
		t.Fatalf("err = %v (kind %v), want kind %v containing %q", err, KindOf(err), k, frag)
	}
}

func selReq(id string, tokens ...uint32) *SelectRequest {
	r := &SelectRequest{PartitionKey: PartitionKey{ModelName: "model"}, PromptRequest: PromptRequest{TokenIDs: tokens}}
	if id != "" {
		r.SelectionID = &id
	}
	return r
}

func loadOf(t testing.TB, s *Service) PotentialLoad {
	t.Helper()
	ls := s.Inspect().Loads(nil, nil)
	if len(ls) != 1 || len(ls[0].Loads) == 0 {
		t.Fatalf("loads = %+v", ls)
	}
	return ls[0].Loads[0]
}

func TestNotReadyWithoutSchedulableWorkers(t *testing.T) {
	s, _ := newService(t, nil)
	if s.Ready().Ready {
		t.Fatal("ready with an empty catalog")
	}
	_, err := s.Select(bg, selReq("s1", 1, 2, 3, 4))
	wantKind(t, err, KindNotReady, "no schedulable workers are available")
	mustUpsert(t, s, workerRec(1))
	_, err = s.Select(bg, &SelectRequest{PartitionKey: PartitionKey{ModelName: "other"}, PromptRequest: PromptRequest{TokenIDs: []uint32{1}}})
	wantKind(t, err, KindNotReady, "no schedulable workers for model=other routing_group=default")
	if st := s.Ready(); !st.Ready || st.SchedulableWorkers != 1 || len(st.Workers) != 1 {
		t.Fatalf("ready = %+v", st)
	}
}

func TestIncompleteWorkerIsAcceptedButNotSchedulable(t *testing.T) {
	s, _ := newService(t, func(c *routerconfig.Config) { c.QueueThreshold = routerconfig.Some(1.0) })
	rec := mustUpsert(t, s, workerRec(1))
	if rec.Lifecycle != catalog.Incomplete || !strings.Contains(rec.NotSchedulableReasons[0], "max_num_batched_tokens") {
		t.Fatalf("record = %+v", rec)
	}
	_, err := s.Select(bg, selReq("", 1, 2, 3, 4))
	wantKind(t, err, KindNotReady, "no schedulable workers")
}

func TestSelectEchoesSelectionIDAndDoesNotBook(t *testing.T) {
	s, _ := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	resp, err := s.Select(bg, selReq("sel-a", 1, 2, 3, 4))
	if err != nil {
		t.Fatal(err)
	}
	if *resp.SelectionID != "sel-a" || resp.RoutingGroup != "default" || resp.WorkerID != 1 || resp.EffectivePrefillTokens != 4 ||
		resp.Overlap.LongestMatched != 0 || resp.Overlap.DP["0"] != 0 || resp.SequenceHashes != nil || resp.ISLTokens != nil || resp.TrackPrefillTokens != nil {
		t.Fatalf("response = %+v", resp)
	}
	if l := loadOf(t, s); l.ActiveRequests != 0 {
		t.Fatalf("select booked load: %+v", l)
	}
}

func TestOverlapScoresListsEveryRank(t *testing.T) {
	s, _ := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	w2 := workerRec(2)
	w2.DataParallelStartRank, w2.DataParallelSize = ptr(uint32(2)), ptr(uint32(2))
	mustUpsert(t, s, w2)
	resp, err := s.Inspect().OverlapScores(bg, &PromptQuery{PartitionKey: PartitionKey{ModelName: "model"}, PromptRequest: PromptRequest{TokenIDs: []uint32{1, 2, 3, 4}}})
	if err != nil {
		t.Fatal(err)
	}
	var got [][2]uint64
	for _, r := range resp.Workers {
		got = append(got, [2]uint64{r.WorkerID, uint64(r.DPRank)})
	}
	if resp.NumBlocks != 1 || !slices.Equal(got, [][2]uint64{{1, 0}, {2, 2}, {2, 3}}) || resp.Workers[0].HostPinnedBlocks != 0 || resp.SharedCache.Enabled {
		t.Fatalf("overlap scores = %+v", resp)
	}
}

func TestSelectAndReserveBooksAndDuplicateConflicts(t *testing.T) {
	s, _ := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	resp, err := s.SelectAndReserve(bg, selReq("res-a", 1, 2, 3, 4))
	if err != nil {
		t.Fatal(err)
	}
	want := toI64(kvhash.SequenceHashes(kvhash.LocalBlockHashes([]uint32{1, 2, 3, 4}, "", "", kvhash.BlockOptions{BlockSize: 4})))
	if *resp.SelectionID != "res-a" || resp.EffectivePrefillTokens != 4 || *resp.ISLTokens != 4 || !*resp.TrackPrefillTokens ||
		!slices.Equal(resp.SequenceHashes, want) {
		t.Fatalf("response = %+v, want sequence hashes %v", resp, want)
	}
	if l := loadOf(t, s); l.PotentialPrefillTokens != 4 || l.ActiveRequests != 1 {
		t.Fatalf("loads = %+v", l)
	}
	_, err = s.SelectAndReserve(bg, selReq("res-a", 1, 2, 3, 4))
	wantKind(t, err, KindConflict, "selection res-a is already reserved or being reserved")
	if err := s.Free(bg, "res-a"); err != nil {
		t.Fatal(err)
	}
	wantKind(t, s.Free(bg, "res-a"), KindNotFound, "reservation res-a not found")
	if l := loadOf(t, s); l.ActiveRequests != 0 || l.PotentialDecodeBlocks != 0 || l.PotentialPrefillTokens != 0 {
		t.Fatalf("load left after free: %+v", l)
	}
}

// TestPickerBookingsSkipSequenceHashes: the picker front reads nothing of the
// JSON answer's sequence hashes, so its bookings do not copy them (half a
// megabyte at 1M tokens); the booking itself is the same.
func TestPickerBookingsSkipSequenceHashes(t *testing.T) {
	s, _ := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	req := selReq("pick", 1, 2, 3, 4, 5, 6, 7, 8)
	req.FromPicker = true
	resp, err := s.SelectAndReserve(bg, req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.SequenceHashes != nil || *resp.ISLTokens != 8 {
		t.Fatalf("picker response = %+v, want no sequence hashes and isl 8", resp)
	}
	if l := loadOf(t, s); l.ActiveRequests != 1 || l.PotentialDecodeBlocks != 2 {
		t.Fatalf("loads = %+v, want the booking's 2 blocks", l)
	}
}

// TestPreparedCountsEveryPrompt: Prepared, the host's sign that requests are
// coming, counts selections and bookings, refused ones too.
func TestPreparedCountsEveryPrompt(t *testing.T) {
	s, _ := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	if n := s.Prepared(); n != 0 {
		t.Fatalf("Prepared before any request = %d", n)
	}
	if _, err := s.SelectAndReserve(bg, selReq("p1", 1, 2, 3, 4)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Select(bg, selReq("", 1, 2, 3, 4)); err != nil {
		t.Fatal(err)
	}
	bad := selReq("p2", 1, 2, 3, 4)
	bad.ModelName = "no-such-model"
	if _, err := s.SelectAndReserve(bg, bad); err == nil {
		t.Fatal("a request for an unknown model was booked")
	}
	if n := s.Prepared(); n != 3 {
		t.Fatalf("Prepared = %d, want 3", n)
	}
}

func TestGeneratedSelectionIDIsUUIDv4(t *testing.T) {
	s, _ := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	resp, err := s.SelectAndReserve(bg, selReq("", 1, 2, 3, 4))
	if err != nil {
		t.Fatal(err)
	}
	id := *resp.SelectionID
	if len(id) != 36 || id[14] != '4' || !strings.ContainsRune("89ab", rune(id[19])) {
		t.Fatalf("generated id %q is not a UUIDv4", id)
	}
}

func TestExplicitReplayPreservesDisabledPrefillTracking(t *testing.T) {
	a, _ := newService(t, nil)
	b, _ := newService(t, nil)
	for _, s := range []*Service{a, b} {
		mustUpsert(t, s, workerRec(1))
	}
	req := selReq("r1", 1, 2, 3, 4)
	req.RouterConfigOverride = &routerconfig.Override{TrackPrefillTokens: ptr(false)}
	resp, err := a.SelectAndReserve(bg, req)
	if err != nil {
		t.Fatal(err)
	}
	if *resp.TrackPrefillTokens {
		t.Fatal("override ignored")
	}
	_, err = b.Reserve(bg, &ReservationRequest{PartitionKey: PartitionKey{ModelName: "model"}, SelectionID: ptr("r1"),
		WorkerID: &resp.WorkerID, DPRank: &resp.DPRank, PromptRequest: PromptRequest{SequenceHashes: resp.SequenceHashes, ISLTokens: resp.ISLTokens},
		EffectivePrefillTokens: &resp.EffectivePrefillTokens, TrackPrefillTokens: resp.TrackPrefillTokens})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*Service{a, b} {
		if l := loadOf(t, s); l.ActiveRequests != 1 || l.PotentialPrefillTokens != 0 || l.PotentialDecodeBlocks != 1 {
			t.Fatalf("loads = %+v", l)
		}
	}
	pl, err := b.Inspect().PotentialLoads(bg, &PromptQuery{PartitionKey: PartitionKey{ModelName: "model"}, PromptRequest: PromptRequest{TokenIDs: []uint32{1, 2, 3, 4}},
		RouterConfigOverride: &routerconfig.Override{TrackPrefillTokens: ptr(false)}})
	if err != nil || pl[0].PotentialDecodeBlocks != 1 {
		t.Fatalf("potential loads = %+v, %v (active blocks must be deduplicated by tracking hash)", pl, err)
	}
}

func TestOutputBlockUpdatesReservedLoad(t *testing.T) {
	s, _ := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	if _, err := s.SelectAndReserve(bg, selReq("ob", 1, 2, 3, 4)); err != nil {
		t.Fatal(err)
	}
	before := loadOf(t, s).PotentialDecodeBlocks
	if err := s.OutputBlock(bg, "ob", nil); err != nil {
		t.Fatal(err)
	}
	wantKind(t, s.OutputBlock(bg, "ob", ptr(1.5)), KindBadRequest, "decay_fraction must be between 0.0 and 1.0")
	if after := loadOf(t, s).PotentialDecodeBlocks; after != before+1 {
		t.Fatalf("decode blocks %d → %d, want +1", before, after)
	}
	wantKind(t, s.OutputBlock(bg, "nope", nil), KindNotFound, "reservation nope not found")
}

func explicit(id string, worker uint64, effective uint64) *ReservationRequest {
	return &ReservationRequest{PartitionKey: PartitionKey{ModelName: "model"}, SelectionID: &id, WorkerID: &worker, DPRank: ptr(uint32(0)),
		PromptRequest: PromptRequest{SequenceHashes: []int64{1}, ISLTokens: ptr(uint64(4))}, EffectivePrefillTokens: &effective}
}

func TestExplicitReservation(t *testing.T) {
	s, _ := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	noEndpoint := workerRec(3)
	noEndpoint.Endpoint = nil
	mustUpsert(t, s, noEndpoint)
	resp, err := s.Reserve(bg, explicit("res-b", 1, 4))
	if err != nil || resp.WorkerID != 1 || resp.Endpoint == "" {
		t.Fatalf("reserve = %+v, %v", resp, err)
	}
	if l := loadOf(t, s); l.PotentialPrefillTokens != 4 {
		t.Fatalf("loads = %+v", l)
	}
	if err := s.PrefillComplete(bg, "res-b"); err != nil {
		t.Fatal(err)
	}
	if err := s.PrefillComplete(bg, "res-b"); err != nil {
		t.Fatalf("prefill_complete must be idempotent: %v", err)
	}
	if l := loadOf(t, s); l.PotentialPrefillTokens != 0 {
		t.Fatalf("prefill not cleared: %+v", l)
	}
	_, err = s.Reserve(bg, explicit("res-c", 1, 5))
	wantKind(t, err, KindBadRequest, "effective_prefill_tokens (5) must not exceed isl_tokens (4)")
	_, err = s.Reserve(bg, explicit("res-d", 3, 1))
	wantKind(t, err, KindNotFound, "schedulable worker 3 not found for model=model routing_group=default")
	_, err = s.Reserve(bg, explicit("res-b", 1, 1))
	wantKind(t, err, KindConflict, "already reserved")
	_, err = s.Reserve(bg, &ReservationRequest{PartitionKey: PartitionKey{ModelName: "model"}, WorkerID: ptr(uint64(1))})
	wantKind(t, err, KindBadRequest, "selection_id")
}

func replay(id, model string) *ReservationRequest {
	return &ReservationRequest{PartitionKey: PartitionKey{ModelName: model}, SelectionID: &id}
}

func TestCachedReservation(t *testing.T) {
	s, _ := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	sel, err := s.Select(bg, selReq("sel-1", 1, 2, 3, 4))
	if err != nil {
		t.Fatal(err)
	}
	// Overrides on the replay are ignored: it books exactly what select captured.
	r := replay("sel-1", "other")
	_, err = s.Reserve(bg, r)
	wantKind(t, err, KindNotFound, "no pending selection sel-1")
	r = replay("sel-1", "model")
	r.EffectivePrefillTokens = ptr(uint64(5))
	resp, err := s.Reserve(bg, r)
	if err != nil || resp.WorkerID != sel.WorkerID || resp.DPRank != sel.DPRank {
		t.Fatalf("replay = %+v, %v", resp, err)
	}
	if l := loadOf(t, s); l.PotentialPrefillTokens != 4 {
		t.Fatalf("loads = %+v", l)
	}
	if err := s.PrefillComplete(bg, "sel-1"); err != nil {
		t.Fatal(err)
	}
	// The first successful booking consumed the entry.
	_, err = s.Reserve(bg, replay("sel-1", "model"))
	wantKind(t, err, KindNotFound, "no pending selection")
}

func TestFailedCachedBookingIsRetryable(t *testing.T) {
	s, _ := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	if _, err := s.Select(bg, selReq("sel-1", 1, 2, 3, 4)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteWorker(bg, 1); err != nil {
		t.Fatal(err)
	}
	_, err := s.Reserve(bg, replay("sel-1", "model"))
	wantKind(t, err, KindNotReady, "no schedulable workers")
	mustUpsert(t, s, workerRec(1))
	if _, err := s.Reserve(bg, replay("sel-1", "model")); err != nil {
		t.Fatal(err)
	}
}

func TestCachedBookingRetryableAfterConflict(t *testing.T) {
	s, _ := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	s.Select(bg, selReq("sel-1", 1, 2, 3, 4))
	if _, err := s.SelectAndReserve(bg, selReq("sel-1", 1, 2, 3, 4)); err != nil {
		t.Fatal(err)
	}
	_, err := s.Reserve(bg, replay("sel-1", "model"))
	wantKind(t, err, KindConflict, "already reserved")
	if err := s.Free(bg, "sel-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reserve(bg, replay("sel-1", "model")); err != nil {
		t.Fatal(err)
	}
}

func TestCachedReservationRejectsStaleDPRank(t *testing.T) {
	s, _ := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	s.Select(bg, selReq("sel-1", 1, 2, 3, 4))
	if _, err := s.PatchWorker(bg, 1, catalog.Patch{DataParallelStartRank: ptr(uint32(1)), DataParallelSize: ptr(uint32(1))}); err != nil {
		t.Fatal(err)
	}
	_, err := s.Reserve(bg, replay("sel-1", "model"))
	wantKind(t, err, KindNotFound, "schedulable worker 1 (dp_rank 0) not found")
	s.PatchWorker(bg, 1, catalog.Patch{DataParallelStartRank: ptr(uint32(0)), DataParallelSize: ptr(uint32(1))})
	if _, err := s.Reserve(bg, replay("sel-1", "model")); err != nil {
		t.Fatal(err)
	}
}

func TestExplicitReservationDiscardsCachedSelection(t *testing.T) {
	s, _ := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	s.Select(bg, selReq("req-1", 1, 2, 3, 4))
	if _, err := s.Reserve(bg, explicit("req-1", 1, 4)); err != nil {
		t.Fatal(err)
	}
	s.Free(bg, "req-1")
	_, err := s.Reserve(bg, replay("req-1", "model"))
	wantKind(t, err, KindNotFound, "no pending selection")
}

func TestCachedBookingHonorsPrefillTracking(t *testing.T) {
	s, _ := newService(t, func(c *routerconfig.Config) { c.TrackPrefillTokens = false })
	mustUpsert(t, s, workerRec(1))
	s.Select(bg, selReq("a", 1, 2, 3, 4))
	s.Reserve(bg, replay("a", "model"))
	if l := loadOf(t, s); l.PotentialPrefillTokens != 0 {
		t.Fatalf("loads = %+v", l)
	}
	// Another prompt: the first booking was recorded into the approximate index,
	// so the same prompt would now be fully cached.
	req := selReq("b", 5, 6, 7, 8)
	req.RouterConfigOverride = &routerconfig.Override{TrackPrefillTokens: ptr(true)}
	s.Select(bg, req)
	s.Reserve(bg, replay("b", "model"))
	if l := loadOf(t, s); l.PotentialPrefillTokens != 4 {
		t.Fatalf("loads = %+v", l)
	}
}

func TestDumpAndApproximateRecording(t *testing.T) {
	s, _ := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	mustUpsert(t, s, workerRec(2))
	if d := s.Inspect().Dump(); d["model:default"].BlockSize != 4 || d["model:default"].Events == nil && len(d) != 1 {
		t.Fatalf("dump = %+v", d)
	}
	tokens := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	// A query-only select records nothing.
	s.Select(bg, selReq("q", tokens...))
	resp, _ := s.Select(bg, selReq("", tokens...))
	if resp.Overlap.LongestMatched != 0 {
		t.Fatal("a query-only select was recorded")
	}
	booked, err := s.SelectAndReserve(bg, selReq("b", tokens...))
	if err != nil {
		t.Fatal(err)
	}
	resp, _ = s.Select(bg, selReq("", tokens...))
	if resp.WorkerID != booked.WorkerID && resp.Overlap.LongestMatched == 0 {
		t.Fatalf("the booking was not recorded: %+v", resp)
	}
	ov, _ := s.Inspect().OverlapScores(bg, &PromptQuery{PartitionKey: PartitionKey{ModelName: "model"}, PromptRequest: PromptRequest{TokenIDs: tokens}})
	for _, r := range ov.Workers {
		if r.WorkerID == booked.WorkerID && r.DeviceBlocks != 2 {
			t.Fatalf("recorded blocks = %+v", r)
		}
	}
	if len(s.Inspect().Dump()["model:default"].Events) == 0 {
		t.Fatal("dump misses the recorded routing decision")
	}
}

func TestHashPathValidation(t *testing.T) {
	s, _ := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	for _, tc := range []struct {
		p    PromptRequest
		frag string
	}{
		{PromptRequest{BlockHashes: []int64{1}, SequenceHashes: []int64{1, 2}, ISLTokens: ptr(uint64(4))}, "block_hashes length 1 must match sequence_hashes length 2"},
		{PromptRequest{SequenceHashes: []int64{1}, ISLTokens: ptr(uint64(4))}, "block_hashes is required without token_ids"},
		{PromptRequest{BlockHashes: []int64{1}, ISLTokens: ptr(uint64(4))}, "sequence_hashes is required without token_ids"},
		{PromptRequest{BlockHashes: []int64{1}, SequenceHashes: []int64{1}}, "isl_tokens is required without token_ids"},
		{PromptRequest{BlockHashes: []int64{1}, SequenceHashes: []int64{1}, ISLTokens: ptr(uint64(0))}, "isl_tokens must be greater than 0"},
	} {
		_, err := s.Select(bg, &SelectRequest{PartitionKey: PartitionKey{ModelName: "model"}, PromptRequest: tc.p})
		wantKind(t, err, KindBadRequest, tc.frag)
	}
	huge := &SelectRequest{PartitionKey: PartitionKey{ModelName: "model"},
		PromptRequest: PromptRequest{BlockHashes: []int64{1}, SequenceHashes: []int64{1}, ISLTokens: ptr(uint64(1) << 63)}}
	_, err := s.Select(bg, huge)
	wantKind(t, err, KindBadRequest, "exceeds the supported maximum")
	_, err = s.Reserve(bg, &ReservationRequest{PartitionKey: PartitionKey{ModelName: "model"}, SelectionID: ptr("huge"), WorkerID: ptr(uint64(1)),
		PromptRequest: PromptRequest{SequenceHashes: []int64{1}, ISLTokens: ptr(uint64(1) << 63)}})
	wantKind(t, err, KindBadRequest, "exceeds the supported maximum")
	// Hash-only inputs are trusted and bit-cast.
	resp, err := s.SelectAndReserve(bg, &SelectRequest{PartitionKey: PartitionKey{ModelName: "model"},
		PromptRequest: PromptRequest{BlockHashes: []int64{5, 6}, SequenceHashes: []int64{-1, 7}, ISLTokens: ptr(uint64(8))}})
	if err != nil || !slices.Equal(resp.SequenceHashes, []int64{-1, 7}) {
		t.Fatalf("hash-only = %+v, %v", resp, err)
	}
}

func TestReconcileRollsBackPartialListenerRegistration(t *testing.T) {
	s, _ := newService(t, func(c *routerconfig.Config) { c.UseKVEvents = true })
	r := workerRec(7)
	r.DataParallelSize = ptr(uint32(2))
	r.KVEventsEndpoints = map[uint32]string{0: "tcp://127.0.0.1:5557", 1: "not-a-zmq-endpoint"}
	rec := mustUpsert(t, s, r)
	if rec.Lifecycle != catalog.Incomplete || !strings.Contains(rec.NotSchedulableReasons[0], "reconciliation failed") {
		t.Fatalf("record = %+v", rec)
	}
	rec, err := s.PatchWorker(bg, 7, catalog.Patch{KVEventsEndpoints: map[uint32]string{0: "tcp://127.0.0.1:5557", 1: "tcp://127.0.0.1:5558"}})
	if err != nil || rec.Lifecycle != catalog.Schedulable {
		t.Fatalf("patched = %+v, %v", rec, err)
	}
	_, err = s.PatchWorker(bg, 99, catalog.Patch{})
	wantKind(t, err, KindNotFound, "worker 99 not found")
}

func TestPartitionFreezesBlockSize(t *testing.T) {
	s, _ := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	r := workerRec(2)
	r.BlockSize = ptr(uint32(16))
	rec := mustUpsert(t, s, r)
	if rec.Lifecycle != catalog.Incomplete || !strings.Contains(rec.NotSchedulableReasons[0], "block_size mismatch") {
		t.Fatalf("record = %+v", rec)
	}
}

func TestUpsertMovesWorkerBetweenRoutingGroups(t *testing.T) {
	s, _ := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	moved := workerRec(1)
	moved.RoutingGroup = "tenant-b"
	mustUpsert(t, s, moved)
	_, err := s.Select(bg, selReq("", 1, 2, 3, 4))
	wantKind(t, err, KindNotReady, "no schedulable workers for model=model routing_group=default")
	req := selReq("", 1, 2, 3, 4)
	req.RoutingGroup = "tenant-b"
	if _, err := s.Select(bg, req); err != nil {
		t.Fatal(err)
	}
	if ws := s.Workers(nil, ptr("default")); len(ws) != 0 {
		t.Fatalf("worker still listed in the old group: %+v", ws)
	}
}

func TestDeleteWorker(t *testing.T) {
	s, _ := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	if _, err := s.SelectAndReserve(bg, selReq("x", 1, 2, 3, 4)); err != nil {
		t.Fatal(err)
	}
	rec, err := s.DeleteWorker(bg, 1)
	if err != nil || rec.Lifecycle != catalog.Unschedulable || rec.NotSchedulableReasons != nil {
		t.Fatalf("delete = %+v, %v", rec, err)
	}
	_, err = s.DeleteWorker(bg, 1)
	wantKind(t, err, KindNotFound, "worker 1 not found")
	wantKind(t, s.Free(bg, "x"), KindNotFound, "reservation x not found")
	if s.Ready().Ready || len(s.Workers(nil, nil)) != 0 {
		t.Fatal("deleted worker still in the catalog")
	}
}

func TestShutdown(t *testing.T) {
	s, _ := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	s.Shutdown()
	st := s.Ready()
	if st.Ready || st.SchedulableWorkers != 1 {
		t.Fatalf("ready during shutdown = %+v", st)
	}
	_, err := s.Select(bg, selReq("", 1, 2, 3, 4))
	wantKind(t, err, KindNotReady, "selection service is shutting down")
	_, err = s.UpsertWorker(bg, workerRec(2))
	wantKind(t, err, KindNotReady, "shutting down")
	_, err = s.Reserve(bg, replay("a", "model"))
	wantKind(t, err, KindNotReady, "shutting down")
	if _, err := s.DeleteWorker(bg, 1); err != nil {
		t.Fatalf("delete must work during shutdown: %v", err)
	}
}

func TestAdvisorySelectReportsWorkerLoad(t *testing.T) {
	s, _ := newService(t, func(c *routerconfig.Config) {
		c.ConditionalDisaggPrefillBusyThreshold = routerconfig.Some(0.5)
		c.ConditionalDisaggDecodeBusyThreshold = routerconfig.Some(0.0)
	})
	r := workerRec(1)
	r.TotalKVBlocks, r.MaxNumBatchedTokens = ptr(uint64(1000)), ptr(uint64(1024))
	mustUpsert(t, s, r)
	req := selReq("", 1, 2, 3, 4)
	req.Advisory = true
	resp, err := s.Select(bg, req)
	if err != nil {
		t.Fatal(err)
	}
	wl := resp.WorkerLoad
	if resp.DecodeBusy == nil || !*resp.DecodeBusy || wl == nil || *wl.TotalKVBlocks != 1000 || *wl.PrefillTokenCapacity != 1024 ||
		wl.ActivePrefillTokens != 0 || wl.PrefillBusy == nil || *wl.PrefillBusy {
		t.Fatalf("advisory = %+v / %+v", resp, wl)
	}
	if l := loadOf(t, s); l.ActiveRequests != 0 {
		t.Fatal("advisory select booked load")
	}
	plain, _ := newService(t, nil)
	mustUpsert(t, plain, workerRec(1))
	resp, _ = plain.Select(bg, req)
	if resp.DecodeBusy != nil || resp.WorkerLoad.PrefillBusy != nil || resp.WorkerLoad.TotalKVBlocks != nil {
		t.Fatalf("busy fields must be absent without thresholds and capacity: %+v", resp)
	}
}

func TestSameSelectionIDInTwoPartitionsConflicts(t *testing.T) {
	s, _ := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	other := workerRec(2)
	other.ModelName = "other"
	mustUpsert(t, s, other)
	if _, err := s.SelectAndReserve(bg, selReq("same", 1, 2, 3, 4)); err != nil {
		t.Fatal(err)
	}
	req := selReq("same", 1, 2, 3, 4)
	req.ModelName = "other"
	_, err := s.SelectAndReserve(bg, req)
	wantKind(t, err, KindConflict, "already reserved")
}

// sessionReq is selReq for a request of session sid.
func sessionReq(sid, id string, tokens ...uint32) *SelectRequest {
	r := selReq(id, tokens...)
	r.SessionID = ptr(sid)
	return r
}

// sessionService is a service with session affinity on (one minute) and
// workers 1 and 2.
func sessionService(t *testing.T) (*Service, *fakeClock) {
	t.Helper()
	s, clock := newService(t, func(c *routerconfig.Config) { c.SessionAffinityTTL = routerconfig.Some(time.Minute) })
	mustUpsert(t, s, workerRec(1))
	mustUpsert(t, s, workerRec(2))
	return s, clock
}

func TestSessionAffinityKeepsSessionOnItsWorker(t *testing.T) {
	s, clock := sessionService(t)
	req := func(id string, tokens ...uint32) *SelectRequest { return sessionReq("sess", id, tokens...) }
	first, err := s.SelectAndReserve(bg, req("a", 1, 2, 3, 4))
	if err != nil {
		t.Fatal(err)
	}
	for i, tokens := range [][]uint32{{9, 9, 9, 9}, {5, 6, 7, 8, 9, 10, 11, 12}} {
		r, err := s.SelectAndReserve(bg, req(string(rune('b'+i)), tokens...))
		if err != nil || r.WorkerID != first.WorkerID {
			t.Fatalf("booking %d went to %d, session bound to %d (%v)", i, r.WorkerID, first.WorkerID, err)
		}
	}
	q, err := s.Select(bg, req("", 42, 42, 42, 42))
	if err != nil || q.WorkerID != first.WorkerID {
		t.Fatalf("select ignored the binding: %+v %v", q, err)
	}
	for _, id := range []string{"a", "b", "c"} {
		s.Free(bg, id)
	}
	clock.Add(2 * time.Minute)
	s.Maintain(bg)
	long := ptr(strings.Repeat("x", 257))
	r := selReq("", 1, 2, 3, 4)
	r.SessionID = long
	_, err = s.Select(bg, r)
	wantKind(t, err, KindBadRequest, "session affinity ID must not exceed 256 bytes")
	// Without affinity a session id is only policy input: any length is fine.
	plain, _ := newService(t, nil)
	mustUpsert(t, plain, workerRec(1))
	if _, err := plain.Select(bg, r); err != nil {
		t.Fatalf("long session id without affinity: %v", err)
	}
}

func TestKVHintFromSameRoleSource(t *testing.T) {
	s, _ := newService(t, func(c *routerconfig.Config) { c.UseKVEvents = true })
	for _, id := range []uint64{1, 2} {
		r := workerRec(id)
		r.KVEventsEndpoint = ptr("tcp://127.0.0.1:555" + string(rune('0'+id)))
		r.RouterHintWorkerType = ptr("decode")
		r.RouterHintSourceControlEndpoints = map[uint32]string{0: "tcp://worker-" + string(rune('0'+id)) + ":5600"}
		mustUpsert(t, s, r)
	}
	// Worker 1 holds two blocks of the prompt; the booking is pinned to worker 2.
	locals := kvhash.LocalBlockHashes([]uint32{1, 2, 3, 4, 5, 6, 7, 8}, "", "", kvhash.BlockOptions{BlockSize: 4})
	p := s.parts.Get(partitionOf(PartitionKey{ModelName: "model"}))
	ev := indexStored(1, locals)
	if err := p.Index().Apply(&ev); err != nil {
		t.Fatal(err)
	}
	req := selReq("hint-1", 1, 2, 3, 4, 5, 6, 7, 8)
	req.PinnedWorker = &WorkerRank{WorkerID: 2}
	resp, err := s.SelectAndReserve(bg, req)
	if err != nil {
		t.Fatal(err)
	}
	h := resp.KVHint
	if h == nil || h.MessageID != "hint-1" || h.Actions[0].Payload.SourceControlEndpoint != "tcp://worker-1:5600" ||
		!slices.Equal(h.Actions[0].Payload.BlockHashes, kvhash.SequenceHashes(locals)) {
		t.Fatalf("hint = %+v", h)
	}
	// No hint on a query-only select, nor when booking on the source itself.
	q, _ := s.Select(bg, selReq("", 1, 2, 3, 4, 5, 6, 7, 8))
	if q.KVHint != nil {
		t.Fatal("query-only select carries a hint")
	}
	req = selReq("hint-2", 1, 2, 3, 4, 5, 6, 7, 8)
	req.PinnedWorker = &WorkerRank{WorkerID: 1}
	if resp, _ := s.SelectAndReserve(bg, req); resp.KVHint != nil {
		t.Fatal("hint when booking on the source")
	}
}

// TestConcurrentBookingsAndCatalogChanges: many goroutines select, book and free
// while workers are upserted and deleted. Run with -race. Afterwards every
// booking was freed exactly once or released with its worker, and no load is
// left behind.
func TestConcurrentBookingsAndCatalogChanges(t *testing.T) {
	s, _ := newService(t, nil)
	for id := uint64(1); id <= 4; id++ {
		mustUpsert(t, s, workerRec(id))
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	freed := map[string]int{}
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 150 {
				id := string(rune('A'+g)) + "-" + itoa(i)
				tokens := []uint32{uint32(i % 7), 2, 3, 4, uint32(g), 6, 7, 8}
				if _, err := s.SelectAndReserve(bg, selReq(id, tokens...)); err != nil {
					if k := KindOf(err); k != KindNotReady && k != KindUnavailable {
						t.Errorf("select_and_reserve: %v", err)
					}
					continue
				}
				s.PrefillComplete(bg, id)
				if err := s.Free(bg, id); err == nil {
					mu.Lock()
					freed[id]++
					mu.Unlock()
				} else if KindOf(err) != KindNotFound {
					t.Errorf("free: %v", err)
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 60 {
			id := uint64(1 + i%4)
			if i%3 == 0 {
				s.DeleteWorker(bg, id)
			} else {
				s.UpsertWorker(bg, workerRec(id))
			}
		}
		for id := uint64(1); id <= 4; id++ {
			s.UpsertWorker(bg, workerRec(id))
		}
	}()
	wg.Wait()
	for id, n := range freed {
		if n != 1 {
			t.Fatalf("booking %s freed %d times", id, n)
		}
	}
	for _, ml := range s.Inspect().Loads(nil, nil) {
		for _, l := range ml.Loads {
			if l.ActiveRequests != 0 || l.PotentialDecodeBlocks != 0 || l.PotentialPrefillTokens != 0 {
				t.Fatalf("load left behind: %+v", l)
			}
		}
	}
	left := s.resv.Len()
	if left != 0 {
		t.Fatalf("%d reservation rows leaked", left)
	}
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{byte('0' + i%10)}, b...)
	}
	return string(b)
}

// indexStored is a device Stored event of worker (rank 0) holding locals, as a
// KV-event listener would apply it.
func indexStored(worker uint64, locals []uint64) index.Event {
	blocks := make([]index.Block, len(locals))
	for i, l := range locals {
		blocks[i] = index.Block{Ext: l ^ 0x5555, Local: l}
	}
	return index.Event{Worker: index.WorkerKey{WorkerID: worker}, Kind: index.EventStored, Blocks: blocks}
}
