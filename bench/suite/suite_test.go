package suite

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/bench/fleet"
	"github.com/kvselect/kvselect/bench/fleet/fleettest"
	"github.com/kvselect/kvselect/bench/vsepp"
	"github.com/kvselect/kvselect/internal/peerproc"
)

// predictionFactor bounds how far the latency model's median prediction may
// be from the median observed TTFT over a short cell: the first 16 requests
// are predicted by the prior alone, which is not fitted to these engines.
const predictionFactor = 4

// TestSuiteHarness runs one short shared-prefix cell over each engine
// family (llm-d-inference-sim and kvselect's mock workers) with kvselect's
// predicted-latency policy and the EPP, and checks the harness: every cell
// and picker reported, no request failed, no booking left, the goals
// evaluated, and the latency model's median prediction within
// predictionFactor of the observed TTFT. It asserts no speed.
func TestSuiteHarness(t *testing.T) {
	bins := fleettest.Binaries(t)
	c := Config{Base: vsepp.Defaults(), Families: []fleet.Family{fleet.FamilySim, fleet.FamilyMock},
		Workloads: []string{SharedPrefix}, Shapes: []string{Shapes[0].Name}, Requests: 40, Repeat: 1, Quiet: true}
	c.Base.Binaries = bins
	c.Base.Sim, c.Base.EPP = peerproc.SimBinary(t), peerproc.EPPBinary(t)
	c.Base.Pickers = []string{"kvselect-latency", "epp"}
	c.Base.Workers, c.Base.Idle, c.Base.Saturate, c.Base.Pin = 2, time.Second, 0, false
	c.Base.Out = t.TempDir()
	var stdout, stderr bytes.Buffer
	rep, err := Run(context.Background(), c, &stdout, &stderr)
	if err != nil {
		t.Fatalf("suite: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	if len(rep.Cells) != 2 {
		t.Fatalf("%d cells, want 2", len(rep.Cells))
	}
	for _, cell := range rep.Cells {
		if len(cell.Report.Runs) != 2 {
			t.Fatalf("%s: %d runs, want 2", cell.Name, len(cell.Report.Runs))
		}
		for _, r := range cell.Report.Runs {
			if r.Errors != 0 || r.Requests != 40 || r.HitRate <= 0 || r.TTFTP99Ms <= 0 {
				t.Errorf("%s/%s: %d errors, %d requests, hit rate %v, TTFT p99 %v", cell.Name, r.Picker, r.Errors, r.Requests, r.HitRate, r.TTFTP99Ms)
			}
			if r.Picker != "kvselect-latency" {
				continue
			}
			if r.LeakedBookings == nil || *r.LeakedBookings != 0 {
				t.Errorf("%s: bookings left: %v", cell.Name, r.LeakedBookings)
			}
			var m struct {
				PredictionError struct {
					Observed int     `json:"observed"`
					Ratio    float64 `json:"predicted_over_observed_p50"`
				} `json:"prediction_error"`
			}
			if err := json.Unmarshal(r.LatencyModel, &m); err != nil {
				t.Fatalf("%s: latency model: %v", cell.Name, err)
			}
			e := m.PredictionError
			if e.Observed != 40 || !(e.Ratio >= 1.0/predictionFactor && e.Ratio <= predictionFactor) {
				t.Errorf("%s: %d predictions checked, median predicted/observed %.2f; want 40 within a factor %d",
					cell.Name, e.Observed, e.Ratio, predictionFactor)
			}
		}
	}
	if !strings.Contains(stdout.String(), "hit rate ≥ the better EPP's") {
		t.Errorf("no goals in the table:\n%s", stdout.String())
	}
	for _, f := range []string{"suite.json", "suite.svg", "shared-prefix.jsonl"} {
		if _, err := os.Stat(filepath.Join(c.Base.Out, f)); err != nil {
			t.Error(err)
		}
	}
}
