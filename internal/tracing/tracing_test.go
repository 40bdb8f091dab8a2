package tracing_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/kvselect/kvselect/internal/tracing"
	"github.com/kvselect/kvselect/internal/tracing/otlptest"
)

func env(kv map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := kv[k]; return v, ok }
}

// TestExportsOverOTLP: spans reach a real OTLP receiver over both
// protocols, as a tree, under the configured service name.
func TestExportsOverOTLP(t *testing.T) {
	rcv := otlptest.Start(t)
	for _, tc := range []struct {
		name string
		env  map[string]string
	}{
		{"grpc", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + rcv.GRPC, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}},
		{"http/protobuf general endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": rcv.HTTP}},
		{"http/protobuf traces endpoint", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": rcv.HTTP + "/v1/traces",
			"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := tracing.FromEnv(t.Context(), env(tc.env), "test")
			if err != nil {
				t.Fatal(err)
			}
			if !tr.Enabled {
				t.Fatal("tracing off with an OTLP endpoint configured")
			}
			ctx, parent := tr.Tracer.Start(t.Context(), "parent "+tc.name)
			_, child := tr.Tracer.Start(ctx, "child "+tc.name)
			child.End()
			parent.End()
			if err := tr.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			spans := rcv.Wait(t, 10*time.Second, "both spans", func(s []otlptest.Span) bool {
				by := otlptest.ByName(s)
				_, p := by["parent "+tc.name]
				_, c := by["child "+tc.name]
				return p && c
			})
			by := otlptest.ByName(spans)
			p, c := by["parent "+tc.name], by["child "+tc.name]
			if c.ParentSpanID != p.SpanID || c.TraceID != p.TraceID {
				t.Errorf("child %s/%s not under parent %s/%s", c.TraceID, c.ParentSpanID, p.TraceID, p.SpanID)
			}
			if p.Service != "kvselect" || p.ScopeName != tracing.InstrumentationName {
				t.Errorf("service %q scope %q, want kvselect and %s", p.Service, p.ScopeName, tracing.InstrumentationName)
			}
		})
	}
}

func TestOffUnlessAnExporterIsConfigured(t *testing.T) {
	for _, kv := range []map[string]string{
		{},
		{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"},
		{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"},
		{"OTEL_TRACES_SAMPLER": "always_on"},
	} {
		tr, err := tracing.FromEnv(t.Context(), env(kv), "test")
		if err != nil {
			t.Fatalf("%v: %v", kv, err)
		}
		if tr.Enabled {
			t.Errorf("%v: tracing on", kv)
		}
		if _, span := tr.Tracer.Start(t.Context(), "x"); span.IsRecording() {
			t.Errorf("%v: spans record with tracing off", kv)
		}
	}
}

func TestBadSettingsAreErrors(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		frag string
	}{
		{map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, "OTEL_TRACES_SAMPLER_ARG"},
	} {
		_, err := tracing.FromEnv(t.Context(), env(tc.env), "test")
		if err == nil || !strings.Contains(err.Error(), tc.frag) {
			t.Errorf("%v: err %v, want one naming %s", tc.env, err, tc.frag)
		}
	}
}

// TestSamplerFromTheEnvironment: a ratio of 0 samples nothing, yet the span
// context still carries a trace to propagate; parent-based sampling follows
// a sampled parent.
func TestSamplerFromTheEnvironment(t *testing.T) {
	base := map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}
	with := func(kv map[string]string) *tracing.Tracing {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for k, v := range kv {
			m[k] = v
		}
		tr, err := tracing.FromEnv(t.Context(), env(m), "test")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
		return tr
	}
	off := with(map[string]string{"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"})
	_, span := off.Tracer.Start(t.Context(), "x")
	if span.IsRecording() || !span.SpanContext().IsValid() || span.SpanContext().IsSampled() {
		t.Errorf("ratio 0: recording %v, valid %v, sampled %v", span.IsRecording(), span.SpanContext().IsValid(), span.SpanContext().IsSampled())
	}
	pb := with(map[string]string{"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"})
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	parent := trace.ContextWithRemoteSpanContext(t.Context(), trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true}))
	if _, span := pb.Tracer.Start(parent, "x"); !span.IsRecording() {
		t.Error("parentbased_traceidratio=0 did not follow a sampled parent")
	}
}
