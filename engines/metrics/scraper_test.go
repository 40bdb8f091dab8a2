package metrics

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvselect/kvselect/mockworker"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

func ptr[T any](v T) *T { return &v }

func newCore(t testing.TB, recs ...catalog.Record) *selection.Service {
	t.Helper()
	rc := routerconfig.Default()
	rc.UseKVEvents = false
	svc, err := selection.New(selection.Config{Router: rc})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if _, err := svc.UpsertWorker(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	return svc
}

func record(id uint64, endpoint string) catalog.Record {
	return catalog.Record{WorkerID: id, ModelName: "m", Endpoint: ptr(endpoint), BlockSize: ptr(uint32(16))}
}

func view(t testing.TB, svc *selection.Service, id uint64) *catalog.EngineMetricsView {
	t.Helper()
	for _, r := range svc.Workers(nil, nil) {
		if r.WorkerID == id {
			return r.EngineMetrics
		}
	}
	t.Fatalf("worker %d not listed", id)
	return nil
}

func target(t testing.TB, svc *selection.Service, id uint64) selection.EngineTarget {
	t.Helper()
	for _, tg := range svc.EngineTargets() {
		if tg.WorkerID == id {
			return tg
		}
	}
	t.Fatalf("worker %d is no target", id)
	return selection.EngineTarget{}
}

// A real mock worker (vLLM's names, two data-parallel ranks) scraped over
// loopback HTTP lands per rank in GET /workers.
func TestScrapeMockWorker(t *testing.T) {
	w, err := mockworker.New(mockworker.Config{Model: "m", WorkerID: 1, DPSize: 2, BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(w.Handler())
	defer srv.Close()
	rec := record(1, srv.URL+"/v1")
	rec.DataParallelSize = ptr(uint32(2))
	svc := newCore(t, rec)
	m := NewMetrics()
	s := NewScraper(svc, m, Options{})
	tg := target(t, svc, 1)
	if tg.URL != srv.URL+"/metrics" || tg.HealthURL != srv.URL+"/health" || tg.Engine != "vllm" {
		t.Fatalf("target = %+v", tg)
	}
	snap := s.ScrapeOnce(context.Background(), tg)
	if snap.Err != "" || len(snap.Ranks) != 2 {
		t.Fatalf("snapshot = %+v", snap)
	}
	v := view(t, svc, 1)
	if v == nil || v.Stale || v.AgeMS == nil || v.KVUsage == nil || len(v.Ranks) != 2 || v.Error != "" {
		t.Fatalf("engine_metrics = %+v", v)
	}
	if m.Count("scrapes", "ok") != 1 {
		t.Fatalf("ok scrapes = %d", m.Count("scrapes", "ok"))
	}
}

func TestScrapeFailuresAreCountedAndKeepTheLastGoodView(t *testing.T) {
	good := "vllm:num_requests_waiting 3\nvllm:num_requests_running 1\n"
	// The handler is swapped between cases while the hung case's handler
	// may still be finishing on the server side: hence the atomic.
	var answer atomic.Pointer[func(w http.ResponseWriter, r *http.Request)]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*answer.Load())(w, r) }))
	defer srv.Close()
	closed := httptest.NewServer(http.NotFoundHandler())
	closedURL := closed.URL
	closed.Close()

	svc := newCore(t, record(1, srv.URL), record(2, closedURL))
	m := NewMetrics()
	s := NewScraper(svc, m, Options{Timeout: 100 * time.Millisecond, MaxBodyBytes: 1 << 10})
	ctx := context.Background()
	answer.Store(ptr(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, good) }))
	s.ScrapeOnce(ctx, target(t, svc, 1))

	tests := []struct {
		name, reason string
		answer       func(w http.ResponseWriter, r *http.Request)
	}{
		{"status 500", "http_status", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "boom", 500) }},
		{"hang", "timeout", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }},
		{"huge body", "too_large", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, good+strings.Repeat("x", 2<<10)) }},
		{"garbage", "missing_series", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "<html>not metrics</html>") }},
		{"broken", "parse_error", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "vllm:num_requests_waiting{ 3\n") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			answer.Store(&tt.answer)
			before := m.Count("scrapes", tt.reason)
			snap := s.ScrapeOnce(ctx, target(t, svc, 1))
			if snap.Err == "" || m.Count("scrapes", tt.reason) != before+1 {
				t.Fatalf("snapshot %+v, %s count %d", snap, tt.reason, m.Count("scrapes", tt.reason))
			}
			v := view(t, svc, 1)
			if v.Waiting != 3 || v.Running != 1 || v.Error != snap.Err {
				t.Fatalf("the last good view was not kept: %+v", v)
			}
		})
	}
	if snap := s.ScrapeOnce(ctx, target(t, svc, 2)); !strings.Contains(snap.Err, "connect") || m.Count("scrapes", "http_error") != 1 {
		t.Fatalf("refused connection: %+v, http_error %d", snap, m.Count("scrapes", "http_error"))
	}
	if v := view(t, svc, 2); v == nil || !v.Stale || v.AgeMS != nil {
		t.Fatalf("never scraped successfully: %+v", v)
	}
}

// Run visits every target each interval and stops with its context.
func TestRunScrapesEveryWorker(t *testing.T) {
	var recs []catalog.Record
	for i := range 5 {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "vllm:num_requests_waiting %d\nvllm:num_requests_running 0\n", i)
		}))
		defer srv.Close()
		recs = append(recs, record(uint64(i+1), srv.URL))
	}
	svc := newCore(t, recs...)
	m := NewMetrics()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		NewScraper(svc, m, Options{Interval: 20 * time.Millisecond, Concurrency: 2}).Run(ctx)
		close(done)
	}()
	deadline := time.Now().Add(20 * time.Second)
	for m.Count("scrapes", "ok") < 15 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d scrapes", m.Count("scrapes", "ok"))
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	for i := range 5 {
		if v := view(t, svc, uint64(i+1)); v == nil || v.Waiting != float64(i) {
			t.Fatalf("worker %d: %+v", i+1, v)
		}
	}
}

// The active prober ejects a worker whose /health fails, and the next
// success after the ejection runs out restores it.
func TestProberEjectsAndRestores(t *testing.T) {
	healthy := make(chan bool, 1)
	healthy <- false
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ok := <-healthy
		healthy <- ok
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	cfg := selection.DefaultEngineConfig()
	cfg.Health.Base, cfg.Health.Max = 50*time.Millisecond, time.Second
	rc := routerconfig.Default()
	rc.UseKVEvents = false
	svc, err := selection.New(selection.Config{Router: rc, Engine: &cfg})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.UpsertWorker(context.Background(), record(1, srv.URL)); err != nil {
		t.Fatal(err)
	}
	m := NewMetrics()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go NewProber(svc, m, Options{Interval: 5 * time.Millisecond}).Run(ctx)
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	waitFor("ejection", func() bool { return svc.Inspect().HealthStats().Ejections >= 1 })
	<-healthy
	healthy <- true
	waitFor("restoration", func() bool { return svc.Inspect().HealthStats().Restorations == 1 })
	if m.Count("probes", "failure") < 5 || m.Count("probes", "ok") < 1 {
		t.Fatalf("probes: %d failures, %d ok", m.Count("probes", "failure"), m.Count("probes", "ok"))
	}
}

// workersOf returns n worker records served by the one server at url, told
// apart by a query on their metrics URL (w=0, w=1, ...).
func workersOf(url string, n int) []catalog.Record {
	var recs []catalog.Record
	for i := range n {
		r := record(uint64(i+1), url)
		r.MetricsEndpoint = ptr(fmt.Sprintf("%s/metrics?w=%d", url, i))
		recs = append(recs, r)
	}
	return recs
}

// 256 workers at 200 ms are visited spread over the interval, a slot at a
// time, each once per round: never the whole fleet in one burst.
func TestRunSpreadsVisitsOverTheInterval(t *testing.T) {
	const workers, interval = 256, 200 * time.Millisecond
	var mu sync.Mutex
	first := map[string]time.Time{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		if _, ok := first[r.URL.RawQuery]; !ok {
			first[r.URL.RawQuery] = time.Now()
		}
		mu.Unlock()
		fmt.Fprint(w, "vllm:num_requests_running 1\n")
	}))
	defer srv.Close()
	svc := newCore(t, workersOf(srv.URL, workers)...)
	ctx, cancel := context.WithTimeout(context.Background(), 3*interval)
	defer cancel()
	NewScraper(svc, NewMetrics(), Options{Interval: interval, Timeout: time.Second}).Run(ctx)
	mu.Lock()
	defer mu.Unlock()
	if len(first) != workers {
		t.Fatalf("%d of %d workers visited in the first round", len(first), workers)
	}
	var lo, hi time.Time
	buckets := map[int64]int{} // first visits per slot width
	for _, at := range first {
		if lo.IsZero() || at.Before(lo) {
			lo = at
		}
		if at.After(hi) {
			hi = at
		}
	}
	for _, at := range first {
		buckets[int64(at.Sub(lo)/slotWidth)]++
	}
	if spread := hi.Sub(lo); spread < interval/2 {
		t.Fatalf("first visits spread over %s, want most of the %s interval", spread, interval)
	}
	for b, n := range buckets {
		if n > workers/2 {
			t.Fatalf("%d of %d workers first visited in slot %d", n, workers, b)
		}
	}
}

// Visits run at most Concurrency at a time, and a worker whose last visit
// has not ended is skipped (and counted) instead of being visited twice.
func TestRunBoundsVisitsAndSkipsBusyWorkers(t *testing.T) {
	const workers, concurrency = 12, 3
	var inFlight, most atomic.Int32
	var mu sync.Mutex
	perWorker := map[string]int{} // visits in flight per worker
	twice := atomic.Bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		mu.Lock()
		perWorker[r.URL.RawQuery]++
		if perWorker[r.URL.RawQuery] > 1 {
			twice.Store(true)
		}
		mu.Unlock()
		time.Sleep(30 * time.Millisecond) // longer than the interval: the next round finds it busy
		mu.Lock()
		perWorker[r.URL.RawQuery]--
		mu.Unlock()
		fmt.Fprint(w, "vllm:num_requests_running 1\n")
	}))
	defer srv.Close()
	svc := newCore(t, workersOf(srv.URL, workers)...)
	m := NewMetrics()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		NewScraper(svc, m, Options{Interval: 10 * time.Millisecond, Timeout: time.Second, Concurrency: concurrency}).Run(ctx)
		close(done)
	}()
	deadline := time.Now().Add(20 * time.Second)
	for m.Count("scrapes", "ok") < 2*workers || m.Count("scrapes", "skipped_busy") == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d scrapes, %d skipped", m.Count("scrapes", "ok"), m.Count("scrapes", "skipped_busy"))
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	if n := inFlight.Load(); n != 0 {
		t.Fatalf("%d visits still in flight after Run returned", n)
	}
	if got := most.Load(); got > concurrency {
		t.Fatalf("%d visits in flight at once, want at most %d", got, concurrency)
	}
	if twice.Load() {
		t.Fatal("a worker was visited twice at once")
	}
}

// A client of the caller's that enforces no body limit still gets the
// scraper's: the body is refused as too large, not parsed.
func TestCallersClientKeepsTheBodyLimit(t *testing.T) {
	body := "vllm:num_requests_waiting 3\nvllm:num_requests_running 1\n" + strings.Repeat("# padding\n", 200)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, body) }))
	defer srv.Close()
	svc := newCore(t, record(1, srv.URL))
	m := NewMetrics()
	s := NewScraper(svc, m, Options{Client: &fasthttp.Client{}, MaxBodyBytes: 1 << 10})
	if snap := s.ScrapeOnce(context.Background(), target(t, svc, 1)); !strings.Contains(snap.Err, "too large") || m.Count("scrapes", "too_large") != 1 {
		t.Fatalf("snapshot %+v, too_large %d", snap, m.Count("scrapes", "too_large"))
	}
	s = NewScraper(svc, m, Options{Client: &fasthttp.Client{}, MaxBodyBytes: 4 << 10})
	if snap := s.ScrapeOnce(context.Background(), target(t, svc, 1)); snap.Err != "" || snap.Ranks[selection.AllRanks].Waiting != 3 {
		t.Fatalf("under the limit: %+v", snap)
	}
}

// A metrics app mounted under a path answers /metrics with a redirect to
// /metrics/ (Starlette's Mount); the scraper follows it, as it follows any
// redirect a few times, and the prober too.
func TestScrapeFollowsRedirects(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/metrics/", http.StatusTemporaryRedirect)
	})
	mux.HandleFunc("GET /metrics/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "vllm:num_requests_waiting 2\nvllm:num_requests_running 5\n")
	})
	mux.HandleFunc("GET /loop", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/loop", http.StatusFound)
	})
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/healthz", http.StatusMovedPermanently)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	loop := record(2, srv.URL)
	loop.MetricsEndpoint = ptr(srv.URL + "/loop")
	svc := newCore(t, record(1, srv.URL), loop)
	m := NewMetrics()
	s := NewScraper(svc, m, Options{Timeout: time.Second})
	snap := s.ScrapeOnce(context.Background(), target(t, svc, 1))
	if snap.Err != "" || snap.Ranks[selection.AllRanks].Waiting != 2 || snap.Ranks[selection.AllRanks].Running != 5 {
		t.Fatalf("redirected scrape: %+v", snap)
	}
	if snap := s.ScrapeOnce(context.Background(), target(t, svc, 2)); !strings.Contains(snap.Err, "redirect") || m.Count("scrapes", "http_error") != 1 {
		t.Fatalf("endless redirects: %+v, http_error %d", snap, m.Count("scrapes", "http_error"))
	}
	if o := NewProber(svc, m, Options{Timeout: time.Second}).ProbeOnce(context.Background(), target(t, svc, 1)); !o.OK {
		t.Fatalf("redirected probe: %+v", o)
	}
}
