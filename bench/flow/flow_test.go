package flow

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/bench/fleet/fleettest"
)

func TestFlowCommand(t *testing.T) {
	out := filepath.Join(t.TempDir(), "flow.json")
	var stdout, stderr bytes.Buffer
	c := Defaults()
	c.Sim.Duration, c.JSON = 20*time.Second, out
	if _, err := Run(context.Background(), c, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	for _, want := range []string{"B alone (unloaded)", "saturated", "overloaded (A × 1.3)", "TTFT p90 / alone"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, stdout.String())
		}
	}
	rep, _ := readFlowReport(t, out)
	if len(rep.Results) != 3 || len(rep.Overload) != 3 || rep.Alone.Tenant("B").Finished == 0 {
		t.Fatalf("report: %+v", rep)
	}
	for name, change := range map[string]func(*Config){
		"overload":   func(c *Config) { c.Overload = 0.5 },
		"no workers": func(c *Config) { c.Sim.Workers = 0 },
		"mode":       func(c *Config) { c.Mode = "dream" },
	} {
		c := Defaults()
		change(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
}

// The real-process run: kvselect with each --flow-control mode, four mock
// workers, requests through the picker with their tenant and priority
// headers. Every request ends (finished, shed or expired) and no booking
// is left (run checks both); under flow control sheddable requests never
// expire in the queue.
func TestFlowRealProcesses(t *testing.T) {
	out := filepath.Join(t.TempDir(), "flow.json")
	var stdout, stderr bytes.Buffer
	c := Defaults()
	c.Binaries = fleettest.Binaries(t)
	c.Mode, c.Sim.Duration, c.Speedup, c.Out, c.JSON = "real", 6*time.Second, 4, t.TempDir(), out
	if _, err := Run(context.Background(), c, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	rep, data := readFlowReport(t, out)
	if len(rep.Results) != 3 || rep.Alone.Tenant("B").Finished == 0 {
		t.Fatalf("report: %s", data)
	}
	for _, r := range rep.Results {
		if a := r.Tenant("A"); a.Finished == 0 {
			t.Errorf("%s: no request of A finished: %+v", r.Mode, a)
		}
		if s := r.Tenant("batch"); r.Mode != "off" && s.Expired != 0 {
			t.Errorf("%s: a sheddable request expired: %+v", r.Mode, s)
		}
	}
}

func readFlowReport(t *testing.T, path string) (Report, []byte) {
	t.Helper()
	var rep Report
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	return rep, data
}
