package tokenize

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvselect/kvselect/selection"
)

// Results of a Tokenize call (kvselect_tokenize_requests_total).
const (
	resultCache    = "cache"        // a whole-request hit
	resultPrefix   = "prefix_cache" // a conversation prefix plus the engine's ids of the rest
	resultEngine   = "engine"       // the engine's ids of the whole request
	resultFallback = "fallback"     // no ids: the front routes on the text index
)

var results = []string{resultCache, resultPrefix, resultEngine, resultFallback}

var (
	descRequests = prometheus.NewDesc("kvselect_tokenize_requests_total",
		"Text prompts the picker tokenized, by result: cache (whole-request hit), prefix_cache (cached conversation prefix plus the engine's ids of the new messages), engine, fallback (routed on the approximate text index).",
		[]string{"result"}, nil)
	descFallbacks = prometheus.NewDesc("kvselect_tokenize_fallbacks_total",
		"Text prompts routed on the approximate text index because tokenizing failed, by reason.", []string{"reason"}, nil)
	descEngineCalls = prometheus.NewDesc("kvselect_tokenize_engine_calls_total",
		"POST /tokenize calls to engines or render services (requests, background completions and template probes).", nil, nil)
	descProbeCalls = prometheus.NewDesc("kvselect_tokenize_probe_calls_total",
		"POST /tokenize calls of chat template probes.", nil, nil)
	descPrefixMismatch = prometheus.NewDesc("kvselect_tokenize_prefix_mismatch_total",
		"Composed answers refused because the tail did not start with the probed head (the template is then no longer reused).", nil, nil)
	descCacheTokens = prometheus.NewDesc("kvselect_tokenize_cache_tokens",
		"Token ids held by the tokenize cache.", nil, nil)
	descCacheEntries = prometheus.NewDesc("kvselect_tokenize_cache_entries",
		"Entries of the tokenize cache (whole requests and conversation prefixes).", nil, nil)
)

type metrics struct {
	requests                                [4]atomic.Uint64 // results
	fallbacks                               [9]atomic.Uint64 // reasons, then other
	engineCalls, probeCalls, prefixMismatch atomic.Uint64
	latency                                 *prometheus.HistogramVec // by result
	budget                                  prometheus.Histogram     // adaptive budgets given
}

func newMetrics() *metrics {
	m := &metrics{latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "kvselect_tokenize_duration_seconds",
		Help: "Time a text prompt spends in the tokenize step of the pick (the picker latency it adds), by result as in kvselect_tokenize_requests_total.",
		// 5 µs to ~1.6 s in 1.25× steps: fine enough to read p50 and p99.
		Buckets: prometheus.ExponentialBuckets(5e-6, 1.25, 58),
	}, []string{"result"}),
		budget: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvselect_tokenize_budget_seconds",
			Help:    "Budgets the adaptive tokenize wait gave text prompts (--tokenize-timeout-max): the prefill time exact ids are predicted to save, within --tokenize-timeout and --tokenize-timeout-max.",
			Buckets: prometheus.ExponentialBuckets(1e-3, 1.5, 16),
		})}
	for _, r := range results {
		m.latency.WithLabelValues(r) // every series from the start
	}
	return m
}

func (m *metrics) observe(start time.Time, result string, err error) {
	m.latency.WithLabelValues(result).Observe(time.Since(start).Seconds())
	for i, r := range results {
		if r == result {
			m.requests[i].Add(1)
		}
	}
	if err == nil {
		return
	}
	reason := ""
	if fe, ok := errors.AsType[*FallbackError](err); ok {
		reason = fe.Reason
	}
	for i, r := range reasons {
		if r == reason {
			m.fallbacks[i].Add(1)
			return
		}
	}
	m.fallbacks[len(reasons)].Add(1)
}

// Describe implements prometheus.Collector.
func (t *Tokenizer) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRequests, descFallbacks, descEngineCalls, descProbeCalls, descPrefixMismatch,
		descCacheTokens, descCacheEntries} {
		ch <- d
	}
	t.m.latency.Describe(ch)
	t.m.budget.Describe(ch)
}

// Collect implements prometheus.Collector.
func (t *Tokenizer) Collect(ch chan<- prometheus.Metric) {
	m := t.m
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	for i, r := range results {
		counter(descRequests, m.requests[i].Load(), r)
	}
	for i, r := range reasons {
		counter(descFallbacks, m.fallbacks[i].Load(), r)
	}
	counter(descFallbacks, m.fallbacks[len(reasons)].Load(), "other")
	counter(descEngineCalls, m.engineCalls.Load())
	counter(descProbeCalls, m.probeCalls.Load())
	counter(descPrefixMismatch, m.prefixMismatch.Load())
	entries, tokens := t.cache.size()
	ch <- prometheus.MustNewConstMetric(descCacheTokens, prometheus.GaugeValue, float64(tokens))
	ch <- prometheus.MustNewConstMetric(descCacheEntries, prometheus.GaugeValue, float64(entries))
	m.latency.Collect(ch)
	m.budget.Collect(ch)
}

// Stats is a snapshot of the counters, for tests and benchmarks.
type Stats struct {
	Requests                                map[string]uint64 // by result
	Fallbacks                               map[string]uint64 // by reason
	EngineCalls, ProbeCalls, PrefixMismatch uint64
}

// Stats returns the counters.
func (t *Tokenizer) Stats() Stats {
	s := Stats{Requests: map[string]uint64{}, Fallbacks: map[string]uint64{}}
	for i, r := range results {
		s.Requests[r] = t.m.requests[i].Load()
	}
	for i, r := range reasons {
		s.Fallbacks[r] = t.m.fallbacks[i].Load()
	}
	s.Fallbacks["other"] = t.m.fallbacks[len(reasons)].Load()
	s.EngineCalls, s.ProbeCalls, s.PrefixMismatch = t.m.engineCalls.Load(), t.m.probeCalls.Load(), t.m.prefixMismatch.Load()
	return s
}

// TemplateState reports what the probe found of the chat template of req's
// model and fields: decided is false while the probe runs or before it
// started; reusable says whether conversation prefixes are reused.
func (t *Tokenizer) TemplateState(req *selection.TokenizeRequest) (reusable, decided bool) {
	p := t.lookupTemplate(keysOf(req))
	if p == nil {
		return false, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state == tplUsable, p.state != tplProbing
}
