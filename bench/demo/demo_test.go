package demo

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvselect/kvselect/bench/fleet"
	"github.com/kvselect/kvselect/bench/fleet/fleettest"
	"github.com/kvselect/kvselect/bench/report/reporttest"
	"github.com/kvselect/kvselect/internal/peerproc"
)

// TestDemoCommand runs the demo on a short slice, sent at a steady -rate
// (the other demo tests replay the trace's times): both phases, the table,
// the JSON and the SVG, no errors, no load left.
func TestDemoCommand(t *testing.T) {
	c := Defaults()
	c.Binaries = fleettest.Binaries(t)
	c.Trace, c.Requests, c.Workers, c.Rate, c.Engine.Speedup, c.Quiet, c.Out = fleettest.Trace, 80, 2, 400, 400, true, t.TempDir()
	var stdout, stderr bytes.Buffer
	if _, err := Run(context.Background(), c, &stdout, &stderr); err != nil {
		t.Fatalf("demo: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	for _, want := range []string{"sent at 400 per second, evenly spaced", "prefix-cache hit rate", "TTFT p90 (ms)", "round-robin",
		"active requests after the run: 0", "decision, the picker's own p50 / p99", "decision, client-observed p50 / p99"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, stdout.String())
		}
	}
	rep := reporttest.ReadJSON[Report](t, filepath.Join(c.Out, "demo.json"))
	if len(rep.Phases) != 2 || rep.Arrivals != "400 per second, evenly spaced" {
		t.Fatalf("demo.json: %+v", rep)
	}
	for _, ph := range rep.Phases {
		if ph.Errors != 0 || ph.Requests != 80 || ph.TTFTP50Ms <= 0 || ph.Throughput <= 0 {
			t.Fatalf("phase %+v", ph)
		}
		if ph.Policy == "kvselect" && (ph.ServerPick == nil || ph.ServerPick.Count != 80 || ph.ServerPick.P50Us <= 0) {
			t.Errorf("kvselect phase: server-side decision time %+v, want 80 observations", ph.ServerPick)
		}
	}
	if !strings.Contains(stderr.String(), "/ui/") {
		t.Errorf("the demo did not print the status page URL:\n%s", stderr.String())
	}
	svg, err := os.ReadFile(filepath.Join(c.Out, "demo.svg"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"CDF", "Hit rate per second", "kvselect: decision time", "<polyline"} {
		if !strings.Contains(string(svg), want) {
			t.Errorf("demo.svg lacks %q", want)
		}
	}
	if strings.Contains(string(svg), "Throughput") {
		t.Error("demo.svg still draws the throughput bar an open-loop replay cannot change")
	}
}

// TestDemoOverLLMDSim runs the demo over llm-d-inference-sim on a short
// slice: kvselect learns the simulators' caches only through its KV events
// collector (they dial it; the demo registers them over REST), both phases
// complete with fresh simulators, the hit rate comes from the simulators' own
// counters, and no booking is left.
func TestDemoOverLLMDSim(t *testing.T) {
	sim := peerproc.SimBinary(t)
	c := Defaults()
	c.Binaries = fleettest.Binaries(t)
	c.Family, c.Sim = fleet.FamilySim, sim
	c.Trace, c.Requests, c.Workers, c.Compress, c.Quiet, c.Out = fleettest.Trace, 120, 2, 100, true, t.TempDir()
	var stdout, stderr bytes.Buffer
	if _, err := Run(context.Background(), c, &stdout, &stderr); err != nil {
		t.Fatalf("demo: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	for _, want := range []string{"llm-d-inference-sim engines", "round-robin", "active requests after the run: 0"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, stdout.String())
		}
	}
	rep := reporttest.ReadJSON[Report](t, filepath.Join(c.Out, "demo.json"))
	if len(rep.Phases) != 2 || rep.Engines != "llmd-sim" {
		t.Fatalf("demo.json: %+v", rep)
	}
	for _, ph := range rep.Phases {
		routed := 0
		for _, n := range ph.PerWorker {
			routed += n
		}
		// A slice of the conversation trace repeats prefixes: some of its
		// prompt tokens must be cache hits in either phase.
		if ph.Errors != 0 || routed != 120 || ph.HitRate <= 0 || ph.TTFTP50Ms <= 0 {
			t.Fatalf("phase %+v", ph)
		}
	}
	if _, err := os.Stat(filepath.Join(c.Out, "kvselect-sim-1.log")); err != nil {
		t.Fatalf("the picker phase's simulator log: %v", err)
	}
}

// Without a simulator binary, the simulator family says where to get one.
func TestDemoOverLLMDSimNeedsTheBinary(t *testing.T) {
	c := Defaults()
	c.Family = fleet.FamilySim
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), peerproc.EnvSim) {
		t.Fatalf("err = %v, want one naming %s", err, peerproc.EnvSim)
	}
}

// TestPaceAndRate checks how the report names the phases' arrivals (the
// trace's times divided by -compress, or evenly at -rate:
// mooncake.Arrivals) and that a rate that is not a finite non-negative
// number is refused.
func TestPaceAndRate(t *testing.T) {
	for _, tc := range []struct {
		compress, rate float64
		pace           string
	}{
		{1, 0, "the trace's times, 1x faster"},
		{20, 0, "the trace's times, 20x faster"},
		{20, 4, "4 per second, evenly spaced"},
	} {
		c := Defaults()
		c.Compress, c.Rate = tc.compress, tc.rate
		if got := c.pace(); got != tc.pace {
			t.Errorf("compress %g, rate %g: pace %q, want %q", tc.compress, tc.rate, got, tc.pace)
		}
	}
	for _, rate := range []float64{-1, math.NaN(), math.Inf(1)} {
		c := Defaults()
		c.Rate = rate
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "-rate") {
			t.Errorf("rate %g: err = %v, want one naming -rate", rate, err)
		}
	}
}

// -gateway-floor measures a gateway's path with the floor picker, which
// serves plaintext only and is run by a command the caller names.
func TestGatewayFloorNeedsItsParts(t *testing.T) {
	for _, tc := range []struct {
		gateway string
		tls     bool
		command []string
		want    string
	}{
		{want: "needs -gateway"},
		{gateway: GatewayNGINX, tls: true, command: []string{"kvbench", "floor-picker"}, want: "plaintext only"},
		{gateway: GatewayNGINX, want: "needs the command"},
	} {
		c := Defaults()
		c.GatewayFloor, c.Gateway, c.ExtProcTLS, c.FloorPicker = true, tc.gateway, tc.tls, tc.command
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("gateway %q, TLS %v, command %q: err = %v, want one saying %q", tc.gateway, tc.tls, tc.command, err, tc.want)
		}
	}
}
