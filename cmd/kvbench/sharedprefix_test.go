package main

import (
	"flag"
	"io"
	"testing"
	"time"

	"github.com/kvselect/kvselect/bench/vsepp"
	"github.com/kvselect/kvselect/bench/workload"
)

// vsEPPConfig parses vs-epp's command line as kvbench does.
func vsEPPConfig(t *testing.T, args ...string) (vsepp.Config, error) {
	t.Helper()
	fs := flag.NewFlagSet("kvbench vs-epp", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	config := vsEPPFlags(fs, args)
	if err := fs.Parse(args); err != nil {
		return vsepp.Config{}, err
	}
	return config()
}

func TestVsEPPLLMDPerfPreset(t *testing.T) {
	c, err := vsEPPConfig(t, "-llmd-perf", "shared_prefix_100k-1k-10qps", "-rate-scale", "0.2", "-max-duration", "60s", "-system-tokens", "90000")
	if err != nil {
		t.Fatal(err)
	}
	sp := c.SharedPrefix
	if sp == nil {
		t.Fatal("-llmd-perf gave no shared_prefix workload")
	}
	want := []workload.Stage{{Rate: 0.2, Duration: 15 * time.Second}, {Rate: 2, Duration: 300 * time.Second}}
	if sp.Groups != 10 || sp.PromptsPerGroup != 5 || sp.SystemTokens != 90000 || sp.QuestionTokens != 5000 || sp.OutputTokens != 1000 ||
		len(sp.Stages) != 2 || sp.Stages[0] != want[0] || sp.Stages[1] != want[1] || sp.MaxDuration != 60*time.Second {
		t.Fatalf("workload %+v", sp)
	}
	if c.Rate != 0 || c.Compress != 1 || c.BlockTokens != workload.BlockTokens || c.Requests != 0 {
		t.Errorf("the generator should pace the run and set the lengths: rate %g, compress %g, block tokens %d, requests %d",
			c.Rate, c.Compress, c.BlockTokens, c.Requests)
	}
	if workload.LLMDPerf["shared_prefix_100k-1k-10qps"].Stages[1].Rate != 10 || workload.LLMDPerf["shared_prefix_100k-1k-10qps"].SystemTokens != 95000 {
		t.Error("the flags changed the published preset")
	}
	reqs, err := sp.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 3+90 { // 0.2/s for 15 s, then 2/s up to 60 s
		t.Errorf("%d requests, want 93", len(reqs))
	}
}

func TestVsEPPSharedPrefixFlags(t *testing.T) {
	c, err := vsEPPConfig(t, "-workload", "shared_prefix", "-groups", "3", "-prompts-per-group", "4", "-system-tokens", "1000",
		"-question-tokens", "200", "-output-tokens", "50", "-rate", "5", "-requests", "7")
	if err != nil {
		t.Fatal(err)
	}
	sp := c.SharedPrefix
	if sp == nil || sp.Groups != 3 || sp.PromptsPerGroup != 4 || sp.SystemTokens != 1000 || sp.QuestionTokens != 200 || sp.OutputTokens != 50 ||
		sp.Rate != 5 || len(sp.Stages) != 0 || c.Rate != 0 || c.Requests != 7 {
		t.Fatalf("workload %+v, rate %g, requests %d", sp, c.Rate, c.Requests)
	}
	c, err = vsEPPConfig(t, "-llmd-perf", "shared_prefix_job1", "-stages", "2:10s, 4:5s", "-rate-scale", "0.5")
	if err != nil {
		t.Fatal(err)
	}
	if st := c.SharedPrefix.Stages; len(st) != 2 || st[0] != (workload.Stage{Rate: 1, Duration: 10 * time.Second}) || st[1] != (workload.Stage{Rate: 2, Duration: 5 * time.Second}) {
		t.Errorf("stages %+v", st)
	}
	if c, err := vsEPPConfig(t); err != nil || c.SharedPrefix != nil {
		t.Errorf("the default is the trace: %+v, %v", c.SharedPrefix, err)
	}
}

func TestVsEPPSharedPrefixFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"-llmd-perf", "shared_prefix_nope"},
		{"-groups", "3"}, // a shared_prefix flag with the trace
		{"-workload", "poisson"},
		{"-llmd-perf", "shared_prefix_job1", "-stages", "10"},
		{"-llmd-perf", "shared_prefix_job1", "-stages", "0:10s"},
		{"-llmd-perf", "shared_prefix_job1", "-rate-scale", "0"},
	} {
		if _, err := vsEPPConfig(t, args...); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}
