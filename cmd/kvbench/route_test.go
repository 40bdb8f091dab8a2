package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvselect/kvselect/bench/routesim"
	"github.com/kvselect/kvselect/selection/scheduler"
)

func TestRouteTableJSONAndSVG(t *testing.T) {
	dir := t.TempDir()
	jsonOut, svgOut := filepath.Join(dir, "route.json"), filepath.Join(dir, "route.svg")
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"route", "-trace", trace, "-requests", "400", "-workers", "4",
		"-capacity", "1024,256", "-json", jsonOut, "-svg", svgOut}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	for _, want := range []string{"block hit rate", "TTFT p90 ms", "kv-cost-approx", "longest-prefix", "least-loaded", "round-robin"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, stdout.String())
		}
	}
	if !strings.Contains(stderr.String(), "100%") {
		t.Errorf("no progress on stderr: %q", stderr.String())
	}
	rep := readJSONFile[routeReport](t, jsonOut)
	if len(rep.Results) != 2*len(routesim.Policies()) || rep.Requests != 400 || rep.InfiniteCacheHitRate <= 0 {
		t.Fatalf("report: %d results, %d requests, infinite %v", len(rep.Results), rep.Requests, rep.InfiniteCacheHitRate)
	}
	checkSVG(t, svgOut, "kv-cost")
}

// The bypass scenario: every combination of bypass share, engine metrics
// and weights is one row, with the bypass columns.
func TestRouteBypassSweep(t *testing.T) {
	dir := t.TempDir()
	jsonOut := filepath.Join(dir, "route.json")
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"route", "-trace", trace, "-requests", "300", "-capacity", "1024",
		"-policies", "kv-cost", "-bypass", "0,0.3", "-engine-metrics", "off,on", "-engine-request-weight", "0,16",
		"-quiet", "-json", jsonOut}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	for _, want := range []string{"bypass", "engine metrics", "request w", "refusals", "all p90 ms"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, stdout.String())
		}
	}
	rep := readJSONFile[routeReport](t, jsonOut)
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

func TestRouteFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"route", "-policies", "kv-cost,best"},
		{"route", "-policies", "kvselect"}, // the old name of kv-cost
		{"route", "-policies", "greedy-oracle"},
		{"route", "-policies", ""},
		{"route", "-capacity", "0"},
		{"route", "-capacity", "x"},
		{"route", "-trace", "/nonexistent.jsonl"},
		{"route", "-workers", "0", "-trace", trace, "-requests", "10"},
		{"route", "extra"},
		{"route", "-bypass", "1.5"},
		{"route", "-bypass", "x"},
		{"route", "-engine-metrics", "maybe"},
		{"route", "-engine-request-weight", "-1"},
		{"route", "-bypass", "0.3", "-bypass-workers", "9", "-trace", trace, "-requests", "10"},
	} {
		var stdout, stderr bytes.Buffer
		if err := run(context.Background(), args, &stdout, &stderr); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

// lowestIDPolicy is a policy a program registers itself: `kvbench route`
// takes any registered name, not only the built-ins.
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

func TestRouteRunsARegisteredPolicy(t *testing.T) {
	var stdout, stderr bytes.Buffer
	dir := t.TempDir()
	jsonOut := filepath.Join(dir, "route.json")
	err := run(context.Background(), []string{"route", "-trace", trace, "-requests", "100", "-workers", "3",
		"-capacity", "256", "-quiet", "-policies", "round-robin," + lowestIDPolicy, "-json", jsonOut}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	rep := readJSONFile[routeReport](t, jsonOut)
	if len(rep.Results) != 2 || rep.Results[1].Policy != lowestIDPolicy {
		t.Fatalf("results %+v", rep.Results)
	}
	// Every request lands on worker 0; round-robin spreads them evenly.
	if rr, low := rep.Results[0].MaxShare, rep.Results[1].MaxShare; low != 1 || rr > 0.35 {
		t.Errorf("max worker share: round-robin %v, %s %v", rr, lowestIDPolicy, low)
	}
	if stderr.Len() != 0 {
		t.Errorf("-quiet wrote %q", stderr.String())
	}
}

// readJSONFile reads the report a subcommand's -json flag wrote.
func readJSONFile[T any](t *testing.T, path string) T {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v
}
