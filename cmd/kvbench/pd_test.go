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

func readPDReport(t *testing.T, path string) pdReport {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rep pdReport
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 3 {
		t.Fatalf("%d results", len(rep.Results))
	}
	return rep
}

var tinyPD = []string{"-sessions", "6", "-turns", "2", "-first-tokens", "512", "-follow-up-tokens", "32", "-output-tokens", "8"}

func TestPDSimulation(t *testing.T) {
	out := filepath.Join(t.TempDir(), "pd.json")
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), append(append([]string{"pd"}, tinyPD...), "-json", out), &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	for _, name := range []string{"aggregated", "always-remote P/D", "conditional P/D"} {
		if !strings.Contains(stdout.String(), name) {
			t.Fatalf("table without %q:\n%s", name, stdout.String())
		}
	}
	rep := readPDReport(t, out)
	agg, remote, cond := rep.Results[0], rep.Results[1], rep.Results[2]
	if agg.RemotePrefills != 0 || remote.RemotePrefills != 12 || cond.LocalPrefills == 0 || cond.RemotePrefills < 6 {
		t.Fatalf("decisions: %+v / %+v / %+v", agg, remote, cond)
	}
}

// The real-process run end to end: kvselect's picker, prefill and decode mock
// workers exchanging the prompt as llm-d's sidecar does, requests relayed as
// Envoy would. Always-remote leaves no prefill to the decode workers;
// conditional keeps the cached follow-ups local; every booking is freed.
func TestPDRealProcesses(t *testing.T) {
	kvselectBin, workerBin := buildFleetBinaries(t)
	out := filepath.Join(t.TempDir(), "pd.json")
	var stdout, stderr bytes.Buffer
	args := append(append([]string{"pd", "-mode", "real", "-speedup", "20", "-kvselect", kvselectBin, "-mockworker", workerBin,
		"-prefill-workers", "1", "-decode-workers", "2", "-out", t.TempDir(), "-json", out}, tinyPD...), "-rate", "20")
	if err := run(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	rep := readPDReport(t, out)
	agg, remote, cond := rep.Results[0], rep.Results[1], rep.Results[2]
	for _, r := range rep.Results {
		if r.Requests != 12 {
			t.Fatalf("%s: %d of 12 requests", r.Setup.Name, r.Requests)
		}
	}
	if agg.RemotePrefills != 0 || agg.DecodePrefilled == 0 || agg.TransferBlocks != 0 {
		t.Fatalf("aggregated: %+v", agg)
	}
	if remote.RemotePrefills != 12 || remote.DecodePrefilled != 0 || remote.TransferBlocks == 0 {
		t.Fatalf("always-remote: %+v", remote)
	}
	if cond.RemotePrefills < 6 || cond.LocalPrefills == 0 || cond.RemotePrefills+cond.LocalPrefills != 12 {
		t.Fatalf("conditional: %+v", cond)
	}
}

// The isl_bounding thresholds reach the service: a threshold of one token
// keeps nothing local.
func TestPDThresholdFlags(t *testing.T) {
	out := filepath.Join(t.TempDir(), "pd.json")
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), append(append([]string{"pd"}, tinyPD...), "-eff-isl-threshold", "1", "-json", out), &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	if cond := readPDReport(t, out).Results[2]; cond.LocalPrefills != 0 || cond.RemotePrefills != 12 {
		t.Fatalf("conditional with a 1-token threshold: %+v", cond)
	}
	if err := run(context.Background(), []string{"pd", "-eff-isl-ratio-threshold", "2"}, &stdout, &stderr); err == nil {
		t.Fatal("a ratio of 2 was accepted")
	}
}
