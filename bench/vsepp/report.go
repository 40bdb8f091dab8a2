package vsepp

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/kvselect/kvselect/bench/fleet"
	"github.com/kvselect/kvselect/bench/report"
)

func (r PickerRun) label() string {
	if r.Transport == "plain" {
		return r.Picker
	}
	return r.Picker + "/" + r.Transport
}

// Table prints every run side by side, then kvselect against the EPP by
// the product's goals.
func (rep *Report) Table(w io.Writer) error {
	pin := "not pinned"
	if rep.Pinned {
		pin = "each picker pinned to CPU 0, load generator and engines to CPU 1"
	}
	prompts := "token-id"
	if rep.Prompts == PromptsText {
		prompts = "text"
	}
	fmt.Fprintf(w, "\n%d requests of %s (%s prompts) over %d %s, %s; %d CPUs, %s; each picker with fresh engines:\n\n",
		rep.Requests, rep.Trace, prompts, rep.Engines, familyNoun(fleet.Family(rep.EngineFamily)), rep.Loop, rep.CPUs, pin)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := report.Columns(tw, rep.Runs)
	row("", func(r PickerRun) string { return r.label() })
	row("decision p50 / p90 / p95 / p99, client (µs)", func(r PickerRun) string {
		return fmt.Sprintf("%.0f / %.0f / %.0f / %.0f", r.Decision.P50, r.Decision.P90, r.Decision.P95, r.Decision.P99)
	})
	row("picker histogram mean / p50 / p90 / p95 / p99 (µs)", func(r PickerRun) string {
		if r.Histogram.Count == 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f / %.0f / %.0f / %.0f / %.0f", r.Histogram.MeanUs, r.Histogram.P50Us, r.Histogram.P90Us, r.Histogram.P95Us, r.Histogram.P99Us)
	})
	row("picker CPU cores used over the trace, gross", func(r PickerRun) string { return fmt.Sprintf("%.3f", r.CPUCores) })
	row("picker RSS idle / peak / after (MiB)", func(r PickerRun) string {
		return fmt.Sprintf("%.0f / %.0f / %.0f", r.RSSIdleMiB, r.PeakRSSMiB, r.RSSAfterMiB)
	})
	row("picker CPU per request, net of idle (gross) (µs)", func(r PickerRun) string {
		return fmt.Sprintf("%.0f (%.0f)", r.CPUPerRequestUs, r.CPUPerRequestGrossUs)
	})
	row("picker idle CPU (% of a core)", func(r PickerRun) string { return fmt.Sprintf("%.1f", r.IdleCPUPercent) })
	row("max requests/s on one core (picker CPU %)", func(r PickerRun) string {
		if r.MaxRPS == 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f (%.0f%%)", r.MaxRPS, r.SaturationCPUPercent)
	})
	row("picker CPU per request, saturating loop (µs)", func(r PickerRun) string {
		if r.MaxRPS == 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f", r.SaturationCPUPerRequestUs)
	})
	row("prefix-cache hit rate (engines)", func(r PickerRun) string { return fmt.Sprintf("%.3f", r.HitRate) })
	row("kvselect's index: hit rate chosen / best-cached", func(r PickerRun) string {
		if r.IndexBestHitRate == 0 {
			return "-"
		}
		return fmt.Sprintf("%.3f / %.3f", r.IndexHitRate, r.IndexBestHitRate)
	})
	row("TTFT p50 / p90 / p99 (ms)", func(r PickerRun) string {
		return fmt.Sprintf("%.1f / %.1f / %.1f", r.TTFTP50Ms, r.TTFTP90Ms, r.TTFTP99Ms)
	})
	row("ITL p90 (ms)", func(r PickerRun) string { return fmt.Sprintf("%.2f", r.ITLP90Ms) })
	row(fmt.Sprintf("goodput, TTFT ≤ %v and ITL ≤ %v (req/s, share)", rep.GoodputTTFT, rep.GoodputITL), func(r PickerRun) string {
		return fmt.Sprintf("%.1f (%.2f)", r.Goodput, r.GoodputShare)
	})
	row("kvselect's TTFT prediction error p50 / p90", func(r PickerRun) string {
		if r.PredictionError == nil {
			return "-"
		}
		return fmt.Sprintf("%.2f / %.2f", r.PredictionError[0], r.PredictionError[1])
	})
	row("requests per engine", func(r PickerRun) string { return strings.Trim(fmt.Sprint(r.PerEngine), "[]") })
	row("load balance CV", func(r PickerRun) string { return fmt.Sprintf("%.3f", r.LoadCV) })
	row("throughput (req/s)", func(r PickerRun) string { return fmt.Sprintf("%.1f", r.Throughput) })
	row("errors (saturating loop)", func(r PickerRun) string { return fmt.Sprintf("%d (%d)", r.Errors, r.SaturationErrors) })
	row("decisions with endpoint scores", func(r PickerRun) string { return strconv.Itoa(r.WithScores) })
	row("request bodies re-encoded by the picker", func(r PickerRun) string { return strconv.Itoa(r.BodiesReencoded) })
	row("decisions with header mutations Envoy refuses", func(r PickerRun) string { return strconv.Itoa(r.RefusedMutations) })
	if rep.Prompts == PromptsText {
		row("text prompts routed on the text index (tokenize fallbacks)", func(r PickerRun) string {
			if r.TokenizeFallbacks == nil {
				return "-"
			}
			out := strconv.FormatUint(*r.TokenizeFallbacks, 10)
			if len(r.TokenizeFallbackReasons) > 0 {
				var why []string
				for _, k := range slices.Sorted(maps.Keys(r.TokenizeFallbackReasons)) {
					why = append(why, fmt.Sprintf("%s %d", k, r.TokenizeFallbackReasons[k]))
				}
				out += " (" + strings.Join(why, ", ") + ")"
			}
			return out
		})
	}
	row("bookings left after the runs", func(r PickerRun) string {
		if r.LeakedBookings == nil {
			return "-"
		}
		return strconv.FormatUint(*r.LeakedBookings, 10)
	})
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range rep.Runs {
		if r.RefusedSample != "" {
			fmt.Fprintf(w, "%s set headers Envoy's default mutation rules refuse (ignored, or a 500 with disallow_is_error): %s\n", r.label(), r.RefusedSample)
		}
	}
	rep.goals(w)
	return nil
}

// goals prints kvselect against each EPP run on the same transport, by the
// product's goals: CPU per request at most 1/5 of the EPP's, decision p50 at
// most 1/3, hit rate at least the EPP's, p90 TTFT lower.
func (rep *Report) goals(w io.Writer) {
	for _, k := range rep.Runs {
		if !IsKvselect(k.Picker) {
			continue
		}
		for _, e := range rep.Runs {
			if !IsEPP(e.Picker) || e.Transport != k.Transport {
				continue
			}
			fmt.Fprintf(w, "\n%s vs %s:\n", k.label(), e.label())
			ratio := func(a, b float64) string {
				if a <= 0 {
					return "-"
				}
				return fmt.Sprintf("%.1fx", b/a)
			}
			met := func(ok bool) string {
				if ok {
					return "met"
				}
				return "missed"
			}
			fmt.Fprintf(w, "  CPU per request: %s less (goal 5x: %s)\n", ratio(k.CPUPerRequestUs, e.CPUPerRequestUs),
				met(k.CPUPerRequestUs > 0 && e.CPUPerRequestUs >= 5*k.CPUPerRequestUs))
			fmt.Fprintf(w, "  decision p50: %s lower (goal 3x: %s)\n", ratio(k.Decision.P50, e.Decision.P50),
				met(k.Decision.P50 > 0 && e.Decision.P50 >= 3*k.Decision.P50))
			fmt.Fprintf(w, "  hit rate: %.3f vs %.3f (goal >=: %s)\n", k.HitRate, e.HitRate, met(k.HitRate >= e.HitRate))
			fmt.Fprintf(w, "  TTFT p90: %.1f vs %.1f ms (goal lower: %s)\n", k.TTFTP90Ms, e.TTFTP90Ms, met(k.TTFTP90Ms < e.TTFTP90Ms))
			if f, ok := rep.floor(k.Transport); ok {
				fmt.Fprintf(w, "  above the floor (%.0f µs of CPU, decision p95 %.0f µs): CPU per request %.0f vs %.0f µs (%s less), decision p95 %.0f vs %.0f µs (%s lower)\n",
					f.CPUPerRequestUs, f.Decision.P95,
					k.CPUPerRequestUs-f.CPUPerRequestUs, e.CPUPerRequestUs-f.CPUPerRequestUs, ratio(k.CPUPerRequestUs-f.CPUPerRequestUs, e.CPUPerRequestUs-f.CPUPerRequestUs),
					k.Decision.P95-f.Decision.P95, e.Decision.P95-f.Decision.P95, ratio(k.Decision.P95-f.Decision.P95, e.Decision.P95-f.Decision.P95))
			}
		}
	}
}

// floor is the floor picker's run on a transport, if there is one.
func (rep *Report) floor(transport string) (PickerRun, bool) {
	for _, r := range rep.Runs {
		if r.Picker == PickerFloor && r.Transport == transport {
			return r, true
		}
	}
	return PickerRun{}, false
}

// Charts are the report's figures, one bar per run.
func (rep *Report) Charts() []report.Chart {
	n := len(rep.Runs)
	series := make([]string, n)
	mk := func(groups int) [][]float64 {
		v := make([][]float64, groups)
		for g := range v {
			v[g] = make([]float64, n)
		}
		return v
	}
	dec, hist, cpu, idle, rps, hit, ttft, bal := mk(3), mk(3), mk(2), mk(1), mk(1), mk(1), mk(2), mk(1)
	for i, r := range rep.Runs {
		series[i] = r.label()
		dec[0][i], dec[1][i], dec[2][i] = r.Decision.P50, r.Decision.P90, r.Decision.P99
		hist[0][i], hist[1][i], hist[2][i] = r.Histogram.P50Us, r.Histogram.P90Us, r.Histogram.P99Us
		cpu[0][i], cpu[1][i] = r.CPUPerRequestUs, r.SaturationCPUPerRequestUs
		idle[0][i] = r.IdleCPUPercent
		rps[0][i] = r.MaxRPS
		hit[0][i] = r.HitRate
		ttft[0][i], ttft[1][i] = r.TTFTP50Ms, r.TTFTP90Ms
		bal[0][i] = r.LoadCV
	}
	return []report.Chart{
		{Title: "Decision latency, client-side", Unit: "µs", Groups: []string{"p50", "p90", "p99"}, Series: series, Values: dec, LowerIsBetter: true, ClipOutliers: true},
		{Title: "Picker's own decision histogram (kvselect: parse+select+book; EPP: scheduling)", Unit: "µs", Groups: []string{"p50", "p90", "p99"}, Series: series, Values: hist, LowerIsBetter: true},
		{Title: "Picker CPU per request", Unit: "µs", Groups: []string{"trace run, net of idle", "saturating loop"}, Series: series, Values: cpu, LowerIsBetter: true},
		{Title: "Picker idle CPU", Unit: "% of a core", Groups: []string{"before traffic"}, Series: series, Values: idle, LowerIsBetter: true},
		{Title: "Saturating closed loop, picker on one core", Unit: "req/s", Groups: []string{"completed requests per second"}, Series: series, Values: rps},
		{Title: "Prefix-cache hit rate (engines' counters)", Groups: []string{"hit rate"}, Series: series, Values: hit},
		{Title: "Time to first token", Unit: "ms", Groups: []string{"p50", "p90"}, Series: series, Values: ttft, LowerIsBetter: true},
		{Title: "Load balance: CV of requests per engine", Groups: []string{"CV"}, Series: series, Values: bal, LowerIsBetter: true},
	}
}
