package extproc_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/kvselect/kvselect/extproc"
	"github.com/kvselect/kvselect/internal/tracing"
	"github.com/kvselect/kvselect/internal/tracing/otlptest"
	"github.com/kvselect/kvselect/selection/catalog"
)

// BenchmarkRequest is one whole request through the picker over loopback
// gRPC, as `kvbench extproc` drives it: headers + ~4 KB body
// (FULL_DUPLEX_STREAMED), the decision, response headers, 20 streamed chunks,
// Envoy's close. Parallel callers (-cpu, SetParallelism) share one
// connection; the envoysim client runs in the same process, so ns/op is the
// client's and the server's CPU together. KV events are on (production's
// default): token prompts are looked up, not recorded; text prompts are
// recorded in the text index, as always.
func BenchmarkRequest(b *testing.B) {
	for _, form := range []string{"tokens", "text", "tokens-long"} {
		b.Run(form, func(b *testing.B) {
			requests(b, benchPicker(b, extproc.Options{}), benchBodies(form))
		})
	}
}

// BenchmarkTracing is BenchmarkRequest's token form with tracing off, on
// with every trace sampled out (ratio 0), and on with every trace sampled:
// its spans exported over OTLP gRPC to a receiver in this process (which
// unmarshals them, so this is an upper bound of what sampling costs the
// picker), or batched and then dropped by an exporter that does nothing
// (the picker's own share: spans, attributes, events, batching).
func BenchmarkTracing(b *testing.B) {
	bodies := benchBodies("tokens")
	for _, mode := range []string{"off", "sampled-0", "sampled-1", "sampled-1-noexport"} {
		b.Run(mode, func(b *testing.B) {
			opts := extproc.Options{}
			switch mode {
			case "sampled-1-noexport":
				tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardExporter{}))
				defer tp.Shutdown(context.Background())
				opts.Tracing = tracing.New(tp)
			case "sampled-0", "sampled-1":
				rcv, stop, err := otlptest.Listen("127.0.0.1:0", "127.0.0.1:0", true)
				if err != nil {
					b.Fatal(err)
				}
				defer stop()
				sampler := map[string]string{"sampled-0": "traceidratio", "sampled-1": "always_on"}[mode]
				env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + rcv.GRPC, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
					"OTEL_TRACES_SAMPLER": sampler, "OTEL_TRACES_SAMPLER_ARG": "0"}
				tr, err := tracing.FromEnv(context.Background(), func(k string) (string, bool) { v, ok := env[k]; return v, ok }, "bench")
				if err != nil {
					b.Fatal(err)
				}
				defer tr.Shutdown(context.Background())
				opts.Tracing = tr
			}
			requests(b, benchPicker(b, opts), bodies)
		})
	}
}

// discardExporter drops every batch.
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

// benchPicker is a picker over 64 workers with KV events on.
func benchPicker(b *testing.B, opts extproc.Options) *harness {
	ws := make([]catalog.Record, 64)
	for i := range ws {
		ws[i] = worker(uint64(i+1), fmt.Sprintf("10.1.%d.%d:8000", i/250, i%250+1))
	}
	return start(b, setup{workers: ws, kvEvents: true, opts: opts})
}

// benchBodies are 64 request bodies of ~4 KB: token prompts or chat text,
// eight prefixes; tokens-long are token prompts of 7,200 ids (~50 KB), the
// length of the suite's shared-prefix workload (a 6,000-token system prompt
// and a 1,200-token question).
func benchBodies(form string) [][]byte {
	bodies := make([][]byte, 64)
	for i := range bodies {
		if form == "tokens" || form == "tokens-long" {
			var sb strings.Builder
			fmt.Fprintf(&sb, `{"model":%q,"stream":true,"prompt":[`, model)
			for j := 0; (form == "tokens" && sb.Len() < 4090) || (form == "tokens-long" && j < 7200); j++ {
				if j > 0 {
					sb.WriteByte(',')
				}
				fmt.Fprintf(&sb, "%d", (i%8)*100000+j)
			}
			sb.WriteString("]}")
			bodies[i] = []byte(sb.String())
		} else {
			bodies[i] = chatBody(fmt.Sprintf("system %d ", i%8)+strings.Repeat("word ", 800), true)
		}
	}
	return bodies
}

// requests runs whole requests through the picker, 64 streams on 2 procs.
func requests(b *testing.B, h *harness, bodies [][]byte) {
	chunks := sseChunks(19) // 19 tokens + [DONE] = 20 chunks
	var n atomic.Uint64
	b.SetParallelism(32)
	b.ReportAllocs()
	cpu0 := processCPU()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			streamRequest(b, h, bodies[i%64], chunks)
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
	// The process's CPU time per request (client and picker together): on a
	// shared machine steadier than the wall time, which counts the waits for
	// a CPU.
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
}

// processCPU is the process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
