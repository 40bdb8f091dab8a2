package extprocload

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/bench/report/reporttest"
)

func TestExtProcBenchInProcess(t *testing.T) {
	for name, change := range map[string]func(*Config){
		"extproc":           func(c *Config) {},
		"extproc text rate": func(c *Config) { c.Prompt, c.Rate = "text", 200 },
		"rest":              func(c *Config) { c.Front = "rest" },
	} {
		t.Run(name, func(t *testing.T) {
			c := Defaults()
			c.Streams, c.Workers, c.Duration, c.Warmup, c.Chunks = 4, 4, 500*time.Millisecond, 100*time.Millisecond, 20
			c.JSON = filepath.Join(t.TempDir(), "ep.json")
			c.SVG = filepath.Join(filepath.Dir(c.JSON), "ep.svg")
			change(&c)
			var stdout, stderr bytes.Buffer
			if _, err := Run(context.Background(), c, &stdout, &stderr); err != nil {
				t.Fatalf("run: %v\n%s", err, stderr.String())
			}
			for _, want := range []string{"requests/s", "decision", "whole request", "CPU per request"} {
				if !strings.Contains(stdout.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, stdout.String())
				}
			}
			raw, err := os.ReadFile(c.JSON)
			if err != nil {
				t.Fatal(err)
			}
			var v Result
			if err := json.Unmarshal(raw, &v); err != nil || v.Requests == 0 || v.Errors != 0 || v.Total.P50 == 0 {
				t.Fatalf("json %s: %v", raw, err)
			}
			reporttest.CheckSVG(t, c.SVG, "decision")
		})
	}
}

func TestExtProcBenchRejectsBadSettings(t *testing.T) {
	for name, change := range map[string]func(*Config){
		"front":            func(c *Config) { c.Front = "x" },
		"prompt":           func(c *Config) { c.Prompt = "x" },
		"rest text":        func(c *Config) { c.Front, c.Prompt = "rest", "text" },
		"no streams":       func(c *Config) { c.Streams = 0 },
		"not on loopback":  func(c *Config) { c.URL = "http://example.com" },
		"extproc no -addr": func(c *Config) { c.URL = "http://127.0.0.1:1" },
	} {
		c := Defaults()
		change(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
}
