package pd

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvselect/kvselect/bench/fleet/fleettest"
	"github.com/kvselect/kvselect/bench/report/reporttest"
)

func readPDReport(t *testing.T, path string) Report {
	t.Helper()
	rep := reporttest.ReadJSON[Report](t, path)
	if len(rep.Results) != 3 {
		t.Fatalf("%d results", len(rep.Results))
	}
	return rep
}

// tiny is a short traffic: 6 sessions of 2 requests.
func tiny(out string) Config {
	c := Defaults()
	c.Sim.Sessions, c.Sim.Turns, c.Sim.FirstTokens, c.Sim.FollowUpTokens, c.Sim.OutputTokens = 6, 2, 512, 32, 8
	c.JSON = out
	return c
}

func TestPDSimulation(t *testing.T) {
	out := filepath.Join(t.TempDir(), "pd.json")
	var stdout, stderr bytes.Buffer
	if _, err := Run(context.Background(), tiny(out), &stdout, &stderr); err != nil {
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
	out := filepath.Join(t.TempDir(), "pd.json")
	var stdout, stderr bytes.Buffer
	c := tiny(out)
	c.Binaries = fleettest.Binaries(t)
	c.Mode, c.Speedup, c.PrefillWorkers, c.DecodeWorkers, c.Out, c.Sim.Rate = "real", 20, 1, 2, t.TempDir(), 20
	if _, err := Run(context.Background(), c, &stdout, &stderr); err != nil {
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
	c := tiny(out)
	c.Sim.EffISLThreshold = 1
	if _, err := Run(context.Background(), c, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	if cond := readPDReport(t, out).Results[2]; cond.LocalPrefills != 0 || cond.RemotePrefills != 12 {
		t.Fatalf("conditional with a 1-token threshold: %+v", cond)
	}
	c = Defaults()
	c.Sim.EffISLRatioThreshold = 2
	if _, err := Run(context.Background(), c, &stdout, &stderr); err == nil {
		t.Fatal("a ratio of 2 was accepted")
	}
}
