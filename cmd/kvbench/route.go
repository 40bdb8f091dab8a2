package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/kvselect/kvselect/bench/mooncake"
	"github.com/kvselect/kvselect/bench/report"
	"github.com/kvselect/kvselect/bench/routesim"
	"github.com/kvselect/kvselect/selection"
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
	bypass := fs.String("bypass", "0", "fraction of requests that skip kvselect and go straight to one of the first -bypass-workers workers; a comma-separated `list` runs each")
	bypassWorkers := fs.Int("bypass-workers", routesim.DefaultBypassWorkers, "workers the bypass traffic is spread over (the first `n`)")
	engineMetrics := fs.String("engine-metrics", "off", "report the engines' waiting/running counts and KV usage to kvselect every -scrape-interval: off, on, or `off,on` to run both")
	scrape := fs.Duration("scrape-interval", routesim.DefaultScrapeInterval, "virtual time between two engine-metrics scrapes")
	engDef := selection.DefaultEngineConfig()
	reqWeights := fs.String("engine-request-weight", strconv.FormatFloat(engDef.RequestWeight, 'g', -1, 64),
		"blocks charged per engine request no booking accounts for; a comma-separated `list` runs each (engine metrics on)")
	kvWeights := fs.String("engine-kv-usage-weight", strconv.FormatFloat(engDef.KVUsageWeight, 'g', -1, 64),
		"blocks charged per unit of KV usage; a comma-separated `list` runs each (engine metrics on)")
	queueDepth := fs.Int("engine-queue-depth-threshold", engDef.QueueDepthThreshold, "waiting requests that saturate a rank (< 0: off)")
	kvThreshold := fs.Float64("engine-kv-util-threshold", engDef.KVCacheUtilThreshold, "KV usage that saturates a rank (< 0: off)")
	whenSaturated := fs.String("engine-when-saturated", "route", "kvselect's --when-saturated with engine metrics on: route (the cheapest saturated rank) or reject (429, retried after -retry-after)")
	retryAfter := fs.Duration("retry-after", routesim.DefaultRetryAfter, "virtual delay before a request refused as overloaded (429) is offered again")
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
	bypasses, err := parseFloats(*bypass, 1)
	if err != nil {
		return fmt.Errorf("-bypass: %w", err)
	}
	rws, err := parseFloats(*reqWeights, 0)
	if err != nil {
		return fmt.Errorf("-engine-request-weight: %w", err)
	}
	kws, err := parseFloats(*kvWeights, 0)
	if err != nil {
		return fmt.Errorf("-engine-kv-usage-weight: %w", err)
	}
	if *whenSaturated != "route" && *whenSaturated != "reject" {
		return fmt.Errorf("-engine-when-saturated %q: want route or reject", *whenSaturated)
	}
	var metricsModes []bool
	for _, m := range strings.Split(*engineMetrics, ",") {
		switch strings.TrimSpace(m) {
		case "off":
			metricsModes = append(metricsModes, false)
		case "on":
			metricsModes = append(metricsModes, true)
		default:
			return fmt.Errorf("-engine-metrics: %q is not off or on", m)
		}
	}
	reqs, err := mooncake.LoadTrace(*trace)
	if err != nil {
		return err
	}
	if *requests > 0 && *requests < len(reqs) {
		reqs = reqs[:*requests]
	}
	cfg := routesim.Config{Workers: *workers, Speedup: *speedup, PrefillPerToken: *prefill,
		DecodePerToken: *decode, DecodeInterference: *interference, Seed: *seed,
		BypassWorkers: *bypassWorkers, ScrapeInterval: *scrape, RetryAfter: *retryAfter}
	rep := routeReport{Trace: *trace, Requests: len(reqs), Config: cfg, InfiniteCacheHitRate: routesim.InfiniteCacheHitRate(reqs)}
	// Every combination: pool × bypass × engine metrics (× weights when on)
	// × policy.
	type variant struct {
		metrics bool
		engine  *selection.EngineConfig
	}
	var variants []variant
	for _, on := range metricsModes {
		if !on {
			variants = append(variants, variant{})
			continue
		}
		for _, rw := range rws {
			for _, kw := range kws {
				ec := selection.DefaultEngineConfig()
				ec.RequestWeight, ec.KVUsageWeight = rw, kw
				ec.QueueDepthThreshold, ec.KVCacheUtilThreshold = *queueDepth, *kvThreshold
				ec.RejectSaturated = *whenSaturated == "reject"
				variants = append(variants, variant{metrics: true, engine: &ec})
			}
		}
	}
	for _, c := range caps {
		for _, b := range bypasses {
			for _, v := range variants {
				for _, name := range names {
					run := cfg
					run.Capacity, run.Bypass, run.EngineMetrics, run.Engine = c, b, v.metrics, v.engine
					w, err := routesim.NewWorld(run)
					if err != nil {
						return err
					}
					p, err := routesim.NewPolicy(ctx, w, name)
					if err != nil {
						return err
					}
					var bar *report.Progress
					if !*quiet {
						label := fmt.Sprintf("%s @%d bypass %g", name, c, b)
						if v.metrics {
							label += fmt.Sprintf(" metrics w=%g/%g", v.engine.RequestWeight, v.engine.KVUsageWeight)
						}
						bar = report.NewProgress(stderr, label)
					}
					res, err := routesim.Run(ctx, w, reqs, p, bar.Update)
					if err != nil {
						return err
					}
					rep.Results = append(rep.Results, res)
				}
			}
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

// parseFloats reads a comma-separated list of numbers in [0, hi] (hi 0: no
// upper bound).
func parseFloats(s string, hi float64) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || !(v >= 0) || (hi > 0 && v > hi) || math.IsInf(v, 0) {
			if hi > 0 {
				return nil, fmt.Errorf("%q is not a number in [0, %g]", f, hi)
			}
			return nil, fmt.Errorf("%q is not a non-negative number", f)
		}
		out = append(out, v)
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
	// The bypass and engine-metrics columns only when a run used them, so
	// that the plain comparison keeps its table.
	extra := false
	for _, r := range rep.Results {
		extra = extra || r.Bypass > 0 || r.EngineMetrics
	}
	head := "pool\tpolicy\tblock hit rate\tTTFT p50 ms\tTTFT p90 ms\tTTFT p99 ms\tthroughput req/s\tmax worker share\tselect p50 µs\tselect p99 µs\t"
	if extra {
		head = "pool\tbypass\tengine metrics\trequest w\tkv usage w\tpolicy\tblock hit rate\tTTFT p50 ms\tTTFT p90 ms\tTTFT p99 ms\tall p90 ms\trefusals\tthroughput req/s\tmax worker share\tselect p50 µs\t"
	}
	fmt.Fprintln(tw, head)
	for _, r := range rep.Results {
		if !extra {
			fmt.Fprintf(tw, "%d\t%s\t%.3f\t%.0f\t%.0f\t%.0f\t%.2f\t%.3f\t%.1f\t%.1f\t\n", r.Capacity, r.Policy, r.HitRate,
				r.TTFTP50Ms, r.TTFTP90Ms, r.TTFTP99Ms, r.Throughput, r.MaxShare, r.SelectP50Us, r.SelectP99Us)
			continue
		}
		metrics, rw, kw := "off", "-", "-"
		if r.EngineMetrics {
			metrics, rw, kw = "on", strconv.FormatFloat(r.RequestWeight, 'g', -1, 64), strconv.FormatFloat(r.KVUsageWeight, 'g', -1, 64)
		}
		fmt.Fprintf(tw, "%d\t%.2f\t%s\t%s\t%s\t%s\t%.3f\t%.0f\t%.0f\t%.0f\t%.0f\t%d\t%.2f\t%.3f\t%.1f\t\n", r.Capacity, r.Bypass,
			metrics, rw, kw, r.Policy, r.HitRate, r.TTFTP50Ms, r.TTFTP90Ms, r.TTFTP99Ms, r.AllTTFTP90Ms, r.Refusals,
			r.Throughput, r.MaxShare, r.SelectP50Us)
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
