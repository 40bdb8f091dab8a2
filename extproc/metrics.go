package extproc

import (
	"strconv"
	"sync/atomic"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
)

// Metric descriptors (GET /metrics on the REST port; docs/extproc.md). The
// per-request cost is a few atomic adds and one histogram observation.
var (
	descStreamsActive = prometheus.NewDesc("kvselect_extproc_streams_active",
		"ext_proc streams (HTTP requests) in flight.", nil, nil)
	descStreams = prometheus.NewDesc("kvselect_extproc_streams_total",
		"ext_proc streams opened.", nil, nil)
	descStreamErrors = prometheus.NewDesc("kvselect_extproc_stream_errors_total",
		"Streams ended with a gRPC error by the picker (a protocol violation, a receive or send failure).", nil, nil)
	descRouted = prometheus.NewDesc("kvselect_extproc_routed_total",
		"Requests routed: a worker was booked and the destination sent.", nil, nil)
	descImmediate = prometheus.NewDesc("kvselect_extproc_immediate_responses_total",
		"Requests answered by the picker itself (immediate response), by HTTP status.", []string{"code"}, nil)
	descRebooked = prometheus.NewDesc("kvselect_extproc_rebooked_total",
		"Bookings moved to the endpoint that served the response (a fallback served it).", nil, nil)
	descOutputBlocks = prometheus.NewDesc("kvselect_extproc_output_blocks_total",
		"Output blocks added to bookings from streamed response tokens.", nil, nil)
	descFreed = prometheus.NewDesc("kvselect_extproc_bookings_freed_total",
		"Bookings freed, by when: response_end (end of body or trailers), stream_end (the stream ended first: reset, cancel, error), or estimate (the stream ended without a response phase: the booking is kept to its estimated end, --booking-end).",
		[]string{"at"}, nil)
	descLost = prometheus.NewDesc("kvselect_extproc_bookings_lost_total",
		"Bookings that vanished under their stream (expired, or their worker removed) before the response ended.", nil, nil)
	descOutcomes = prometheus.NewDesc("kvselect_extproc_response_outcomes_total",
		"Response statuses handed to the passive health checks, by result: ok (below 500) or failure (5xx).", []string{"result"}, nil)
	descUnknownObjectives = prometheus.NewDesc("kvselect_extproc_unknown_objectives_total",
		"Requests naming an InferenceObjective (x-llm-d-inference-objective) that no source defines: routed at priority 0.", nil, nil)
	descDeprecated = prometheus.NewDesc("kvselect_extproc_deprecated_headers_total",
		"Requests that sent a deprecated header name (x-gateway-inference-objective, x-gateway-inference-fairness-id, x-slo-ttft-ms, x-slo-tpot-ms, x-gateway-model-name-rewrite), by that name.",
		[]string{"header"}, nil)
	descForwardedIDs = prometheus.NewDesc("kvselect_extproc_forwarded_token_ids_total",
		"Completions bodies whose text prompt was replaced by its token ids before forwarding (--tokenize-forward-ids).", nil, nil)
)

// immediateCodes are the statuses the picker answers with; any other counts
// under "other".
var immediateCodes = []typev3.StatusCode{
	typev3.StatusCode_BadRequest, typev3.StatusCode_NotFound, typev3.StatusCode_Conflict,
	typev3.StatusCode_PayloadTooLarge, typev3.StatusCode_TooManyRequests,
	typev3.StatusCode_InternalServerError, typev3.StatusCode_ServiceUnavailable,
}

// metrics are the picker's counters; a Server owns one.
type metrics struct {
	streams, streamErrors, routed, rebooked, outputBlocks atomic.Uint64
	freedAtEnd, freedAtStreamEnd, lost, forwardedIDs      atomic.Uint64
	keptToEstimate                                        atomic.Uint64
	outcomeOK, outcomeFailures                            atomic.Uint64
	unknownObjectives                                     atomic.Uint64
	deprecated                                            [len(deprecatedHeaders)]atomic.Uint64
	immediate                                             [8]atomic.Uint64 // immediateCodes, then other
	pick                                                  prometheus.Histogram
}

func newMetrics() *metrics {
	return &metrics{pick: prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "kvselect_extproc_pick_duration_seconds",
		Help:    "Time from the complete request (headers, or headers and body) to the routing decision: body parse, selection and booking.",
		Buckets: PickBuckets(),
	})}
}

// PickBuckets are the pick-duration histogram's bucket bounds, 50 µs to
// ~0.8 s: a picker measured beside kvselect (bench/floorpicker) uses them
// too, so that the two histograms read alike.
func PickBuckets() []float64 { return prometheus.ExponentialBuckets(50e-6, 2, 15) }

func (m *metrics) immediateResponse(code typev3.StatusCode) {
	for i, c := range immediateCodes {
		if c == code {
			m.immediate[i].Add(1)
			return
		}
	}
	m.immediate[len(immediateCodes)].Add(1)
}

func (m *metrics) observePick(start time.Time) { m.pick.Observe(time.Since(start).Seconds()) }

// Describe implements prometheus.Collector.
func (s *Server) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descStreamsActive, descStreams, descStreamErrors, descRouted, descImmediate,
		descRebooked, descOutputBlocks, descFreed, descLost, descForwardedIDs, descOutcomes, descUnknownObjectives, descDeprecated} {
		ch <- d
	}
	s.metrics.pick.Describe(ch)
	for _, c := range s.requests.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (s *Server) Collect(ch chan<- prometheus.Metric) {
	m := s.metrics
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v *atomic.Uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v.Load()), labels...)
	}
	gauge(descStreamsActive, float64(s.active.Load()))
	counter(descStreams, &m.streams)
	counter(descStreamErrors, &m.streamErrors)
	counter(descRouted, &m.routed)
	for i, c := range immediateCodes {
		counter(descImmediate, &m.immediate[i], strconv.Itoa(int(c)))
	}
	counter(descImmediate, &m.immediate[len(immediateCodes)], "other")
	counter(descRebooked, &m.rebooked)
	counter(descOutputBlocks, &m.outputBlocks)
	counter(descFreed, &m.freedAtEnd, "response_end")
	counter(descFreed, &m.freedAtStreamEnd, "stream_end")
	counter(descFreed, &m.keptToEstimate, "estimate")
	counter(descLost, &m.lost)
	counter(descForwardedIDs, &m.forwardedIDs)
	counter(descUnknownObjectives, &m.unknownObjectives)
	for i, name := range deprecatedHeaders {
		counter(descDeprecated, &m.deprecated[i], name)
	}
	counter(descOutcomes, &m.outcomeOK, "ok")
	counter(descOutcomes, &m.outcomeFailures, "failure")
	s.metrics.pick.Collect(ch)
	for _, c := range s.requests.collectors() {
		c.Collect(ch)
	}
}
