package observe

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/kvselect/kvselect/bench/fleet/fleettest"
	"github.com/kvselect/kvselect/internal/peerproc"
)

// TestObserveCommand runs the observe check end to end: kvselect and mock
// workers scraped by a real Prometheus with the alert rules loaded, the
// status page in headless Chromium. The run itself fails on a dashboard
// query that errs or has no data, on a rule that does not evaluate, or on a
// status page without the workers and decisions; the test checks its
// report and the screenshots it saved.
func TestObserveCommand(t *testing.T) {
	c := Defaults()
	c.Prometheus, c.Chromium = peerproc.ObserveTool(t, "prometheus"), peerproc.ObserveTool(t, "chromium")
	c.Demo.Binaries = fleettest.Binaries(t)
	c.Demo.Workers, c.Demo.Requests, c.Demo.Quiet, c.Demo.Trace, c.Demo.Out = 2, 150, true, fleettest.Trace, t.TempDir()
	c.Dashboard, c.Alerts = "../../deploy/observability/grafana-dashboard.json", "../../deploy/observability/alerts.yaml"
	var stdout, stderr bytes.Buffer
	if _, err := Run(context.Background(), c, &stdout, &stderr); err != nil {
		t.Fatalf("kvbench observe: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	raw, err := os.ReadFile(filepath.Join(c.Demo.Out, "observe.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Rules != 8 || rep.PageWorkers != 2 || rep.PageDecided == 0 || len(rep.Panels) == 0 {
		t.Errorf("report: %d rules, %d worker rows, %d decision rows, %d panels", rep.Rules, rep.PageWorkers, rep.PageDecided, len(rep.Panels))
	}
	for _, p := range rep.Panels {
		for _, q := range p.Queries {
			if q.Error != "" || q.Series == 0 && p.Optional == "" {
				t.Errorf("panel %q: %+v", p.Title, q)
			}
		}
	}
	for _, png := range []string{rep.StatusPage, rep.Dashboard} {
		b, err := os.ReadFile(png)
		if err != nil || len(b) < 1000 || !bytes.HasPrefix(b, []byte("\x89PNG")) {
			t.Errorf("%s: not a PNG screenshot (%d bytes, %v)", png, len(b), err)
		}
	}
}

// TestAlertRulesPassPromtool: the rules file as Prometheus's own checker
// reads it, and its unit tests (alerts_test.yaml: each alert fires on the
// series that should page, with its labels and text, and not before).
func TestAlertRulesPassPromtool(t *testing.T) {
	promtool := peerproc.ObserveTool(t, "promtool")
	if out, err := exec.Command(promtool, "check", "rules", "../../deploy/observability/alerts.yaml").CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	cmd := exec.Command(promtool, "test", "rules", "alerts_test.yaml")
	cmd.Dir = "../../deploy/observability"
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}
