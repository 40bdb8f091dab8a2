package demo

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvselect/kvselect/bench/fleet/fleettest"
	"github.com/kvselect/kvselect/bench/ngf"
	"github.com/kvselect/kvselect/bench/report/reporttest"
)

// TestNGFDemoBothPaths runs the demo with -gateway nginx on a short slice:
// one table with a row per path (envoysim's, NGINX's) beside round-robin, the
// comparison block, and the JSON's gateway figures. Named TestNGF* so that
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
	c.Gateway, c.NGFShimDir = GatewayNGINX, dir
	c.Trace, c.Requests, c.Workers, c.Compress, c.Engine.Speedup, c.Quiet, c.Out = fleettest.Trace, 60, 2, 400, 400, true, t.TempDir()
	var stdout, stderr bytes.Buffer
	if _, err := Run(context.Background(), c, &stdout, &stderr); err != nil {
		t.Fatalf("demo: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	for _, want := range []string{PolicyKVSelect, PolicyKVSelectNGINX, PolicyRoundRobin, "kvselect CPU per request (µs)",
		"bookings within ±1 of client in flight", "NGINX path vs envoysim path (goals):"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, stdout.String())
		}
	}
	rep := reporttest.ReadJSON[Report](t, filepath.Join(c.Out, "demo.json"))
	if len(rep.Phases) != 3 || rep.Gateway == nil {
		t.Fatalf("demo.json: %+v", rep)
	}
	for _, ph := range rep.Phases[:2] {
		if ph.Errors != 0 || ph.Requests != 60 || ph.TTFTP90Ms <= 0 || ph.InFlight == nil || ph.InFlight.Samples == 0 || ph.InFlight.Engines == nil ||
			ph.CPUPerRequestUs <= 0 || ph.ServerPick == nil || ph.ServerPick.Count != 60 {
			t.Errorf("phase %s: %+v (in flight %+v)", ph.Policy, ph, ph.InFlight)
		}
	}
	if p := rep.Phases[1]; p.Path != PathNGINX || p.Routed() != 60 {
		t.Errorf("NGINX phase: path %q, %d requests counted on a worker, want nginx and 60", p.Path, p.Routed())
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

// The goals are judged from the two picker phases alone.
func TestCompareGatewayJudgesTheGoals(t *testing.T) {
	env := Phase{Path: PathEnvoysim, HitRate: 0.20, TTFTP90Ms: 100, CPUPerRequestUs: 100}
	for _, tc := range []struct {
		name string
		gw   Phase
		want GatewayGoals
	}{
		{"all met", Phase{Path: PathNGINX, HitRate: 0.25, TTFTP90Ms: 90, CPUPerRequestUs: 150, InFlight: &InFlight{Client: Tracking{Within1: 0.5}, Engines: &Tracking{Within1: 0.96}}},
			GatewayGoals{HitRateMet: true, TTFTMet: true, InFlightMet: true, CPUMet: true}},
		{"all missed", Phase{Path: PathNGINX, HitRate: 0.10, TTFTP90Ms: 120, CPUPerRequestUs: 250, InFlight: &InFlight{Client: Tracking{Within1: 0.99}, Engines: &Tracking{Within1: 0.99}, BookingsLeft: 1}},
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
