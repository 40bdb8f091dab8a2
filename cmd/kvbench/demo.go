package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvselect/kvselect/bench/mooncake"
	"github.com/kvselect/kvselect/bench/promtext"
	"github.com/kvselect/kvselect/bench/relay"
	"github.com/kvselect/kvselect/bench/report"
	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/internal/peerproc"
)

// The demo: kvselect and N engines as real processes on loopback; a slice of
// the Mooncake conversation trace replayed twice, once through kvselect's
// ext_proc picker with the Envoy-faithful client (the way Envoy reaches a
// worker behind an InferencePool) and once round-robin (Envoy's plain load
// balancing, no picker), each from empty prefix caches. It prints a
// side-by-side table and writes JSON and an SVG chart.
//
// Two engine families: kvselect's own mock workers (-engines mock), which
// register themselves and publish KV events on a socket kvselect subscribes
// to, and their caches are reset between phases; or the llm-d project's vLLM
// simulator, llm-d-inference-sim (-engines llmd-sim), an engine kvselect's
// authors did not write: its KV events dial kvselect's collector
// (--kv-events-bind, llm-d's topology), the demo registers each simulator
// over REST, and every phase starts fresh simulators, since they have no
// prefix-cache reset.

type demoConfig struct {
	engines                string // engineMock or engineSim
	kvselectBin, workerBin string
	simBin                 string
	maxNumSeqs             int    // llm-d-inference-sim's --max-num-seqs
	maxModelLen            int    // llm-d-inference-sim's --max-model-len, from the trace slice
	phase                  string // names the logs of a phase's own processes
	trace                  string
	workers                int
	requests, offset       int
	compress               float64 // trace time is divided by this
	concurrency            int
	blockTokens            int // prompt tokens per trace block
	blockSize              int
	poolBlocks             int // KV blocks per worker
	speedup                float64
	prefillPerToken        time.Duration
	decodePerToken         time.Duration
	maxOutput              int
	kvselectArgs           []string // more kvselect flags (mock engines)
	out                    string
	quiet                  bool
}

// demoPhase is one policy's run.
type demoPhase struct {
	Policy      string  `json:"policy"`
	Requests    int     `json:"requests"`
	Errors      int     `json:"errors"`
	HitRate     float64 `json:"prefix_cache_hit_rate"` // cached prompt tokens / prompt tokens, from the workers' metrics
	TTFTP50Ms   float64 `json:"ttft_p50_ms"`
	TTFTP90Ms   float64 `json:"ttft_p90_ms"`
	Throughput  float64 `json:"throughput_rps"`
	SelectP50Us float64 `json:"select_p50_us,omitempty"` // ext_proc decision latency as the client saw it
	SelectP99Us float64 `json:"select_p99_us,omitempty"`
	// ServerPick is kvselect's own decision time (its pick-duration
	// histogram over the phase): what the picker spends, without the gRPC
	// round trips and the scheduling of every process on the machine.
	ServerPick *promtext.Summary `json:"server_pick,omitempty"`
	// HitRateOverTime is the workers' prefix-cache hit rate per second of
	// the phase.
	HitRateOverTime []demoPoint `json:"hit_rate_over_time"`
	WallSeconds     float64     `json:"wall_seconds"`
	PerWorker       []int       `json:"requests_per_worker"`
	LoadAfterRun    uint64      `json:"active_requests_after_run,omitempty"`
	promptTokens    float64
	cachedTokens    float64
	ttfts, selDur   []time.Duration
}

// demoPoint is one sample of a series over a phase.
type demoPoint struct {
	Seconds float64 `json:"seconds"`
	Value   float64 `json:"value"`
}

type demoReport struct {
	Engines  string      `json:"engines"`
	Trace    string      `json:"trace"`
	Requests int         `json:"requests"`
	Workers  int         `json:"workers"`
	Phases   []demoPhase `json:"phases"`
}

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvbench demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c demoConfig
	fs.StringVar(&c.engines, "engines", engineMock, "engine `family`: "+engineMock+" (kvselect's mock workers) or "+engineSim+" (llm-d-inference-sim processes)")
	binaryFlags(fs, &c.kvselectBin, &c.workerBin)
	fs.StringVar(&c.simBin, "sim-bin", os.Getenv(peerproc.EnvSim), "llm-d-inference-sim `binary` for -engines "+engineSim+" (default $"+peerproc.EnvSim+")")
	fs.IntVar(&c.maxNumSeqs, "max-num-seqs", 4, "llm-d-inference-sim's --max-num-seqs: requests an engine runs at once, the rest wait in its queue")
	fs.StringVar(&c.trace, "trace", "bench/testdata/mooncake/conversation_trace.jsonl.gz", "Mooncake trace `path`")
	fs.IntVar(&c.workers, "workers", 4, "`engines` (mock workers or simulators)")
	fs.IntVar(&c.requests, "requests", 1000, "trace `requests` to replay per phase")
	fs.IntVar(&c.offset, "offset", 0, "skip this many trace requests first")
	fs.Float64Var(&c.compress, "compress", 20, "replay the trace this many `times` faster than recorded")
	fs.IntVar(&c.concurrency, "concurrency", 128, "most requests in flight")
	fs.IntVar(&c.blockTokens, "block-tokens", 64, "prompt `tokens` per trace block (the trace's blocks are 512 tokens; smaller keeps the demo quick)")
	fs.IntVar(&c.blockSize, "block-size", 16, "engines' KV block size")
	// llm-d-inference-sim can chain a stored block to the wrong parent when
	// it evicts blocks of the request it is storing, which happens when the
	// cache is small next to one prompt: the default holds dozens of the
	// longest prompts (older blocks still get evicted between requests).
	fs.IntVar(&c.poolBlocks, "pool-blocks", 8192, "engines' KV pool, in KV blocks (the simulator's --kv-cache-size)")
	fs.Float64Var(&c.speedup, "speedup", demoSpeedup, "engines' timing speed-up: the per-token times below are divided by it (with -compress 20 and 4 workers, each worker sees the load one of 8 would see at the trace's own pace, scaled by the per-token times)")
	// A trace block is 512 tokens; with -block-tokens 64 each prompt token
	// stands for 8, so the per-token times are 8x engine-like ones: 100 µs
	// of prefill per real token (10k prefill tokens/s, a large model on one
	// GPU) and 10 ms per output token.
	fs.DurationVar(&c.prefillPerToken, "prefill-time-per-token", demoPrefillPerToken, "engines' prefill time per uncached prompt token (before -speedup; the simulator's --prefill-time-per-token)")
	fs.DurationVar(&c.decodePerToken, "decode-time-per-token", demoDecodePerToken, "engines' decode time per output token (before -speedup; the simulator's --inter-token-latency)")
	fs.IntVar(&c.maxOutput, "max-output", 16, "cap on output `tokens` per request (the trace's lengths scaled like the prompts, then capped: every streamed chunk is an ext_proc round trip)")
	fs.StringVar(&c.out, "out", "bench/out/demo", "`directory` for demo.json, demo.svg and the processes' logs")
	fs.BoolVar(&c.quiet, "quiet", false, "no progress bars")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	case c.engines != engineMock && c.engines != engineSim:
		return fmt.Errorf("-engines %q: want %s or %s", c.engines, engineMock, engineSim)
	case c.engines == engineSim && c.simBin == "":
		return fmt.Errorf("-engines %s needs llm-d-inference-sim: set -sim-bin or $%s (build it from github.com/llm-d/llm-d-inference-sim)", engineSim, peerproc.EnvSim)
	case c.maxNumSeqs < 1:
		return errors.New("-max-num-seqs must be positive")
	case c.workers < 1 || c.requests < 1 || c.concurrency < 1 || c.blockTokens < 1 || c.blockSize < 1 || c.poolBlocks < 1 || c.maxOutput < 1:
		return errors.New("-workers, -requests, -concurrency, -block-tokens, -block-size, -pool-blocks and -max-output must be positive")
	case !(c.compress > 0) || !(c.speedup > 0):
		return errors.New("-compress and -speedup must be positive")
	}
	reqs, err := mooncake.LoadTrace(c.trace)
	if err != nil {
		return err
	}
	if c.offset >= len(reqs) {
		return fmt.Errorf("-offset %d: the trace has %d requests", c.offset, len(reqs))
	}
	reqs = reqs[c.offset:min(len(reqs), c.offset+c.requests)]
	c.maxModelLen = simModelLen(reqs, c.blockTokens, c.maxOutput)
	if err := os.MkdirAll(c.out, 0o755); err != nil {
		return err
	}
	if c.engines == engineSim {
		if st, err := os.Stat(c.simBin); err != nil || st.IsDir() {
			return fmt.Errorf("-sim-bin %q is not a file (set -sim-bin or $%s)", c.simBin, peerproc.EnvSim)
		}
	}

	rep := demoReport{Engines: c.engines, Trace: c.trace, Requests: len(reqs), Workers: c.workers}
	var fl *fleet
	defer func() {
		if fl != nil {
			fl.stop()
		}
	}()
	for _, policy := range []string{"kvselect", "round-robin"} {
		switch {
		case c.engines == engineSim:
			// The simulator cannot empty its cache: fresh processes (and a
			// fresh kvselect, whose index they feed) for every phase.
			if fl != nil {
				fl.stop()
			}
			fl = nil
			c.phase = policy
			var err error
			if fl, err = startFleet(ctx, &c, stderr); err != nil {
				return err
			}
		case fl == nil:
			var err error
			if fl, err = startFleet(ctx, &c, stderr); err != nil {
				return err
			}
			fallthrough
		default:
			if err := fl.resetCaches(ctx); err != nil {
				return err
			}
		}
		ph, err := fl.replay(ctx, &c, policy, reqs, stderr)
		if err != nil {
			return err
		}
		rep.Phases = append(rep.Phases, ph)
	}
	if err := demoTable(stdout, &rep); err != nil {
		return err
	}
	if err := report.WriteJSON(filepath.Join(c.out, "demo.json"), rep); err != nil {
		return err
	}
	svg := filepath.Join(c.out, "demo.svg")
	if err := report.WriteSVG(svg, fmt.Sprintf("kvselect demo: %d %s, %d trace requests", c.workers, engineNoun(c.engines), len(reqs)), demoCharts(&rep)...); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nwrote %s and %s (logs in %s)\n", filepath.Join(c.out, "demo.json"), svg, c.out)
	for _, ph := range rep.Phases {
		if ph.Errors > 0 {
			return fmt.Errorf("%s: %d of %d requests failed (see %s)", ph.Policy, ph.Errors, ph.Requests, c.out)
		}
	}
	return nil
}

// The demo's engine timing (see its flags), which kvbench health reuses.
const (
	demoSpeedup         = 40
	demoPrefillPerToken = 800 * time.Microsecond
	demoDecodePerToken  = 80 * time.Millisecond
)

// Engine families of the demo.
const (
	engineMock = "mock"
	engineSim  = "llmd-sim"
)

func engineNoun(engines string) string {
	if engines == engineSim {
		return "llm-d-inference-sim engines"
	}
	return "mock workers"
}

// simModel is the model every simulator serves (its dummy tokenizer needs no
// download for a name that does not look like a real model).
const simModel = "fake-model"

// simModelLen is a --max-model-len that admits every request of the slice:
// the simulator refuses prompt + max_tokens above it (1024 by default).
func simModelLen(reqs []mooncake.Request, blockTokens, maxOutput int) int {
	longest := 0
	for _, r := range reqs {
		longest = max(longest, len(r.HashIDs)*blockTokens)
	}
	return max(1024, longest+maxOutput+64)
}

// fleet is the running processes.
type fleet struct {
	procs   []proc
	sims    []*peerproc.SimProcess
	model   string   // the model the engines serve
	rest    string   // kvselect REST base URL
	extproc string   // kvselect ext_proc address
	workers []string // host:port of every mock worker, worker id i+1 at i
	conn    *grpc.ClientConn
	hc      *http.Client
}

// binaryFlags are the -kvselect and -mockworker flags of the subcommands that
// start those processes, with `make build`'s paths as defaults.
func binaryFlags(fs *flag.FlagSet, kvselect, mockworker *string) {
	fs.StringVar(kvselect, "kvselect", "bin/kvselect", "kvselect `binary`")
	fs.StringVar(mockworker, "mockworker", "bin/kvselect-mockworker", "mock worker `binary`")
}

func freePort() (int, error) { return peerproc.FreePort() }

func startFleet(ctx context.Context, c *demoConfig, stderr io.Writer) (*fleet, error) {
	if c.engines == engineSim {
		return startSimFleet(ctx, c, stderr)
	}
	fl := &fleet{model: "mock-model", hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c.concurrency, MaxIdleConns: 4 * c.concurrency}}}
	ok := false
	defer func() {
		if !ok {
			fl.stop()
		}
	}()
	if err := fl.startKVSelect(ctx, c.out, "kvselect", c.kvselectBin, c.kvselectArgs...); err != nil {
		return nil, err
	}
	for i := range c.workers {
		if err := fl.startWorker(c.out, fmt.Sprintf("worker-%d", i+1), c.workerBin, i,
			"--block-size", strconv.Itoa(c.blockSize), "--num-gpu-blocks", strconv.Itoa(c.poolBlocks),
			"--speedup", strconv.FormatFloat(c.speedup, 'g', -1, 64), "--prefill-slots", "1",
			"--prefill-time-per-token", c.prefillPerToken.String(), "--decode-time-per-token", c.decodePerToken.String()); err != nil {
			return nil, err
		}
	}
	fmt.Fprintf(stderr, "started kvselect (REST %s, ext_proc %s) and %d mock workers; waiting for their KV event streams...\n",
		fl.rest, fl.extproc, c.workers)
	fmt.Fprintf(stderr, "status page (live while this runs): %s/ui/\n", fl.rest)
	if err := fl.waitWorkers(ctx, c.workers, 60*time.Second); err != nil {
		return nil, fmt.Errorf("%w (logs in %s)", err, c.out)
	}
	if err := fl.dialPicker(); err != nil {
		return nil, err
	}
	ok = true
	return fl, nil
}

// startWorker starts mock worker number i+1 (its worker id) on a free
// loopback port, registered with the fleet's kvselect, logging to
// out/name.log; args follow the fleet's own.
func (fl *fleet) startWorker(out, name, bin string, i int, args ...string) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	fl.workers = append(fl.workers, fmt.Sprintf("127.0.0.1:%d", port))
	return fl.start(out, name, bin, append([]string{"--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--worker-id", strconv.Itoa(i + 1), "--register", fl.rest, "--log-level", "warn"}, args...)...)
}

// waitNoBookings waits until kvselect holds no booking: the picker frees
// each at its response's end, a moment after the client saw it.
func (fl *fleet) waitNoBookings(limit time.Duration) error {
	for deadline := time.Now().Add(limit); ; time.Sleep(20 * time.Millisecond) {
		n, err := fl.activeRequests()
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d bookings left in kvselect after every response ended", n)
		}
	}
}

// startKVSelect starts kvselect on two free loopback ports (REST, then
// ext_proc) with args after the fleet's own, logging to out/name.log, and
// waits until it answers /health.
func (fl *fleet) startKVSelect(ctx context.Context, out, name, bin string, args ...string) error {
	restPort, err := freePort()
	if err != nil {
		return err
	}
	epPort, err := freePort()
	if err != nil {
		return err
	}
	fl.rest, fl.extproc = fmt.Sprintf("http://127.0.0.1:%d", restPort), fmt.Sprintf("127.0.0.1:%d", epPort)
	if err := fl.start(out, name, bin, append([]string{"--host", "127.0.0.1", "--port", strconv.Itoa(restPort),
		"--extproc-port", strconv.Itoa(epPort), "--log-level", "warn"}, args...)...); err != nil {
		return err
	}
	if err := waitHTTP(ctx, fl.hc, fl.rest+"/health", 30*time.Second); err != nil {
		return fmt.Errorf("kvselect did not come up: %w (log in %s)", err, out)
	}
	return nil
}

// dialPicker connects the fleet's ext_proc client, as Envoy dials (plaintext).
func (fl *fleet) dialPicker() error {
	conn, err := grpc.NewClient(fl.extproc, append(envoysim.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		return err
	}
	fl.conn = conn
	return nil
}

func (fl *fleet) start(out, name, bin string, args ...string) error {
	logf, err := os.Create(filepath.Join(out, name+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s (%s): %w; build it with `make build`", name, bin, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(done) }()
	fl.procs = append(fl.procs, proc{cmd, done})
	return nil
}

type proc struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

// startSimFleet starts kvselect with a KV events collector, then the
// simulators (their PUB sockets dial the collector, and what they publish
// before it is bound is lost), and registers each simulator over REST without
// a KV events endpoint: kvselect matches the topic of each message,
// kv@<host>:<port>@<model>, to the worker whose endpoint has that host:port.
// The replay endpoint lets kvselect catch up on batches sent before the
// registration.
func startSimFleet(ctx context.Context, c *demoConfig, stderr io.Writer) (*fleet, error) {
	fl := &fleet{model: simModel, hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c.concurrency, MaxIdleConns: 4 * c.concurrency}}}
	ok := false
	defer func() {
		if !ok {
			fl.stop()
		}
	}()
	var ports [3]int
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	fl.rest = fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	fl.extproc = fmt.Sprintf("127.0.0.1:%d", ports[1])
	collector := fmt.Sprintf("tcp://127.0.0.1:%d", ports[2])
	if err := fl.start(c.out, c.phase+"-kvselect", c.kvselectBin, "--host", "127.0.0.1", "--port", strconv.Itoa(ports[0]),
		"--extproc-port", strconv.Itoa(ports[1]), "--kv-events-bind", collector, "--log-level", "warn"); err != nil {
		return nil, err
	}
	if err := waitHTTP(ctx, fl.hc, fl.rest+"/health", 30*time.Second); err != nil {
		return nil, fmt.Errorf("kvselect did not come up: %w (log in %s)", err, c.out)
	}
	sims, err := startSims(ctx, simFleetConfig{
		bin: c.simBin, n: c.workers, collector: collector, blockSize: c.blockSize, kvBlocks: c.poolBlocks,
		prefillPerToken: time.Duration(float64(c.prefillPerToken) / c.speedup), interToken: time.Duration(float64(c.decodePerToken) / c.speedup),
		maxNumSeqs: c.maxNumSeqs, maxModelLen: c.maxModelLen, logDir: c.out, logPrefix: c.phase,
	})
	fl.sims = sims
	if err != nil {
		return nil, err
	}
	for i, p := range sims {
		fl.workers = append(fl.workers, p.HostPort())
		if err := registerEngine(ctx, fl.hc, fl.rest, uint64(i+1), p, c.blockSize, c.poolBlocks); err != nil {
			return nil, err
		}
	}
	fmt.Fprintf(stderr, "%s: started kvselect (REST %s, ext_proc %s, KV events collector %s) and %d llm-d-inference-sim engines; waiting for their KV event streams...\n",
		c.phase, fl.rest, fl.extproc, collector, c.workers)
	fmt.Fprintf(stderr, "status page (live while this runs): %s/ui/\n", fl.rest)
	if err := fl.waitWorkers(ctx, c.workers, 60*time.Second); err != nil {
		return nil, fmt.Errorf("%w (logs in %s)", err, c.out)
	}
	if err := fl.dialPicker(); err != nil {
		return nil, err
	}
	ok = true
	return fl, nil
}

// simFleetConfig is how the demo and vs-epp start their simulators.
type simFleetConfig struct {
	bin                         string
	n                           int
	collector                   string // the ZMQ endpoint their PUB sockets dial
	blockSize, kvBlocks         int
	prefillPerToken, interToken time.Duration
	maxNumSeqs, maxModelLen     int
	logDir, logPrefix           string
	// ports are the HTTP ports, chosen beforehand when a picker must know
	// the engines before they start; free ports when nil.
	ports []int
}

// startSims starts n simulators on free ports, each with a replay endpoint,
// and waits until each answers /health. On error it returns the ones that
// started, for the caller to stop.
func startSims(ctx context.Context, sc simFleetConfig) ([]*peerproc.SimProcess, error) {
	var (
		sims []*peerproc.SimProcess
		err  error
	)
	for i := range sc.n {
		var port int
		if i < len(sc.ports) {
			port = sc.ports[i]
		} else if port, err = peerproc.FreePort(); err != nil {
			return sims, err
		}
		replay, err := peerproc.FreePort()
		if err != nil {
			return sims, err
		}
		name := fmt.Sprintf("sim-%d.log", i+1)
		if sc.logPrefix != "" {
			name = sc.logPrefix + "-" + name
		}
		logf, err := os.Create(filepath.Join(sc.logDir, name))
		if err != nil {
			return sims, err
		}
		p, err := peerproc.StartSim(ctx, peerproc.Sim{
			Binary: sc.bin, Model: simModel, Port: port, ZMQEndpoint: sc.collector, ReplayPort: replay,
			BlockSize: sc.blockSize, KVCacheSize: sc.kvBlocks, Log: logf,
			Extra: []string{
				"--prefill-time-per-token", sc.prefillPerToken.String(),
				"--inter-token-latency", sc.interToken.String(),
				"--max-num-seqs", strconv.Itoa(sc.maxNumSeqs),
				"--max-model-len", strconv.Itoa(sc.maxModelLen),
			},
		})
		if err != nil {
			logf.Close()
			return sims, fmt.Errorf("start llm-d-inference-sim %d (log %s): %w", i+1, filepath.Join(sc.logDir, name), err)
		}
		sims = append(sims, p)
	}
	return sims, nil
}

// registeredEngine is what a registration needs of an engine process
// (peerproc's simulators and mock workers).
type registeredEngine interface {
	URL() string
	ReplayEndpoint() string
}

// registerEngine registers an engine with kvselect over REST, fed through
// its collector: no kv_events_endpoint, the replay endpoint for catch-up.
func registerEngine(ctx context.Context, hc *http.Client, rest string, id uint64, p registeredEngine, blockSize, kvBlocks int) error {
	b, err := json.Marshal(map[string]any{
		"worker_id": id, "model_name": simModel, "endpoint": p.URL(), "replay_endpoint": p.ReplayEndpoint(),
		"block_size": blockSize, "total_kv_blocks": kvBlocks,
	})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, rest+"/workers", bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("content-type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("register %s: %w", p.URL(), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("register %s: %s: %s", p.URL(), resp.Status, msg)
	}
	return nil
}

// stop ends the engines first (mock workers deregister), then kvselect.
func (fl *fleet) stop() {
	if fl.conn != nil {
		fl.conn.Close()
	}
	for _, p := range fl.sims {
		p.Stop()
	}
	for i := len(fl.procs) - 1; i >= 0; i-- {
		p := fl.procs[i]
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			p.cmd.Process.Kill()
			<-p.exited
		}
	}
}

func waitHTTP(ctx context.Context, hc *http.Client, url string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var last error
	for time.Now().Before(deadline) {
		if err := ctx.Err(); err != nil {
			return err
		}
		resp, err := hc.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("%s: %s", url, resp.Status)
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("timed out: %w", last)
}

// waitWorkers waits until kvselect lists n schedulable workers whose KV event
// listeners are connected.
func (fl *fleet) waitWorkers(ctx context.Context, n int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if err := ctx.Err(); err != nil {
			return err
		}
		var ws []struct {
			Lifecycle      string `json:"lifecycle"`
			KVEventsStatus map[string]struct {
				Connected bool `json:"connected"`
			} `json:"kv_events_status"`
		}
		if err := getJSON(fl.hc, fl.rest+"/workers", &ws); err == nil {
			ready := 0
			for _, w := range ws {
				conn := len(w.KVEventsStatus) > 0
				for _, st := range w.KVEventsStatus {
					conn = conn && st.Connected
				}
				if w.Lifecycle == "schedulable" && conn {
					ready++
				}
			}
			if ready == n {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("timed out waiting for %d registered workers with connected KV event streams", n)
}

func getJSON(hc *http.Client, url string, v any) error {
	resp, err := hc.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// resetCaches empties every worker's prefix cache (vLLM's POST
// /reset_prefix_cache); the workers publish AllBlocksCleared, so kvselect's
// index empties too.
func (fl *fleet) resetCaches(ctx context.Context) error {
	for _, w := range fl.workers {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+w+"/reset_prefix_cache", nil)
		resp, err := fl.hc.Do(req)
		if err != nil {
			return fmt.Errorf("reset %s: %w", w, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("reset %s: %s", w, resp.Status)
		}
	}
	return nil
}

// cacheCounters sums the workers' vLLM prefix-cache counters (tokens).
func (fl *fleet) cacheCounters() (queries, hits float64, err error) {
	for _, w := range fl.workers {
		m, err := promtext.Scrape(context.Background(), fl.hc, "http://"+w+"/metrics")
		if err != nil {
			return 0, 0, err
		}
		queries += m.Sum("vllm:prefix_cache_queries_total")
		hits += m.Sum("vllm:prefix_cache_hits_total")
	}
	return queries, hits, nil
}

// pickHistogram is kvselect's server-side decision time, a histogram.
const pickHistogram = "kvselect_extproc_pick_duration_seconds"

// demoTokens is the prompt of a trace request: every trace block becomes
// blockTokens token ids derived from its hash id, so requests that share a
// prefix of hash ids share a token prefix.
func demoTokens(ids []uint64, blockTokens int) []uint32 {
	out := make([]uint32, 0, len(ids)*blockTokens)
	for _, id := range ids {
		for j := range blockTokens {
			out = append(out, uint32(mooncake.Mix64(id<<16|uint64(j))%32000))
		}
	}
	return out
}

type demoBody struct {
	Model     string   `json:"model"`
	Prompt    []uint32 `json:"prompt"`
	MaxTokens int      `json:"max_tokens"`
	Stream    bool     `json:"stream"`
	// StreamOptions asks for the final usage event, whose cached_tokens
	// the picker's engine hit-rate series read.
	StreamOptions *demoStreamOptions `json:"stream_options,omitempty"`
}

type demoStreamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// replay runs one phase: open loop at the trace's (compressed) arrival times,
// at most c.concurrency requests in flight.
func (fl *fleet) replay(ctx context.Context, c *demoConfig, policy string, reqs []mooncake.Request, stderr io.Writer) (demoPhase, error) {
	ph := demoPhase{Policy: policy, Requests: len(reqs), PerWorker: make([]int, len(fl.workers))}
	q0, h0, err := fl.cacheCounters()
	if err != nil {
		return ph, err
	}
	var pick0 promtext.Samples
	if policy == "kvselect" {
		if pick0, err = promtext.Scrape(ctx, fl.hc, fl.rest+"/metrics"); err != nil {
			return ph, err
		}
	}
	bodies := make([][]byte, len(reqs))
	for i, r := range reqs {
		b, err := json.Marshal(demoBody{Model: fl.model, Prompt: demoTokens(r.HashIDs, c.blockTokens),
			MaxTokens: min(max(1, r.OutputLength*c.blockTokens/512), c.maxOutput), Stream: true,
			StreamOptions: &demoStreamOptions{IncludeUsage: true}})
		if err != nil {
			return ph, err
		}
		bodies[i] = b
	}
	var bar *report.Progress
	if !c.quiet {
		bar = report.NewProgress(stderr, policy)
	}
	client := envoysim.New(fl.conn)
	var (
		mu       sync.Mutex
		done     atomic.Int64
		wg       sync.WaitGroup
		sem      = make(chan struct{}, c.concurrency)
		rr       atomic.Int64
		firstErr error
	)
	start := time.Now()
	sampling := make(chan struct{})
	sampled := make(chan []demoPoint)
	go func() { sampled <- fl.sampleHitRate(start, q0, h0, sampling) }()
	t0 := reqs[0].Timestamp
	for i, r := range reqs {
		at := start.Add(time.Duration(float64(time.Duration(r.Timestamp-t0)*time.Millisecond) / c.compress))
		if d := time.Until(at); d > 0 {
			select {
			case <-ctx.Done():
				wg.Wait()
				close(sampling)
				<-sampled
				return ph, ctx.Err()
			case <-time.After(d):
			}
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			var res demoResult
			var err error
			if policy == "kvselect" {
				res, err = fl.viaPicker(ctx, client, bodies[i], i)
			} else {
				w := int(rr.Add(1)-1) % len(fl.workers)
				res, err = fl.direct(ctx, fl.workers[w], bodies[i])
				res.worker = w
			}
			mu.Lock()
			if err != nil {
				ph.Errors++
				if firstErr == nil {
					firstErr = err
				}
			} else {
				ph.ttfts = append(ph.ttfts, res.ttft)
				if policy == "kvselect" {
					ph.selDur = append(ph.selDur, res.selection)
				}
				if res.worker >= 0 && res.worker < len(ph.PerWorker) {
					ph.PerWorker[res.worker]++
				}
			}
			mu.Unlock()
			bar.Update(int(done.Add(1)), len(reqs))
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	close(sampling)
	ph.HitRateOverTime = <-sampled
	if firstErr != nil {
		fmt.Fprintf(stderr, "%s: first error: %v\n", policy, firstErr)
	}
	q1, h1, err := fl.cacheCounters()
	if err != nil {
		return ph, err
	}
	ph.promptTokens, ph.cachedTokens = q1-q0, h1-h0
	if ph.promptTokens > 0 {
		ph.HitRate = ph.cachedTokens / ph.promptTokens
	}
	ttft, sel := percentiles(ph.ttfts), percentiles(ph.selDur)
	ph.TTFTP50Ms, ph.TTFTP90Ms = float64(ttft.P50)/1e6, float64(ttft.P90)/1e6
	ph.SelectP50Us, ph.SelectP99Us = float64(sel.P50)/1e3, float64(sel.P99)/1e3
	ph.WallSeconds = wall.Seconds()
	ph.Throughput = float64(len(ph.ttfts)) / wall.Seconds()
	if policy == "kvselect" {
		ph.LoadAfterRun, err = fl.activeRequests()
		if err != nil {
			return ph, err
		}
		pick1, err := promtext.Scrape(ctx, fl.hc, fl.rest+"/metrics")
		if err != nil {
			return ph, err
		}
		sp := pick1.Minus(pick0).Summarize(pickHistogram)
		ph.ServerPick = &sp
	}
	return ph, nil
}

// sampleHitRate reads the workers' prefix-cache counters every second until
// stop closes: the hit rate of each second of the phase (seconds without
// prompt tokens are left out).
func (fl *fleet) sampleHitRate(start time.Time, q, h float64, stop <-chan struct{}) []demoPoint {
	out := []demoPoint{}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return out
		case now := <-tick.C:
			q1, h1, err := fl.cacheCounters()
			if err != nil {
				continue
			}
			if q1 > q {
				out = append(out, demoPoint{Seconds: now.Sub(start).Seconds(), Value: (h1 - h) / (q1 - q)})
			}
			q, h = q1, h1
		}
	}
}

// activeRequests sums kvselect's active requests over every worker (GET /loads).
func (fl *fleet) activeRequests() (uint64, error) {
	var loads []struct {
		Loads []struct {
			ActiveRequests uint64 `json:"active_requests"`
		} `json:"loads"`
	}
	if err := getJSON(fl.hc, fl.rest+"/loads", &loads); err != nil {
		return 0, err
	}
	var n uint64
	for _, m := range loads {
		for _, l := range m.Loads {
			n += l.ActiveRequests
		}
	}
	return n, nil
}

type demoResult struct {
	ttft, selection time.Duration
	worker          int
}

// viaPicker is one request as Envoy runs it with the ext_proc filter: the
// picker chooses the endpoint from the body, the request goes there with the
// headers the picker set, and the response streams back through the filter.
func (fl *fleet) viaPicker(ctx context.Context, client *envoysim.Client, body []byte, i int) (demoResult, error) {
	res, _, err := fl.throughPicker(ctx, client, body, fmt.Sprintf("demo-%d-%d", time.Now().UnixNano(), i))
	if err != nil {
		return demoResult{}, err
	}
	return res, nil
}

// throughPicker is viaPicker's exchange, also for callers that need the
// worker's status: status is the worker's answer (or the picker's immediate
// one; 0 when nothing answered), res.worker the chosen worker's index (-1
// when the picker answered itself). A worker's error answer passes back
// through the picker and ends there, as Envoy passes a 5xx on, so the
// picker sees its status; it is returned as an error too. res.ttft counts
// from before the pick.
func (fl *fleet) throughPicker(ctx context.Context, client *envoysim.Client, body []byte, id string) (res demoResult, status int, err error) {
	r := relay.Relay{Picker: client, HTTP: fl.hc}
	out, err := r.Do(ctx, "/v1/completions", body, envoysim.Header{Key: "x-request-id", Value: id})
	res.worker = -1
	if d := out.Decision; d != nil {
		if d.Immediate != nil {
			return res, int(d.Immediate.Status), err
		}
		res.worker = slices.Index(fl.workers, d.Endpoint)
	}
	res.selection, res.ttft = out.Pick, out.TTFT
	return res, out.Status, err
}

// direct sends body straight to a worker, without the picker, and times its
// first generated token as the picker's path does (bench/relay).
func (fl *fleet) direct(ctx context.Context, endpoint string, body []byte) (demoResult, error) {
	res, err := relay.Direct(ctx, fl.hc, "http://"+endpoint+"/v1/completions", body)
	return demoResult{ttft: res.TTFT}, err
}

func demoTable(w io.Writer, rep *demoReport) error {
	fmt.Fprintf(w, "\n%d requests of %s over %d %s, each policy from empty caches:\n\n", rep.Requests, rep.Trace, rep.Workers, engineNoun(rep.Engines))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(name string, f func(p demoPhase) string) {
		fmt.Fprintf(tw, "%s\t", name)
		for _, p := range rep.Phases {
			fmt.Fprintf(tw, "%s\t", f(p))
		}
		fmt.Fprintln(tw)
	}
	row("", func(p demoPhase) string { return p.Policy })
	row("prefix-cache hit rate", func(p demoPhase) string { return fmt.Sprintf("%.3f", p.HitRate) })
	row("TTFT p50 (ms)", func(p demoPhase) string { return fmt.Sprintf("%.1f", p.TTFTP50Ms) })
	row("TTFT p90 (ms)", func(p demoPhase) string { return fmt.Sprintf("%.1f", p.TTFTP90Ms) })
	row("throughput (req/s)", func(p demoPhase) string { return fmt.Sprintf("%.1f", p.Throughput) })
	row("decision, kvselect's own p50 / p99 (µs)", func(p demoPhase) string {
		if p.ServerPick == nil || p.ServerPick.Count == 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f / %.0f", p.ServerPick.P50Us, p.ServerPick.P99Us)
	})
	row("decision, client-observed p50 / p99 (µs)", func(p demoPhase) string {
		if p.SelectP50Us == 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f / %.0f", p.SelectP50Us, p.SelectP99Us)
	})
	row("requests per worker", func(p demoPhase) string { return strings.Trim(fmt.Sprint(p.PerWorker), "[]") })
	row("errors", func(p demoPhase) string { return strconv.Itoa(p.Errors) })
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, p := range rep.Phases {
		if p.Policy == "kvselect" {
			fmt.Fprintf(w, "\nkvselect active requests after the run: %d (every booking freed when its response ended)\n", p.LoadAfterRun)
			fmt.Fprintln(w, "decision time: kvselect's own is its kvselect_extproc_pick_duration_seconds histogram (body parse, selection,\n"+
				"booking; interpolated within buckets). The client-observed time adds the ext_proc gRPC round trips of the\n"+
				"Envoy-faithful client and the waits of every demo process (kvselect, the workers, the client) for the\n"+
				"machine's CPUs: on a small shared machine that queueing, not the picker, is most of it.")
		}
	}
	return nil
}

func demoCharts(rep *demoReport) []report.Chart {
	series := make([]string, len(rep.Phases))
	hit := [][]float64{make([]float64, len(rep.Phases))}
	var ttft, hitOverTime []report.Line
	for i, p := range rep.Phases {
		series[i] = p.Policy
		hit[0][i] = p.HitRate
		ms := make([]float64, len(p.ttfts))
		for j, d := range p.ttfts {
			ms[j] = float64(d) / 1e6
		}
		ttft = append(ttft, report.CDF(p.Policy, ms, 200))
		l := report.Line{Name: p.Policy}
		for _, pt := range p.HitRateOverTime {
			l.X, l.Y = append(l.X, pt.Seconds), append(l.Y, pt.Value)
		}
		hitOverTime = append(hitOverTime, l)
	}
	charts := []report.Chart{
		{Title: "Prefix-cache hit rate over the phase", Groups: []string{"hit rate"}, Series: series, Values: hit},
		{Title: "Hit rate per second of the run", Lines: hitOverTime, XLabel: "seconds since the phase began"},
		{Title: "Time to first token, CDF (fraction of requests at or below)", Lines: ttft, XLabel: "TTFT, ms (log scale)", LogX: true},
	}
	for _, p := range rep.Phases {
		if p.ServerPick != nil && p.ServerPick.Count > 0 {
			charts = append(charts, report.Chart{Title: "kvselect decision time", Unit: "µs", Groups: []string{"p50", "p99"},
				Series: []string{"kvselect's own (pick-duration histogram)", "client-observed (with gRPC and CPU queueing)"},
				Values: [][]float64{{p.ServerPick.P50Us, p.SelectP50Us}, {p.ServerPick.P99Us, p.SelectP99Us}}, LowerIsBetter: true})
		}
	}
	return charts
}
