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
	var rep flowReport
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 3 || len(rep.Overload) != 3 || rep.Alone.Tenant("B").Finished == 0 {
		t.Fatalf("report: %+v", rep)
	}
	for _, args := range [][]string{{"flow", "-overload", "0.5"}, {"flow", "-workers", "0"}, {"flow", "extra"}} {
		if err := run(context.Background(), args, &stdout, &stderr); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}
