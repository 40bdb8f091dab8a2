// Package metricstest reads Prometheus collectors in tests, the way /metrics
// would: through a pedantic registry, which also checks that Describe and
// Collect agree. Test code only.
package metricstest

import (
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Series gathers the collectors' metrics as "name{label=value,...}" → value,
// labels sorted by name; counters and gauges give their value, histograms
// their sample count under "name_count{...}".
func Series(t testing.TB, cs ...prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			t.Fatal(err)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			sort.Strings(ls)
			labels := ""
			if len(ls) > 0 {
				labels = "{" + strings.Join(ls, ",") + "}"
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				out[mf.GetName()+labels] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[mf.GetName()+labels] = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				out[mf.GetName()+"_count"+labels] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}
