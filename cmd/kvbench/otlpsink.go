package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/kvselect/kvselect/internal/tracing/otlptest"
)

// kvbench otlp-sink: an OTLP trace receiver (gRPC and HTTP) that counts the
// spans it is sent and keeps none, for measuring what tracing costs kvselect
// with a real exporter at the other end (bench/tracing-overhead.sh).
func runOTLPSink(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvbench otlp-sink", flag.ContinueOnError)
	fs.SetOutput(stderr)
	grpcAddr := fs.String("grpc", "127.0.0.1:4317", "`address` of the OTLP gRPC endpoint")
	httpAddr := fs.String("http", "127.0.0.1:4318", "`address` of the OTLP HTTP endpoint")
	every := fs.Duration("report-every", 0, "print the span count this often (0: only at exit)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	r, stop, err := otlptest.Listen(*grpcAddr, *httpAddr, true)
	if err != nil {
		return err
	}
	defer stop()
	fmt.Fprintf(stderr, "otlp-sink: gRPC %s, HTTP %s/v1/traces\n", r.GRPC, r.HTTP)
	var tick <-chan time.Time
	if *every > 0 {
		t := time.NewTicker(*every)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintf(stdout, "spans %d\n", r.Count())
			return nil
		case <-tick:
			fmt.Fprintf(stdout, "spans %d\n", r.Count())
		}
	}
}
