package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kvselect/kvselect/bench/benchflag"
	"github.com/kvselect/kvselect/bench/extprocload"
	"github.com/kvselect/kvselect/bench/fleet"
	"github.com/kvselect/kvselect/bench/kvtarget"
	"github.com/kvselect/kvselect/bench/mooncake"
	"github.com/kvselect/kvselect/bench/report"
	"github.com/kvselect/kvselect/bench/restload"
	"github.com/kvselect/kvselect/internal/tracing/otlptest"
)

// indexCmd is `kvbench index`: a Mooncake trace replayed through a mock
// engine per worker into kvselect's KV index (bench/kvtarget), every lookup
// and the event application timed.
func indexCmd(fs *flag.FlagSet, _ []string) func(context.Context, io.Writer, io.Writer) error {
	var m mooncake.Flags
	m.Register(fs, mooncake.DefaultTrace)
	noReserve := fs.Bool("no-reserve", false, "do not pre-size kvselect's per-worker tables from the engines' capacity (the service does, from total_kv_blocks)")
	var prof benchflag.CPUProfile
	prof.Register(fs)
	var files report.Files
	files.Register(fs)
	return func(ctx context.Context, stdout, stderr io.Writer) error {
		fmt.Fprintf(stderr, "preparing the workload (%d mock engines)...\n", m.Config.Workers)
		w, err := m.Prepare()
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		kv, err := kvtarget.New(512)
		if err != nil {
			return err
		}
		if !*noReserve {
			kv.Reserve(w.Config().Workers, w.Config().BlocksPerWorker)
		}
		stop, err := prof.Start()
		if err != nil {
			return err
		}
		res := w.Run(kv)
		stop()
		if kv.Errors() > 0 {
			return fmt.Errorf("the index rejected %d events of a well-formed replay", kv.Errors())
		}
		st := kv.Index().Stats()
		fmt.Fprintf(stdout, "Mooncake replay: %s\n", m.Trace)
		fmt.Fprintf(stdout, "%d workers x %d blocks, %s placement, duplication %d; index now %d entries in %d nodes\n\n",
			res.Config.Workers, res.Config.BlocksPerWorker, res.Config.Assign, res.Config.TraceDuplication, st.Entries, st.Nodes)
		if err := report.Table(stdout, res); err != nil {
			return err
		}
		return files.Write(map[string]any{"results": []mooncake.Result{res}, "index": st}, "kvbench index: "+m.Trace,
			func() []report.Chart { return report.ReplayCharts(res) })
	}
}

// restCmd is `kvbench rest` (bench/restload).
func restCmd(fs *flag.FlagSet, _ []string) func(context.Context, io.Writer, io.Writer) error {
	c := restload.Defaults()
	fs.StringVar(&c.URL, "url", "", "base URL of a kvselect REST server on loopback (empty: start one in this process on 127.0.0.1)")
	fs.IntVar(&c.Clients, "clients", c.Clients, "concurrent keep-alive connections, one goroutine each (closed loop)")
	loadFlags(fs, &c.Workers, &c.Duration, &c.Warmup)
	fs.StringVar(&c.Prompt, "prompt", c.Prompt, "prompt form: tokens (token_ids) or hashes (block_hashes + sequence_hashes + isl_tokens)")
	fs.IntVar(&c.Blocks, "blocks", c.Blocks, "prompt size in 16-token blocks")
	c.Files.Register(fs)
	auth := fs.String("auth", "off", "comma-separated server `modes` measured in turn in one run (in-process server only): off (no authentication), token (a bearer token checked against a token file), tls (HTTPS, a self-signed certificate, keep-alive), tls+token")
	fs.IntVar(&c.Rounds, "rounds", c.Rounds, "times the -auth list is run, alternating modes so that drift on a shared machine hits each alike")
	fs.StringVar(&c.Token, "token", "", "bearer `token` sent to a -url server")
	return func(ctx context.Context, stdout, stderr io.Writer) error {
		c.Auth = strings.Split(*auth, ",")
		_, err := restload.Run(ctx, c, stdout, stderr)
		return err
	}
}

// extprocCmd is `kvbench extproc` (bench/extprocload).
func extprocCmd(fs *flag.FlagSet, _ []string) func(context.Context, io.Writer, io.Writer) error {
	c := extprocload.Defaults()
	fs.StringVar(&c.Front, "front", c.Front, "front to drive: extproc (gRPC ext_proc via envoysim) or rest (the same lifecycle over the REST API)")
	fs.IntVar(&c.Streams, "streams", c.Streams, "concurrent requests (one goroutine each)")
	loadFlags(fs, &c.Workers, &c.Duration, &c.Warmup)
	fs.IntVar(&c.Body, "body", c.Body, "request body size in bytes")
	fs.IntVar(&c.Chunks, "chunks", c.Chunks, "streamed response chunks (one token each)")
	fs.StringVar(&c.Prompt, "prompt", c.Prompt, "prompt form: tokens (completions prompt as token ids) or text (chat messages; ext_proc only)")
	fs.Float64Var(&c.Rate, "rate", c.Rate, "open-loop arrival rate in requests/s over all streams (0 = closed loop: each stream starts its next request at once)")
	fs.BoolVar(&c.KVEvents, "kv-events", c.KVEvents, "run the service with KV events on (the default; no engine publishes, so token prompts find no cache) instead of the approximate index that records every pick")
	fs.BoolVar(&c.PlainGRPC, "plain-grpc", false, "serve ext_proc with grpc.NewServer's defaults instead of extproc.ServerOptions (stream workers)")
	fs.StringVar(&c.URL, "url", "", "REST base URL of an external kvselect on loopback (workers are registered there; its /metrics gives the server's own CPU per request); empty: run the server in this process")
	fs.StringVar(&c.Addr, "addr", "", "ext_proc host:port of the external kvselect (with -url)")
	server := fleet.KVSelectConfig{Name: "extproc-kvselect", Dir: os.TempDir()}
	fs.StringVar(&server.Binary, "kvselect", "", "kvselect `binary` to start on loopback and measure as the external server (instead of -url and -addr)")
	cpu := fs.Int("kvselect-cpu", -1, "pin the started kvselect to this `CPU` (taskset); -1: not pinned")
	env := fs.String("kvselect-env", "", "VAR=value `words` added to the started kvselect's environment")
	c.Files.Register(fs)
	var prof benchflag.CPUProfile
	prof.Register(fs)
	return func(ctx context.Context, stdout, stderr io.Writer) error {
		if server.Binary != "" {
			if *cpu >= 0 {
				server.Wrap = []string{"taskset", "-c", strconv.Itoa(*cpu)}
			}
			if c.JSON != "" {
				server.Dir = filepath.Dir(c.JSON) // its log beside the report
			}
			server.Env, c.Server = strings.Fields(*env), &server
		}
		stop, err := prof.Start()
		if err != nil {
			return err
		}
		defer stop()
		_, err = extprocload.Run(ctx, c, stdout, stderr)
		return err
	}
}

// loadFlags are what rest and extproc share: the workers they register on
// the server, the measured time and the warmup.
func loadFlags(fs *flag.FlagSet, workers *int, measured, warmup *time.Duration) {
	fs.IntVar(workers, "workers", *workers, "workers to register (POST /workers, model \"bench\", block_size 16)")
	fs.DurationVar(measured, "duration", *measured, "measured time after the warmup")
	fs.DurationVar(warmup, "warmup", *warmup, "unmeasured time before the measurement")
}

// otlpSinkCmd is `kvbench otlp-sink`: an OTLP trace receiver (gRPC and HTTP)
// that counts the spans it is sent and keeps none, for measuring what
// tracing costs kvselect with a real exporter at the other end
// (bench/tracing-overhead.sh).
func otlpSinkCmd(fs *flag.FlagSet, _ []string) func(context.Context, io.Writer, io.Writer) error {
	grpcAddr := fs.String("grpc", "127.0.0.1:4317", "`address` of the OTLP gRPC endpoint")
	httpAddr := fs.String("http", "127.0.0.1:4318", "`address` of the OTLP HTTP endpoint")
	every := fs.Duration("report-every", 0, "print the span count this often (0: only at exit)")
	return func(ctx context.Context, stdout, stderr io.Writer) error {
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
}
