package soak

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"math"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvselect/kvselect/bench/report"
	"github.com/kvselect/kvselect/bench/stats"
)

// Report is a whole run: kvbench soak writes it as soak.json.
type Report struct {
	Config   Config `json:"config"`
	Baseline *Phase `json:"baseline,omitempty"`
	Faulted  *Phase `json:"faulted"`
	// HitRateRatio is the faulted phase's prefix-cache hit rate over the
	// baseline's (same traffic, no faults); NaN without a baseline.
	HitRateRatio float64 `json:"hit_rate_ratio"`
}

// Phase is one run of the traffic.
type Phase struct {
	Name     string        `json:"name"`
	Duration time.Duration `json:"duration"`
	// Outcomes counts requests per front and outcome.
	Outcomes map[string]map[string]int `json:"outcomes"`
	// ByFault counts the requests that did not succeed, per fault kind active
	// when they were sent ("none" when no fault was), and outcome.
	ByFault map[string]map[string]int `json:"by_fault"`
	// Failures counts the requests that did not succeed by front, outcome
	// and what they were told (numbers blanked out), the first place to look.
	Failures   map[string]int    `json:"failures"`
	HitRate    float64           `json:"hit_rate"` // after the first fifth (warm-up)
	PickP50    time.Duration     `json:"pick_p50"`
	PickP99    time.Duration     `json:"pick_p99"`
	Faults     []Fault           `json:"faults"`
	IndexTruth IndexTruth        `json:"index_truth"`
	Leaks      map[string]string `json:"leaks,omitempty"`
	Resources  []ResourceSlope   `json:"resources,omitempty"`
	Violations []Violation       `json:"violations"`
	Samples    []Sample          `json:"samples"`
}

// Violation is one invariant broken, with its context.
type Violation struct {
	Invariant string        `json:"invariant"`
	At        time.Duration `json:"at"`
	Detail    string        `json:"detail"`
}

// ResourceSlope is one replica's growth of one resource over the last half of
// the faulted phase, per hour, fitted by least squares.
type ResourceSlope struct {
	Replica  string  `json:"replica"`
	Resource string  `json:"resource"`
	Unit     string  `json:"unit"`
	First    float64 `json:"first"` // at the start of the fitted window
	Last     float64 `json:"last"`
	PerHour  float64 `json:"per_hour"`
	Bound    float64 `json:"bound"`
	Samples  int     `json:"samples"`
	Judged   bool    `json:"judged"` // the window was long enough to hold it to the bound
	OK       bool    `json:"ok"`
	Note     string  `json:"note,omitempty"`
}

func (r ResourceSlope) String() string {
	s := fmt.Sprintf("replica %s %s: %+.1f %s/h over the last half (%.0f → %.0f, %d samples; bound %.0f)",
		r.Replica, r.Resource, r.PerHour, r.Unit, r.First, r.Last, r.Samples, r.Bound)
	if r.Note != "" {
		s += "; " + r.Note
	}
	return s
}

// warmUp is how long both phases fill their caches before the hit rate
// counts: the same stretch in both, so that the ratio compares like with
// like (half the baseline, at most a minute; the pools fill in well under
// that at the default rates).
func warmUp(cfg *Config) time.Duration {
	if cfg.Baseline == 0 {
		return min(cfg.Duration/2, time.Minute)
	}
	return min(cfg.Baseline/2, time.Minute)
}

var digits = regexp.MustCompile(`[0-9]+`)

func (ph *Phase) summarize(results []result, trafficEnd time.Duration, cfg *Config) {
	ph.Outcomes = map[string]map[string]int{}
	ph.ByFault = map[string]map[string]int{}
	ph.Failures = map[string]int{}
	var picks []time.Duration
	for _, r := range results {
		if ph.Outcomes[r.Front] == nil {
			ph.Outcomes[r.Front] = map[string]int{}
		}
		ph.Outcomes[r.Front][r.Outcome]++
		if r.Front == "extproc" && r.Pick > 0 && r.Outcome != outUnreachable {
			picks = append(picks, r.Pick)
		}
		if r.Outcome == outOK || r.Outcome == outCancelled {
			continue
		}
		detail := digits.ReplaceAllString(r.Detail, "N")
		if len(detail) > 160 {
			detail = detail[:160]
		}
		ph.Failures[fmt.Sprintf("%s %s %d: %s", r.Front, r.Outcome, r.Status, detail)]++
		kinds := map[string]bool{}
		for _, f := range ph.Faults {
			// Two seconds of grace: a fault's effects outlast its undoing a little.
			if r.At >= f.Start && r.At <= f.End+2*time.Second {
				kinds[f.Kind] = true
			}
		}
		if len(kinds) == 0 {
			kinds["none"] = true
		}
		for k := range kinds {
			if ph.ByFault[k] == nil {
				ph.ByFault[k] = map[string]int{}
			}
			ph.ByFault[k][r.Front+" "+r.Outcome]++
		}
	}
	ph.PickP50, ph.PickP99 = stats.Quantile(picks, 0.5), stats.Quantile(picks, 0.99)
	var hits, queries float64
	for _, s := range ph.Samples {
		if s.At > warmUp(cfg) && s.At <= trafficEnd {
			hits += s.Hits
			queries += s.Queries
		}
	}
	ph.HitRate = math.NaN()
	if queries > 0 {
		ph.HitRate = hits / queries
	}
	ph.Resources = resourceSlopes(ph.Samples, ph.Duration, cfg)
}

// resourceSlopes fits each replica's RSS, goroutines and fds over the last
// half of the phase, on the samples of the process that was running at the
// end (a replica the run killed starts over; its earlier life is not a trend).
func resourceSlopes(samples []Sample, d time.Duration, cfg *Config) []ResourceSlope {
	names := map[string]bool{}
	for _, s := range samples {
		for n := range s.Replicas {
			names[n] = true
		}
	}
	var out []ResourceSlope
	for _, name := range slices.Sorted(maps.Keys(names)) {
		lastPID := 0
		for _, s := range samples {
			if rs, ok := s.Replicas[name]; ok {
				lastPID = rs.PID
			}
		}
		type metric struct {
			name, unit string
			bound      float64
			get        func(ReplicaSample) float64
		}
		for _, m := range []metric{
			{"RSS", "MiB", cfg.MaxRSSSlope, func(r ReplicaSample) float64 { return r.RSSMiB }},
			{"goroutines", "", cfg.MaxGoroutineSlope, func(r ReplicaSample) float64 { return float64(r.Goroutines) }},
			{"open fds", "", cfg.MaxFDSlope, func(r ReplicaSample) float64 { return float64(r.FDs) }},
		} {
			var xs, ys []float64
			for _, s := range samples {
				rs, ok := s.Replicas[name]
				if !ok || rs.PID != lastPID || s.At < d/2 || s.At > d {
					continue
				}
				xs = append(xs, s.At.Hours())
				ys = append(ys, m.get(rs))
			}
			rs := ResourceSlope{Replica: name, Resource: m.name, Unit: m.unit, Bound: m.bound, Samples: len(xs), OK: true}
			if len(xs) < 3 {
				rs.Note = "too few samples of the last incarnation"
				out = append(out, rs)
				continue
			}
			rs.First, rs.Last, rs.PerHour = ys[0], ys[len(ys)-1], slope(xs, ys)
			span := time.Duration((xs[len(xs)-1] - xs[0]) * float64(time.Hour))
			switch {
			case d/2 < cfg.JudgeAfter:
				rs.Note = fmt.Sprintf("reported only: the window is shorter than %s", cfg.JudgeAfter)
			case span < d/4:
				rs.Note = fmt.Sprintf("reported only: restarted %s before the end", span.Round(time.Second))
			default:
				rs.Judged = true
				rs.OK = rs.PerHour <= rs.Bound
			}
			out = append(out, rs)
		}
	}
	return out
}

func (r *Report) finish() {
	r.HitRateRatio = math.NaN()
	if r.Baseline != nil && r.Baseline.HitRate > 0 {
		r.HitRateRatio = r.Faulted.HitRate / r.Baseline.HitRate
	}
}

func (r *Report) failed() int { return len(r.Faulted.Violations) }

func (r *Report) write(dir string) error {
	if err := report.WriteJSON(filepath.Join(dir, "soak.json"), jsonSafe(r)); err != nil {
		return err
	}
	return report.WriteSVG(filepath.Join(dir, "soak.svg"), fmt.Sprintf("kvbench soak: %s under faults (seed %d)", r.Config.Duration, r.Config.Seed), r.charts()...)
}

// jsonSafe replaces the NaNs encoding/json refuses with -1.
func jsonSafe(r *Report) *Report {
	c := *r
	if math.IsNaN(c.HitRateRatio) {
		c.HitRateRatio = -1
	}
	for _, ph := range []**Phase{&c.Baseline, &c.Faulted} {
		if *ph != nil && math.IsNaN((*ph).HitRate) {
			p := **ph
			p.HitRate = -1
			*ph = &p
		}
	}
	return &c
}

func (r *Report) charts() []report.Chart {
	ph := r.Faulted
	var marks []report.Mark
	for _, f := range ph.Faults {
		marks = append(marks, report.Mark{X: f.Start.Minutes(), Label: fmt.Sprintf("%s %s (%s)", f.Kind, f.Target, f.Detail)})
	}
	names := map[string]bool{}
	for _, s := range ph.Samples {
		for n := range s.Replicas {
			names[n] = true
		}
	}
	perReplica := func(get func(ReplicaSample) float64) []report.Line {
		var ls []report.Line
		for _, n := range slices.Sorted(maps.Keys(names)) {
			l := report.Line{Name: "replica " + n}
			for _, s := range ph.Samples {
				if rs, ok := s.Replicas[n]; ok {
					l.X, l.Y = append(l.X, s.At.Minutes()), append(l.Y, get(rs))
				}
			}
			ls = append(ls, l)
		}
		return ls
	}
	hit := func(p *Phase, name string) report.Line {
		l := report.Line{Name: name}
		for _, s := range p.Samples {
			if s.Queries > 0 {
				l.X, l.Y = append(l.X, s.At.Minutes()), append(l.Y, s.Hits/s.Queries)
			}
		}
		return l
	}
	hits := []report.Line{hit(ph, "under faults")}
	if r.Baseline != nil {
		hits = append(hits, hit(r.Baseline, "fault-free baseline"))
	}
	p99 := report.Line{Name: "p99 decision (client-side)"}
	for _, s := range ph.Samples {
		p99.X, p99.Y = append(p99.X, s.At.Minutes()), append(p99.Y, float64(s.PickP99)/1e6)
	}
	return []report.Chart{
		{Title: "RSS per replica (dashed: faults)", Unit: "MiB", XLabel: "minutes", Lines: perReplica(func(s ReplicaSample) float64 { return s.RSSMiB }), Marks: marks},
		{Title: "Goroutines per replica", XLabel: "minutes", Lines: perReplica(func(s ReplicaSample) float64 { return float64(s.Goroutines) }), Marks: marks},
		{Title: "Open file descriptors per replica", XLabel: "minutes", Lines: perReplica(func(s ReplicaSample) float64 { return float64(s.FDs) }), Marks: marks},
		{Title: "Workers' prefix-cache hit rate per sample", XLabel: "minutes", Lines: hits, Marks: marks},
		{Title: "p99 decision latency per sample", Unit: "ms", XLabel: "minutes", Lines: []report.Line{p99}, Marks: marks},
	}
}

func (r *Report) table(w io.Writer) {
	ph := r.Faulted
	fmt.Fprintf(w, "\nkvbench soak: %s under faults, %d replicas, %d mock workers (%d behind the lossy proxy) and %d llm-d-inference-sim, %.0f ext_proc + %.0f REST requests/s, seed %d\n\n",
		ph.Duration, r.Config.Replicas, r.Config.Workers, r.Config.ProxiedWorkers, r.Config.Sims, r.Config.ExtprocRate, r.Config.RESTRate, r.Config.Seed)

	kinds := map[string]int{}
	errs := map[string]int{}
	for _, f := range ph.Faults {
		kinds[f.Kind]++
		if f.Err != "" {
			errs[f.Kind]++
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "fault\tinjected\tnot undone\trequests failed while active")
	for _, k := range faultKinds {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", k.name, kinds[k.name], errs[k.name], countList(ph.ByFault[k.name]))
	}
	fmt.Fprintf(tw, "(no fault)\t\t\t%s\n", countList(ph.ByFault["none"]))
	tw.Flush()

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "front\trequests\toutcomes")
	for _, front := range slices.Sorted(maps.Keys(ph.Outcomes)) {
		n := 0
		for _, c := range ph.Outcomes[front] {
			n += c
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\n", front, n, countList(ph.Outcomes[front]))
	}
	tw.Flush()

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "replica\tresource\tlast half, per hour\tbound\tverdict")
	for _, rs := range ph.Resources {
		verdict := "ok"
		switch {
		case !rs.Judged:
			verdict = rs.Note
		case !rs.OK:
			verdict = "FAIL"
		}
		fmt.Fprintf(tw, "%s\t%s\t%+.1f %s (%.0f → %.0f)\t%.0f\t%s\n", rs.Replica, rs.Resource, rs.PerHour, rs.Unit, rs.First, rs.Last, rs.Bound, verdict)
	}
	tw.Flush()

	fmt.Fprintf(w, "\nrouting quality: prefix-cache hit rate %.1f %% under faults", 100*ph.HitRate)
	if r.Baseline != nil {
		fmt.Fprintf(w, ", %.1f %% fault-free: ratio %.3f", 100*r.Baseline.HitRate, r.HitRateRatio)
	}
	fmt.Fprintf(w, "\ndecision latency (client-side, ext_proc): p50 %s, p99 %s\n", ph.PickP50.Round(time.Microsecond), ph.PickP99.Round(time.Microsecond))
	it := ph.IndexTruth
	fmt.Fprintf(w, "index truth: ")
	if it.OK {
		fmt.Fprintf(w, "every replica's index equals every worker's cache (%d blocks, agreed %s after the faults stopped, %d nudges)\n", it.Blocks, it.Settled.Round(time.Millisecond), it.Nudges)
	} else {
		fmt.Fprintf(w, "%d mismatches\n", len(it.Mismatches))
	}
	fmt.Fprintf(w, "leaked load after expiry: %s\n", countListS(ph.Leaks))
	fmt.Fprintln(w)
	if len(ph.Violations) == 0 {
		fmt.Fprintln(w, "invariants: all held")
		return
	}
	fmt.Fprintf(w, "invariants: %d violations\n", len(ph.Violations))
	for i, v := range ph.Violations {
		if i == 20 {
			fmt.Fprintf(w, "  … %d more in soak.json\n", len(ph.Violations)-20)
			break
		}
		fmt.Fprintf(w, "  %s at %s: %s\n", v.Invariant, v.At.Round(time.Second), v.Detail)
	}
}

func countList(m map[string]int) string {
	if len(m) == 0 {
		return "-"
	}
	keys := slices.SortedFunc(maps.Keys(m), func(a, b string) int { return cmp.Or(cmp.Compare(m[b], m[a]), strings.Compare(a, b)) })
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

func countListS(m map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+": "+m[k])
	}
	return strings.Join(parts, "; ")
}
