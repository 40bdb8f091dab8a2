package selection

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/routerconfig"
	"github.com/kvselect/kvselect/selection/scheduler"
)

// pdService is a service with decode workers 1 and 2 and prefill workers 11
// and 12 (role prefill, no routing group: they join "prefill"), block size 4,
// approximate index.
func pdService(t testing.TB, edit func(*routerconfig.Config)) (*Service, *[]string) {
	t.Helper()
	return pdServiceSeeded(t, edit, 1)
}

// pdServiceSeeded is pdService with its own random seed (and so its own
// replica id).
func pdServiceSeeded(t testing.TB, edit func(*routerconfig.Config), seed uint64) (*Service, *[]string) {
	t.Helper()
	rc := routerconfig.Default()
	rc.UseKVEvents = false
	if edit != nil {
		edit(&rc)
	}
	var mu sync.Mutex
	var transitions []string
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	s, err := New(Config{Router: rc, Clock: clock.Now, Rand: rand.New(rand.NewPCG(seed, 2)),
		OnPrefillPool: func(model string, usable bool, reason string) {
			mu.Lock()
			transitions = append(transitions, fmt.Sprintf("%s usable=%v %s", model, usable, reason))
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []uint64{1, 2} {
		mustUpsert(t, s, workerRec(id))
	}
	for _, id := range []uint64{11, 12} {
		r := catalog.Record{WorkerID: id, ModelName: "model", Role: ptr(catalog.RolePrefill),
			Endpoint: ptr(fmt.Sprintf("http://prefill-%d:8000", id)), BlockSize: ptr(uint32(4))}
		if out := mustUpsert(t, s, r); out.RoutingGroup != DefaultPrefillRoutingGroup || out.Lifecycle != catalog.Schedulable {
			t.Fatalf("prefill worker = group %q lifecycle %s %v", out.RoutingGroup, out.Lifecycle, out.NotSchedulableReasons)
		}
	}
	return s, &transitions
}

func pdReq(id string, n int) *SelectRequest {
	toks := make([]uint32, n)
	for i := range toks {
		toks[i] = uint32(i + 1)
	}
	r := selReq(id, toks...)
	r.Disaggregated = true
	return r
}

// loadsOf sums each group's potential prefill tokens and active requests.
func loadsOf(s *Service) map[string][2]uint64 {
	out := map[string][2]uint64{}
	for _, ml := range s.Inspect().Loads(nil, nil) {
		var sum [2]uint64
		for _, l := range ml.Loads {
			sum[0] += l.PotentialPrefillTokens
			sum[1] += l.ActiveRequests
		}
		out[ml.RoutingGroup] = sum
	}
	return out
}

func TestDisaggregatedReserveUnconditionalPrefillsRemotely(t *testing.T) {
	s, _ := pdService(t, nil)
	resp, err := s.SelectAndReserve(bg, pdReq("r1", 32))
	if err != nil {
		t.Fatal(err)
	}
	if resp.RoutingGroup != "default" || (resp.WorkerID != 1 && resp.WorkerID != 2) {
		t.Fatalf("decode selection = %s worker %d", resp.RoutingGroup, resp.WorkerID)
	}
	pf := resp.Prefill.Selection
	if !resp.Prefill.Set || pf == nil || (pf.WorkerID != 11 && pf.WorkerID != 12) || pf.RoutingGroup != "prefill" {
		t.Fatalf("prefill = %+v", resp.Prefill)
	}
	if *pf.SelectionID != "r1.prefill" || pf.EffectivePrefillTokens != 32 || !strings.HasPrefix(pf.Endpoint, "http://prefill-") {
		t.Fatalf("prefill selection = %+v", pf)
	}
	if d := resp.PrefillDecision; d == nil || !d.Remote || d.Reason != scheduler.ReasonDisaggUnconditional {
		t.Fatalf("decision = %+v", d)
	}
	if *resp.TrackPrefillTokens {
		t.Error("the decode booking of a remote prefill tracks prefill tokens")
	}
	// The prefill carries the prompt's prefill; the decode booking none.
	if got := loadsOf(s); got["prefill"] != [2]uint64{32, 1} || got["default"] != [2]uint64{0, 1} {
		t.Fatalf("loads = %v", got)
	}
	// The decode side's prefill completion frees the prefill booking.
	if err := s.PrefillComplete(bg, "r1"); err != nil {
		t.Fatal(err)
	}
	if got := loadsOf(s); got["prefill"] != [2]uint64{0, 0} || got["default"] != [2]uint64{0, 1} {
		t.Fatalf("loads after prefill_complete = %v", got)
	}
	if err := s.Free(bg, "r1"); err != nil {
		t.Fatal(err)
	}
	if got := loadsOf(s); got["prefill"] != [2]uint64{} || got["default"] != [2]uint64{} {
		t.Fatalf("loads after free = %v", got)
	}
	if err := s.Free(bg, "r1.prefill"); KindOf(err) != KindNotFound {
		t.Fatalf("the prefill booking outlived its prefill completion: %v", err)
	}
	if st := s.Inspect().DisaggStats(); st[scheduler.ReasonDisaggUnconditional] != 1 {
		t.Fatalf("stats = %v", st)
	}
}

func TestDisaggregatedFreeReleasesBothBookingsOnce(t *testing.T) {
	s, _ := pdService(t, nil)
	if _, err := s.SelectAndReserve(bg, pdReq("r1", 16)); err != nil {
		t.Fatal(err)
	}
	// The stream died before the first byte: one free releases both.
	if err := s.Free(bg, "r1"); err != nil {
		t.Fatal(err)
	}
	if got := loadsOf(s); got["prefill"] != [2]uint64{} || got["default"] != [2]uint64{} {
		t.Fatalf("loads = %v", got)
	}
	for _, id := range []string{"r1", "r1.prefill"} {
		if err := s.Free(bg, id); KindOf(err) != KindNotFound {
			t.Errorf("second free of %s: %v, want not found", id, err)
		}
	}
	// The prefill booking is a reservation of its own, freeable directly.
	if _, err := s.SelectAndReserve(bg, pdReq("r2", 16)); err != nil {
		t.Fatal(err)
	}
	if err := s.Free(bg, "r2.prefill"); err != nil {
		t.Fatal(err)
	}
	if err := s.PrefillComplete(bg, "r2"); err != nil {
		t.Fatal(err)
	}
	if err := s.Free(bg, "r2"); err != nil {
		t.Fatal(err)
	}
	if got := loadsOf(s); got["prefill"] != [2]uint64{} || got["default"] != [2]uint64{} {
		t.Fatalf("loads = %v", got)
	}
}

func TestDisaggregatedConditionalKeepsCachedPromptsLocal(t *testing.T) {
	s, _ := pdService(t, func(c *routerconfig.Config) { c.ConditionalDisagg = true })
	// Cold 32-token prompt: uncached ratio 1.0 ≥ 0.7, remote.
	first, err := s.SelectAndReserve(bg, pdReq("a", 32))
	if err != nil {
		t.Fatal(err)
	}
	if d := first.PrefillDecision; !d.Remote || d.Reason != scheduler.ReasonPolicyDeclined {
		t.Fatalf("cold prompt decision = %+v", d)
	}
	// The same prompt plus 4 tokens: the approximate index credits the
	// decode worker that was booked with the first 32, so 4 of 36 are
	// uncached (ratio 0.11) — local, on that worker.
	second, err := s.SelectAndReserve(bg, pdReq("b", 36))
	if err != nil {
		t.Fatal(err)
	}
	if d := second.PrefillDecision; d.Remote || d.Reason != scheduler.ReasonDecodeGateOff || second.Prefill.Selection != nil {
		t.Fatalf("warm prompt decision = %+v prefill %+v", d, second.Prefill)
	}
	if second.WorkerID != first.WorkerID || second.EffectivePrefillTokens != 4 || !*second.TrackPrefillTokens {
		t.Fatalf("warm prompt went to worker %d with %d uncached (first on %d)", second.WorkerID, second.EffectivePrefillTokens, first.WorkerID)
	}
	// Marshalled, a local decision says prefill: null.
	b, _ := json.Marshal(second)
	if !strings.Contains(string(b), `"prefill":null,"prefill_decision":{"remote":false,"reason":"bypass_allowed_decode_gate_disabled"}`) {
		t.Fatalf("json = %s", b)
	}
}

func TestDisaggregatedDecodeGate(t *testing.T) {
	s, _ := pdService(t, func(c *routerconfig.Config) {
		c.ConditionalDisagg = true
		c.ConditionalDisaggDecodeBusyThreshold = routerconfig.Some(0.0)
	})
	// The decode workers report no total_kv_blocks: the gate cannot clear
	// a local prefill, so even an empty-uncached prompt goes remote.
	if _, err := s.SelectAndReserve(bg, pdReq("a", 8)); err != nil {
		t.Fatal(err)
	}
	resp, err := s.SelectAndReserve(bg, pdReq("b", 8))
	if err != nil {
		t.Fatal(err)
	}
	if d := resp.PrefillDecision; !d.Remote || d.Reason != scheduler.ReasonDecodeBusyUnknown {
		t.Fatalf("decision = %+v", d)
	}
}

func TestDisaggregatedFallsBackWhenPrefillPoolEmpties(t *testing.T) {
	s, transitions := pdService(t, nil)
	if r, err := s.SelectAndReserve(bg, pdReq("a", 8)); err != nil || !r.PrefillDecision.Remote {
		t.Fatalf("%+v %v", r, err)
	}
	for _, id := range []uint64{11, 12} {
		if _, err := s.DeleteWorker(bg, id); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"b", "c"} {
		r, err := s.SelectAndReserve(bg, pdReq(id, 8))
		if err != nil {
			t.Fatalf("no prefill pool: %v", err)
		}
		if d := r.PrefillDecision; d.Remote || d.Reason != scheduler.ReasonNoPrefillWorkers || r.Prefill.Selection != nil || !*r.TrackPrefillTokens {
			t.Fatalf("decision = %+v", d)
		}
	}
	mustUpsert(t, s, catalog.Record{WorkerID: 13, ModelName: "model", RoutingGroup: "prefill",
		Endpoint: ptr("http://prefill-13:8000"), BlockSize: ptr(uint32(4))})
	if r, err := s.SelectAndReserve(bg, pdReq("d", 8)); err != nil || r.Prefill.Selection == nil || r.Prefill.Selection.WorkerID != 13 {
		t.Fatalf("%+v %v", r, err)
	}
	want := []string{"model usable=false no_prefill_workers", "model usable=true conditional_disagg_disabled"}
	if strings.Join(*transitions, "|") != strings.Join(want, "|") {
		t.Fatalf("transitions = %q, want %q (one per change)", *transitions, want)
	}
	st := s.Inspect().DisaggStats()
	if st[scheduler.ReasonNoPrefillWorkers] != 2 || st[scheduler.ReasonDisaggUnconditional] != 2 {
		t.Fatalf("stats = %v", st)
	}
}

func TestDisaggregatedPrefillUnavailableFallsBack(t *testing.T) {
	// Busy rejection at 0 prefill tokens: a prefill worker with a booking is
	// overloaded. Decode workers 1 and 2 are too, so the test books on the
	// prefill pool directly to fill it.
	s, _ := pdService(t, func(c *routerconfig.Config) {
		c.ActivePrefillTokensThreshold = routerconfig.Some(0)
	})
	for _, id := range []string{"p1", "p2"} {
		r := pdReq(id, 8)
		r.Disaggregated, r.RoutingGroup = false, "prefill"
		if _, err := s.SelectAndReserve(bg, r); err != nil {
			t.Fatal(err)
		}
	}
	r, err := s.SelectAndReserve(bg, pdReq("x", 8))
	if err != nil {
		t.Fatalf("an overloaded prefill pool failed the request: %v", err)
	}
	if d := r.PrefillDecision; d.Remote || d.Reason != scheduler.ReasonPrefillUnavailable {
		t.Fatalf("decision = %+v", d)
	}
	if err := s.Free(bg, "x.prefill"); KindOf(err) != KindNotFound {
		t.Fatalf("a failed prefill booking left a reservation: %v", err)
	}
}

func TestDisaggregatedRequestErrors(t *testing.T) {
	s, _ := pdService(t, nil)
	r := pdReq("a", 8)
	r.RoutingGroup = "prefill"
	_, err := s.SelectAndReserve(bg, r)
	wantKind(t, err, KindBadRequest, "names the decode routing group")
	_, err = s.Select(bg, r)
	wantKind(t, err, KindBadRequest, "names the decode routing group")
	// An id whose prefill booking id is taken conflicts, and books nothing.
	taken := pdReq("z.prefill", 8)
	taken.Disaggregated = false
	if _, err := s.SelectAndReserve(bg, taken); err != nil {
		t.Fatal(err)
	}
	_, err = s.SelectAndReserve(bg, pdReq("z", 8))
	wantKind(t, err, KindConflict, "z.prefill")
	if got := loadsOf(s); got["prefill"][1] != 0 || got["default"][1] != 1 {
		t.Fatalf("loads = %v (only z.prefill should be booked)", got)
	}
}

func TestDisaggregatedSelectCachesBothStages(t *testing.T) {
	s, _ := pdService(t, nil)
	resp, err := s.Select(bg, pdReq("s1", 16))
	if err != nil {
		t.Fatal(err)
	}
	pf := resp.Prefill.Selection
	if pf == nil || *pf.SelectionID != "s1.prefill" {
		t.Fatalf("prefill = %+v", resp.Prefill)
	}
	if got := loadsOf(s); got["prefill"][1] != 0 || got["default"][1] != 0 {
		t.Fatalf("select booked: %v", got)
	}
	// Ray's flow: reserve each stage from its cached selection.
	pr, err := s.Reserve(bg, &ReservationRequest{PartitionKey: PartitionKey{ModelName: "model", RoutingGroup: "prefill"}, SelectionID: pf.SelectionID})
	if err != nil || pr.WorkerID != pf.WorkerID {
		t.Fatalf("prefill replay = %+v, %v", pr, err)
	}
	dr, err := s.Reserve(bg, replay("s1", "model"))
	if err != nil || dr.WorkerID != resp.WorkerID {
		t.Fatalf("decode replay = %+v, %v", dr, err)
	}
}

func TestNonDisaggregatedResponseIsUnchanged(t *testing.T) {
	s, _ := pdService(t, nil)
	resp, err := s.SelectAndReserve(bg, selReq("a", 1, 2, 3, 4))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(resp)
	if strings.Contains(string(b), "prefill\"") || strings.Contains(string(b), "prefill_decision") {
		t.Fatalf("a plain request's answer mentions prefill: %s", b)
	}
	if got := loadsOf(s); got["default"] != [2]uint64{4, 1} || got["prefill"][1] != 0 {
		t.Fatalf("loads = %v", got)
	}
	if st := s.Inspect().DisaggStats(); st[scheduler.ReasonDisaggUnconditional]+st[scheduler.ReasonNoPrefillWorkers] != 0 {
		t.Fatalf("a plain request was counted: %v", st)
	}
}

func TestWorkerRoleConflictsMakeIncompleteWorkers(t *testing.T) {
	s, _ := newService(t, nil)
	for _, tc := range []struct {
		name  string
		role  *string
		group string
		want  string // "" = schedulable
	}{
		{"prefill role in another group", ptr("prefill"), "fast", `role prefill conflicts with routing_group "fast"`},
		{"decode role in the prefill group", ptr("decode"), "prefill", `role decode conflicts with routing_group "prefill"`},
		{"both in the prefill group", ptr("both"), "prefill", `role both conflicts`},
		{"no role in the prefill group is a prefill worker (Dynamo's way)", nil, "prefill", ""},
		{"decode role in the default group", ptr("decode"), "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := workerRec(1)
			r.Role, r.RoutingGroup = tc.role, tc.group
			out := mustUpsert(t, s, r)
			got := strings.Join(out.NotSchedulableReasons, "; ")
			if (tc.want == "") != (out.Lifecycle == catalog.Schedulable) || !strings.Contains(got, tc.want) {
				t.Fatalf("lifecycle %s reasons %q, want %q", out.Lifecycle, got, tc.want)
			}
		})
	}
	r := workerRec(2)
	r.Role = ptr("prefiller")
	_, err := s.UpsertWorker(bg, r)
	wantKind(t, err, KindBadRequest, "role must be one of prefill, decode, both")
}

// A disaggregated booking replicates as two bookings, one per group, and the
// origin's prefill completion frees the prefill one on the peer too.
func TestDisaggregatedBookingsReplicate(t *testing.T) {
	a, _ := pdService(t, nil)
	b, _ := pdServiceSeeded(t, nil, 7)
	ra := &recorder{}
	a.Replica().ObserveReplicas(ra)
	if _, err := a.SelectAndReserve(bg, pdReq("r", 8)); err != nil {
		t.Fatal(err)
	}
	evs, _ := ra.take()
	if len(evs) != 2 || evs[0].RequestID != "r.prefill" || evs[0].Partition.RoutingGroup != "prefill" || evs[1].RequestID != "r" || evs[1].Partition.RoutingGroup != "default" {
		t.Fatalf("published %+v", evs)
	}
	deliver(t, b, evs, RemoteApplied)
	if got := loadsOf(b); got["prefill"] != [2]uint64{8, 1} || got["default"] != [2]uint64{0, 1} {
		t.Fatalf("peer loads = %v", got)
	}
	if err := a.PrefillComplete(bg, "r"); err != nil {
		t.Fatal(err)
	}
	if err := a.Free(bg, "r"); err != nil {
		t.Fatal(err)
	}
	evs, _ = ra.take()
	deliver(t, b, evs, RemoteApplied)
	if got := loadsOf(b); got["prefill"] != [2]uint64{} || got["default"] != [2]uint64{} {
		t.Fatalf("peer loads after the lifecycle = %v (events %+v)", got, evs)
	}
}

func TestDisaggregatedPrefillLoadKeepsBusyPoolLocal(t *testing.T) {
	s, _ := pdService(t, func(c *routerconfig.Config) {
		c.ConditionalDisagg, c.ConditionalDisaggPolicy = true, routerconfig.DisaggPrefillLoad
		c.ConditionalDisaggPrefillBusyThreshold = routerconfig.Some(0.5)
	})
	for _, id := range []uint64{11, 12} {
		if _, err := s.PatchWorker(bg, id, catalog.Patch{MaxNumBatchedTokens: ptr(uint64(16))}); err != nil {
			t.Fatal(err)
		}
	}
	// The busy line is 0.5 × 16 = 8 active prefill tokens. The first two
	// 12-token prompts find an idle prefill worker each and go remote.
	first, err := s.SelectAndReserve(bg, pdReq("a", 12))
	if err != nil || !first.PrefillDecision.Remote {
		t.Fatalf("%+v %v", first.PrefillDecision, err)
	}
	second, err := s.SelectAndReserve(bg, pdReq("b", 12))
	if err != nil || !second.PrefillDecision.Remote || second.Prefill.Selection.WorkerID == first.Prefill.Selection.WorkerID {
		t.Fatalf("second: %+v %v", second.Prefill, err)
	}
	// Both prefill workers now hold 12 > 8 prefill tokens: busy, local.
	third, err := s.SelectAndReserve(bg, pdReq("c", 12))
	if err != nil || third.PrefillDecision.Remote || third.PrefillDecision.Reason != scheduler.ReasonDecodeGateOff {
		t.Fatalf("third: %+v %v", third.PrefillDecision, err)
	}
}

// Concurrent disaggregated bookings, frees and prefill workers coming and
// going (run with -race): every booking is freed once and nothing is left.
func TestDisaggregatedConcurrentChurnLeavesNothing(t *testing.T) {
	s, _ := pdService(t, func(c *routerconfig.Config) { c.ConditionalDisagg = true })
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 200 {
				id := fmt.Sprintf("g%d-%d", g, i)
				if _, err := s.SelectAndReserve(bg, pdReq(id, 4+(i%5)*16)); err != nil {
					t.Error(err)
					return
				}
				if i%2 == 0 {
					_ = s.PrefillComplete(bg, id)
				}
				if err := s.Free(bg, id); err != nil && KindOf(err) != KindNotFound {
					t.Error(err)
				}
			}
		})
	}
	wg.Go(func() {
		for i := range 50 {
			w := catalog.Record{WorkerID: 12, ModelName: "model", Role: ptr(catalog.RolePrefill),
				Endpoint: ptr("http://prefill-12:8000"), BlockSize: ptr(uint32(4))}
			if i%2 == 0 {
				_, _ = s.DeleteWorker(bg, 12)
			} else {
				_, _ = s.UpsertWorker(bg, w)
			}
		}
	})
	wg.Wait()
	if got := loadsOf(s); got["prefill"] != [2]uint64{} || got["default"] != [2]uint64{} {
		t.Fatalf("loads = %v", got)
	}
	st := s.Inspect().DisaggStats()
	total := uint64(0)
	for _, n := range st {
		total += n
	}
	if total != 800 {
		t.Fatalf("%d decisions counted, want 800: %v", total, st)
	}
}

// A prefill pool whose every worker the health checks ejected (an active
// probe's failures, say) is not usable: decode workers prefill locally, and
// the pool is usable again once a worker is restored.
func TestDisaggregatedEjectedPrefillPoolFallsBack(t *testing.T) {
	s, transitions := pdService(t, nil)
	for _, id := range []uint64{11, 12} {
		for range 5 {
			if _, err := s.ReportOutcome(id, Outcome{Detail: "probe: connect: refused", Source: "probe"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	r, err := s.SelectAndReserve(bg, pdReq("a", 8))
	if err != nil {
		t.Fatalf("an ejected prefill pool failed the request: %v", err)
	}
	if d := r.PrefillDecision; d.Remote || d.Reason != scheduler.ReasonPrefillUnavailable || !*r.TrackPrefillTokens {
		t.Fatalf("decision = %+v", d)
	}
	if got := strings.Join(*transitions, "|"); got != "model usable=false prefill_unavailable" {
		t.Fatalf("transitions = %q", got)
	}
}

// Every decision gives its overlap rows back once its caller has answered,
// on every path: plain and disaggregated selections, booked or not,
// unconditional and conditional (the prefill-load policy probes the prefill
// pool with a decision of its own), with and without a selection id.
func TestDecisionsGiveTheirOverlapRowsBack(t *testing.T) {
	cases := []struct {
		name string
		edit func(*routerconfig.Config)
	}{
		{"unconditional", nil},
		{"conditional", func(c *routerconfig.Config) { c.ConditionalDisagg = true }},
		{"conditional on prefill load", func(c *routerconfig.Config) {
			c.ConditionalDisagg, c.ConditionalDisaggPolicy = true, routerconfig.DisaggPrefillLoad
			c.ConditionalDisaggPrefillBusyThreshold = routerconfig.Some(0.5)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := pdService(t, tc.edit)
			for i := range 40 {
				id := fmt.Sprint(tc.name, i)
				n := 4 + (i%5)*16
				if _, err := s.SelectAndReserve(bg, pdReq(id, n)); err != nil {
					t.Fatal(err)
				}
				if err := s.Free(bg, id); err != nil {
					t.Fatal(err)
				}
				sel := pdReq("", n)
				if i%2 == 0 {
					sid := id + "-select"
					sel.SelectionID = &sid
				}
				if _, err := s.Select(bg, sel); err != nil {
					t.Fatal(err)
				}
				plain := pdReq(id+"-plain", n)
				plain.Disaggregated = false
				if _, err := s.SelectAndReserve(bg, plain); err != nil {
					t.Fatal(err)
				}
				if err := s.Free(bg, id+"-plain"); err != nil {
					t.Fatal(err)
				}
			}
			if out := s.rows.out.Load(); out != 0 {
				t.Fatalf("%d overlap arrays never given back", out)
			}
		})
	}
}
