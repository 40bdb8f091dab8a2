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

func TestExtProcBenchInProcess(t *testing.T) {
	for _, args := range [][]string{
		{"-front", "extproc"},
		{"-front", "extproc", "-prompt", "text", "-rate", "200"},
		{"-front", "rest"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "ep.json")
			var stdout, stderr bytes.Buffer
			svg := filepath.Join(filepath.Dir(out), "ep.svg")
			all := append([]string{"extproc", "-streams", "4", "-workers", "4", "-duration", "500ms", "-warmup", "100ms", "-chunks", "20", "-json", out, "-svg", svg}, args...)
			if err := run(context.Background(), all, &stdout, &stderr); err != nil {
				t.Fatalf("run: %v\n%s", err, stderr.String())
			}
			for _, want := range []string{"requests/s", "decision", "whole request", "CPU per request"} {
				if !strings.Contains(stdout.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, stdout.String())
				}
			}
			raw, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			var v epResult
			if err := json.Unmarshal(raw, &v); err != nil || v.Requests == 0 || v.Errors != 0 || v.Total.P50 == 0 {
				t.Fatalf("json %s: %v", raw, err)
			}
			checkSVG(t, svg, "decision")
		})
	}
}

func TestExtProcBenchRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-front", "x"}, {"-prompt", "x"}, {"-front", "rest", "-prompt", "text"}, {"-streams", "0"}, {"-url", "http://example.com"}} {
		var stdout, stderr bytes.Buffer
		if err := run(context.Background(), append([]string{"extproc"}, args...), &stdout, &stderr); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}
