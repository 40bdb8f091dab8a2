package main

import (
	"flag"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvselect/kvselect/bench/workload"
)

// Workloads of vs-epp.
const (
	workloadTrace        = "trace"
	workloadSharedPrefix = "shared_prefix"
)

// sharedPrefixFlags are vs-epp's flags for inference-perf's shared_prefix
// workload: llm-d-router's published configurations by name (-llmd-perf),
// each parameter on its own to override them, and the scale that fits a
// run to a small machine.
type sharedPrefixFlags struct {
	workload, preset                  string
	groups, prompts, system, question int
	output                            int
	stages                            string
	rateScale                         float64
	maxDuration                       time.Duration
	seed                              uint64
}

func (f *sharedPrefixFlags) register(fs *flag.FlagSet) {
	names := slices.Sorted(maps.Keys(workload.LLMDPerf))
	fs.StringVar(&f.workload, "workload", workloadTrace, "`workload`: "+workloadTrace+" (the Mooncake trace of -trace) or "+workloadSharedPrefix+" (inference-perf's shared_prefix generator, its prompts at their exact token lengths)")
	fs.StringVar(&f.preset, "llmd-perf", "", "shared_prefix workload of llm-d-router's test/perf/config (v0.10.0), by `name`: "+strings.Join(names, ", ")+"; implies -workload "+workloadSharedPrefix+"; the flags below override its parameters")
	fs.IntVar(&f.groups, "groups", 0, "shared_prefix: system prompts (`groups`)")
	fs.IntVar(&f.prompts, "prompts-per-group", 0, "shared_prefix: distinct questions per system prompt")
	fs.IntVar(&f.system, "system-tokens", 0, "shared_prefix: system prompt length in `tokens`")
	fs.IntVar(&f.question, "question-tokens", 0, "shared_prefix: question length in `tokens`")
	fs.IntVar(&f.output, "output-tokens", 0, "shared_prefix: output length in `tokens` (then capped by -max-output)")
	fs.StringVar(&f.stages, "stages", "", "shared_prefix: inference-perf's constant-rate load `stages`, comma-separated rate:duration (e.g. 1:15s,10:300s); without it one pass over the prompts at -rate")
	fs.Float64Var(&f.rateScale, "rate-scale", 1, "shared_prefix: multiply every stage's rate (or -rate) by this `factor`, to fit a published load to this machine")
	fs.DurationVar(&f.maxDuration, "max-duration", 0, "shared_prefix: keep only the requests that arrive within this `duration` of the start (0: all; -requests caps the count too)")
	fs.Uint64Var(&f.seed, "seed", 1, "shared_prefix: `seed` of the prompts' order")
}

// resolve is the shared_prefix workload the flags ask for, nil for the
// trace; rate is -rate, set lists the flags given on the command line.
func (f *sharedPrefixFlags) resolve(rate float64, set func(string) bool) (*workload.SharedPrefix, error) {
	if f.preset != "" {
		if f.workload != workloadTrace && f.workload != workloadSharedPrefix {
			return nil, fmt.Errorf("-workload %q: want %s or %s", f.workload, workloadTrace, workloadSharedPrefix)
		}
		f.workload = workloadSharedPrefix
	}
	switch f.workload {
	case workloadTrace:
		for _, name := range []string{"groups", "prompts-per-group", "system-tokens", "question-tokens", "output-tokens", "stages", "rate-scale", "max-duration", "seed"} {
			if set(name) {
				return nil, fmt.Errorf("-%s is a shared_prefix flag: add -workload %s or -llmd-perf", name, workloadSharedPrefix)
			}
		}
		return nil, nil
	case workloadSharedPrefix:
	default:
		return nil, fmt.Errorf("-workload %q: want %s or %s", f.workload, workloadTrace, workloadSharedPrefix)
	}
	var sp workload.SharedPrefix
	if f.preset != "" {
		p, ok := workload.LLMDPerf[f.preset]
		if !ok {
			return nil, fmt.Errorf("-llmd-perf %q: want one of %s", f.preset, strings.Join(slices.Sorted(maps.Keys(workload.LLMDPerf)), ", "))
		}
		sp = p
		sp.Stages = slices.Clone(p.Stages)
	}
	for _, o := range []struct {
		name string
		v    int
		to   *int
	}{{"groups", f.groups, &sp.Groups}, {"prompts-per-group", f.prompts, &sp.PromptsPerGroup}, {"system-tokens", f.system, &sp.SystemTokens},
		{"question-tokens", f.question, &sp.QuestionTokens}, {"output-tokens", f.output, &sp.OutputTokens}} {
		if set(o.name) {
			*o.to = o.v
		}
	}
	if set("stages") {
		st, err := parseStages(f.stages)
		if err != nil {
			return nil, err
		}
		sp.Stages = st
	}
	if set("rate") {
		// A fixed rate is one pass over the prompts at that pace.
		sp.Rate, sp.Stages = rate, nil
	}
	if !(f.rateScale > 0) {
		return nil, fmt.Errorf("-rate-scale %g: must be positive", f.rateScale)
	}
	sp.Rate *= f.rateScale
	sp.Stages = workload.Scaled(sp.Stages, f.rateScale, 1)
	sp.MaxDuration, sp.Seed = f.maxDuration, f.seed
	return &sp, nil
}

// parseStages reads rate:duration pairs, comma-separated.
func parseStages(s string) ([]workload.Stage, error) {
	var out []workload.Stage
	for _, part := range strings.Split(s, ",") {
		r, d, ok := strings.Cut(strings.TrimSpace(part), ":")
		rate, err1 := strconv.ParseFloat(r, 64)
		dur, err2 := time.ParseDuration(d)
		if !ok || err1 != nil || err2 != nil || !(rate > 0) || dur <= 0 {
			return nil, fmt.Errorf("-stages: %q is not rate:duration with both positive (e.g. 10:300s)", part)
		}
		out = append(out, workload.Stage{Rate: rate, Duration: dur})
	}
	return out, nil
}
