package httpadmin

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvselect/kvselect/internal/tracing"
	"github.com/kvselect/kvselect/selection"
)

// untraced are the routes too frequent and too plain to trace: probes,
// scrapes and the status page's assets and polls.
var untraced = map[string]bool{
	"GET /health": true, "GET /ready": true, "GET /metrics": true, "GET /ui/": true, "GET /ui/api/status": true,
}

// traced serves r under a server span named by its route, continuing the
// caller's traceparent; only with tracing on.
func (s *server) traced(w http.ResponseWriter, r *http.Request, pattern string, next func(http.ResponseWriter, *http.Request)) {
	t := s.tracing
	if !t.Enabled || untraced[pattern] {
		next(w, r)
		return
	}
	ctx := t.Propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := t.Tracer.Start(ctx, pattern, trace.WithSpanKind(trace.SpanKindServer))
	defer span.End()
	rec := &statusRecorder{ResponseWriter: w}
	next(rec, r.WithContext(ctx))
	if span.IsRecording() {
		span.SetAttributes(attribute.String("http.request.method", r.Method), attribute.String("http.route", pattern),
			attribute.Int("http.response.status_code", rec.status()), attribute.String("kvselect.front", "rest"))
		if rec.status() >= 500 {
			span.SetStatus(codes.Error, http.StatusText(rec.status()))
		}
	}
}

// statusRecorder notes the status a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

func (r *statusRecorder) status() int {
	if r.code == 0 {
		return http.StatusOK
	}
	return r.code
}

// Unwrap lets http.ResponseController reach the connection.
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// span starts a child span of the request's when tracing is on; off, it is
// the context's no-op span, allocating nothing.
func (s *server) span(ctx context.Context, name string) (context.Context, trace.Span) {
	if !s.tracing.Enabled {
		return ctx, trace.SpanFromContext(ctx)
	}
	return s.tracing.Tracer.Start(ctx, name)
}

// selected ends a selection span with the decision or the error.
func selected(span trace.Span, resp *selection.SelectResponse, err error) {
	if span.IsRecording() {
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		} else {
			span.SetAttributes(tracing.SelectionAttributes(resp)...)
		}
	}
	span.End()
}

// lifecycle puts a booking event on the request's span.
func lifecycle(r *http.Request, event string, attrs ...attribute.KeyValue) {
	span := trace.SpanFromContext(r.Context())
	if span.IsRecording() {
		span.AddEvent(event, trace.WithAttributes(append(attrs, attribute.String("kvselect.selection_id", r.PathValue("reservation_id")))...))
	}
}
