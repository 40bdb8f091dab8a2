package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the scraper's and the prober's counters (GET /metrics).
type Metrics struct {
	mu       sync.Mutex
	scrapes  map[string]uint64
	dropped  map[string]uint64
	probes   map[string]uint64
	duration prometheus.Histogram
}

// NewMetrics returns the counters; register them with a registry.
func NewMetrics() *Metrics {
	return &Metrics{scrapes: map[string]uint64{}, dropped: map[string]uint64{}, probes: map[string]uint64{},
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvselect_engine_metrics_scrape_duration_seconds",
			Help:    "Time of one engine metrics scrape: request, body and parse.",
			Buckets: prometheus.ExponentialBuckets(100e-6, 2, 14), // 0.1 ms to ~0.8 s
		})}
}

var (
	descScrapes = prometheus.NewDesc("kvselect_engine_metrics_scrapes_total",
		"Engine metrics scrapes by result: ok, timeout, http_error, http_status, too_large, parse_error, missing_series, unknown_engine, skipped_busy (the previous scrape of the worker still ran).",
		[]string{"result"}, nil)
	descDropped = prometheus.NewDesc("kvselect_engine_metrics_values_dropped_total",
		"Values in engine metrics payloads refused before selection saw them, by reason: bad_value (not finite, negative, a usage above 1), unknown_rank, bad_lora_info.",
		[]string{"reason"}, nil)
	descProbes = prometheus.NewDesc("kvselect_health_probes_total",
		"Active health probes (GET /health) by result: ok, failure, skipped_busy.", []string{"result"}, nil)
)

func (m *Metrics) scrape(result string) { m.add(m.scrapes, result, 1) }
func (m *Metrics) probe(result string)  { m.add(m.probes, result, 1) }
func (m *Metrics) drop(d Dropped) {
	for k, n := range d {
		m.add(m.dropped, k, uint64(n))
	}
}
func (m *Metrics) observe(d time.Duration) { m.duration.Observe(d.Seconds()) }

func (m *Metrics) add(to map[string]uint64, k string, n uint64) {
	m.mu.Lock()
	to[k] += n
	m.mu.Unlock()
}

// Count returns one counter's value (tests and benchmarks).
func (m *Metrics) Count(kind, key string) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch kind {
	case "scrapes":
		return m.scrapes[key]
	case "dropped":
		return m.dropped[key]
	case "probes":
		return m.probes[key]
	}
	return 0
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- descScrapes
	ch <- descDropped
	ch <- descProbes
	m.duration.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	for _, x := range []struct {
		d  *prometheus.Desc
		by map[string]uint64
	}{{descScrapes, m.scrapes}, {descDropped, m.dropped}, {descProbes, m.probes}} {
		for k, v := range x.by {
			ch <- prometheus.MustNewConstMetric(x.d, prometheus.CounterValue, float64(v), k)
		}
	}
	m.mu.Unlock()
	m.duration.Collect(ch)
}
