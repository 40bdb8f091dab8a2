package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvselect/kvselect/bench/mooncake"
	"github.com/kvselect/kvselect/internal/peerproc"
)

// TestVsEPPHarness runs `kvbench vs-epp` on the first 20 seconds of the
// conversation trace (65 requests, replayed 4x faster) for kvselect and llm-d's
// endpoint picker, each with fresh llm-d-inference-sim engines, and checks the
// harness itself: both pickers route every request to one of the engines, every
// engine response comes back through the picker byte for byte (the harness
// counts any difference as an error), each figure of the report is produced,
// and kvselect holds no booking afterwards. It asserts no speed.
func TestVsEPPHarness(t *testing.T) {
	sim, epp := peerproc.SimBinary(t), peerproc.EPPBinary(t)
	kvselectBin, _ := buildFleetBinaries(t)
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"vs-epp", "-kvselect", kvselectBin, "-sim-bin", sim, "-epp-bin", epp, "-trace", trace,
		"-requests", "65", "-compress", "4", "-engines", "2", "-pickers", "kvselect,epp", "-idle", "1s", "-saturate", "1s",
		"-saturate-streams", "8", "-pin=false", "-quiet", "-out", out}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("vs-epp: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	b, err := os.ReadFile(filepath.Join(out, "vs-epp.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep vsReport
	if err := json.Unmarshal(b, &rep); err != nil || len(rep.Runs) != 2 {
		t.Fatalf("vs-epp.json: %v %s", err, b)
	}
	for _, r := range rep.Runs {
		routed := 0
		for _, n := range r.PerEngine {
			routed += n
		}
		switch {
		case r.Errors != 0 || r.SaturationErrors != 0:
			t.Errorf("%s: %d errors (%s), %d in the saturating loop (%s)", r.Picker, r.Errors, r.ErrorSample, r.SaturationErrors, r.SaturationError)
		case routed != 65:
			t.Errorf("%s routed %d of 65 requests: %v", r.Picker, routed, r.PerEngine)
		case r.Decision.P50 <= 0 || r.TTFTP50Ms <= 0 || r.TTFTP90Ms < r.TTFTP50Ms:
			t.Errorf("%s: decision %+v, TTFT %.1f / %.1f ms", r.Picker, r.Decision, r.TTFTP50Ms, r.TTFTP90Ms)
		case r.Histogram.Count < 65:
			t.Errorf("%s: the picker's %s counted %.0f decisions", r.Picker, r.Histogram.Name, r.Histogram.Count)
		case r.CPUPerRequestGrossUs <= 0 || r.MaxRPS <= 0:
			t.Errorf("%s: CPU per request %.0f µs, saturating loop %.0f req/s", r.Picker, r.CPUPerRequestGrossUs, r.MaxRPS)
		// Every trace request starts with the same block: after the first
		// request an engine holds it, so some prompt tokens are hits.
		case !(r.HitRate > 0 && r.HitRate < 1):
			t.Errorf("%s: hit rate %v from the engines' counters", r.Picker, r.HitRate)
		}
	}
	kv, epp0 := rep.Runs[0], rep.Runs[1]
	if kv.Picker != pickerKvselect || kv.LeakedBookings == nil || *kv.LeakedBookings != 0 || kv.Histogram.Name != "kvselect_extproc_pick_duration_seconds" {
		t.Errorf("kvselect run: %+v", kv)
	}
	if epp0.Picker != pickerEPP || epp0.WithScores != 65 || epp0.Histogram.Name != "llm_d_epp_scheduler_e2e_duration_seconds" {
		t.Errorf("EPP run: picker %q, %d decisions with endpoint scores, histogram %q", epp0.Picker, epp0.WithScores, epp0.Histogram.Name)
	}
	for _, want := range []string{"decision p50 / p90 / p99", "prefix-cache hit rate", "kvselect vs epp:"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, stdout.String())
		}
	}
	for _, f := range []string{"vs-epp.svg", "epp-plain/epp-config.yaml", "epp-plain/endpoints.yaml"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Error(err)
		}
	}
}

// Without the endpoint picker's binary, vs-epp says where to get it.
func TestVsEPPNeedsThePeers(t *testing.T) {
	t.Setenv(peerproc.EnvEPP, "")
	t.Setenv(peerproc.EnvSim, "/bin/true")
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"vs-epp"}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), peerproc.EnvEPP) {
		t.Fatalf("err = %v, want one naming %s", err, peerproc.EnvEPP)
	}
	err = run(context.Background(), []string{"vs-epp", "-pickers", "kvselect", "-sim-bin", ""}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), peerproc.EnvSim) {
		t.Fatalf("err = %v, want one naming %s", err, peerproc.EnvSim)
	}
}

// The picker's histogram is summarised over the run alone (the difference of
// two scrapes), quantiles interpolated within a bucket as Prometheus's
// histogram_quantile does.
func TestHistogramSummaryIsTheRunsShare(t *testing.T) {
	before := `# TYPE h histogram
h_bucket{le="0.0001"} 10
h_bucket{le="0.0002"} 10
h_bucket{le="0.0004"} 10
h_bucket{le="+Inf"} 10
h_sum 0.0005
h_count 10
other_bucket{le="1"} 99
`
	// The run adds 100 observations: 50 in (0.1, 0.2] ms, 50 in (0.2, 0.4] ms,
	// summing to 25 ms.
	after := `h_bucket{le="0.0001"} 10
h_bucket{le="0.0002"} 60
h_bucket{le="0.0004"} 110
h_bucket{le="+Inf"} 110 1700000000000
h_sum 0.0255
h_count 110
`
	b, err := parseHistogram(strings.NewReader(before), "h")
	if err != nil {
		t.Fatal(err)
	}
	a, err := parseHistogram(strings.NewReader(after), "h")
	if err != nil {
		t.Fatal(err)
	}
	got := a.minus(b)
	near := func(x, want float64) bool { return math.Abs(x-want) < 1e-6 }
	if got.Count != 100 || !near(got.MeanUs, 250) || !near(got.P50Us, 200) || !near(got.P90Us, 360) || !near(got.P99Us, 396) {
		t.Fatalf("summary %+v", got)
	}
	if empty := b.minus(b); empty.Count != 0 || empty.P50Us != 0 {
		t.Fatalf("no observation: %+v", empty)
	}
}

// procCPU reads a process's CPU time: this process's grows while it works.
func TestProcCPUCountsWork(t *testing.T) {
	c0, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); {
		for i := range 1000 {
			x += i
		}
	}
	c1, err := procCPU(os.Getpid())
	if err != nil || c1 <= c0 || x == 0 {
		t.Fatalf("CPU %v then %v (%v)", c0, c1, err)
	}
	if _, err := procCPU(-1); err == nil {
		t.Fatal("no error for a process that does not exist")
	}
}

func TestLoadCV(t *testing.T) {
	for _, tc := range []struct {
		n    []int
		want float64
	}{
		{[]int{5, 5, 5}, 0},
		{[]int{0, 10}, 1},
		{[]int{2, 4, 6}, math.Sqrt(8.0/3) / 4},
		{nil, 0},
		{[]int{0, 0}, 0},
	} {
		if got := cv(tc.n); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("cv(%v) = %v, want %v", tc.n, got, tc.want)
		}
	}
}

// Both traffic modes issue every trace request exactly once: the closed loop
// with at most -concurrency in flight, the open loop at a fixed rate too.
func TestTrafficIssuesEveryRequestOnce(t *testing.T) {
	reqs := make([]mooncake.Request, 40)
	for i := range reqs {
		reqs[i].Timestamp = int64(i) // 1 ms apart in trace time
	}
	for _, c := range []vsConfig{
		{loop: "closed", concurrency: 3},
		{loop: "open", concurrency: 3, compress: 10},
		{loop: "open", concurrency: 2, rate: 2000},
	} {
		var mu sync.Mutex
		seen := make([]int, len(reqs))
		inFlight, most := 0, 0
		err := c.traffic(context.Background(), reqs, func(i int) {
			mu.Lock()
			seen[i]++
			inFlight++
			most = max(most, inFlight)
			mu.Unlock()
			time.Sleep(time.Millisecond)
			mu.Lock()
			inFlight--
			mu.Unlock()
		})
		if err != nil {
			t.Fatal(err)
		}
		for i, n := range seen {
			if n != 1 {
				t.Fatalf("%s: request %d issued %d times", c.loopName(), i, n)
			}
		}
		if most > c.concurrency {
			t.Fatalf("%s: %d in flight, limit %d", c.loopName(), most, c.concurrency)
		}
	}
}
