package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	for _, want := range []string{"block hit rate", "TTFT p90 ms", "kvselect-approx", "greedy-oracle", "least-loaded"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, stdout.String())
		}
	}
	if !strings.Contains(stderr.String(), "100%") {
		t.Errorf("no progress on stderr: %q", stderr.String())
	}
	b, err := os.ReadFile(jsonOut)
	if err != nil {
		t.Fatal(err)
	}
	var rep routeReport
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 2*len(routePolicies) || rep.Requests != 400 || rep.InfiniteCacheHitRate <= 0 {
		t.Fatalf("report: %d results, %d requests, infinite %v", len(rep.Results), rep.Requests, rep.InfiniteCacheHitRate)
	}
	checkSVG(t, svgOut, "kvselect")
}

func TestRouteFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"route", "-policies", "kvselect,best"},
		{"route", "-capacity", "0"},
		{"route", "-capacity", "x"},
		{"route", "-trace", "/nonexistent.jsonl"},
		{"route", "-workers", "0", "-trace", trace, "-requests", "10"},
		{"route", "extra"},
	} {
		var stdout, stderr bytes.Buffer
		if err := run(context.Background(), args, &stdout, &stderr); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}
