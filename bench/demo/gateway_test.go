package demo

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvselect/kvselect/bench/fleet/fleettest"
	"github.com/kvselect/kvselect/bench/floorpicker/floortest"
	"github.com/kvselect/kvselect/bench/ngf"
	"github.com/kvselect/kvselect/bench/report/reporttest"
)

// TestNGFDemoBothPaths runs the demo with -gateway nginx and -gateway-floor
// on a short slice: one table with a row per path (envoysim's, NGINX's) for
// kvselect and for the floor picker beside round-robin, the comparison
// block, and the JSON's gateway figures. Named TestNGF* so that
// `make test`'s parallel run skips it and `make conformance-gateways` runs it
// after conformance/gateways: NGF fixes the shim's port (54800), so no two
// runs of it may overlap.
func TestNGFDemoBothPaths(t *testing.T) {
	dir := os.Getenv(ngf.EnvShimDir)
	if err := ngf.Check(dir); err != nil {
		if ngf.Required() {
			t.Fatalf("%v (required: %s is set)", err, ngf.EnvRequire)
		}
		t.Skipf("%v (%s=1 makes this a failure)", err, ngf.EnvRequire)
	}
	c := Defaults()
	c.Binaries = fleettest.Binaries(t)
	c.Gateway, c.NGFShimDir, c.GatewayFloor, c.FloorPicker = GatewayNGINX, dir, true, floortest.Command()
	c.Trace, c.Requests, c.Workers, c.Compress, c.Engine.Speedup, c.Quiet, c.Out = fleettest.Trace, 60, 2, 400, 400, true, t.TempDir()
	var stdout, stderr bytes.Buffer
	if _, err := Run(context.Background(), c, &stdout, &stderr); err != nil {
		t.Fatalf("demo: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	for _, want := range []string{PolicyKVSelect, PolicyKVSelectNGINX, PolicyFloor, PolicyFloorNGINX, PolicyRoundRobin, "picker CPU per request (µs)",
		"bookings within ±1 of client in flight", "NGINX path vs envoysim path (goals):", "the floor's path"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, stdout.String())
		}
	}
	rep := reporttest.ReadJSON[Report](t, filepath.Join(c.Out, "demo.json"))
	if len(rep.Phases) != 5 || rep.Gateway == nil || rep.Gateway.Floor == nil {
		t.Fatalf("demo.json: %+v", rep)
	}
	for _, ph := range rep.Phases[:2] {
		if ph.Errors != 0 || ph.Requests != 60 || ph.TTFTP90Ms <= 0 || ph.InFlight == nil || ph.InFlight.Samples == 0 || ph.InFlight.Engines == nil ||
			ph.CPUPerRequestUs <= 0 || ph.ServerPick == nil || ph.ServerPick.Count != 60 || ph.Routing == nil {
			t.Errorf("phase %s: %+v (in flight %+v)", ph.Policy, ph, ph.InFlight)
		}
	}
	if p := rep.Phases[1]; p.Path != PathNGINX || p.Routed() != 60 {
		t.Errorf("NGINX phase: path %q, %d requests counted on a worker, want nginx and 60", p.Path, p.Routed())
	}
	// The floor's phases: its own decisions and CPU, nothing booked to
	// track, every request on a worker, round-robin within one of even.
	for i, path := range []string{PathEnvoysim, PathNGINX} {
		ph := rep.Phases[2+i]
		if ph.Policy != []string{PolicyFloor, PolicyFloorNGINX}[i] || ph.Path != path || ph.Errors != 0 || ph.InFlight != nil || ph.Routing != nil ||
			ph.CPUPerRequestUs <= 0 || ph.ServerPick == nil || ph.ServerPick.Count != 60 || ph.Routed() != 60 {
			t.Errorf("phase %d: %+v", 2+i, ph)
		}
		for w, n := range ph.PerWorker {
			if n < 29 || n > 31 {
				t.Errorf("%s: worker %d served %d of 60, want round-robin's 30", ph.Policy, w, n)
			}
		}
	}
}

func TestTrackingBracketsTheReference(t *testing.T) {
	var tr Tracking
	for _, s := range []struct{ booked, a, b float64 }{
		{5, 4, 6},  // inside the range the reads span: 0
		{3, 5, 5},  // 2 below
		{7, 6, 5},  // 1 above, reads in either order
		{10, 4, 4}, // 6 above
	} {
		tr.add(s.booked, s.a, s.b)
	}
	tr.finish(4)
	if tr.Within1 != 0.5 || tr.MeanAbsError != 9.0/4 || tr.MeanError != 5.0/4 || tr.Mean != 4.875 {
		t.Fatalf("tracking = %+v, want half within, |error| 9/4, error +5/4, mean 4.875", tr)
	}
}

// The goals are judged from kvselect's two phases alone.
func TestCompareGatewayJudgesTheGoals(t *testing.T) {
	env := Phase{Policy: PolicyKVSelect, HitRate: 0.20, TTFTP90Ms: 100, CPUPerRequestUs: 100}
	for _, tc := range []struct {
		name string
		gw   Phase
		want GatewayGoals
	}{
		{"all met", Phase{Policy: PolicyKVSelectNGINX, HitRate: 0.25, TTFTP90Ms: 90, CPUPerRequestUs: 150, InFlight: &InFlight{Client: Tracking{Within1: 0.5}, Engines: &Tracking{Within1: 0.96}}},
			GatewayGoals{HitRateMet: true, TTFTMet: true, InFlightMet: true, CPUMet: true}},
		{"all missed", Phase{Policy: PolicyKVSelectNGINX, HitRate: 0.10, TTFTP90Ms: 120, CPUPerRequestUs: 250, InFlight: &InFlight{Client: Tracking{Within1: 0.99}, Engines: &Tracking{Within1: 0.99}, BookingsLeft: 1}},
			GatewayGoals{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := compareGateway([]Phase{env, tc.gw, {Policy: PolicyRoundRobin}})
			if g == nil || g.HitRateMet != tc.want.HitRateMet || g.TTFTMet != tc.want.TTFTMet || g.InFlightMet != tc.want.InFlightMet || g.CPUMet != tc.want.CPUMet {
				t.Fatalf("got %+v, want the goals of %+v", g, tc.want)
			}
		})
	}
	if compareGateway([]Phase{env}) != nil {
		t.Error("a comparison without the NGINX phase")
	}
}

// The path's cost is reported in milliseconds beside the goal's allowance,
// for kvselect and, when its phases ran, for the floor picker; the floor's
// figures do not enter the goals.
func TestCompareGatewayPathCosts(t *testing.T) {
	phases := []Phase{
		{Policy: PolicyKVSelect, TTFTP50Ms: 20, TTFTP90Ms: 80, HitRate: 0.2, CPUPerRequestUs: 100},
		{Policy: PolicyKVSelectNGINX, TTFTP50Ms: 24, TTFTP90Ms: 83, HitRate: 0.2, CPUPerRequestUs: 100},
		{Policy: PolicyFloor, TTFTP50Ms: 30, TTFTP90Ms: 100},
		{Policy: PolicyFloorNGINX, TTFTP50Ms: 35, TTFTP90Ms: 110},
		{Policy: PolicyRoundRobin, TTFTP50Ms: 30, TTFTP90Ms: 100},
	}
	g := compareGateway(phases)
	if g == nil || g.Floor == nil {
		t.Fatalf("got %+v, want kvselect's and the floor's path costs", g)
	}
	near := func(got, want PathCost) bool {
		return math.Abs(got.TTFTP50GapMs-want.TTFTP50GapMs) < 1e-9 && math.Abs(got.TTFTP90GapMs-want.TTFTP90GapMs) < 1e-9 &&
			math.Abs(got.TTFTP90Delta-want.TTFTP90Delta) < 1e-9
	}
	if !near(g.Path, PathCost{TTFTP50GapMs: 4, TTFTP90GapMs: 3, TTFTP90Delta: 0.0375}) || g.TTFTAllowanceMs != 4 || !g.TTFTMet {
		t.Errorf("kvselect's path: %+v, allowance %v, met %v; want +4 / +3 ms, 4 ms allowed, met", g.Path, g.TTFTAllowanceMs, g.TTFTMet)
	}
	if !near(*g.Floor, PathCost{TTFTP50GapMs: 5, TTFTP90GapMs: 10, TTFTP90Delta: 0.1}) {
		t.Errorf("the floor's path: %+v, want +5 / +10 ms, +10 %%", *g.Floor)
	}
	if g := compareGateway(phases[:3]); g == nil || g.Floor != nil {
		t.Errorf("without floor-nginx: %+v, want kvselect's comparison alone", g)
	}
}
