// Package tracing sets up OpenTelemetry tracing from the standard OTEL_*
// environment variables and carries W3C trace context through the headers
// the fronts see.
//
// Tracing is off unless an exporter is configured: OTEL_TRACES_EXPORTER=otlp,
// or an OTLP endpoint (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or
// OTEL_EXPORTER_OTLP_ENDPOINT). Off, the provider is OpenTelemetry's no-op
// one: a span costs a context lookup and no allocation. On, the exporter
// reads the rest of the OTLP variables from the process environment itself
// (headers, TLS, timeout, compression); OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL picks grpc or
// http/protobuf (the default, as the OpenTelemetry specification
// recommends); OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG choose the
// sampler (parentbased_always_on by default); OTEL_SERVICE_NAME
// and OTEL_RESOURCE_ATTRIBUTES describe the process; OTEL_SDK_DISABLED=true
// turns it all off.
package tracing

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// InstrumentationName names kvselect's tracer.
const InstrumentationName = "github.com/kvselect/kvselect"

// Tracing is the process's tracer and how trace context crosses its fronts.
type Tracing struct {
	// Tracer starts kvselect's spans; a no-op tracer when tracing is off.
	Tracer trace.Tracer
	// Propagator reads and writes W3C traceparent/tracestate and baggage.
	Propagator propagation.TextMapPropagator
	// Enabled says an exporter is configured.
	Enabled bool
	// Protocol is the exporter's: "grpc" or "http/protobuf" ("" when off).
	Protocol string

	shutdown func(context.Context) error
}

// Off is tracing switched off: no-op spans, trace context still propagated.
func Off() *Tracing {
	return &Tracing{Tracer: noop.NewTracerProvider().Tracer(InstrumentationName), Propagator: propagator(),
		shutdown: func(context.Context) error { return nil }}
}

// New is tracing for a provider the caller built (tests use an in-memory
// exporter this way).
func New(tp trace.TracerProvider) *Tracing {
	t := Off()
	t.Tracer, t.Enabled = tp.Tracer(InstrumentationName), true
	return t
}

func propagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

// Shutdown flushes the spans still buffered and stops the exporter.
func (t *Tracing) Shutdown(ctx context.Context) error { return t.shutdown(ctx) }

// FromEnv configures tracing from the OTEL_* variables lookup returns (the
// process environment in production). The exporter connects lazily: an
// unreachable collector costs dropped spans, not a failed start.
func FromEnv(ctx context.Context, lookup func(string) (string, bool), version string) (*Tracing, error) {
	get := func(k string) string {
		v, _ := lookup(k)
		return strings.TrimSpace(v)
	}
	if strings.EqualFold(get("OTEL_SDK_DISABLED"), "true") {
		return Off(), nil
	}
	switch exp := strings.ToLower(get("OTEL_TRACES_EXPORTER")); exp {
	case "none":
		return Off(), nil
	case "", "otlp":
		if exp == "" && get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" && get("OTEL_EXPORTER_OTLP_ENDPOINT") == "" {
			return Off(), nil
		}
	default:
		return nil, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: kvselect exports traces with otlp or none", exp)
	}
	protocol := strings.ToLower(cmp.Or(get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), get("OTEL_EXPORTER_OTLP_PROTOCOL"), "http/protobuf"))
	sampler, err := samplerFrom(get("OTEL_TRACES_SAMPLER"), get("OTEL_TRACES_SAMPLER_ARG"))
	if err != nil {
		return nil, err
	}
	// The endpoint is read here, from lookup, so that what decided tracing
	// is on also says where spans go; the signal-specific variable is a
	// whole URL, the general one a base the HTTP exporter appends
	// /v1/traces to (the OTLP exporter specification).
	endpoint := get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	var client otlptrace.Client
	switch protocol {
	case "grpc":
		var opts []otlptracegrpc.Option
		if endpoint = cmp.Or(endpoint, get("OTEL_EXPORTER_OTLP_ENDPOINT")); endpoint != "" {
			opts = append(opts, otlptracegrpc.WithEndpointURL(endpoint))
		}
		client = otlptracegrpc.NewClient(opts...)
	case "http/protobuf":
		var opts []otlptracehttp.Option
		if endpoint == "" && get("OTEL_EXPORTER_OTLP_ENDPOINT") != "" {
			endpoint = strings.TrimRight(get("OTEL_EXPORTER_OTLP_ENDPOINT"), "/") + "/v1/traces"
		}
		if endpoint != "" {
			opts = append(opts, otlptracehttp.WithEndpointURL(endpoint))
		}
		client = otlptracehttp.NewClient(opts...)
	default:
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%q: want grpc or http/protobuf", protocol)
	}
	exp, err := otlptrace.New(ctx, client)
	if err != nil {
		return nil, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	res, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK(),
		resource.WithAttributes(semconv.ServiceVersion(version)))
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	if _, ok := lookup("OTEL_SERVICE_NAME"); !ok && !hasServiceName(get("OTEL_RESOURCE_ATTRIBUTES")) {
		res, _ = resource.Merge(res, resource.NewSchemaless(semconv.ServiceName("kvselect")))
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res), sdktrace.WithSampler(sampler))
	t := New(tp)
	t.Protocol, t.shutdown = protocol, tp.Shutdown
	return t, nil
}

// samplerFrom is OTEL_TRACES_SAMPLER and its argument, as the OpenTelemetry
// SDK environment specification defines them; parentbased_always_on when
// unset.
func samplerFrom(name, arg string) (sdktrace.Sampler, error) {
	ratio := 1.0
	if arg != "" && strings.HasSuffix(name, "traceidratio") {
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || r < 0 || r > 1 {
			return nil, fmt.Errorf("OTEL_TRACES_SAMPLER_ARG=%q: want a ratio from 0 to 1", arg)
		}
		ratio = r
	}
	switch strings.ToLower(name) {
	case "", "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "traceidratio":
		return sdktrace.TraceIDRatioBased(ratio), nil
	case "parentbased_traceidratio":
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio)), nil
	}
	return nil, fmt.Errorf("OTEL_TRACES_SAMPLER=%q: want always_on, always_off, traceidratio or their parentbased_ forms", name)
}

func hasServiceName(attrs string) bool {
	for kv := range strings.SplitSeq(attrs, ",") {
		if k, _, ok := strings.Cut(kv, "="); ok && strings.TrimSpace(k) == "service.name" {
			return true
		}
	}
	return false
}
