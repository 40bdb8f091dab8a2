package extproc

import (
	"context"
	"strconv"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvselect/kvselect/internal/tracing"
	"github.com/kvselect/kvselect/selection"
)

// Per-model request metrics: what the picker sees of each routed request on
// its way back. The model label is the partition's model, which exists only
// for registered workers' models, so its cardinality is the catalog's.
type requestMetrics struct {
	ttft, itl, duration                   *prometheus.HistogramVec
	prompt, completion, engPrompt, engHit *prometheus.CounterVec
	responses                             *prometheus.CounterVec
	byModel                               sync.Map // model → *modelMetrics
}

// modelMetrics are one model's series, resolved once per model.
type modelMetrics struct {
	ttft, itl, duration                   prometheus.Observer
	prompt, completion, engPrompt, engHit prometheus.Counter
	model                                 string
}

func newRequestMetrics() *requestMetrics {
	latency := func(name, help string, start float64, n int) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help,
			Buckets: prometheus.ExponentialBuckets(start, 2, n)}, []string{"model"})
	}
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"model"})
	}
	return &requestMetrics{
		// 1 ms to ~65 s.
		ttft: latency("kvselect_request_ttft_seconds",
			"Time to first token: from the routing decision to the first response body byte, by model.", 1e-3, 17),
		// 0.5 ms to ~4 s.
		itl: latency("kvselect_request_inter_token_latency_seconds",
			"Inter-token latency of streamed (SSE) responses: the time between response chunks carrying tokens, divided by the tokens they carry, by model.", 5e-4, 14),
		// 5 ms to ~5.5 min.
		duration: latency("kvselect_request_duration_seconds",
			"Time from the routing decision to the response's end (or the stream's, when it ended first), by model.", 5e-3, 17),
		prompt:     counter("kvselect_request_prompt_tokens_total", "Prompt tokens of routed requests, as the picker identified them, by model."),
		completion: counter("kvselect_request_completion_tokens_total", "Completion tokens of routed requests: the final usage report's, else one per streamed event, by model."),
		engPrompt: counter("kvselect_request_engine_prompt_tokens_total",
			"Prompt tokens of responses that reported usage (usage.prompt_tokens), by model."),
		engHit: counter("kvselect_request_engine_cached_tokens_total",
			"Prompt tokens the engine served from its prefix cache, from responses that reported them (usage.prompt_tokens_details.cached_tokens), by model."),
		responses: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvselect_request_responses_total",
			Help: "Routed requests by model and the worker's response status; \"none\" when the stream ended before a response."},
			[]string{"model", "code"}),
	}
}

func (m *requestMetrics) forModel(model string) *modelMetrics {
	if v, ok := m.byModel.Load(model); ok {
		return v.(*modelMetrics)
	}
	mm := &modelMetrics{
		ttft: m.ttft.WithLabelValues(model), itl: m.itl.WithLabelValues(model), duration: m.duration.WithLabelValues(model),
		prompt: m.prompt.WithLabelValues(model), completion: m.completion.WithLabelValues(model),
		engPrompt: m.engPrompt.WithLabelValues(model), engHit: m.engHit.WithLabelValues(model), model: model,
	}
	v, _ := m.byModel.LoadOrStore(model, mm)
	return v.(*modelMetrics)
}

func (m *requestMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.ttft, m.itl, m.duration, m.prompt, m.completion, m.engPrompt, m.engHit, m.responses}
}

// maxUsageTail bounds how much of a non-streamed response body the picker
// keeps to read its usage object (OpenAI-style servers write it last).
const maxUsageTail = 4 << 10

// exchange follows one request for its span and, once routed, the request
// metrics. Owned by the stream goroutine.
type exchange struct {
	ctx  context.Context // carries span
	span trace.Span

	mm                   *modelMetrics // nil until routed
	routedAt, lastTokens time.Time
	firstByte            bool
	events               int // token events counted at lastTokens
	promptTokens         int
	status               string
	finished             bool
	tail                 []byte // non-SSE body tail, for its usage
}

// traceCarrier reads and writes W3C trace context in the request headers.
type traceCarrier struct {
	id  *identity
	out []*corev3.HeaderValueOption
}

func (c *traceCarrier) Get(key string) string {
	switch key {
	case "traceparent":
		return c.id.traceparent
	case "tracestate":
		return c.id.tracestate
	case "baggage":
		return c.id.baggage
	}
	return ""
}

func (c *traceCarrier) Set(key, value string) { c.out = append(c.out, setHeader(key, value)) }

func (c *traceCarrier) Keys() []string { return []string{"traceparent", "tracestate", "baggage"} }

// startRequest opens the request's span, continuing the trace the gateway
// forwarded in traceparent.
// With tracing off nothing happens: the stream keeps the no-op span it
// started with, and the request path allocates no context for spans.
func (st *stream) startRequest() {
	t := st.s.opts.Tracing
	if !t.Enabled {
		return
	}
	ctx := t.Propagator.Extract(st.ctx, &traceCarrier{id: &st.id})
	st.ex.ctx, st.ex.span = t.Tracer.Start(ctx, tracing.SpanRequest, trace.WithSpanKind(trace.SpanKindServer))
	if st.ex.span.IsRecording() {
		st.ex.span.SetAttributes(attribute.String("http.request.method", st.id.method), attribute.String("url.path", st.id.path),
			attribute.String("kvselect.front", "ext_proc"))
	}
	st.bk.span = st.ex.span
}

// startSpan starts a child of the request span; with tracing off it is the
// stream's no-op span, at no cost.
func (st *stream) startSpan(name string) (context.Context, trace.Span) {
	if !st.s.opts.Tracing.Enabled {
		return st.ex.ctx, st.ex.span
	}
	return st.s.opts.Tracing.Tracer.Start(st.ex.ctx, name)
}

// propagate sets the request span's trace context on the request to the
// worker, so the engine's spans join the trace. Without tracing the
// client's own headers pass through untouched.
func (st *stream) propagate(mut []*corev3.HeaderValueOption) []*corev3.HeaderValueOption {
	t := st.s.opts.Tracing
	if !t.Enabled {
		return mut
	}
	c := traceCarrier{id: &st.id, out: mut}
	t.Propagator.Inject(st.ex.ctx, &c)
	return c.out
}

// routed starts the request metrics of a booked request.
func (st *stream) routed(resp *selection.SelectResponse) {
	st.ex.mm = st.s.requests.forModel(resp.ModelName)
	st.ex.routedAt = time.Now()
	st.ex.promptTokens = resp.Decision.ISLTokens
}

// responseChunk observes a response body chunk: the first byte (TTFT) and,
// for streamed responses, the tokens it carries (inter-token latency).
func (st *stream) responseChunk(body []byte) {
	ex := &st.ex
	if ex.mm == nil || ex.finished || len(body) == 0 {
		return
	}
	now := time.Now()
	if !ex.firstByte {
		ex.firstByte = true
		ttft := now.Sub(ex.routedAt)
		ex.mm.ttft.Observe(ttft.Seconds())
		if ex.span.IsRecording() {
			ex.span.AddEvent("kvselect.first_byte", trace.WithAttributes(attribute.Float64("kvselect.ttft_ms", float64(ttft.Microseconds())/1000)))
		}
	}
	if !st.sse {
		ex.tail = appendTail(ex.tail, body, maxUsageTail)
		return
	}
	n := st.counter.events
	if n > ex.events {
		if !ex.lastTokens.IsZero() {
			ex.mm.itl.Observe(now.Sub(ex.lastTokens).Seconds() / float64(n-ex.events))
		}
		ex.lastTokens, ex.events = now, n
	}
}

// finishRequest records the request metrics once: at the response's end,
// else when the stream ends.
func (st *stream) finishRequest() {
	ex := &st.ex
	if ex.mm == nil || ex.finished {
		return
	}
	ex.finished = true
	mm := ex.mm
	mm.duration.Observe(time.Since(ex.routedAt).Seconds())
	mm.prompt.Add(float64(ex.promptTokens))
	code := ex.status
	if code == "" {
		code = "none"
	}
	st.s.requests.responses.WithLabelValues(mm.model, code).Inc()
	completion, eng := st.counter.tokens(), st.counter.eng
	if !st.sse {
		var u engineUsage
		completion, u = usageFromTail(ex.tail, st.counter.format)
		eng = u
	}
	mm.completion.Add(float64(completion))
	if eng.seen {
		mm.engPrompt.Add(float64(eng.promptTokens))
		mm.engHit.Add(float64(min(eng.cachedTokens, eng.promptTokens)))
	}
	if ex.span.IsRecording() {
		a := []attribute.KeyValue{attribute.Int("kvselect.completion_tokens", completion)}
		if eng.seen {
			a = append(a, attribute.Int("kvselect.engine.prompt_tokens", eng.promptTokens), attribute.Int("kvselect.engine.cached_tokens", eng.cachedTokens))
		}
		ex.span.SetAttributes(a...)
	}
}

// responseEnd: the response is complete; its booking is freed and its
// metrics recorded.
func (st *stream) responseEnd() {
	st.bk.responseEnd(st.ctx)
	st.finishRequest()
}

// end runs when the stream ends, however it ends.
func (st *stream) end() {
	if st.bk.live && st.keepToEstimate() {
		st.bk.endByEstimate(st.ctx)
	}
	st.bk.streamEnd(st.ctx)
	st.finishRequest()
	st.ex.span.End()
	st.releaseBody() // a stream that ended before its decision
}

// statusSeen notes the worker's response status for the metrics and span.
func (st *stream) statusSeen(status string) {
	if _, err := strconv.Atoi(status); err != nil || len(status) != 3 {
		return
	}
	st.ex.status = status
	if st.ex.span.IsRecording() {
		code, _ := strconv.Atoi(status)
		st.ex.span.SetAttributes(attribute.Int("http.response.status_code", code))
		if code >= 500 {
			st.ex.span.SetStatus(codes.Error, "worker answered "+status)
		}
	}
}

// immediateSeen marks the span of a request the picker answered itself.
func (st *stream) immediateSeen(code int, msg string) {
	if !st.ex.span.IsRecording() {
		return
	}
	st.ex.span.SetAttributes(attribute.Int("http.response.status_code", code), attribute.Bool("kvselect.immediate_response", true))
	if code >= 500 || code == 429 {
		st.ex.span.SetStatus(codes.Error, msg)
	}
}

func appendTail(tail, b []byte, limit int) []byte {
	if len(b) >= limit {
		return append(tail[:0], b[len(b)-limit:]...)
	}
	if over := len(tail) + len(b) - limit; over > 0 {
		tail = append(tail[:0], tail[over:]...)
	}
	return append(tail, b...)
}

// usageFromTail reads the usage report of a non-streamed response from the
// body's tail (servers write it last): its completion tokens, and the prompt
// side. The format says where it is: usage (OpenAI, Anthropic, Responses)
// or meta_info (SGLang).
func usageFromTail(tail []byte, f requestFormat) (int, engineUsage) {
	key := usageKey
	if f == formatSGLang {
		key = metaInfoKey
	}
	u := objectAfterKey(tail, key)
	completion := 0
	if n := u.completion(); n != nil {
		completion = *n
	}
	return completion, u.engine()
}
