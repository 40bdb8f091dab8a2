package routesim

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/kvselect/kvselect/bench/mooncake"
	"github.com/kvselect/kvselect/bench/report"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/scheduler"
)

// Sweep is a comparison: every combination of pool size, bypass share,
// engine metrics (and, with them on, request and KV-usage weights) and
// policy, each a Run in a fresh world.
type Sweep struct {
	// Config is every run's setting but the swept ones.
	Config     Config
	Capacities []int
	Bypasses   []float64
	// EngineMetrics lists the runs without (false) and with (true) the
	// engines' metrics reported to the service.
	EngineMetrics                  []bool
	RequestWeights, KVUsageWeights []float64
	// Engine is the service's engine configuration with metrics on, its
	// weights replaced by each pair of the lists.
	Engine   selection.EngineConfig
	Policies []string
}

// Report is what `kvbench route -json` writes.
type Report struct {
	Trace                string   `json:"trace"`
	Requests             int      `json:"requests"`
	Config               Config   `json:"config"`
	InfiniteCacheHitRate float64  `json:"infinite_cache_block_hit_rate"`
	Results              []Result `json:"results"`
}

// KnownPolicies checks policy names: the registered selection policies and
// ApproxPolicy.
func KnownPolicies(names []string) error {
	if len(names) == 0 {
		return fmt.Errorf("-policies: no policy (known: %s)", strings.Join(append(scheduler.Names(), ApproxPolicy), ", "))
	}
	for _, p := range names {
		if !Known(p) {
			return fmt.Errorf("-policies: unknown policy %q (known: %s)", p,
				strings.Join(append(scheduler.Names(), ApproxPolicy), ", "))
		}
	}
	return nil
}

// Compare runs the sweep over reqs, read from trace; progress, unless nil,
// shows a bar per run.
func Compare(ctx context.Context, s Sweep, trace string, reqs []mooncake.Request, progress io.Writer) (*Report, error) {
	if err := KnownPolicies(s.Policies); err != nil {
		return nil, err
	}
	rep := &Report{Trace: trace, Requests: len(reqs), Config: s.Config, InfiniteCacheHitRate: InfiniteCacheHitRate(reqs)}
	type variant struct {
		metrics bool
		engine  *selection.EngineConfig
	}
	var variants []variant
	for _, on := range s.EngineMetrics {
		if !on {
			variants = append(variants, variant{})
			continue
		}
		for _, rw := range s.RequestWeights {
			for _, kw := range s.KVUsageWeights {
				ec := s.Engine
				ec.RequestWeight, ec.KVUsageWeight = rw, kw
				variants = append(variants, variant{metrics: true, engine: &ec})
			}
		}
	}
	for _, c := range s.Capacities {
		for _, b := range s.Bypasses {
			for _, v := range variants {
				for _, name := range s.Policies {
					run := s.Config
					run.Capacity, run.Bypass, run.EngineMetrics, run.Engine = c, b, v.metrics, v.engine
					w, err := NewWorld(run)
					if err != nil {
						return nil, err
					}
					p, err := NewPolicy(ctx, w, name)
					if err != nil {
						return nil, err
					}
					var bar *report.Progress
					if progress != nil {
						label := fmt.Sprintf("%s @%d bypass %g", name, c, b)
						if v.metrics {
							label += fmt.Sprintf(" metrics w=%g/%g", v.engine.RequestWeight, v.engine.KVUsageWeight)
						}
						bar = report.NewProgress(progress, label)
					}
					res, err := Run(ctx, w, reqs, p, bar.Update)
					if err != nil {
						return nil, err
					}
					rep.Results = append(rep.Results, res)
				}
			}
		}
	}
	return rep, nil
}

// Table prints one row per run; the bypass and engine-metrics columns only
// when a run used them, so that the plain comparison keeps its table.
func (rep *Report) Table(w io.Writer) error {
	fmt.Fprintf(w, "%d requests from %s; one infinite cache would hit %.3f of the blocks\n\n", rep.Requests, rep.Trace, rep.InfiniteCacheHitRate)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
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

// Charts draw hit rate and TTFT per pool size, one bar per policy.
func (rep *Report) Charts() []report.Chart {
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
