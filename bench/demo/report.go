package demo

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/kvselect/kvselect/bench/report"
)

// Table prints the phases side by side.
func (rep *Report) Table(w io.Writer) error {
	fmt.Fprintf(w, "\n%d requests of %s over %d %s, sent at %s, each policy from empty caches:\n\n", rep.Requests, rep.Trace, rep.Workers, rep.Engines.Noun(), rep.Arrivals)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := report.Columns(tw, rep.Phases)
	row("", func(p Phase) string { return p.Policy })
	row("prefix-cache hit rate", func(p Phase) string { return fmt.Sprintf("%.3f", p.HitRate) })
	row("TTFT p50 (ms)", func(p Phase) string { return fmt.Sprintf("%.1f", p.TTFTP50Ms) })
	row("TTFT p90 (ms)", func(p Phase) string { return fmt.Sprintf("%.1f", p.TTFTP90Ms) })
	row("kvselect's index: cached on the chosen / given up for load", func(p Phase) string {
		if p.Routing == nil {
			return "-"
		}
		return fmt.Sprintf("%.3f / %.3f", p.Routing.CachedShare, p.Routing.GivenUpForLoad)
	})
	row("throughput (req/s)", func(p Phase) string { return fmt.Sprintf("%.1f", p.Throughput) })
	row("decision, the picker's own p50 / p99 (µs)", func(p Phase) string {
		if p.ServerPick == nil || p.ServerPick.Count == 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f / %.0f", p.ServerPick.P50Us, p.ServerPick.P99Us)
	})
	row("decision, client-observed p50 / p99 (µs)", func(p Phase) string {
		if p.SelectP50Us == 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f / %.0f", p.SelectP50Us, p.SelectP99Us)
	})
	row("picker CPU per request (µs)", func(p Phase) string {
		if p.CPUPerRequestUs == 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f", p.CPUPerRequestUs)
	})
	if slices.ContainsFunc(rep.Phases, func(p Phase) bool { return p.KVSelectAsideCPUPerRequestUs > 0 }) {
		row("kvselect CPU per request beside the floor (µs)", func(p Phase) string {
			if p.KVSelectAsideCPUPerRequestUs == 0 {
				return "-"
			}
			return fmt.Sprintf("%.0f", p.KVSelectAsideCPUPerRequestUs)
		})
	}
	row("bookings within ±1 of engines' requests", func(p Phase) string {
		if p.InFlight == nil || p.InFlight.Engines == nil || p.InFlight.Samples == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f %% of %d", 100*p.InFlight.Engines.Within1, p.InFlight.Samples)
	})
	row("bookings within ±1 of client in flight", func(p Phase) string {
		if p.InFlight == nil || p.InFlight.Samples == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f %% of %d", 100*p.InFlight.Client.Within1, p.InFlight.Samples)
	})
	row("bookings within ±1 of the span engines'–client's", func(p Phase) string {
		if p.InFlight == nil || p.InFlight.Span == nil || p.InFlight.Samples == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f %% of %d", 100*p.InFlight.Span.Within1, p.InFlight.Samples)
	})
	row("bookings left after the run", func(p Phase) string {
		if p.InFlight == nil {
			return "-"
		}
		return fmt.Sprintf("%d (drained in %.0f ms)", p.InFlight.BookingsLeft, p.InFlight.DrainMs)
	})
	row("bookings − engines' / client's, mean", func(p Phase) string {
		f := p.InFlight
		if f == nil || f.Samples == 0 {
			return "-"
		}
		engines := "-"
		if f.Engines != nil {
			engines = fmt.Sprintf("%+.2f of %.1f", f.Engines.MeanError, f.Engines.Mean)
		}
		return fmt.Sprintf("%s / %+.2f of %.1f", engines, f.Client.MeanError, f.Client.Mean)
	})
	row("lifetime, client / estimated / booked (ms)", func(p Phase) string {
		f := p.InFlight
		if f == nil {
			return "-"
		}
		booked := "-"
		if f.BookedLifetimeMs > 0 {
			booked = fmt.Sprintf("%.0f", f.BookedLifetimeMs)
		}
		return fmt.Sprintf("%.0f / %.0f / %s", f.ClientLifetimeMs, f.EstimatedLifetimeMs, booked)
	})
	row("estimated ends: at estimate / unseen / engine counts; first tokens seen", func(p Phase) string {
		f := p.InFlight
		if f == nil || (len(f.EndedBy) == 0 && f.FirstTokensSeen == 0) {
			return "-"
		}
		return fmt.Sprintf("%.0f / %.0f / %.0f; %.0f", f.EndedBy["estimated_end"], f.EndedBy["first_token_unseen"], f.EndedBy["engine_counts"], f.FirstTokensSeen)
	})
	row("requests per worker", func(p Phase) string {
		if p.Path == PathNGINX && p.Routed() == 0 {
			return "- (the engines do not name themselves)"
		}
		return strings.Trim(fmt.Sprint(p.PerWorker), "[]")
	})
	row("errors", func(p Phase) string { return strconv.Itoa(p.Errors) })
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, p := range rep.Phases {
		if p.Policy == PolicyFloorNGINX {
			fmt.Fprintln(w, "\nfloor, floor-nginx: the floor picker (kvbench floor-picker) in kvselect's place, reached as kvselect is in the two phases\n"+
				"before them: it names the engines round-robin and does only what the protocol requires (no prompt read, nothing booked).\n"+
				"kvselect runs beside it, indexing the engines' KV events, and the demo samples /loads and the engines as in kvselect's\n"+
				"phases, so that the machine carries the same load.")
		}
		if p.Policy == PolicyKVSelectNGINX {
			transport := "plaintext"
			if p.TLS {
				transport = "TLS, unverified"
			}
			fmt.Fprintf(w, "\nkvselect-nginx: NGINX running NGINX Gateway Fabric's epp.js, its shim, kvselect's ext_proc picker (%s);\n"+
				"the shim never sends the response phase, so kvselect ends those bookings at an estimated end (--booking-end auto).\n", transport)
		}
		if p.Policy == PolicyKVSelect {
			fmt.Fprintf(w, "\nkvselect active requests after the run: %d (every booking freed when its response ended)\n", p.LoadAfterRun)
			fmt.Fprintln(w, "decision time: kvselect's own is its kvselect_extproc_pick_duration_seconds histogram (body parse, selection,\n"+
				"booking; interpolated within buckets). The client-observed time adds the ext_proc gRPC round trips of the\n"+
				"Envoy-faithful client and the waits of every demo process (kvselect, the workers, the client) for the\n"+
				"machine's CPUs: on a small shared machine that queueing, not the picker, is most of it.")
		}
	}
	if g := rep.Gateway; g != nil {
		met := func(ok bool) string {
			if ok {
				return "met"
			}
			return "MISSED"
		}
		fmt.Fprintf(w, "\nNGINX path vs envoysim path (goals):\n")
		fmt.Fprintf(w, "  hit rate            %+.1f %%  (at most 5 %% lower: %s)\n", 100*g.HitRateDelta, met(g.HitRateMet))
		fmt.Fprintf(w, "  TTFT p90            %+.1f %% (%+.1f ms; p50 %+.1f ms)  (at most 5 %% slower, %.1f ms: %s)\n", 100*g.TTFTP90Delta,
			g.Path.TTFTP90GapMs, g.Path.TTFTP50GapMs, g.TTFTAllowanceMs, met(g.TTFTMet))
		if f := g.Floor; f != nil {
			fmt.Fprintf(w, "    the floor's path  %+.1f %% (%+.1f ms; p50 %+.1f ms)  (what NGINX adds to a picker that does nothing)\n",
				100*f.TTFTP90Delta, f.TTFTP90GapMs, f.TTFTP50GapMs)
		}
		fmt.Fprintf(w, "  in-flight samples   %.1f %% within ±1 of the engines' requests, %d bookings left  (≥ 95 %% and 0: %s)\n", 100*g.InFlightWithin1, g.BookingsLeft, met(g.InFlightMet))
		fmt.Fprintf(w, "  kvselect CPU/req    %.2f× envoysim's  (at most 2×: %s)\n", g.CPURatio, met(g.CPUMet))
	}
	return nil
}

// Routed is how many of the phase's requests were counted on a worker.
func (p Phase) Routed() int {
	n := 0
	for _, c := range p.PerWorker {
		n += c
	}
	return n
}

// Charts are the hit rate, its course over each phase, the TTFT
// distributions and the picker's decision time.
func (rep *Report) Charts() []report.Chart {
	series := make([]string, len(rep.Phases))
	hit := [][]float64{make([]float64, len(rep.Phases))}
	var ttft, hitOverTime []report.Line
	for i, p := range rep.Phases {
		series[i] = p.Policy
		hit[0][i] = p.HitRate
		ms := make([]float64, len(p.ttfts))
		for j, d := range p.ttfts {
			ms[j] = float64(d) / 1e6
		}
		ttft = append(ttft, report.CDF(p.Policy, ms, 200))
		l := report.Line{Name: p.Policy}
		for _, pt := range p.HitRateOverTime {
			l.X, l.Y = append(l.X, pt.Seconds), append(l.Y, pt.Value)
		}
		hitOverTime = append(hitOverTime, l)
	}
	charts := []report.Chart{
		{Title: "Prefix-cache hit rate over the phase", Groups: []string{"hit rate"}, Series: series, Values: hit},
		{Title: "Hit rate per second of the run", Lines: hitOverTime, XLabel: "seconds since the phase began"},
		{Title: "Time to first token, CDF (fraction of requests at or below)", Lines: ttft, XLabel: "TTFT, ms (log scale)", LogX: true},
	}
	for _, p := range rep.Phases {
		if p.ServerPick != nil && p.ServerPick.Count > 0 {
			charts = append(charts, report.Chart{Title: p.Policy + ": decision time", Unit: "µs", Groups: []string{"p50", "p99"},
				Series: []string{"the picker's own (pick-duration histogram)", "client-observed (with gRPC and CPU queueing)"},
				Values: [][]float64{{p.ServerPick.P50Us, p.SelectP50Us}, {p.ServerPick.P99Us, p.SelectP99Us}}, LowerIsBetter: true})
		}
	}
	return charts
}
