package promtext

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The picker's histogram is summarised over the run alone (the difference of
// two scrapes), quantiles interpolated within a bucket as Prometheus's
// histogram_quantile does.
func TestHistogramSummaryIsTheRunsShare(t *testing.T) {
	before := `# TYPE h histogram
h_bucket{le="0.0001"} 10
h_bucket{le="0.0002"} 10
h_bucket{le="0.0004"} 10
h_bucket{le="+Inf"} 10
h_sum 0.0005
h_count 10
other_bucket{le="1"} 99
`
	// The run adds 100 observations: 50 in (0.1, 0.2] ms, 50 in (0.2, 0.4] ms,
	// summing to 25 ms.
	after := `h_bucket{le="0.0001"} 10
h_bucket{le="0.0002"} 60
h_bucket{le="0.0004"} 110
h_bucket{le="+Inf"} 110 1700000000000
h_sum 0.0255
h_count 110
`
	b, err := Parse(strings.NewReader(before))
	if err != nil {
		t.Fatal(err)
	}
	a, err := Parse(strings.NewReader(after))
	if err != nil {
		t.Fatal(err)
	}
	got := a.Minus(b).Summarize("h")
	near := func(x, want float64) bool { return math.Abs(x-want) < 1e-6 }
	if got.Count != 100 || !near(got.MeanUs, 250) || !near(got.P50Us, 200) || !near(got.P90Us, 360) || !near(got.P99Us, 396) {
		t.Fatalf("summary %+v", got)
	}
	if empty := b.Minus(b).Summarize("h"); empty.Count != 0 || empty.P50Us != 0 {
		t.Fatalf("no observation: %+v", empty)
	}
	if absent := b.Summarize("never_registered"); absent.Count != 0 || absent.Name != "never_registered" {
		t.Fatalf("absent histogram: %+v", absent)
	}
}

func TestHistogramQuantileInterpolatesLikePromQL(t *testing.T) {
	var p Samples
	add := func(result, le string, v float64) {
		p = append(p, Sample{"h_bucket", map[string]string{"result": result, "le": le}, v})
	}
	// 10 observations in (0, 1], 10 in (1, 2]; another series in (2, 4].
	add("a", "1", 10)
	add("a", "2", 20)
	add("a", "4", 20)
	add("a", "+Inf", 20)
	add("b", "1", 0)
	add("b", "2", 0)
	add("b", "4", 20)
	add("b", "+Inf", 20)
	for _, tc := range []struct {
		result string
		q      float64
		want   float64
	}{{"a", 0.5, 1}, {"a", 0.75, 1.5}, {"b", 0.5, 3}, {"", 0.5, 2}, {"", 0.25, 1}} {
		s := p
		if tc.result != "" {
			s = p.Where("result", tc.result)
		}
		if got := s.HistogramQuantile("h", tc.q); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("q%v of %q = %v, want %v", tc.q, tc.result, got, tc.want)
		}
	}
}

// Counters, gauges and untyped samples are summed and broken down by label
// as exposed, _total suffix and colons included; a malformed exposition is an
// error, not a silent zero.
func TestScrapeSumsAndBreaksDown(t *testing.T) {
	const text = `# HELP vllm:prefix_cache_queries_total Prefix cache queries.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{model_name="m",engine="0"} 30
vllm:prefix_cache_queries_total{model_name="m",engine="1"} 12
# TYPE kvselect_tokenize_fallbacks_total counter
kvselect_tokenize_fallbacks_total{reason="timeout"} 2
kvselect_tokenize_fallbacks_total{reason="error, \"quoted\""} 1
# TYPE go_goroutines gauge
go_goroutines 17
process_cpu_seconds_total 1.25
`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/bad" {
			w.Write([]byte("not a metric line\n"))
			return
		}
		w.Write([]byte(text))
	}))
	defer srv.Close()
	s, err := Scrape(context.Background(), srv.Client(), srv.URL+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Sum("vllm:prefix_cache_queries_total"); got != 42 {
		t.Errorf("queries %v", got)
	}
	if got := s.ByLabel("kvselect_tokenize_fallbacks_total", "reason"); got["timeout"] != 2 || got[`error, "quoted"`] != 1 || len(got) != 2 {
		t.Errorf("fallbacks by reason %v", got)
	}
	if s.Sum("go_goroutines") != 17 || s.Sum("process_cpu_seconds_total") != 1.25 || s.Sum("absent") != 0 {
		t.Errorf("gauge %v, untyped %v", s.Sum("go_goroutines"), s.Sum("process_cpu_seconds_total"))
	}
	if _, err := Scrape(context.Background(), srv.Client(), srv.URL+"/bad"); err == nil {
		t.Error("a malformed exposition parsed")
	}
	if _, err := Scrape(context.Background(), srv.Client(), "http://127.0.0.1:1/metrics"); err == nil {
		t.Error("no error from a closed port")
	}
}
