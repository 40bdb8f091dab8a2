package report

import "github.com/kvselect/kvselect/bench/mooncake"

// ReplayCharts draws Mooncake replay results (one series per target): lookup
// latency percentiles and throughput.
func ReplayCharts(rs ...mooncake.Result) []Chart {
	series := make([]string, len(rs))
	lat := [][]float64{make([]float64, len(rs)), make([]float64, len(rs)), make([]float64, len(rs))}
	ops := [][]float64{make([]float64, len(rs)), make([]float64, len(rs))}
	for i, r := range rs {
		series[i] = r.Target
		lat[0][i], lat[1][i], lat[2][i] = float64(r.LookupP50)/1e3, float64(r.LookupP90)/1e3, float64(r.LookupP99)/1e3
		ops[0][i], ops[1][i] = r.OpsPerSec/1e6, r.BlockOpsPerSec/1e6
	}
	return []Chart{
		{Title: "Lookup latency", Unit: "µs", Groups: []string{"p50", "p90", "p99"}, Series: series, Values: lat, LowerIsBetter: true},
		{Title: "Throughput", Unit: "millions per second", Groups: []string{"ops (lookups + events)", "block ops"}, Series: series, Values: ops},
	}
}

// LatencyChart is one panel of p50/p90/p99 latencies in microseconds (from
// nanoseconds) for named series, plus a throughput panel.
func LatencyChart(title string, series []string, p50, p90, p99 []int64, perSec []float64) []Chart {
	lat := [][]float64{make([]float64, len(series)), make([]float64, len(series)), make([]float64, len(series))}
	thr := [][]float64{make([]float64, len(series))}
	for i := range series {
		lat[0][i], lat[1][i], lat[2][i] = float64(p50[i])/1e3, float64(p90[i])/1e3, float64(p99[i])/1e3
		thr[0][i] = perSec[i]
	}
	return []Chart{
		{Title: title + " latency", Unit: "µs", Groups: []string{"p50", "p90", "p99"}, Series: series, Values: lat, LowerIsBetter: true},
		{Title: title + " throughput", Unit: "per second", Groups: []string{"requests"}, Series: series, Values: thr},
	}
}
