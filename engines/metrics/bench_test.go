package metrics

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvselect/kvselect/mockworker"
	"github.com/kvselect/kvselect/selection/catalog"
)

// mockPayload is what a real mock worker's /metrics serves: vLLM's names for
// one rank plus the Go runtime's and the process's series (about 10 KB).
func mockPayload(b *testing.B) []byte {
	b.Helper()
	w, err := mockworker.New(mockworker.Config{Model: "m", WorkerID: 1, BlockSize: 16})
	if err != nil {
		b.Fatal(err)
	}
	rec := httptest.NewRecorder()
	w.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	return rec.Body.Bytes()
}

// BenchmarkParse is the parse of one mock worker payload alone, with the
// parser state reused as the scraper reuses it.
func BenchmarkParse(b *testing.B) {
	body := mockPayload(b)
	d, _ := DialectFor("vllm")
	p := newParser()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := d.parse(p, body, []uint32{0}, Dropped{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkScrape is one whole scrape over loopback HTTP (keep-alive): the
// request, the body, the parse and the report. The endpoint answers a fixed
// payload from the same process, so its cost is included: an upper bound.
func BenchmarkScrape(b *testing.B) {
	body := mockPayload(b)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(body) }))
	defer srv.Close()
	svc := newCore(b, record(1, srv.URL))
	s := NewScraper(svc, NewMetrics(), Options{Timeout: time.Second})
	tg := target(b, svc, 1)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if snap := s.ScrapeOnce(context.Background(), tg); snap.Err != "" {
			b.Fatal(snap.Err)
		}
	}
}

// BenchmarkFleet runs the scraper for 5 s against 256 workers at the
// default interval (5 Hz) and at 1 Hz, and reports the scraper's CPU as a share of one
// core (cpu-%-of-core), the endpoints' CPU (endpoint-cpu-%-of-core) and the
// scrapes done per second. The endpoints run in a child process (this test
// binary, serving a mock worker's payload), so the scraper's figure is its
// own: HTTP client, parse, reports into the core and its timers.
func BenchmarkFleet(b *testing.B) {
	for _, interval := range []time.Duration{DefaultInterval, time.Second} {
		b.Run("interval="+interval.String(), func(b *testing.B) { benchmarkFleet(b, interval) })
	}
}

func benchmarkFleet(b *testing.B, interval time.Duration) {
	const workers, run = 256, 5 * time.Second
	for b.Loop() {
		// One endpoint per worker, each at its own loopback address, so
		// that every worker is its own host with its own keep-alive
		// connection, as in a fleet.
		addrs, stop := startEndpoints(b, workers)
		var recs []catalog.Record
		for i, addr := range addrs {
			recs = append(recs, record(uint64(i+1), "http://"+addr))
		}
		svc := newCore(b, recs...)
		m := NewMetrics()
		ctx, cancel := context.WithTimeout(context.Background(), run)
		before := cpuTime(syscall.RUSAGE_SELF)
		start := time.Now()
		NewScraper(svc, m, Options{Interval: interval}).Run(ctx)
		elapsed := time.Since(start)
		self := cpuTime(syscall.RUSAGE_SELF) - before
		cancel()
		childBefore := cpuTime(syscall.RUSAGE_CHILDREN)
		stop()
		child := cpuTime(syscall.RUSAGE_CHILDREN) - childBefore
		ok := m.Count("scrapes", "ok")
		b.ReportMetric(100*float64(self)/float64(elapsed), "cpu-%-of-core")
		b.ReportMetric(100*float64(child)/float64(elapsed), "endpoint-cpu-%-of-core")
		b.ReportMetric(float64(ok)/elapsed.Seconds(), "scrapes/s")
		if ok < workers {
			b.Fatalf("only %d scrapes ok (%d timeouts)", ok, m.Count("scrapes", "timeout"))
		}
	}
}

// envServe makes the test binary a metrics endpoint (BenchmarkFleet's child).
const envServe = "KVSELECT_METRICS_BENCH_SERVE"

func TestMain(m *testing.M) {
	if os.Getenv(envServe) != "" {
		serveEndpoints()
		return
	}
	os.Exit(m.Run())
}

// serveEndpoints answers every path with a mock worker's /metrics payload on
// as many loopback addresses as envServe says (127.0.1.1, 127.0.1.2, ...),
// prints each address on a line and serves until stdin closes.
func serveEndpoints() {
	n, err := strconv.Atoi(os.Getenv(envServe))
	if err != nil || n < 1 || n > 250*250 {
		fmt.Fprintf(os.Stderr, "%s=%q: want a count of endpoints\n", envServe, os.Getenv(envServe))
		os.Exit(1)
	}
	w, err := mockworker.New(mockworker.Config{Model: "m", WorkerID: 1, BlockSize: 16})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	rec := httptest.NewRecorder()
	w.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body := rec.Body.Bytes()
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(body) })
	for i := range n {
		// Linux routes all of 127.0.0.0/8 to the loopback interface.
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.%d.%d:0", 1+i/250, 1+i%250))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(ln.Addr().String())
		go func() { _ = http.Serve(ln, handler) }()
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// startEndpoints starts the endpoint child with n endpoints; stop ends it
// and waits, so that its CPU time is in RUSAGE_CHILDREN afterwards.
func startEndpoints(b *testing.B, n int) (addrs []string, stop func()) {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envServe+"="+strconv.Itoa(n))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	r := bufio.NewReader(out)
	for range n {
		line, err := r.ReadString('\n')
		if err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			b.Fatalf("endpoint child: %v", err)
		}
		addrs = append(addrs, strings.TrimSpace(line))
	}
	return addrs, func() { in.Close(); _ = cmd.Wait() }
}

func cpuTime(who int) time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(who, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
