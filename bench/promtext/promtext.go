// Package promtext reads what the harnesses scrape from kvselect, the engines
// (mock workers, llm-d-inference-sim) and llm-d's endpoint picker: the
// Prometheus text exposition of their /metrics, parsed by Prometheus's own
// parser (expfmt) into flat samples, and the few questions a report asks of
// them — a metric summed over its series or broken down by a label, what a
// run added between two scrapes, and a histogram's quantiles interpolated
// within buckets as PromQL's histogram_quantile does.
package promtext

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Sample is one line of the exposition: a histogram's buckets, sum and
// count are samples of their own (name_bucket with an le label, name_sum,
// name_count), as the text shows them.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Samples is a whole scrape.
type Samples []Sample

// Scrape reads url's exposition.
func Scrape(ctx context.Context, hc *http.Client, url string) (Samples, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", url, resp.Status)
	}
	s, err := Parse(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	return s, nil
}

// Parse reads a text exposition.
func Parse(r io.Reader) (Samples, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	var out Samples
	for _, name := range slices.Sorted(maps.Keys(fams)) {
		for _, m := range fams[name].GetMetric() {
			out = appendMetric(out, name, m)
		}
	}
	return out, nil
}

// appendMetric flattens one series of family name into its samples.
func appendMetric(out Samples, name string, m *dto.Metric) Samples {
	labels := make(map[string]string, len(m.GetLabel()))
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	with := func(k, v string) map[string]string {
		l := maps.Clone(labels)
		l[k] = v
		return l
	}
	switch {
	case m.Counter != nil:
		return append(out, Sample{name, labels, m.GetCounter().GetValue()})
	case m.Gauge != nil:
		return append(out, Sample{name, labels, m.GetGauge().GetValue()})
	case m.Untyped != nil:
		return append(out, Sample{name, labels, m.GetUntyped().GetValue()})
	case m.Histogram != nil:
		h := m.GetHistogram()
		for _, b := range h.GetBucket() {
			n := float64(b.GetCumulativeCount())
			if b.CumulativeCountFloat != nil {
				n = b.GetCumulativeCountFloat()
			}
			out = append(out, Sample{name + "_bucket", with(model.BucketLabel, formatBound(b.GetUpperBound())), n})
		}
		n := float64(h.GetSampleCount())
		if h.SampleCountFloat != nil {
			n = h.GetSampleCountFloat()
		}
		return append(out, Sample{name + "_sum", labels, h.GetSampleSum()}, Sample{name + "_count", labels, n})
	case m.Summary != nil:
		s := m.GetSummary()
		for _, q := range s.GetQuantile() {
			out = append(out, Sample{name, with(model.QuantileLabel, strconv.FormatFloat(q.GetQuantile(), 'g', -1, 64)), q.GetValue()})
		}
		return append(out, Sample{name + "_sum", labels, s.GetSampleSum()}, Sample{name + "_count", labels, float64(s.GetSampleCount())})
	}
	return out
}

func formatBound(b float64) string {
	if math.IsInf(b, 1) {
		return "+Inf"
	}
	return strconv.FormatFloat(b, 'g', -1, 64)
}

// Sum is the total of every series of the named sample.
func (s Samples) Sum(name string) float64 {
	t := 0.0
	for _, x := range s {
		if x.Name == name {
			t += x.Value
		}
	}
	return t
}

// ByLabel sums the named sample's series by the value of one label.
func (s Samples) ByLabel(name, label string) map[string]float64 {
	out := map[string]float64{}
	for _, x := range s {
		if x.Name == name {
			out[x.Labels[label]] += x.Value
		}
	}
	return out
}

// Where keeps the samples whose label has the given value.
func (s Samples) Where(label, value string) Samples {
	var out Samples
	for _, x := range s {
		if x.Labels[label] == value {
			out = append(out, x)
		}
	}
	return out
}

// Minus is what was added since before, an earlier scrape of the same
// counters and histograms: every series less its value then (a series that
// did not exist then counts from zero).
func (s Samples) Minus(before Samples) Samples {
	old := make(map[string]float64, len(before))
	for _, x := range before {
		old[x.key()] = x.Value
	}
	out := slices.Clone(s)
	for i := range out {
		out[i].Value -= old[out[i].key()]
	}
	return out
}

// key names a series: its name and its labels in order.
func (x Sample) key() string {
	var b strings.Builder
	b.WriteString(x.Name)
	for _, k := range slices.Sorted(maps.Keys(x.Labels)) {
		fmt.Fprintf(&b, ",%s=%q", k, x.Labels[k])
	}
	return b.String()
}

// HistogramQuantile is the q-quantile of the named histogram over all its
// series, as PromQL's histogram_quantile computes it: linear interpolation
// within the bucket that holds the rank, the lowest bucket starting at 0; a
// rank in the +Inf bucket is the highest finite bound. 0 without
// observations.
func (s Samples) HistogramQuantile(name string, q float64) float64 {
	byBound := map[float64]float64{}
	for _, x := range s {
		if x.Name != name+"_bucket" {
			continue
		}
		le, err := strconv.ParseFloat(x.Labels[model.BucketLabel], 64)
		if err != nil {
			le = math.Inf(1)
		}
		byBound[le] += x.Value
	}
	bounds := slices.Sorted(maps.Keys(byBound))
	if len(bounds) == 0 || !(byBound[bounds[len(bounds)-1]] > 0) {
		return 0
	}
	rank := q * byBound[bounds[len(bounds)-1]]
	lo, below := 0.0, 0.0
	for _, le := range bounds {
		n := byBound[le]
		if n >= rank {
			if math.IsInf(le, 1) {
				return lo
			}
			if n == below {
				return le
			}
			return lo + (le-lo)*(rank-below)/(n-below)
		}
		lo, below = le, n
	}
	return lo
}

// Summary is a histogram of seconds summarised in microseconds, as the
// reports show a picker's decision time.
type Summary struct {
	Name   string  `json:"name"`
	Count  float64 `json:"count"`
	MeanUs float64 `json:"mean_us"`
	P50Us  float64 `json:"p50_us"`
	P90Us  float64 `json:"p90_us"`
	P95Us  float64 `json:"p95_us"`
	P99Us  float64 `json:"p99_us"`
}

// Summarize is the named histogram (in seconds) over all its series: a
// histogram with no observation yet, or none exposed at all (llm-d's
// endpoint picker registers its series lazily), has a zero count.
func (s Samples) Summarize(name string) Summary {
	out := Summary{Name: name, Count: s.Sum(name + "_count")}
	if out.Count <= 0 {
		return out
	}
	out.MeanUs = s.Sum(name+"_sum") / out.Count * 1e6
	out.P50Us = s.HistogramQuantile(name, 0.5) * 1e6
	out.P90Us = s.HistogramQuantile(name, 0.9) * 1e6
	out.P95Us = s.HistogramQuantile(name, 0.95) * 1e6
	out.P99Us = s.HistogramQuantile(name, 0.99) * 1e6
	return out
}
