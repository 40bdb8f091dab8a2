package health

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/bench/fleet/fleettest"
)

// TestHealthBench runs the health bench on real processes: worker 4 fails
// every request for 2.5 s while direct traffic loads workers 1 and 2. The
// picker must eject worker 4 after its consecutive failures, route nothing
// to it afterwards but the probation trials, restore it once a trial
// succeeds after the fault ends, and free every booking.
func TestHealthBench(t *testing.T) {
	c := Defaults()
	c.Binaries = fleettest.Binaries(t)
	c.Healthy, c.Fault, c.Recover, c.EjectBase, c.FailWorker = time.Second, 2500*time.Millisecond, 3*time.Second, time.Second, 4
	c.DirectRate, c.DirectWorkers, c.PromptTokens, c.Out = 10, 2, 256, t.TempDir()
	var out, errOut bytes.Buffer
	rep, err := Measure(context.Background(), c, &out, &errOut)
	if err != nil {
		t.Fatalf("%v\n%s\n%s", err, out.String(), errOut.String())
	}
	if len(rep.Runs) != 1 {
		t.Fatalf("%d runs, want 1", len(rep.Runs))
	}
	run := rep.Runs[0]
	switch {
	case !run.Ejected:
		t.Errorf("worker 4 was never ejected")
	case run.FailuresBeforeEjection < 5:
		t.Errorf("ejected after %d failures, want at least --eject-after's 5", run.FailuresBeforeEjection)
	case run.Beyond != 0:
		t.Errorf("%d requests routed to the ejected worker beyond its %d trials", run.Beyond, run.Trials)
	case !run.Restored:
		t.Errorf("worker 4 not restored after the fault ended")
	}
	if run.ActiveAfterRun != 0 {
		t.Errorf("%d bookings left after the run", run.ActiveAfterRun)
	}
	if run.Direct == 0 || run.DirectFailed != 0 {
		t.Errorf("direct traffic: %d sent, %d failed", run.Direct, run.DirectFailed)
	}
	if run.FirstError != "" {
		t.Errorf("a routed request got no answer: %s", run.FirstError)
	}
	for _, ph := range run.Phases {
		// A request sent just before the fault began may still reach the
		// worker after it: only the recover phase must be clean.
		if ph.Name == "recover" && ph.Failed != 0 {
			t.Errorf("%s phase: %d failed requests", ph.Name, ph.Failed)
		}
		if ph.Routed == 0 {
			t.Errorf("%s phase: nothing routed", ph.Name)
		}
	}
	if !strings.Contains(out.String(), "beyond") {
		t.Errorf("the table lacks the ejection line:\n%s", out.String())
	}
	if t.Failed() {
		t.Logf("report:\n%s", out.String())
	}
}
