package mockworker

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics exposes vLLM's metric names (vllm/v1/metrics/loggers.py), labelled
// with model_name and engine (the data-parallel rank) as vLLM labels them, so
// that dashboards and scrapers written for vLLM read the mock unchanged. It
// has its own registry: several workers can live in one process.
type metrics struct {
	w    *Worker
	reg  *prometheus.Registry
	ttft *prometheus.HistogramVec
	itl  *prometheus.HistogramVec
	e2e  *prometheus.HistogramVec

	running, waiting, usage *prometheus.Desc
	queries, hits           *prometheus.Desc
	prompt, generation      *prometheus.Desc
	success, aborted        *prometheus.Desc
	publishErrs, evicted    *prometheus.Desc
	cacheConfig             *prometheus.Desc
	// Disaggregated prefill/decode (pd.go).
	computed, transferred         *prometheus.Desc
	remotePrefills, remoteDecodes *prometheus.Desc
}

var labels = []string{"model_name", "engine"}

func newMetrics(w *Worker) *metrics {
	desc := func(name, help string, extra ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, append(append([]string(nil), labels...), extra...), nil)
	}
	// vLLM's latency buckets (seconds).
	ttftBuckets := []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560}
	itlBuckets := []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}
	e2eBuckets := []float64{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680}
	m := &metrics{
		w:   w,
		reg: prometheus.NewRegistry(),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "vllm:time_to_first_token_seconds",
			Help: "Histogram of time to first token in seconds.", Buckets: ttftBuckets}, labels),
		itl: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "vllm:inter_token_latency_seconds",
			Help: "Histogram of inter-token latency in seconds.", Buckets: itlBuckets}, labels),
		e2e: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "vllm:e2e_request_latency_seconds",
			Help: "Histogram of e2e request latency in seconds.", Buckets: e2eBuckets}, labels),
		running:     desc("vllm:num_requests_running", "Number of requests in model execution batches."),
		waiting:     desc("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
		usage:       desc("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
		queries:     desc("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens."),
		hits:        desc("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
		prompt:      desc("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		generation:  desc("vllm:generation_tokens_total", "Number of generation tokens processed."),
		success:     desc("vllm:request_success_total", "Count of successfully processed requests.", "finished_reason"),
		aborted:     desc("kvselect_mockworker_requests_aborted_total", "Requests cancelled by the client or the worker's shutdown."),
		publishErrs: desc("kvselect_mockworker_kv_events_publish_errors_total", "KV event batches that could not be published."),
		evicted:     desc("kvselect_mockworker_evicted_blocks_total", "Cached KV blocks evicted (least recently used first) to make room."),
		computed:    desc("kvselect_mockworker_prefill_computed_tokens_total", "Prompt tokens this rank prefilled itself (not cached, not pulled from a prefill worker)."),
		transferred: desc("kvselect_mockworker_kv_transfer_blocks_total", "KV blocks pulled from prefill workers for remotely prefilled requests."),
		remotePrefills: desc("kvselect_mockworker_remote_prefill_requests_total",
			"Requests decoded here whose prompt a prefill worker computed (kv_transfer_params.do_remote_prefill)."),
		remoteDecodes: desc("kvselect_mockworker_remote_decode_requests_total",
			"Prefill stages computed here for another worker's decode (kv_transfer_params.do_remote_decode)."),
		// vLLM's info gauge of its CacheConfig (value 1, the settings in
		// labels), from which endpoint pickers such as GIE's read the block
		// size and the KV cache's capacity; the mock sets the labels it has.
		cacheConfig: prometheus.NewDesc("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
			[]string{"engine", "block_size", "num_gpu_blocks", "enable_prefix_caching"}, nil),
	}
	m.reg.MustRegister(m, m.ttft, m.itl, m.e2e,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.running, m.waiting, m.usage, m.queries, m.hits,
		m.prompt, m.generation, m.success, m.aborted, m.publishErrs, m.evicted, m.cacheConfig,
		m.computed, m.transferred, m.remotePrefills, m.remoteDecodes} {
		ch <- d
	}
}

// Collect reads every rank's state at scrape time, so the gauges are exact
// and the engine keeps plain counters under the lock it already holds.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	model := m.w.cfg.Model
	for _, r := range m.w.ranks {
		r.mu.Lock()
		running, waiting := float64(r.running), float64(len(r.queue))
		usage := float64(r.pool.used()) / float64(r.pool.capacity)
		queries, hits := float64(r.queries), float64(r.hits)
		prompt, gen := float64(r.promptToks), float64(r.genToks)
		finished, aborted, pubErrs := float64(r.finished), float64(r.aborted), float64(r.publishErrs)
		evicted := float64(r.pool.evictions)
		computed, transferred := float64(r.computedPrefill), float64(r.transferredBlocks)
		remotePrefills, remoteDecodes := float64(r.remotePrefills), float64(r.remoteDecodes)
		r.mu.Unlock()
		engine := strconv.Itoa(r.global)
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, model, engine)
		}
		counter := func(d *prometheus.Desc, v float64, extra ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, append([]string{model, engine}, extra...)...)
		}
		gauge(m.running, running)
		gauge(m.waiting, waiting)
		gauge(m.usage, usage)
		counter(m.queries, queries)
		counter(m.hits, hits)
		counter(m.prompt, prompt)
		counter(m.generation, gen)
		counter(m.success, finished, "length")
		counter(m.aborted, aborted)
		counter(m.publishErrs, pubErrs)
		counter(m.evicted, evicted)
		counter(m.computed, computed)
		counter(m.transferred, transferred)
		counter(m.remotePrefills, remotePrefills)
		counter(m.remoteDecodes, remoteDecodes)
		ch <- prometheus.MustNewConstMetric(m.cacheConfig, prometheus.GaugeValue, 1, engine,
			strconv.Itoa(m.w.cfg.BlockSize), strconv.Itoa(m.w.cfg.NumBlocks), "True")
	}
}

func (m *metrics) firstToken(r *rank, ttft time.Duration) {
	m.ttft.WithLabelValues(m.w.cfg.Model, strconv.Itoa(r.global)).Observe(ttft.Seconds())
}

// observe records a finished request: its latency and, like vLLM's
// inter_token_latency_seconds, each gap between its tokens (the mock
// counts their mean once per gap).
func (m *metrics) observe(r *rank, res Result) {
	engine := strconv.Itoa(r.global)
	m.e2e.WithLabelValues(m.w.cfg.Model, engine).Observe(res.Latency.Seconds())
	if gaps := len(res.Output) - 1; gaps > 0 {
		itl := m.itl.WithLabelValues(m.w.cfg.Model, engine)
		mean := (res.Latency - res.TTFT).Seconds() / float64(gaps)
		for range gaps {
			itl.Observe(mean)
		}
	}
}

// Registry is the worker's Prometheus registry (served on /metrics).
func (w *Worker) Registry() *prometheus.Registry { return w.metrics.reg }
