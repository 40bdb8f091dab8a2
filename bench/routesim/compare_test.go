package routesim

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvselect/kvselect/bench/report"
	"github.com/kvselect/kvselect/bench/report/reporttest"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/scheduler"
)

// sweep is every default policy on pools of the given sizes, without
// bypass or engine metrics.
func sweep(workers int, capacities ...int) Sweep {
	c := DefaultConfig()
	c.Workers, c.BypassWorkers, c.ScrapeInterval, c.RetryAfter = workers, DefaultBypassWorkers, DefaultScrapeInterval, DefaultRetryAfter
	ec := selection.DefaultEngineConfig()
	return Sweep{Config: c, Capacities: capacities, Bypasses: []float64{0}, EngineMetrics: []bool{false},
		RequestWeights: []float64{ec.RequestWeight}, KVUsageWeights: []float64{ec.KVUsageWeight}, Engine: ec, Policies: Policies()}
}

func TestCompareTableAndCharts(t *testing.T) {
	var stdout, progress bytes.Buffer
	rep, err := Compare(context.Background(), sweep(4, 1024, 256), "trace", loadTrace(t, 400), &progress)
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Table(&stdout); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"block hit rate", "TTFT p90 ms", "kv-cost-approx", "longest-prefix", "least-loaded", "round-robin"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, stdout.String())
		}
	}
	if !strings.Contains(progress.String(), "100%") {
		t.Errorf("no progress: %q", progress.String())
	}
	if len(rep.Results) != 2*len(Policies()) || rep.Requests != 400 || rep.InfiniteCacheHitRate <= 0 {
		t.Fatalf("report: %d results, %d requests, infinite %v", len(rep.Results), rep.Requests, rep.InfiniteCacheHitRate)
	}
	svg := filepath.Join(t.TempDir(), "route.svg")
	if err := report.WriteSVG(svg, "route", rep.Charts()...); err != nil {
		t.Fatal(err)
	}
	reporttest.CheckSVG(t, svg, "kv-cost")
}

// The bypass scenario: every combination of bypass share, engine metrics
// and weights is one row, with the bypass columns.
func TestCompareBypassSweep(t *testing.T) {
	s := sweep(DefaultConfig().Workers, 1024)
	s.Policies, s.Bypasses, s.EngineMetrics, s.RequestWeights = []string{"kv-cost"}, []float64{0, 0.3}, []bool{false, true}, []float64{0, 16}
	rep, err := Compare(context.Background(), s, "trace", loadTrace(t, 300), nil)
	if err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	if err := rep.Table(&stdout); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"bypass", "engine metrics", "request w", "refusals", "all p90 ms"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, stdout.String())
		}
	}
	// 2 bypass shares × (off + 2 weights) = 6 rows.
	if len(rep.Results) != 6 {
		t.Fatalf("%d results, want 6", len(rep.Results))
	}
	for _, r := range rep.Results {
		if (r.Bypass > 0) != (r.Bypassed > 0) || r.Requests+r.Bypassed != 300 {
			t.Errorf("row %+v: bypass share and bypassed count disagree", r)
		}
	}
}

func TestKnownPolicies(t *testing.T) {
	for _, names := range [][]string{{"kv-cost", "best"}, {"kvselect"}, {"greedy-oracle"}, {""}, nil} {
		if err := KnownPolicies(names); err == nil {
			t.Errorf("%q: no error", names)
		}
	}
	if err := KnownPolicies(Policies()); err != nil {
		t.Error(err)
	}
}

// lowestIDPolicy is a policy a program registers itself: the comparison
// runs it like the built-in ones.
const lowestIDPolicy = "kvbench-test-lowest-id"

func init() {
	scheduler.Register(lowestIDPolicy, func(p scheduler.Params) (scheduler.Policy, error) {
		return scheduler.Policy{Scorer: idCost{}, Picker: scheduler.FirstMinPicker{}, ExclusiveAffinity: true}, nil
	})
}

type idCost struct{}

func (idCost) Score(_ *scheduler.Context, c *scheduler.Candidate) (float64, error) {
	return float64(c.Worker.WorkerID), nil
}

func TestCompareRunsARegisteredPolicy(t *testing.T) {
	s := sweep(3, 256)
	s.Policies = []string{"round-robin", lowestIDPolicy}
	rep, err := Compare(context.Background(), s, "trace", loadTrace(t, 100), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 2 || rep.Results[1].Policy != lowestIDPolicy {
		t.Fatalf("results %+v", rep.Results)
	}
	// Every request lands on worker 0; round-robin spreads them evenly.
	if rr, low := rep.Results[0].MaxShare, rep.Results[1].MaxShare; low != 1 || rr > 0.35 {
		t.Errorf("max worker share: round-robin %v, %s %v", rr, lowestIDPolicy, low)
	}
}
