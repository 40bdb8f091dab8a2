package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/kvselect/kvselect/bench/mooncake"
	"github.com/kvselect/kvselect/bench/report"
	"github.com/kvselect/kvselect/bench/routesim"
	"github.com/kvselect/kvselect/selection/scheduler"
)

// routeReport is what `kvbench route -json` writes.
type routeReport struct {
	Trace                string            `json:"trace"`
	Requests             int               `json:"requests"`
	Config               routesim.Config   `json:"config"`
	InfiniteCacheHitRate float64           `json:"infinite_cache_block_hit_rate"`
	Results              []routesim.Result `json:"results"`
}

func runRoute(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvbench route", flag.ContinueOnError)
	fs.SetOutput(stderr)
	def := routesim.DefaultConfig()
	trace := fs.String("trace", "bench/testdata/mooncake/conversation_trace.jsonl.gz", "Mooncake trace (`path`, .jsonl or .jsonl.gz)")
	workers := fs.Int("workers", def.Workers, "simulated `workers`")
	capacities := fs.String("capacity", "16384,4096", "KV pool per worker in trace blocks (512 tokens); a comma-separated `list` runs each")
	speedup := fs.Float64("speedup", def.Speedup, "replay the trace this many `times` faster (offered load)")
	prefill := fs.Duration("prefill-per-token", def.PrefillPerToken, "prefill time per uncached prompt token")
	decode := fs.Duration("decode-per-token", def.DecodePerToken, "decode time per output token")
	interference := fs.Float64("decode-interference", def.DecodeInterference, "prefill slowdown per 1,000 context tokens being decoded on the worker (`fraction`)")
	requests := fs.Int("requests", 0, "replay only the first `n` requests (0: all)")
	seed := fs.Uint64("seed", def.Seed, "random `seed` for the random policy and tie-breaking")
	policies := fs.String("policies", strings.Join(routesim.Policies(), ","),
		"comma-separated `policies` to compare: registered selection policies ("+strings.Join(scheduler.Names(), ", ")+
			") and "+routesim.ApproxPolicy+" (kv-cost without KV events)")
	jsonOut := fs.String("json", "", "write the results as JSON to this `file`")
	svgOut := fs.String("svg", "", "write a bar chart of the results to this SVG `file`")
	quiet := fs.Bool("quiet", false, "no progress bar")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	names, err := parsePolicies(*policies)
	if err != nil {
		return err
	}
	caps, err := parseInts(*capacities)
	if err != nil {
		return fmt.Errorf("-capacity: %w", err)
	}
	reqs, err := mooncake.LoadTrace(*trace)
	if err != nil {
		return err
	}
	if *requests > 0 && *requests < len(reqs) {
		reqs = reqs[:*requests]
	}
	cfg := routesim.Config{Workers: *workers, Speedup: *speedup, PrefillPerToken: *prefill,
		DecodePerToken: *decode, DecodeInterference: *interference, Seed: *seed}
	rep := routeReport{Trace: *trace, Requests: len(reqs), Config: cfg, InfiniteCacheHitRate: routesim.InfiniteCacheHitRate(reqs)}
	for _, c := range caps {
		cfg.Capacity = c
		for _, name := range names {
			w, err := routesim.NewWorld(cfg)
			if err != nil {
				return err
			}
			p, err := routesim.NewPolicy(ctx, w, name)
			if err != nil {
				return err
			}
			var bar *report.Progress
			if !*quiet {
				bar = report.NewProgress(stderr, fmt.Sprintf("%s @%d", name, c))
			}
			res, err := routesim.Run(ctx, w, reqs, p, bar.Update)
			if err != nil {
				return err
			}
			rep.Results = append(rep.Results, res)
		}
	}
	if err := routeTable(stdout, &rep); err != nil {
		return err
	}
	return writeOutputs(*jsonOut, rep, *svgOut, fmt.Sprintf("kvbench route: %d workers, %d requests", cfg.Workers, len(reqs)),
		func() []report.Chart { return routeCharts(&rep) })
}

func parsePolicies(s string) ([]string, error) {
	var out []string
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if !routesim.Known(p) {
			return nil, fmt.Errorf("-policies: unknown policy %q (known: %s)", p,
				strings.Join(append(scheduler.Names(), routesim.ApproxPolicy), ", "))
		}
		out = append(out, p)
	}
	return out, nil
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, errors.New("empty list")
	}
	return out, nil
}

func routeTable(w io.Writer, rep *routeReport) error {
	fmt.Fprintf(w, "%d requests from %s; one infinite cache would hit %.3f of the blocks\n\n", rep.Requests, rep.Trace, rep.InfiniteCacheHitRate)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "pool\tpolicy\tblock hit rate\tTTFT p50 ms\tTTFT p90 ms\tTTFT p99 ms\tthroughput req/s\tmax worker share\tselect p50 µs\tselect p99 µs\t")
	for _, r := range rep.Results {
		fmt.Fprintf(tw, "%d\t%s\t%.3f\t%.0f\t%.0f\t%.0f\t%.2f\t%.3f\t%.1f\t%.1f\t\n", r.Capacity, r.Policy, r.HitRate,
			r.TTFTP50Ms, r.TTFTP90Ms, r.TTFTP99Ms, r.Throughput, r.MaxShare, r.SelectP50Us, r.SelectP99Us)
	}
	return tw.Flush()
}

// routeCharts draws hit rate and TTFT p90 per pool size, one bar per policy.
func routeCharts(rep *routeReport) []report.Chart {
	var pools []int
	var series []string
	for _, r := range rep.Results {
		if !slices.Contains(pools, r.Capacity) {
			pools = append(pools, r.Capacity)
		}
		if !slices.Contains(series, r.Policy) {
			series = append(series, r.Policy)
		}
	}
	groups := make([]string, len(pools))
	hit := make([][]float64, len(pools))
	p50 := make([][]float64, len(pools))
	p90 := make([][]float64, len(pools))
	for g, c := range pools {
		groups[g] = fmt.Sprintf("%d-block pools", c)
		hit[g], p50[g], p90[g] = make([]float64, len(series)), make([]float64, len(series)), make([]float64, len(series))
	}
	for _, r := range rep.Results {
		g, s := slices.Index(pools, r.Capacity), slices.Index(series, r.Policy)
		hit[g][s], p50[g][s], p90[g][s] = r.HitRate, r.TTFTP50Ms, r.TTFTP90Ms
	}
	return []report.Chart{
		{Title: "Prefix-cache block hit rate", Groups: groups, Series: series, Values: hit},
		{Title: "Simulated TTFT p90", Unit: "ms", Groups: groups, Series: series, Values: p90, LowerIsBetter: true, ClipOutliers: true},
		{Title: "Simulated TTFT p50", Unit: "ms", Groups: groups, Series: series, Values: p50, LowerIsBetter: true, ClipOutliers: true},
	}
}
