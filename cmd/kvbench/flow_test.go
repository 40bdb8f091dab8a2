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

func TestFlowCommand(t *testing.T) {
	out := filepath.Join(t.TempDir(), "flow.json")
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), []string{"flow", "-duration", "20s", "-json", out}, &stdout, &stderr); err != nil {
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
	for _, args := range [][]string{{"flow", "-overload", "0.5"}, {"flow", "-workers", "0"}, {"flow", "extra"}} {
		if err := run(context.Background(), args, &stdout, &stderr); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

// The real-process run: kvselect with each --flow-control mode, four mock
// workers, requests through the picker with their tenant and priority
// headers. Every request ends (finished, shed or expired) and no booking
// is left (run checks both); under flow control sheddable requests never
// expire in the queue.
func TestFlowRealProcesses(t *testing.T) {
	kvselectBin, workerBin := buildFleetBinaries(t)
	out := filepath.Join(t.TempDir(), "flow.json")
	var stdout, stderr bytes.Buffer
	args := []string{"flow", "-mode", "real", "-duration", "6s", "-speedup", "4", "-kvselect", kvselectBin, "-mockworker", workerBin,
		"-out", t.TempDir(), "-json", out}
	if err := run(context.Background(), args, &stdout, &stderr); err != nil {
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

func readFlowReport(t *testing.T, path string) (flowReport, []byte) {
	t.Helper()
	var rep flowReport
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	return rep, data
}
