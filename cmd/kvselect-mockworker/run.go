package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/kvselect/kvselect/mockworker"
	"github.com/kvselect/kvselect/mockworker/kvpublish"
)

// usageError marks errors caused by the command line (exit status 2).
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

const helpIntro = `kvselect-mockworker: a simulated vLLM-like engine for demos, tests and benchmarks
without GPUs.

Usage:
  kvselect-mockworker [flags]

Serves POST /v1/completions and /v1/chat/completions (streaming or not),
POST /tokenize (vLLM's: prompt or chat messages), GET /v1/models, /health and
/metrics (vLLM metric names) and POST /reset_prefix_cache on --host:--port. Each data-parallel rank has a pool of
--num-gpu-blocks KV blocks with prefix caching and LRU eviction, and publishes
vLLM-format KV events on ZMQ (PUB, plus a ROUTER replay ring), binding its PUB
sockets or, with --kv-events-connect, dialing a collector. Text prompts are
tokenized one token per whitespace-separated word. With --register the worker
announces itself to a kvselect REST API and deletes itself on SIGINT/SIGTERM.
A request carrying --prefiller-header (x-prefiller-host-port) is prefilled on
the named worker first and decoded here with the KV pulled from it, as llm-d's
routing sidecar and vLLM's NIXL connector do (--role prefill|decode).
See docs/mockworker.md.

Flags:
`

type options struct {
	host, advertiseHost   string
	port                  uint
	cfg                   mockworker.Config
	workerID              uint64
	kvEvents, kvReplay    bool
	eventsEP, replayEP    string
	collector             string
	eventFormat           string
	register              string
	routingGroup          string
	registerTimeout       time.Duration
	shutdownTimeout       time.Duration
	logLevel, logFormat   string
	workerIDSet, helpFlag bool
}

func newFlagSet(o *options) *flag.FlagSet {
	fs := flag.NewFlagSet("kvselect-mockworker", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c := &o.cfg
	fs.StringVar(&o.host, "host", "127.0.0.1", "address to serve HTTP on (and to bind KV event sockets on by default)")
	fs.UintVar(&o.port, "port", 8000, "HTTP port (0 picks a free port)")
	fs.StringVar(&o.advertiseHost, "advertise-host", "", "host other processes reach this worker at, for --register (default: --host, or 127.0.0.1 when --host is a wildcard)")
	fs.StringVar(&c.Model, "model", mockworker.DefaultModel, "served model name")
	fs.Uint64Var(&o.workerID, "worker-id", 0, "worker id to register under (default: derived from the advertised HTTP endpoint)")
	fs.IntVar(&c.BlockSize, "block-size", mockworker.DefaultBlockSize, "tokens per KV block")
	fs.IntVar(&c.NumBlocks, "num-gpu-blocks", mockworker.DefaultNumBlocks, "KV blocks per data-parallel rank")
	fs.IntVar(&c.DPSize, "data-parallel-size", 1, "number of data-parallel ranks, each with its own block pool and KV event sockets")
	fs.IntVar(&c.DPStartRank, "data-parallel-start-rank", 0, "global rank of the first data-parallel rank")
	fs.IntVar(&c.MaxNumSeqs, "max-num-seqs", mockworker.DefaultMaxNumSeqs, "requests a rank runs at once; the rest wait in FIFO order")
	fs.IntVar(&c.MaxNumBatchedTokens, "max-num-batched-tokens", mockworker.DefaultMaxNumBatchedTokens, "advertised to kvselect (max_num_batched_tokens); with --prefill-stalls-decode also the prefill chunk size")
	fs.IntVar(&c.MaxModelLen, "max-model-len", mockworker.DefaultMaxModelLen, "maximum prompt plus output tokens of a request")
	fs.IntVar(&c.VocabSize, "vocab-size", mockworker.DefaultVocabSize, "token ids are below this")
	fs.DurationVar(&c.PrefillPerToken, "prefill-time-per-token", mockworker.DefaultPrefillPerToken, "prefill time per prompt token not found in the prefix cache")
	fs.DurationVar(&c.DecodePerToken, "decode-time-per-token", mockworker.DefaultDecodePerToken, "time per output token of a sequence running alone")
	fs.Float64Var(&c.DecodeBatchSlowdown, "decode-batch-slowdown", mockworker.DefaultDecodeBatchSlowdown, "decode time grows by this fraction per additional running sequence")
	fs.Float64Var(&c.Speedup, "speedup", 1, "divide every simulated duration by this factor")
	fs.IntVar(&c.PrefillSlots, "prefill-slots", 0, "prefills a rank computes at once, the rest wait (1: prefill throughput shared like one GPU's; 0: unlimited)")
	fs.StringVar(&c.Role, "role", mockworker.RoleBoth, "part in disaggregated prefill/decode serving: both (whole requests), prefill (the prefill stage of disaggregated requests; refuses requests naming a prefill worker; kvselect puts it in its prefill routing group) or decode (prefills remotely when a request names its prefill worker); registered as the worker's role")
	fs.StringVar(&c.PrefillerHeader, "prefiller-header", mockworker.DefaultPrefillerHeader, "request header naming the prefill worker (host:port) of a disaggregated request, as llm-d's routing sidecar reads it: the worker has it prefill the prompt (max_tokens 1, kv_transfer_params do_remote_decode), then decodes with the returned kv_transfer_params")
	fs.DurationVar(&c.KVTransferPerBlock, "kv-transfer-per-block", mockworker.DefaultKVTransferPerBlock, "time to pull one KV block of a remotely prefilled prompt from the prefill worker (blocks cached here are not pulled); divided by --speedup")
	fs.DurationVar(&c.PrefillTimeout, "prefill-timeout", mockworker.DefaultPrefillTimeout, "how long a decode worker waits for its prefill worker's answer (a failure answers 502)")
	fs.BoolVar(&c.PrefillStallsDecode, "prefill-stalls-decode", false, "chunked prefill shares engine steps with decoding: prefills run in chunks of --max-num-batched-tokens and no running sequence of the rank gets a token during a chunk (what makes a long prompt raise inter-token latency, and disaggregation worth it)")
	fs.Float64Var(&c.Faults.FailRate, "fail-rate", 0, "fraction (0..1) of completions/chat requests answered 500 with an OpenAI error body (POST /admin/faults changes it at run time)")
	fs.BoolVar(&c.Faults.Hang, "hang", false, "accept completions/chat requests and never answer them until the client goes away")
	fs.DurationVar(&c.Faults.HangAfter, "hang-after", 0, "start hanging this long after start (implies --hang from then on)")
	fs.BoolVar(&c.Faults.FailHealth, "fail-health", false, "answer GET /health with 503 (otherwise /health stays 200 under the other faults, as vLLM's does)")
	fs.Uint64Var(&c.FaultSeed, "fault-seed", 0, "seeds which requests --fail-rate fails (with the worker id)")
	fs.BoolVar(&o.kvEvents, "kv-events", true, "publish KV events on ZMQ")
	fs.StringVar(&o.eventsEP, "kv-events-endpoint", "", "PUB endpoint of rank 0, vLLM style; rank i uses port+i, port 0 a free port per rank (default tcp://HOST:0)")
	fs.StringVar(&o.collector, "kv-events-connect", "", "KV events collector every rank's PUB socket dials instead of binding one, tcp://HOST:PORT (llm-d's topology: kvselect --kv-events-bind, or llm-d's endpoint picker); excludes --kv-events-endpoint; the topic defaults to kv@<advertised host>:<http port>@<model>")
	fs.BoolVar(&o.kvReplay, "kv-replay", true, "serve the replay ring on a ROUTER socket")
	fs.StringVar(&o.replayEP, "kv-replay-endpoint", "", "ROUTER replay endpoint of rank 0, offset like --kv-events-endpoint (default tcp://HOST:0)")
	fs.StringVar(&c.EventsTopic, "kv-events-topic", "", "topic frame of KV event messages (default: none when binding, kv@<advertised host>:<http port>@<model> with --kv-events-connect)")
	fs.StringVar(&o.eventFormat, "kv-events-format", "map", "event encoding: map (vLLM v0.26+) or positional (earlier vLLM, SGLang)")
	fs.IntVar(&c.ReplayRing, "kv-replay-buffer", kvpublish.DefaultRingSize, "batches each rank keeps for replay (vLLM buffer_steps)")
	fs.StringVar(&o.register, "register", "", "kvselect REST base URL to register with (POST /workers), e.g. http://127.0.0.1:8092")
	fs.StringVar(&o.routingGroup, "routing-group", "", "routing group to register in (kvselect's default when empty)")
	fs.DurationVar(&o.registerTimeout, "register-timeout", time.Minute, "how long to retry registration while kvselect is not reachable")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 5*time.Second, "time in-flight requests get to finish on SIGINT/SIGTERM")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.logFormat, "log-format", "text", "text or json")
	fs.BoolVar(&o.helpFlag, "help", false, "print this help")
	return fs
}

func writeHelp(w io.Writer) {
	var o options
	fs := newFlagSet(&o)
	fs.SetOutput(w)
	fmt.Fprint(w, helpIntro)
	fs.PrintDefaults()
}

func parse(args []string) (*options, error) {
	o := &options{}
	fs := newFlagSet(o)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			o.helpFlag = true
			return o, nil
		}
		return nil, &usageError{err}
	}
	if fs.NArg() > 0 {
		return nil, &usageError{fmt.Errorf("unexpected arguments %q", fs.Args())}
	}
	fs.Visit(func(f *flag.Flag) { o.workerIDSet = o.workerIDSet || f.Name == "worker-id" })
	if o.port > 65535 {
		return nil, &usageError{fmt.Errorf("--port %d is out of range", o.port)}
	}
	// The library reads zero as "default"; on the command line a zero is a
	// mistake worth saying so.
	c := &o.cfg
	for _, f := range []struct {
		name string
		v    int
	}{{"block-size", c.BlockSize}, {"num-gpu-blocks", c.NumBlocks}, {"data-parallel-size", c.DPSize},
		{"max-num-seqs", c.MaxNumSeqs}, {"max-num-batched-tokens", c.MaxNumBatchedTokens},
		{"max-model-len", c.MaxModelLen}, {"vocab-size", c.VocabSize}, {"kv-replay-buffer", c.ReplayRing}} {
		if f.v <= 0 {
			return nil, &usageError{fmt.Errorf("--%s must be positive, got %d", f.name, f.v)}
		}
	}
	if !(c.Faults.FailRate >= 0 && c.Faults.FailRate <= 1) {
		return nil, &usageError{fmt.Errorf("--fail-rate must be in [0, 1], got %v", c.Faults.FailRate)}
	}
	if !(c.Speedup > 0) {
		return nil, &usageError{fmt.Errorf("--speedup must be positive, got %v", c.Speedup)}
	}
	switch c.Role {
	case mockworker.RoleBoth, mockworker.RolePrefill, mockworker.RoleDecode:
	default:
		return nil, &usageError{fmt.Errorf("--role %q: want both, prefill or decode", c.Role)}
	}
	if c.KVTransferPerBlock < 0 {
		return nil, &usageError{fmt.Errorf("--kv-transfer-per-block must not be negative, got %v", c.KVTransferPerBlock)}
	}
	if c.PrefillTimeout <= 0 {
		// The library reads 0 as its default; on the command line a decode
		// worker that never waits for its prefill worker is a mistake.
		return nil, &usageError{fmt.Errorf("--prefill-timeout must be positive, got %v", c.PrefillTimeout)}
	}
	if c.PrefillerHeader == "" {
		return nil, &usageError{errors.New("--prefiller-header must not be empty")}
	}
	switch o.eventFormat {
	case "map":
		o.cfg.EventShape = kvpublish.ShapeMap
	case "positional":
		o.cfg.EventShape = kvpublish.ShapePositional
	default:
		return nil, &usageError{fmt.Errorf("--kv-events-format %q: want map or positional", o.eventFormat)}
	}
	zmqHost := o.host
	if zmqHost == "" || zmqHost == "0.0.0.0" || zmqHost == "::" {
		zmqHost = "*"
	} else if strings.Contains(zmqHost, ":") {
		zmqHost = "[" + zmqHost + "]"
	}
	if o.collector != "" {
		switch {
		case !o.kvEvents:
			return nil, &usageError{errors.New("--kv-events-connect needs --kv-events")}
		case o.eventsEP != "":
			return nil, &usageError{errors.New("--kv-events-connect and --kv-events-endpoint exclude each other: the PUB socket dials a collector or binds, not both")}
		}
		if _, err := mockworker.OffsetEndpoint(o.collector, 0); err != nil {
			return nil, &usageError{fmt.Errorf("--kv-events-connect: %w", err)}
		}
	}
	if o.kvEvents {
		o.cfg.KVEventsEndpoint, o.cfg.KVEventsCollector = o.eventsEP, o.collector
		if o.cfg.KVEventsEndpoint == "" && o.collector == "" {
			o.cfg.KVEventsEndpoint = "tcp://" + zmqHost + ":0"
		}
		if o.kvReplay {
			o.cfg.ReplayEndpoint = o.replayEP
			if o.cfg.ReplayEndpoint == "" {
				o.cfg.ReplayEndpoint = "tcp://" + zmqHost + ":0"
			}
		}
	}
	if o.advertiseHost == "" {
		o.advertiseHost = o.host
		if ip := net.ParseIP(o.host); o.host == "" || (ip != nil && ip.IsUnspecified()) {
			o.advertiseHost = "127.0.0.1"
		}
	}
	if o.register != "" && !strings.HasPrefix(o.register, "http://") && !strings.HasPrefix(o.register, "https://") {
		return nil, &usageError{fmt.Errorf("--register %q: want an http:// or https:// URL", o.register)}
	}
	return o, nil
}

func newLogger(o *options, w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return nil, &usageError{fmt.Errorf("--log-level %q: %w", o.logLevel, err)}
	}
	ho := &slog.HandlerOptions{Level: level}
	switch o.logFormat {
	case "text":
		return slog.New(slog.NewTextHandler(w, ho)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, ho)), nil
	}
	return nil, &usageError{fmt.Errorf("--log-format %q: want text or json", o.logFormat)}
}

// run is the program. onListen, when set, is told the HTTP address once the
// worker serves (tests use it).
func run(ctx context.Context, args []string, stdout, stderr io.Writer, onListen func(addr string)) error {
	o, err := parse(args)
	if err != nil {
		return err
	}
	if o.helpFlag {
		writeHelp(stdout)
		return nil
	}
	log, err := newLogger(o, stderr)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(o.host, strconv.FormatUint(uint64(o.port), 10)))
	if err != nil {
		return err
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	endpoint := "http://" + net.JoinHostPort(o.advertiseHost, strconv.Itoa(port))
	o.cfg.WorkerID = o.workerID
	if !o.workerIDSet {
		// Stable across restarts at the same address, and below 2^53 so that
		// JSON clients in any language read it exactly.
		o.cfg.WorkerID = xxh3.HashString(endpoint) & (1<<53 - 1)
	}
	if o.cfg.KVEventsCollector != "" && o.cfg.EventsTopic == "" {
		// The collector knows this worker by the host:port it routes to.
		o.cfg.EventsTopic = mockworker.LLMDTopic(net.JoinHostPort(o.advertiseHost, strconv.Itoa(port)), o.cfg.Model)
	}
	// A prefill stage names this address (remote_host, remote_port) as where
	// its KV can be pulled from.
	o.cfg.AdvertiseAddr = net.JoinHostPort(o.advertiseHost, strconv.Itoa(port))
	o.cfg.Logger = log
	w, err := mockworker.New(o.cfg)
	if err != nil {
		return &usageError{err}
	}
	defer w.Close()
	if err := w.Start(ctx); err != nil {
		return err
	}
	cfg := w.Config()
	attrs := []any{"addr", ln.Addr().String(), "endpoint", endpoint, "model", cfg.Model, "worker_id", cfg.WorkerID,
		"dp_ranks", fmt.Sprintf("%d..%d", cfg.DPStartRank, cfg.DPStartRank+cfg.DPSize-1), "block_size", cfg.BlockSize,
		"num_gpu_blocks", cfg.NumBlocks, "speedup", cfg.Speedup}
	if cfg.KVEventsCollector != "" {
		attrs = append(attrs, "kv_events_collector", cfg.KVEventsCollector, "kv_events_topic", cfg.EventsTopic)
	}
	for _, e := range w.Endpoints() {
		if cfg.KVEventsCollector == "" {
			attrs = append(attrs, fmt.Sprintf("kv_events_rank_%d", e.DPRank), e.KVEvents)
		}
		if e.Replay != "" {
			attrs = append(attrs, fmt.Sprintf("kv_replay_rank_%d", e.DPRank), e.Replay)
		}
	}
	log.Info("mock worker listening", attrs...)

	srv := &http.Server{Handler: w.Handler(), ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	if onListen != nil {
		onListen(ln.Addr().String())
	}

	registered := false
	if o.register != "" {
		reg := w.Registration(endpoint, o.routingGroup, o.advertiseHost)
		if err := registerWithRetry(ctx, log, o.register, reg, o.registerTimeout); err != nil {
			shutdown(srv, o.shutdownTimeout)
			return err
		}
		registered = true
		log.Info("registered with kvselect", "url", o.register, "worker_id", reg.WorkerID)
	}

	select {
	case err = <-served:
	case <-ctx.Done():
	}
	if registered {
		// Leave the catalog first, so that kvselect stops routing here
		// before in-flight requests drain.
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if derr := mockworker.Deregister(dctx, nil, o.register, cfg.WorkerID); derr != nil {
			log.Warn("deregistration failed", "err", derr)
		} else {
			log.Info("deregistered from kvselect", "worker_id", cfg.WorkerID)
		}
		cancel()
	}
	shutdown(srv, o.shutdownTimeout)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

func shutdown(srv *http.Server, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if srv.Shutdown(ctx) != nil {
		srv.Close()
	}
}

// registerWithRetry registers, retrying with backoff while kvselect is not
// reachable yet (it may be starting beside the worker), until timeout. A
// rejection (an HTTP error status) is final.
func registerWithRetry(ctx context.Context, log *slog.Logger, url string, reg mockworker.Registration, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	delay := 100 * time.Millisecond
	for {
		err := mockworker.Register(ctx, nil, url, reg)
		if err == nil {
			return nil
		}
		var status *mockworker.StatusError
		if errors.As(err, &status) || ctx.Err() != nil {
			return fmt.Errorf("register with %s: %w", url, err)
		}
		log.Info("kvselect not reachable yet; retrying registration", "url", url, "err", err, "retry_in", delay)
		select {
		case <-ctx.Done():
			return fmt.Errorf("register with %s: %w (gave up after %v)", url, err, timeout)
		case <-time.After(delay):
		}
		delay = min(2*delay, 2*time.Second)
	}
}
