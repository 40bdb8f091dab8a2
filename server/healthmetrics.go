package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvselect/kvselect/selection"
)

var (
	descEjections = prometheus.NewDesc("kvselect_worker_ejections_total",
		"Workers ejected by the health checks (consecutive failures, or a failed probation trial).", nil, nil)
	descRestorations = prometheus.NewDesc("kvselect_worker_restorations_total",
		"Ejected workers restored by a successful probation trial.", nil, nil)
	descEjected = prometheus.NewDesc("kvselect_workers_ejected",
		"Workers ejected now (not candidates; their bookings and index stay).", nil, nil)
	descEngineViews = prometheus.NewDesc("kvselect_engine_metrics_workers",
		"Scraped workers by the state of their engine figures: fresh, or stale (no good scrape within --engine-metrics-stale-after: selection relies on bookings alone).",
		[]string{"state"}, nil)
	descOutcomes = prometheus.NewDesc("kvselect_health_outcomes_total",
		"Request and probe outcomes reported to the health checks, by result.", []string{"result"}, nil)
)

// healthMetrics exposes the service's health-check totals and the state of
// its engine figures.
type healthMetrics struct{ svc *selection.Service }

func (healthMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descEjections, descRestorations, descEjected, descOutcomes, descEngineViews} {
		ch <- d
	}
}

func (m healthMetrics) Collect(ch chan<- prometheus.Metric) {
	st := m.svc.Inspect().HealthStats()
	ch <- prometheus.MustNewConstMetric(descEjections, prometheus.CounterValue, float64(st.Ejections))
	ch <- prometheus.MustNewConstMetric(descRestorations, prometheus.CounterValue, float64(st.Restorations))
	ch <- prometheus.MustNewConstMetric(descEjected, prometheus.GaugeValue, float64(st.Ejected))
	ch <- prometheus.MustNewConstMetric(descOutcomes, prometheus.CounterValue, float64(st.Successes), "ok")
	ch <- prometheus.MustNewConstMetric(descOutcomes, prometheus.CounterValue, float64(st.Failures), "failure")
	fresh, stale := m.svc.Inspect().EngineStats()
	ch <- prometheus.MustNewConstMetric(descEngineViews, prometheus.GaugeValue, float64(fresh), "fresh")
	ch <- prometheus.MustNewConstMetric(descEngineViews, prometheus.GaugeValue, float64(stale), "stale")
}
