package selection

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

// report hands the service one scrape of a worker's whole engine (unranked).
func report(t testing.TB, s *Service, c *fakeClock, id uint64, r EngineRank) {
	t.Helper()
	if !s.ReportEngineMetrics(id, EngineSnapshot{At: c.Now(), Ranks: map[uint32]EngineRank{AllRanks: r}}) {
		t.Fatalf("report for worker %d dropped", id)
	}
}

// picks counts which worker n selections choose.
func picks(t testing.TB, s *Service, n int, edit func(*SelectRequest)) map[uint64]int {
	t.Helper()
	out := map[uint64]int{}
	for i := range n {
		req := selReq("", uint32(100+i), 2, 3, 4, 5)
		if edit != nil {
			edit(req)
		}
		resp, err := s.Select(bg, req)
		if err != nil {
			t.Fatal(err)
		}
		out[resp.WorkerID]++
	}
	return out
}

func TestEngineMetricsSteerAwayFromUnbookedRequests(t *testing.T) {
	for _, busy := range []uint64{1, 2} {
		s, c := newService(t, nil)
		mustUpsert(t, s, workerRec(1))
		mustUpsert(t, s, workerRec(2))
		// Without engine figures the two tie and both are picked.
		if got := picks(t, s, 40, nil); got[1] == 0 || got[2] == 0 {
			t.Fatalf("without engine metrics picks = %v, want both", got)
		}
		report(t, s, c, busy, EngineRank{Running: 3, Waiting: 2})
		other := 3 - busy
		if got := picks(t, s, 20, nil); got[other] != 20 {
			t.Fatalf("worker %d holds 5 unbooked requests: picks = %v, want all on %d", busy, got, other)
		}
		// Stale figures are not used: the tie is back.
		c.Add(2*time.Second + time.Millisecond)
		if got := picks(t, s, 40, nil); got[1] == 0 || got[2] == 0 {
			t.Fatalf("stale engine metrics still steer: picks = %v", got)
		}
	}
}

func TestBookedRequestsAreNotCountedTwice(t *testing.T) {
	s, c := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	mustUpsert(t, s, workerRec(2))
	// Three bookings on worker 1, which its engine reports as running: they
	// are this service's own load, not extra load.
	for i := range 3 {
		req := selReq(itoa(i), uint32(200+i), 1)
		req.PinnedWorker = &WorkerRank{WorkerID: 1}
		if _, err := s.SelectAndReserve(bg, req); err != nil {
			t.Fatal(err)
		}
	}
	var base [3]float64
	for i, running := range []float64{0, 3, 5} {
		report(t, s, c, 1, EngineRank{Running: running})
		cands := s.candidatesFor(t, "")
		for _, cd := range cands {
			if cd.Worker.WorkerID == 1 {
				base[i] = max(cd.EngineWaiting+cd.EngineRunning-float64(cd.ActiveRequests), 0)
			}
		}
	}
	if base != [3]float64{0, 0, 2} {
		t.Fatalf("unbooked requests for engine running 0, 3, 5 with 3 bookings = %v, want [0 0 2]", base)
	}
}

// candidatesFor returns the candidates a selection of the default partition
// would see now.
func (s *Service) candidatesFor(t testing.TB, lora string) []candidateView {
	t.Helper()
	p := s.parts.Get(partitionOf(PartitionKey{ModelName: "model"}))
	st := p.Sched()
	st.Lock()
	defer st.Unlock()
	ws := p.Workers()
	projs := p.Loads().Project(nil, nil)
	cands, _ := ws.Candidates(nil, projs, nil, &s.judge, lora, s.clock())
	out := make([]candidateView, len(cands))
	for i, c := range cands {
		out[i] = candidateView{Worker: c.Worker, EngineWaiting: c.EngineWaiting, EngineRunning: c.EngineRunning,
			ActiveRequests: float64(c.ActiveRequests), Saturated: c.Saturated, LoRAFit: c.LoRAFit, Fresh: c.EngineFresh}
	}
	return out
}

type candidateView struct {
	Worker                                       index.WorkerKey
	EngineWaiting, EngineRunning, ActiveRequests float64
	Saturated, Fresh                             bool
	LoRAFit                                      int
}

// Both thresholds make a rank saturated (GET /workers says so); only the
// waiting queue's keeps it out of selection while another rank has room.
func TestSaturation(t *testing.T) {
	tests := []struct {
		name           string
		rank           EngineRank
		saturated      bool
		skipped        bool
		cachedOnWorker bool // worker 1 holds the prompts' prefix (text index)
	}{
		{"idle", EngineRank{}, false, false, false},
		{"four waiting", EngineRank{Waiting: 4, Running: 50}, false, false, false},
		{"five waiting", EngineRank{Waiting: 5}, true, true, false},
		{"five waiting, prefix cached there", EngineRank{Waiting: 5}, true, true, true},
		{"kv usage 0.79", EngineRank{KVUsage: 0.79, HasKVUsage: true}, false, false, false},
		{"kv usage 0.8", EngineRank{KVUsage: 0.8, HasKVUsage: true}, true, false, false},
		{"kv usage 0.8, prefix cached there", EngineRank{KVUsage: 0.8, HasKVUsage: true}, true, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, c := newService(t, nil)
			mustUpsert(t, s, workerRec(1))
			mustUpsert(t, s, workerRec(2))
			prefix := strings.Repeat("a long shared system prompt. ", 40)
			if tt.cachedOnWorker {
				r, err := s.SelectAndReserve(bg, &SelectRequest{PartitionKey: PartitionKey{ModelName: "model"},
					PromptRequest: PromptRequest{PromptText: prefix}, AllowedWorkerIDs: []uint64{1}})
				if err != nil {
					t.Fatal(err)
				}
				if err := s.Free(bg, *r.SelectionID); err != nil {
					t.Fatal(err)
				}
			}
			report(t, s, c, 1, tt.rank)
			got := picks(t, s, 20, nil)
			if tt.skipped && got[1] != 0 {
				t.Fatalf("queue-saturated worker 1 picked: %v", got)
			}
			if tt.saturated && !tt.skipped && got[1] == 0 {
				t.Fatalf("worker 1 with room in its queue never picked: %v", got)
			}
			if tt.cachedOnWorker {
				r, err := s.Select(bg, &SelectRequest{PartitionKey: PartitionKey{ModelName: "model"},
					PromptRequest: PromptRequest{PromptText: prefix + " and a question"}})
				if err != nil {
					t.Fatal(err)
				}
				if want := map[bool]uint64{true: 2, false: 1}[tt.skipped]; r.WorkerID != want {
					t.Fatalf("the cached prompt went to worker %d, want %d", r.WorkerID, want)
				}
			}
			if w := s.Workers(nil, nil)[0].EngineMetrics; w == nil || w.Saturated != tt.saturated {
				t.Fatalf("engine_metrics = %+v, want saturated %v", w, tt.saturated)
			}
		})
	}
}

// Every rank saturated and no queue: routed to the cheapest saturated rank
// by default (GIE's semantics), 429 with RejectSaturated; stale figures
// never reject.
func TestEverySaturated(t *testing.T) {
	for _, reject := range []bool{false, true} {
		t.Run(fmt.Sprintf("reject=%v", reject), func(t *testing.T) {
			clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
			rc := routerconfig.Default()
			rc.UseKVEvents = false
			ec := DefaultEngineConfig()
			ec.RejectSaturated = reject
			s, err := New(Config{Router: rc, Clock: clock.Now, Rand: rand.New(rand.NewPCG(1, 2)), Engine: &ec})
			if err != nil {
				t.Fatal(err)
			}
			mustUpsert(t, s, workerRec(1))
			mustUpsert(t, s, workerRec(2))
			// Both saturated; worker 2 holds fewer requests nobody booked.
			report(t, s, clock, 1, EngineRank{Waiting: 9})
			report(t, s, clock, 2, EngineRank{Waiting: 1, KVUsage: 0.95, HasKVUsage: true})
			resp, err := s.SelectAndReserve(bg, selReq("x", 1, 2, 3))
			if reject {
				wantKind(t, err, KindOverloaded, "all eligible workers are overloaded")
			} else if err != nil {
				t.Fatal(err)
			} else if resp.WorkerID != 2 {
				t.Fatalf("picked worker %d of a saturated pool, want the less loaded worker 2", resp.WorkerID)
			}
			// The figures age out: the service relies on its bookings again.
			clock.Add(3 * time.Second)
			if _, err := s.SelectAndReserve(bg, selReq("y", 1, 2, 3)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestSaturatedPartitionQueuesUntilAReportClearsIt(t *testing.T) {
	s, c := newService(t, func(rc *routerconfig.Config) { rc.QueueThreshold = routerconfig.Some(2.0) })
	r := workerRec(1)
	r.MaxNumBatchedTokens = ptr(uint64(1000))
	mustUpsert(t, s, r)
	report(t, s, c, 1, EngineRank{Waiting: 7})
	done := make(chan error, 1)
	ctx, cancel := context.WithTimeout(bg, 30*time.Second)
	defer cancel()
	go func() {
		_, err := s.SelectAndReserve(ctx, selReq("q", 1, 2, 3))
		done <- err
	}()
	// Wait until the request is parked in the queue.
	for {
		if n, _ := s.parts.Get(partitionOf(PartitionKey{ModelName: "model"})).Queue().Pending(); n == 1 {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("selection did not queue behind a saturated worker: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	report(t, s, c, 1, EngineRank{Waiting: 1})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestLoRAResidencyIsAPreference(t *testing.T) {
	s, c := newService(t, nil)
	for id := uint64(1); id <= 3; id++ {
		mustUpsert(t, s, workerRec(id))
	}
	lora := func(r *SelectRequest) { r.LoraName = ptr("sql") }
	report(t, s, c, 1, EngineRank{LoRA: &LoRAState{Running: []string{"a", "b"}, MaxLoRA: 2}})                      // no free slot
	report(t, s, c, 2, EngineRank{LoRA: &LoRAState{Running: []string{"a"}, MaxLoRA: 2}})                           // a free slot
	report(t, s, c, 3, EngineRank{LoRA: &LoRAState{Running: []string{"a"}, Waiting: []string{"sql"}, MaxLoRA: 2}}) // loading it
	if got := picks(t, s, 20, lora); got[3] != 20 {
		t.Fatalf("adapter waiting on worker 3: picks = %v", got)
	}
	// With worker 3 saturated, the free slot wins over no slot.
	report(t, s, c, 3, EngineRank{Waiting: 10, LoRA: &LoRAState{Waiting: []string{"sql"}, MaxLoRA: 2}})
	if got := picks(t, s, 20, lora); got[2] != 20 {
		t.Fatalf("free slot on worker 2: picks = %v", got)
	}
	// Never a filter: with only the slotless worker left it still serves.
	report(t, s, c, 2, EngineRank{Waiting: 10})
	if got := picks(t, s, 5, lora); got[1] != 5 {
		t.Fatalf("only worker 1 left: picks = %v", got)
	}
	// A request without an adapter ignores residency.
	report(t, s, c, 2, EngineRank{LoRA: &LoRAState{Running: []string{"a"}, MaxLoRA: 2}})
	if got := picks(t, s, 40, nil); got[1] == 0 || got[2] == 0 {
		t.Fatalf("no adapter: picks = %v, want both 1 and 2", got)
	}
}

func TestEngineMetricsView(t *testing.T) {
	s, c := newService(t, nil)
	r := workerRec(1)
	r.DataParallelSize = ptr(uint32(2))
	mustUpsert(t, s, r)
	if s.ReportEngineMetrics(9, EngineSnapshot{At: c.Now()}) {
		t.Fatal("report for an unknown worker kept")
	}
	if v := s.Workers(nil, nil)[0].EngineMetrics; v != nil {
		t.Fatalf("engine_metrics before any scrape = %+v", v)
	}
	s.ReportEngineMetrics(1, EngineSnapshot{At: c.Now(), Ranks: map[uint32]EngineRank{
		0: {Waiting: 1, Running: 2, KVUsage: 0.5, HasKVUsage: true},
		1: {Waiting: math.NaN(), Running: math.Inf(1), KVUsage: -3, HasKVUsage: true},
	}})
	c.Add(150 * time.Millisecond)
	s.ReportEngineMetrics(1, EngineSnapshot{At: c.Now(), Err: "status 500"})
	v := s.Workers(nil, nil)[0].EngineMetrics
	if v == nil || v.Waiting != 1 || v.Running != 2 || v.KVUsage == nil || *v.KVUsage != 0.5 || v.AgeMS == nil || *v.AgeMS != 150 ||
		v.Stale || v.Error != "status 500" || len(v.Ranks) != 2 || v.Ranks[1].KVUsage != nil {
		t.Fatalf("engine_metrics = %+v", v)
	}
	// Poisoned values never reach the cost.
	if _, err := s.Select(bg, selReq("", 1, 2, 3)); err != nil {
		t.Fatal(err)
	}
	c.Add(2 * time.Second)
	if v := s.Workers(nil, nil)[0].EngineMetrics; !v.Stale {
		t.Fatalf("engine_metrics after 2.15 s = %+v, want stale", v)
	}
	if fresh, stale := s.Inspect().EngineStats(); fresh != 0 || stale != 1 {
		t.Fatalf("EngineStats = %d fresh, %d stale", fresh, stale)
	}
	if _, err := s.DeleteWorker(bg, 1); err != nil {
		t.Fatal(err)
	}
	mustUpsert(t, s, r)
	if v := s.Workers(nil, nil)[0].EngineMetrics; v != nil {
		t.Fatalf("a deleted worker's figures survived: %+v", v)
	}
}
