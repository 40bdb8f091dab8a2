package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kvselect/kvselect/bench/report/reporttest"
	"github.com/kvselect/kvselect/bench/routesim"
	"github.com/kvselect/kvselect/internal/peerproc"
)

const trace = "../../bench/testdata/mooncake/conversation_trace.jsonl.gz"

func TestIndexReplayPrintsTableAndJSON(t *testing.T) {
	out := filepath.Join(t.TempDir(), "r.json")
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"index", "-trace", trace, "-max", "300", "-workers", "4", "-blocks", "256", "-json", out, "-svg", out + ".svg"}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	for _, want := range []string{"kvselect", "combined ops/s", "lookup p99 ns", "4 workers x 256 blocks"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, stdout.String())
		}
	}
	v := reporttest.ReadJSON[struct {
		Results []struct{ Requests, RemovedBlocks int }
	}](t, out)
	if len(v.Results) != 1 || v.Results[0].Requests != 300 || v.Results[0].RemovedBlocks == 0 {
		t.Fatalf("json = %+v", v)
	}
	reporttest.CheckSVG(t, out+".svg", "Lookup latency")
}

// kvbench route writes the report routesim.Compare makes, with the run
// settings as given (the swept ones left out), and its chart; the engine
// timing's old spellings still set it.
func TestRouteJSONAndSVG(t *testing.T) {
	dir := t.TempDir()
	jsonOut, svgOut := filepath.Join(dir, "route.json"), filepath.Join(dir, "route.svg")
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"route", "-trace", trace, "-requests", "200", "-capacity", "256", "-policies", "kv-cost,round-robin",
		"-prefill-per-token", "40us", "-decode-per-token", "10ms", "-quiet", "-json", jsonOut, "-svg", svgOut}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	rep := reporttest.ReadJSON[routesim.Report](t, jsonOut)
	c := rep.Config
	if len(rep.Results) != 2 || rep.Requests != 200 || c.Workers != 8 || c.Capacity != 0 || c.PrefillPerToken.Microseconds() != 40 || c.DecodePerToken.Milliseconds() != 10 {
		t.Fatalf("report: %d results, %d requests, config %+v", len(rep.Results), rep.Requests, c)
	}
	if stderr.Len() != 0 {
		t.Errorf("-quiet wrote %q", stderr.String())
	}
	reporttest.CheckSVG(t, svgOut, "kv-cost")
}

// Bad subcommands, flags and settings are refused before anything runs.
func TestUsageErrors(t *testing.T) {
	t.Setenv(peerproc.EnvSim, "")
	t.Setenv(peerproc.EnvEPP, "")
	t.Setenv(peerproc.EnvRequireSim, "")
	for _, tc := range []struct {
		args []string
		want string // in the error; "" for any
	}{
		{[]string{"nope"}, "unknown subcommand"},
		{[]string{"index", "-assign", "sticky", "-trace", trace}, ""},
		{[]string{"index", "-trace", "/does/not/exist"}, ""},
		{[]string{"index", "-bogus-flag"}, "not defined"},
		{[]string{"route", "-policies", "kv-cost,best"}, "unknown policy"},
		{[]string{"route", "-policies", "kvselect"}, "unknown policy"}, // the old name of kv-cost
		{[]string{"route", "-policies", ""}, "no policy"},
		{[]string{"route", "-capacity", "0"}, "-capacity"},
		{[]string{"scale", "-parts", "selection,gpu"}, "unknown part"},
		{[]string{"scale", "-ranks", "0"}, "-ranks"},
		{[]string{"scale", "-from", "/does/not/exist.json"}, "-from"},
		{[]string{"route", "-capacity", "x"}, "-capacity"},
		{[]string{"route", "-trace", "/nonexistent.jsonl"}, ""},
		{[]string{"route", "-workers", "0", "-trace", trace, "-requests", "10"}, ""},
		{[]string{"route", "extra"}, "unexpected arguments"},
		{[]string{"route", "-bypass", "1.5"}, "-bypass"},
		{[]string{"route", "-bypass", "x"}, "-bypass"},
		{[]string{"route", "-engine-metrics", "maybe"}, "-engine-metrics"},
		{[]string{"route", "-engine-request-weight", "-1"}, "-engine-request-weight"},
		{[]string{"route", "-bypass", "0.3", "-bypass-workers", "9", "-trace", trace, "-requests", "10"}, ""},
		{[]string{"pd", "-eff-isl-ratio-threshold", "2"}, ""},
		{[]string{"pd", "-mode", "dream"}, "-mode"},
		{[]string{"flow", "-overload", "0.5"}, "-overload"},
		{[]string{"flow", "-workers", "0"}, ""},
		{[]string{"flow", "extra"}, "unexpected arguments"},
		{[]string{"text", "-phases", "tokens,magic"}, "unknown phase"},
		{[]string{"text", "-sessions", "0"}, "positive"},
		{[]string{"text", "-speedup", "0"}, "-speedup"},
		{[]string{"text", "extra"}, "unexpected arguments"},
		{[]string{"health", "-engine-metrics-interval", "soon"}, "-engine-metrics-interval"},
		{[]string{"health", "-fail-worker", "9"}, "-fail-worker"},
		{[]string{"rest", "-prompt", "words"}, "-prompt"},
		{[]string{"rest", "-clients", "0"}, "positive"},
		{[]string{"rest", "-duration", "0s"}, "-duration"},
		{[]string{"rest", "-url", "http://192.0.2.1:8080"}, "loopback"},
		{[]string{"rest", "-url", "https://localhost:8080"}, "-url"},
		{[]string{"rest", "-auth", "bogus"}, "unknown mode"},
		{[]string{"rest", "extra"}, "unexpected arguments"},
		{[]string{"extproc", "-front", "x"}, "-front"},
		{[]string{"extproc", "-prompt", "x"}, "-prompt"},
		{[]string{"extproc", "-front", "rest", "-prompt", "text"}, "-prompt"},
		{[]string{"extproc", "-streams", "0"}, "positive"},
		{[]string{"extproc", "-url", "http://example.com"}, "loopback"},
		{[]string{"demo", "-engine-family", "llmd-sim"}, peerproc.EnvSim},
		{[]string{"demo", "-engines", "llmd-sim"}, peerproc.EnvSim}, // the old spelling
		{[]string{"vs-epp", "-sim-bin", "/bin/true"}, peerproc.EnvEPP},
		{[]string{"vs-epp", "-pickers", "kvselect"}, peerproc.EnvSim},
		{[]string{"vs-epp", "-engines", "0", "-kv-blocks", "8", "-inter-token-latency", "1ms"}, "-workers"}, // old spellings, then a bad count
		{[]string{"soak", "-expiry", "1500ms"}, "whole seconds"},
		{[]string{"soak", "-short", "-replicas", "0"}, "replicas"},
		{[]string{"soak", "-proxied-workers", "9"}, "proxied"},
		{[]string{"soak", "-sims", "2"}, "simulator"},
		{[]string{"soak", "-duration", "1m", "extra"}, "unexpected arguments"},
	} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), tc.args, &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err = %v, want one containing %q", tc.args, err, tc.want)
		}
	}
	t.Setenv(peerproc.EnvRequireSim, "1")
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), []string{"soak"}, &stdout, &stderr); err == nil || !strings.Contains(err.Error(), "KVSELECT_REQUIRE_LLMD_SIM") {
		t.Errorf("required simulator missing: %v", err)
	}
	stdout.Reset()
	if err := run(context.Background(), nil, &stdout, &stdout); err != nil || !strings.Contains(stdout.String(), "usage") {
		t.Fatalf("no args: %v %q", err, stdout.String())
	}
}

// Every subcommand answers -h with its flags, the deprecated spellings left
// out.
func TestEverySubcommandHelps(t *testing.T) {
	for name := range subcommands {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), []string{name, "-h"}, &stdout, &stderr)
		if !errors.Is(err, flag.ErrHelp) || !strings.Contains(stderr.String(), "Usage of kvbench "+name) {
			t.Errorf("%s -h: %v\n%s", name, err, stderr.String())
		}
		for _, old := range []string{"prefill-per-token", "decode-per-token", "inter-token-latency", "decode-step", "kv-blocks", "engines", "sim"} {
			if regexp.MustCompile(`(?m)^  -` + old + `( |$)`).MatchString(stderr.String()) {
				t.Errorf("%s -h shows the deprecated -%s", name, old)
			}
		}
		if !strings.Contains(usage, "\n  "+name+" ") {
			t.Errorf("the usage does not list %s", name)
		}
	}
}

// kvbench scale prints its tables and writes scale.json and the curves; -from
// prints and redraws them from that file without running anything.
func TestScaleWritesTablesJSONAndCurves(t *testing.T) {
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"scale", "-parts", "selection,ingest", "-ranks", "8", "-ingest-engines", "8",
		"-ranks-per-worker", "4", "-ranks-per-group", "4", "-cache-blocks", "64", "-system-tokens", "128", "-question-tokens", "128",
		"-output-tokens", "64", "-requests", "20", "-warmup", "5", "-in-flight", "4", "-ingest-seconds", "0.5", "-out", dir}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	for _, want := range []string{"Selection on one core", "Ingest on one core"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, stdout.String())
		}
	}
	reporttest.CheckSVG(t, filepath.Join(dir, "scale-selection.svg"), "p50")
	redraw := t.TempDir()
	var again bytes.Buffer
	if err := run(context.Background(), []string{"scale", "-from", filepath.Join(dir, "scale.json"), "-out", redraw}, &again, &stderr); err != nil {
		t.Fatalf("-from: %v", err)
	}
	if again.String() != stdout.String() {
		t.Errorf("-from printed\n%s\nwant\n%s", again.String(), stdout.String())
	}
	reporttest.CheckSVG(t, filepath.Join(redraw, "scale-ingest.svg"), "goal")
}
