package server

import (
	"flag"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/latency"
)

// latencyFlags tune the online latency model (docs/selection.md,
// "predicted-latency"): how fast it forgets and when its fit replaces the
// prior.
type latencyFlags struct {
	forgetting      float64
	minObservations int
}

func (f *latencyFlags) register(fs *flag.FlagSet) {
	fs.Float64Var(&f.forgetting, "latency-forgetting", 0.995, "the latency model's forgetting `factor` in (0, 1]: an observation weighs factor^k after k newer ones (0.995 remembers about 200 requests per model)")
	fs.IntVar(&f.minObservations, "latency-min-observations", 16, "observations (`n`) a model's latency fit needs before predictions use it instead of the documented prior")
}

func (f *latencyFlags) validate() []error {
	var errs []error
	if !(f.forgetting > 0 && f.forgetting <= 1) {
		errs = append(errs, fmt.Errorf("--latency-forgetting must be in (0, 1], got %v", f.forgetting))
	}
	if f.minObservations < 1 {
		errs = append(errs, fmt.Errorf("--latency-min-observations must be at least 1, got %d", f.minObservations))
	}
	return errs
}

func (f *latencyFlags) apply(cfg *selection.Config, m *latencyMetrics) {
	cfg.Latency = latency.Config{Forgetting: f.forgetting, MinObservations: f.minObservations}
	cfg.OnLatency = m.observe
}

// latencyMetrics are the latency model's series: predicted and observed
// TTFT and ITL of the same traced requests, the relative error of each TTFT
// prediction (its quantiles are the model's accuracy), and the requests
// judged against their objectives.
type latencyMetrics struct {
	ttft, itl *prometheus.HistogramVec // by model and kind (predicted, observed)
	ttftError *prometheus.HistogramVec // by model
	slo       *prometheus.CounterVec   // by objective and outcome
	engine    *prometheus.CounterVec   // engine histogram intervals, by model and outcome
	drift     *prometheus.CounterVec   // drift resets, by model
}

func newLatencyMetrics() *latencyMetrics {
	return &latencyMetrics{
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvselect_latency_ttft_seconds",
			Help:    "Time to first token of traced bookings, as predicted at the decision and as observed (decision to first token), by model.",
			Buckets: prometheus.ExponentialBuckets(1e-3, 2, 16),
		}, []string{"model", "kind"}),
		itl: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvselect_latency_itl_seconds",
			Help:    "Mean inter-token latency of traced bookings, as predicted at the decision and as observed over the response, by model.",
			Buckets: prometheus.ExponentialBuckets(1e-4, 2, 14),
		}, []string{"model", "kind"}),
		ttftError: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvselect_latency_ttft_relative_error",
			Help:    "|predicted − observed| / observed TTFT of each traced booking (observed floored at 1 ms), by model: the latency model's accuracy.",
			Buckets: []float64{0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10},
		}, []string{"model"}),
		slo: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvselect_slo_requests_total",
			Help: "Requests with a latency objective, by objective (ttft, tpot) and outcome: met or missed as observed, shed when refused because no worker was predicted to meet it (objective all).",
		}, []string{"objective", "outcome"}),
		engine: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvselect_latency_engine_intervals_total",
			Help: "Scrape intervals of the engines' latency histograms with first tokens or inter-token gaps, by model and outcome: fitted (TTFT fitted: no response path from the rank), compared (attributed to bookings and checked for drift only), unattributed (more first tokens than bookings: traffic the picker did not route), itl_fitted.",
		}, []string{"model", "outcome"}),
		drift: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvselect_latency_drift_resets_total",
			Help: "Drifts the engines' TTFT histograms confirmed against the predictions (a factor of two for three intervals), each inflating the model's fit covariance so it relearns, by model.",
		}, []string{"model"}),
	}
}

func (m *latencyMetrics) observe(ev selection.LatencyEvent) {
	switch ev.Kind {
	case selection.LatencyFirstToken:
		m.ttft.WithLabelValues(ev.Model, "predicted").Observe(ev.PredictedTTFT)
		m.ttft.WithLabelValues(ev.Model, "observed").Observe(ev.ObservedTTFT)
		m.ttftError.WithLabelValues(ev.Model).Observe(latency.RelativeError(ev.PredictedTTFT, ev.ObservedTTFT))
		m.judge("ttft", ev)
	case selection.LatencyEnd:
		m.itl.WithLabelValues(ev.Model, "predicted").Observe(ev.PredictedITL)
		m.itl.WithLabelValues(ev.Model, "observed").Observe(ev.ObservedITL)
		m.judge("tpot", ev)
	case selection.LatencyShed:
		m.slo.WithLabelValues("all", "shed").Inc()
	case selection.LatencyEngine:
		out := ev.Engine
		switch {
		case out.FittedTTFT:
			m.engine.WithLabelValues(ev.Model, "fitted").Inc()
		case out.Attributed:
			m.engine.WithLabelValues(ev.Model, "compared").Inc()
		case out.Unattributed:
			m.engine.WithLabelValues(ev.Model, "unattributed").Inc()
		}
		if out.FittedITL {
			m.engine.WithLabelValues(ev.Model, "itl_fitted").Inc()
		}
		if out.DriftReset {
			m.drift.WithLabelValues(ev.Model).Inc()
		}
	}
}

func (m *latencyMetrics) judge(objective string, ev selection.LatencyEvent) {
	if ev.SLO <= 0 {
		return
	}
	outcome := "missed"
	if ev.Met {
		outcome = "met"
	}
	m.slo.WithLabelValues(objective, outcome).Inc()
}

// Describe implements prometheus.Collector.
func (m *latencyMetrics) Describe(ch chan<- *prometheus.Desc) {
	m.ttft.Describe(ch)
	m.itl.Describe(ch)
	m.ttftError.Describe(ch)
	m.slo.Describe(ch)
	m.engine.Describe(ch)
	m.drift.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *latencyMetrics) Collect(ch chan<- prometheus.Metric) {
	m.ttft.Collect(ch)
	m.itl.Collect(ch)
	m.ttftError.Collect(ch)
	m.slo.Collect(ch)
	m.engine.Collect(ch)
	m.drift.Collect(ch)
}
