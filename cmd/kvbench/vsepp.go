package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvselect/kvselect/bench/mooncake"
	"github.com/kvselect/kvselect/bench/promtext"
	"github.com/kvselect/kvselect/bench/report"
	"github.com/kvselect/kvselect/bench/stats"
	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/internal/peerproc"
)

// `kvbench vs-epp`: kvselect's endpoint picker and llm-d's (llm-d-router's
// EPP) side by side, each driven through envoysim exactly as Envoy's ext_proc
// filter drives a GIE endpoint picker — FULL_DUPLEX_STREAMED both ways, the
// body, the destination from the picker's header, the request forwarded to
// that engine and the engine's real SSE response streamed back through the
// picker — against the same engines and the same Mooncake trace slice. The
// engines are llm-d-inference-sim processes or, with -engine-family mock,
// kvselect's mock workers dialing the collector the same way. Every picker
// run starts fresh engines, so each begins with empty caches and an empty
// index.
//
// How each picker learns about the engines:
//   - kvselect binds a KV events collector (--kv-events-bind); the engines'
//     PUB sockets dial it, and each message's topic kv@<host>:<port>@<model>
//     names the worker, registered over REST beforehand with its endpoint
//     and replay endpoint (no kv_events_endpoint). Load comes from its own
//     bookings (every routed request until its response ends).
//   - the EPP reads its endpoints from a file (file discovery), binds the
//     SUB socket of its precise-prefix-cache producer where the engines dial
//     (same topic), and scrapes every engine's /metrics (queue length, KV
//     cache utilisation) every 50 ms (its --refresh-metrics-interval).
//
// With -prompts text the trace goes out as text: kvselect runs with
// --tokenize pool (its registered engines answer POST /tokenize), the EPP's
// token producer renders each prompt through the first engine's
// /v1/completions/render, which only llm-d-inference-sim serves.

const (
	pickerKvselect = "kvselect"
	// pickerKvselectPrefix is kvselect tuned once for this workload, as the
	// EPP is: the longest-prefix policy (greedy on the cached prefix,
	// ignoring load) instead of Dynamo's cost.
	pickerKvselectPrefix = "kvselect-prefix"
	pickerEPP            = "epp"
	pickerEPPTuned       = "epp-tuned"

	familySim  = "llmd-sim"
	familyMock = "mock"
	promptsIDs = "tokens"
	promptsTxt = "text"
)

// isKvselect reports whether a picker name is one of kvselect's runs.
func isKvselect(picker string) bool {
	return picker == pickerKvselect || picker == pickerKvselectPrefix
}

type vsConfig struct {
	kvselectBin, simBin, eppBin string
	mockBin                     string
	family, prompts             string
	kvselectArgs, eppArgs       []string
	trace                       string
	requests, offset            int
	loop                        string  // "open" or "closed"
	compress                    float64 // open loop: trace time is divided by this
	rate                        float64 // open loop: fixed arrivals per second instead of the trace's
	concurrency                 int     // closed loop: clients; open loop: most in flight
	sims                        int
	blockTokens, blockSize      int
	kvBlocks                    int
	prefillPerToken, interToken time.Duration
	maxNumSeqs, maxOutput       int
	pickers, transports         []string
	idle, saturate              time.Duration
	saturateStreams             int
	pin                         bool
	out                         string
	quiet                       bool
}

// vsRun is one picker's run on one transport.
type vsRun struct {
	Picker    string `json:"picker"`
	Transport string `json:"transport"`
	Requests  int    `json:"requests"`
	Errors    int    `json:"errors"`
	// ErrorSample is the first error, to read when Errors > 0.
	ErrorSample string `json:"error_sample,omitempty"`
	// Decision is client-side: envoysim's Start (request headers sent) to
	// the routing decision (destination known, body streamed back), µs.
	Decision vsPct `json:"decision_us"`
	// Histogram is the picker's own decision histogram over the trace run:
	// kvselect_extproc_pick_duration_seconds (body parse, selection,
	// booking) or llm_d_epp_scheduler_e2e_duration_seconds (the scheduling
	// cycle alone). Quantiles interpolate within buckets.
	Histogram promtext.Summary `json:"picker_histogram"`
	// CPUPerRequestUs is the picker's CPU (utime+stime) over the trace run
	// less its idle rate over the same time, per routed request;
	// CPUPerRequestGrossUs is without the subtraction.
	CPUPerRequestUs      float64 `json:"cpu_per_request_us"`
	CPUPerRequestGrossUs float64 `json:"cpu_per_request_gross_us"`
	// IdleCPUPercent is the picker's CPU while no request runs (KV event
	// ingestion, metric scraping, timers), in % of one core.
	IdleCPUPercent float64 `json:"idle_cpu_percent"`
	// MaxRPS is the saturating closed loop's completed requests per second
	// (picker only: the response is synthesised, no engine runs); its
	// SaturationCPUPercent below ~90 % means the load generator, not the
	// picker, was the limit.
	MaxRPS               float64 `json:"max_requests_per_second"`
	SaturationCPUPercent float64 `json:"saturation_picker_cpu_percent"`
	// SaturationCPUPerRequestUs is the picker's CPU per request in the
	// saturating loop: with many streams in flight, reads and writes carry
	// several messages per system call, so this is the marginal cost, where
	// CPUPerRequestUs at the trace's pace pays a wake-up per message.
	SaturationCPUPerRequestUs float64 `json:"saturation_cpu_per_request_us"`
	SaturationErrors          int     `json:"saturation_errors"`
	SaturationError           string  `json:"saturation_error_sample,omitempty"`
	// HitRate is cached prompt tokens / prompt tokens from the engines' own
	// vllm:prefix_cache_* counters.
	HitRate   float64 `json:"prefix_cache_hit_rate"`
	TTFTP50Ms float64 `json:"ttft_p50_ms"`
	TTFTP90Ms float64 `json:"ttft_p90_ms"`
	PerEngine []int   `json:"requests_per_engine"`
	// LoadCV is the coefficient of variation of PerEngine.
	LoadCV      float64 `json:"load_cv"`
	WallSeconds float64 `json:"wall_seconds"`
	Throughput  float64 `json:"throughput_rps"`
	// WithScores counts decisions whose envoy.lb metadata carried endpoint
	// scores (the EPP's --emit-endpoint-scores).
	WithScores int `json:"decisions_with_scores"`
	// BodiesReencoded counts request bodies the picker streamed back as the
	// same JSON in other bytes (the EPP re-marshals every body).
	BodiesReencoded int `json:"bodies_reencoded"`
	// RefusedMutations counts decisions with header mutations Envoy's
	// default mutation rules refuse (the EPP echoes :authority, :method and
	// :scheme); RefusedSample lists one decision's.
	RefusedMutations int    `json:"decisions_with_refused_header_mutations"`
	RefusedSample    string `json:"refused_header_mutations_sample,omitempty"`
	// LeakedBookings is kvselect's active requests (GET /loads) after the
	// trace run and after the saturation run; nil for the EPP.
	LeakedBookings *uint64 `json:"leaked_bookings,omitempty"`
	// TokenizeFallbacks is, for kvselect with text prompts, the trace's
	// prompts it could not tokenize through an engine and so routed on its
	// approximate text index (kvselect_tokenize_requests_total{result=
	// "fallback"}); nil otherwise.
	TokenizeFallbacks       *uint64           `json:"tokenize_fallbacks,omitempty"`
	TokenizeFallbackReasons map[string]uint64 `json:"tokenize_fallback_reasons,omitempty"`

	decisions, ttfts []time.Duration
}

type vsPct struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
}

type vsReport struct {
	Date     string `json:"date"`
	CPUs     int    `json:"cpus"`
	Pinned   bool   `json:"pinned"`
	Trace    string `json:"trace"`
	Requests int    `json:"requests"`
	Engines  int    `json:"engines"`
	// EngineFamily is llmd-sim (llm-d-inference-sim) or mock
	// (kvselect-mockworker); Prompts is tokens (token-id prompts) or text.
	EngineFamily string  `json:"engine_family"`
	Prompts      string  `json:"prompts"`
	Loop         string  `json:"loop"`
	Args         string  `json:"args"`
	EPPConfig    string  `json:"epp_config_default,omitempty"`
	Runs         []vsRun `json:"runs"`
}

func runVsEPP(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvbench vs-epp", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c vsConfig
	var pickers, transports, kvselectArgs, eppArgs string
	fs.StringVar(&c.kvselectBin, "kvselect", "bin/kvselect", "kvselect `binary`")
	fs.StringVar(&c.simBin, "sim-bin", os.Getenv(peerproc.EnvSim), "llm-d-inference-sim `binary` (default $"+peerproc.EnvSim+")")
	fs.StringVar(&c.mockBin, "mockworker", "bin/kvselect-mockworker", "kvselect-mockworker `binary` (-engine-family mock)")
	fs.StringVar(&c.family, "engine-family", familySim, "`engines`: "+familySim+" (llm-d-inference-sim) or "+familyMock+" (kvselect-mockworker with the same timing model, dialing the picker's collector the same way)")
	fs.StringVar(&c.prompts, "prompts", promptsIDs, "`form` of the prompts: "+promptsIDs+" (token ids) or "+promptsTxt+" (a text per trace block; kvselect runs --tokenize pool, the EPP renders through an engine, which needs -engine-family "+familySim+")")
	fs.StringVar(&c.eppBin, "epp-bin", os.Getenv(peerproc.EnvEPP), "llm-d endpoint picker `binary` (default $"+peerproc.EnvEPP+")")
	fs.StringVar(&kvselectArgs, "kvselect-args", "", "extra kvselect `flags`, space-separated (e.g. --enable-pprof)")
	fs.StringVar(&eppArgs, "epp-args", "", "extra endpoint picker `flags`, space-separated")
	fs.StringVar(&c.trace, "trace", "bench/testdata/mooncake/conversation_trace.jsonl.gz", "Mooncake trace `path`")
	fs.IntVar(&c.requests, "requests", 1000, "trace `requests` per picker run")
	fs.IntVar(&c.offset, "offset", 0, "skip this many trace requests first")
	fs.StringVar(&c.loop, "loop", "open", "`traffic`: open (arrivals at the trace's times / -compress, or at -rate) or closed (-concurrency clients back to back)")
	fs.Float64Var(&c.compress, "compress", 10, "open loop: replay the trace this many `times` faster than recorded (at 20x, four engines and the load generator saturate one core)")
	fs.Float64Var(&c.rate, "rate", 0, "open loop: arrivals per `second` at a fixed pace instead of the trace's times")
	fs.IntVar(&c.concurrency, "concurrency", 64, "closed loop: `clients`; open loop: most requests in flight")
	fs.IntVar(&c.sims, "engines", 4, "`engines` (of -engine-family)")
	fs.IntVar(&c.blockTokens, "block-tokens", 64, "prompt `tokens` per trace block (the trace's blocks are 512 tokens)")
	fs.IntVar(&c.blockSize, "block-size", 16, "engines' KV block size (both pickers are told the same)")
	fs.IntVar(&c.kvBlocks, "kv-blocks", 8192, "engines' KV cache, in blocks (large next to one prompt: the simulator mis-chains blocks when it evicts within a request)")
	fs.DurationVar(&c.prefillPerToken, "prefill-time-per-token", 20*time.Microsecond, "engines' prefill time per uncached prompt token")
	fs.DurationVar(&c.interToken, "inter-token-latency", 2*time.Millisecond, "engines' time per output token")
	fs.IntVar(&c.maxNumSeqs, "max-num-seqs", 4, "requests an engine runs at once; the rest wait in its queue (small, so that piling requests on one engine costs TTFT)")
	fs.IntVar(&c.maxOutput, "max-output", 16, "cap on output `tokens` per request")
	fs.StringVar(&pickers, "pickers", strings.Join([]string{pickerKvselect, pickerKvselectPrefix, pickerEPP, pickerEPPTuned}, ","), "pickers to run, comma-separated: "+pickerKvselect+" (Dynamo's cost, the default policy), "+pickerKvselectPrefix+" (--policy longest-prefix), "+pickerEPP+" (its sample configuration's weights), "+pickerEPPTuned+" (llm-d-router's precise-prefix perf-test scorers)")
	fs.StringVar(&transports, "transports", "plain", "ext_proc `transports`, comma-separated: plain, tls (each picker serves a self-signed certificate; the client does not verify it)")
	fs.DurationVar(&c.idle, "idle", 5*time.Second, "idle window before traffic, to measure each picker's idle CPU")
	fs.DurationVar(&c.saturate, "saturate", 5*time.Second, "saturating closed loop after the trace, picker only (0 skips it)")
	fs.IntVar(&c.saturateStreams, "saturate-streams", 64, "concurrent streams of the saturating loop")
	fs.BoolVar(&c.pin, "pin", true, "pin the picker to CPU 0 and this process with the engines to CPU 1 (taskset; needs 2 CPUs)")
	fs.StringVar(&c.out, "out", "bench/out/vs-epp", "`directory` for vs-epp.json, vs-epp.svg, the generated EPP configuration and the processes' logs")
	fs.BoolVar(&c.quiet, "quiet", false, "no progress bars")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c.kvselectArgs, c.eppArgs = strings.Fields(kvselectArgs), strings.Fields(eppArgs)
	c.pickers = splitList(pickers)
	c.transports = splitList(transports)
	if err := c.check(fs); err != nil {
		return err
	}
	reqs, err := mooncake.LoadTrace(c.trace)
	if err != nil {
		return err
	}
	if c.offset >= len(reqs) {
		return fmt.Errorf("-offset %d: the trace has %d requests", c.offset, len(reqs))
	}
	reqs = reqs[c.offset:min(len(reqs), c.offset+c.requests)]
	if err := os.MkdirAll(c.out, 0o755); err != nil {
		return err
	}
	if c.pin {
		if err := pinSelf(1); err != nil {
			fmt.Fprintf(stderr, "vs-epp: not pinned: %v\n", err)
			c.pin = false
		} else {
			fmt.Fprintln(stderr, "vs-epp: each picker on CPU 0; this load generator and the engines on CPU 1")
		}
	}
	rep := vsReport{Date: time.Now().UTC().Format(time.RFC3339), CPUs: runtime.NumCPU(), Pinned: c.pin, Trace: c.trace,
		Requests: len(reqs), Engines: c.sims, EngineFamily: c.family, Prompts: c.prompts, Loop: c.loopName(), Args: strings.Join(args, " ")}
	bodies, err := c.bodies(reqs)
	if err != nil {
		return err
	}
	for _, tr := range c.transports {
		for _, p := range c.pickers {
			fmt.Fprintf(stderr, "vs-epp: %s over %s...\n", p, tr)
			run, err := c.runOne(ctx, p, tr, reqs, bodies, stderr)
			if err != nil {
				return fmt.Errorf("%s/%s: %w (logs in %s)", p, tr, err, c.out)
			}
			rep.Runs = append(rep.Runs, run)
		}
	}
	if b, err := os.ReadFile(filepath.Join(c.out, pickerEPP+"-plain", "epp-config.yaml")); err == nil {
		rep.EPPConfig = string(b)
	}
	if err := vsTable(stdout, &rep); err != nil {
		return err
	}
	if err := report.WriteJSON(filepath.Join(c.out, "vs-epp.json"), rep); err != nil {
		return err
	}
	svg := filepath.Join(c.out, "vs-epp.svg")
	title := fmt.Sprintf("kvselect vs llm-d EPP: %d %s, %d trace requests (%s prompts), %s", c.sims, familyNoun(c.family), len(reqs), c.prompts, rep.Loop)
	if err := report.WriteSVG(svg, title, vsCharts(&rep)...); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nwrote %s and %s (logs and EPP configurations in %s)\n", filepath.Join(c.out, "vs-epp.json"), svg, c.out)
	for _, r := range rep.Runs {
		if r.Errors > 0 || r.SaturationErrors > 0 {
			return fmt.Errorf("%s/%s: %d of %d requests failed (first: %s), %d in the saturating loop (first: %s)",
				r.Picker, r.Transport, r.Errors, r.Requests, r.ErrorSample, r.SaturationErrors, r.SaturationError)
		}
		if r.LeakedBookings != nil && *r.LeakedBookings != 0 {
			return fmt.Errorf("%s/%s: %d bookings left after the run", r.Picker, r.Transport, *r.LeakedBookings)
		}
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func (c *vsConfig) check(fs *flag.FlagSet) error {
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	case c.requests < 1 || c.concurrency < 1 || c.sims < 1 || c.blockTokens < 1 || c.blockSize < 1 || c.kvBlocks < 1 ||
		c.maxNumSeqs < 1 || c.maxOutput < 1 || c.saturateStreams < 1:
		return errors.New("-requests, -concurrency, -engines, -block-tokens, -block-size, -kv-blocks, -max-num-seqs, -max-output and -saturate-streams must be positive")
	case c.loop != "open" && c.loop != "closed":
		return fmt.Errorf("-loop %q: want open or closed", c.loop)
	case !(c.compress > 0) || c.rate < 0:
		return errors.New("-compress must be positive and -rate not negative")
	case c.idle <= 0 || c.saturate < 0:
		return errors.New("-idle must be positive and -saturate not negative")
	case len(c.pickers) == 0 || len(c.transports) == 0:
		return errors.New("-pickers and -transports name at least one each")
	}
	for _, p := range c.pickers {
		if !isKvselect(p) && p != pickerEPP && p != pickerEPPTuned {
			return fmt.Errorf("-pickers: unknown picker %q", p)
		}
		if !isKvselect(p) && c.eppBin == "" {
			return fmt.Errorf("picker %s needs llm-d's endpoint picker: set -epp-bin or $%s (build it from github.com/llm-d/llm-d-router, cmd/epp)", p, peerproc.EnvEPP)
		}
	}
	for _, t := range c.transports {
		if t != "plain" && t != "tls" {
			return fmt.Errorf("-transports: unknown transport %q", t)
		}
	}
	switch c.family {
	case familySim:
		if c.simBin == "" {
			return fmt.Errorf("vs-epp needs llm-d-inference-sim: set -sim-bin or $%s (build it from github.com/llm-d/llm-d-inference-sim)", peerproc.EnvSim)
		}
	case familyMock:
		if c.mockBin == "" {
			return errors.New("-engine-family mock needs -mockworker (build it with `make build`)")
		}
	default:
		return fmt.Errorf("-engine-family %q: want %s or %s", c.family, familySim, familyMock)
	}
	switch c.prompts {
	case promptsIDs:
	case promptsTxt:
		for _, p := range c.pickers {
			// The EPP's token producer renders text through an engine's
			// /v1/completions/render, which the mock worker does not serve.
			if !isKvselect(p) && c.family == familyMock {
				return fmt.Errorf("-prompts text with picker %s needs -engine-family %s: the EPP renders text prompts through an engine's /v1/completions/render, which kvselect-mockworker does not serve", p, familySim)
			}
		}
	default:
		return fmt.Errorf("-prompts %q: want %s or %s", c.prompts, promptsIDs, promptsTxt)
	}
	return nil
}

// familyNoun names the engines of a family in the report.
func familyNoun(family string) string {
	if family == familyMock {
		return "kvselect-mockworker engines"
	}
	return "llm-d-inference-sim engines"
}

// vsTextBody is a completions request with a text prompt.
type vsTextBody struct {
	Model     string `json:"model"`
	Prompt    string `json:"prompt"`
	MaxTokens int    `json:"max_tokens"`
	Stream    bool   `json:"stream"`
}

// bodies are the trace's requests as the client sends them, token ids or text.
func (c *vsConfig) bodies(reqs []mooncake.Request) ([][]byte, error) {
	bodies := make([][]byte, len(reqs))
	for i, r := range reqs {
		maxTokens := min(max(1, r.OutputLength*c.blockTokens/512), c.maxOutput)
		var body any = demoBody{Model: simModel, Prompt: demoTokens(r.HashIDs, c.blockTokens), MaxTokens: maxTokens, Stream: true}
		if c.prompts == promptsTxt {
			body = vsTextBody{Model: simModel, Prompt: vsText(r.HashIDs, c.blockTokens), MaxTokens: maxTokens, Stream: true}
		}
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("request %d: %w", i, err)
		}
		bodies[i] = b
	}
	return bodies, nil
}

// vsText is the text analogue of demoTokens: every trace block becomes
// blockTokens words derived from its hash id, so requests that share a prefix
// of hash ids share a text prefix, ending at a word boundary. Every word is
// six lowercase letters, so a tokenizer that gives a word one token (the mock
// worker's) gives every block blockTokens tokens, and one that splits words
// further (the simulator's) splits them alike.
func vsText(ids []uint64, blockTokens int) string {
	var b strings.Builder
	b.Grow(len(ids) * blockTokens * 8)
	const letters = "abcdefghijklmnopqrstuvwxyz"
	for _, id := range ids {
		for j := range blockTokens {
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			h := mooncake.Mix64(id<<16 | uint64(j))
			for range 6 {
				b.WriteByte(letters[h%26])
				h /= 26
			}
		}
	}
	return b.String()
}

func (c *vsConfig) loopName() string {
	switch {
	case c.loop == "closed":
		return fmt.Sprintf("closed loop, %d clients", c.concurrency)
	case c.rate > 0:
		return fmt.Sprintf("open loop, %.0f req/s, at most %d in flight", c.rate, c.concurrency)
	}
	return fmt.Sprintf("open loop at %gx the trace's pace, at most %d in flight", c.compress, c.concurrency)
}

// pinSelf moves every thread of this process to cpu, so that the engines it
// starts inherit that CPU; the picker is started on the other one.
func pinSelf(cpu int) error {
	if runtime.NumCPU() < 2 {
		return fmt.Errorf("needs 2 CPUs, found %d", runtime.NumCPU())
	}
	ts, err := exec.LookPath("taskset")
	if err != nil {
		return fmt.Errorf("taskset (util-linux) not found: %w", err)
	}
	if out, err := exec.Command(ts, "-a", "-p", "-c", strconv.Itoa(cpu), strconv.Itoa(os.Getpid())).CombinedOutput(); err != nil {
		return fmt.Errorf("taskset: %w: %s", err, out)
	}
	return nil
}

// vsPicker is a running picker.
type vsPicker struct {
	pid     int
	metrics string // Prometheus URL
	hist    string // its decision histogram
	rest    string // kvselect's REST base URL; "" for the EPP
	conn    *grpc.ClientConn
	stop    func()
}

// runOne is one picker's run: the picker first (the engines dial its KV
// events socket), fresh engines, an idle window, the trace, then the
// saturating loop.
func (c *vsConfig) runOne(ctx context.Context, picker, transport string, reqs []mooncake.Request, bodies [][]byte, stderr io.Writer) (vsRun, error) {
	run := vsRun{Picker: picker, Transport: transport, Requests: len(reqs), PerEngine: make([]int, c.sims)}
	name := picker + "-" + transport
	dir := filepath.Join(c.out, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return run, err
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c.concurrency, MaxIdleConns: 4 * c.concurrency}}
	defer hc.CloseIdleConnections()
	ports := make([]int, c.sims)
	endpoints := make([]string, c.sims)
	for i := range ports {
		p, err := peerproc.FreePort()
		if err != nil {
			return run, err
		}
		ports[i], endpoints[i] = p, "127.0.0.1:"+strconv.Itoa(p)
	}
	collectorPort, err := peerproc.FreePort()
	if err != nil {
		return run, err
	}
	collector := "tcp://127.0.0.1:" + strconv.Itoa(collectorPort)
	pk, err := c.startPicker(ctx, picker, transport == "tls", dir, endpoints, collector, hc)
	if err != nil {
		return run, err
	}
	defer pk.stop()
	engines, err := c.startEngines(ctx, reqs, collector, dir, ports)
	defer func() {
		for _, e := range engines {
			e.Stop()
		}
	}()
	if err != nil {
		return run, err
	}
	fl := &fleet{hc: hc, rest: pk.rest, workers: endpoints, model: simModel}
	if pk.rest != "" {
		for i, e := range engines {
			if err := registerEngine(ctx, hc, pk.rest, uint64(i+1), e, c.blockSize, c.kvBlocks); err != nil {
				return run, err
			}
		}
		if err := fl.waitWorkers(ctx, c.sims, 60*time.Second); err != nil {
			return run, err
		}
	}

	// Idle: the engines' PUB sockets dial the collector (they retry every
	// second), the EPP scrapes every engine's metrics, kvselect's listeners
	// wait. Both pickers get the same window before the first request.
	cpu0, err := procCPU(pk.pid)
	if err != nil {
		return run, err
	}
	select {
	case <-ctx.Done():
		return run, ctx.Err()
	case <-time.After(c.idle):
	}
	cpu1, err := procCPU(pk.pid)
	if err != nil {
		return run, err
	}
	idleRate := float64(cpu1-cpu0) / float64(c.idle) // CPU seconds per second
	run.IdleCPUPercent = 100 * idleRate

	h0, err := promtext.Scrape(ctx, hc, pk.metrics)
	if err != nil {
		return run, err
	}
	client := envoysim.New(pk.conn)
	var bar *report.Progress
	if !c.quiet {
		bar = report.NewProgress(stderr, name)
	}
	start := time.Now()
	cpuStart, err := procCPU(pk.pid)
	if err != nil {
		return run, err
	}
	var (
		mu       sync.Mutex
		done     atomic.Int64
		firstErr error
	)
	one := func(i int) {
		res, err := vsRequest(ctx, client, hc, bodies[i], fmt.Sprintf("vs-%s-%d", name, i))
		mu.Lock()
		if err != nil {
			run.Errors++
			if firstErr == nil {
				firstErr = err
			}
		} else {
			run.decisions = append(run.decisions, res.decision)
			run.ttfts = append(run.ttfts, res.ttft)
			if k := slices.Index(endpoints, res.endpoint); k >= 0 {
				run.PerEngine[k]++
			} else {
				run.Errors++
				if firstErr == nil {
					firstErr = fmt.Errorf("routed to %q, not one of the engines", res.endpoint)
				}
			}
			if res.scores {
				run.WithScores++
			}
			if res.rewritten {
				run.BodiesReencoded++
			}
			if len(res.refused) > 0 {
				run.RefusedMutations++
				if run.RefusedSample == "" {
					run.RefusedSample = strings.Join(res.refused, " ")
				}
			}
		}
		mu.Unlock()
		bar.Update(int(done.Add(1)), len(reqs))
	}
	if err := c.traffic(ctx, reqs, one); err != nil {
		return run, err
	}
	wall := time.Since(start)
	cpuEnd, err := procCPU(pk.pid)
	if err != nil {
		return run, err
	}
	if firstErr != nil {
		run.ErrorSample = firstErr.Error()
		fmt.Fprintf(stderr, "%s: first error: %v\n", name, firstErr)
	}
	routed := len(run.decisions)
	run.WallSeconds = wall.Seconds()
	run.Throughput = float64(routed) / wall.Seconds()
	if routed > 0 {
		gross := float64(cpuEnd - cpuStart)
		run.CPUPerRequestGrossUs = gross / float64(routed) / 1e3
		run.CPUPerRequestUs = math.Max(0, gross-idleRate*float64(wall)) / float64(routed) / 1e3
	}
	h1, err := promtext.Scrape(ctx, hc, pk.metrics)
	if err != nil {
		return run, err
	}
	run.Histogram = h1.Minus(h0).Summarize(pk.hist)
	d, t := percentiles(run.decisions), percentiles(run.ttfts)
	run.Decision = vsPct{P50: float64(d.P50) / 1e3, P90: float64(d.P90) / 1e3, P99: float64(d.P99) / 1e3}
	run.TTFTP50Ms, run.TTFTP90Ms = float64(t.P50)/1e6, float64(t.P90)/1e6
	run.LoadCV = stats.CV(run.PerEngine)
	queries, hits, err := fl.cacheCounters()
	if err != nil {
		return run, err
	}
	if queries > 0 {
		run.HitRate = hits / queries
	}
	if pk.rest != "" {
		n, err := fl.settledLoad(ctx)
		if err != nil {
			return run, err
		}
		run.LeakedBookings = &n
		if c.prompts == promptsTxt {
			if err := run.tokenizeFigures(ctx, hc, pk.metrics); err != nil {
				return run, err
			}
		}
	}

	if c.saturate > 0 {
		if err := c.saturation(ctx, pk, client, bodies, &run); err != nil {
			return run, err
		}
		if pk.rest != "" {
			n, err := fl.settledLoad(ctx)
			if err != nil {
				return run, err
			}
			*run.LeakedBookings += n
		}
	}
	return run, nil
}

// tokenizeFigures reads how many text prompts kvselect routed on its text
// index for want of the engine's ids, and why.
func (run *vsRun) tokenizeFigures(ctx context.Context, hc *http.Client, metricsURL string) error {
	m, err := promtext.Scrape(ctx, hc, metricsURL)
	if err != nil {
		return err
	}
	n := uint64(m.ByLabel("kvselect_tokenize_requests_total", "result")["fallback"])
	run.TokenizeFallbacks = &n
	for reason, v := range m.ByLabel("kvselect_tokenize_fallbacks_total", "reason") {
		if v > 0 {
			if run.TokenizeFallbackReasons == nil {
				run.TokenizeFallbackReasons = make(map[string]uint64)
			}
			run.TokenizeFallbackReasons[reason] = uint64(v)
		}
	}
	return nil
}

// startPicker starts kvselect or the EPP (on CPU 0 when pinned) and dials
// its ext_proc port as Envoy would.
func (c *vsConfig) startPicker(ctx context.Context, picker string, secure bool, dir string, endpoints []string, collector string, hc *http.Client) (*vsPicker, error) {
	var wrap []string
	if c.pin {
		wrap = []string{"taskset", "-c", "0"}
	}
	var ports [3]int
	for i := range ports {
		p, err := peerproc.FreePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	logf, err := os.Create(filepath.Join(dir, picker+".log"))
	if err != nil {
		return nil, err
	}
	pk := &vsPicker{}
	var addr string
	switch picker {
	case pickerKvselect, pickerKvselectPrefix:
		args := []string{"--host", "127.0.0.1", "--port", strconv.Itoa(ports[0]), "--extproc-port", strconv.Itoa(ports[1]),
			"--kv-events-bind", collector, "--log-level", "warn"}
		if secure {
			args = append(args, "--extproc-secure-serving")
		}
		if picker == pickerKvselectPrefix {
			args = append(args, "--policy", "longest-prefix")
		}
		if c.prompts == promptsTxt {
			args = append(args, "--tokenize", "pool")
		}
		args = append(args, c.kvselectArgs...)
		argv := append(append(wrap, c.kvselectBin), args...)
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Stdout, cmd.Stderr = logf, logf
		peerproc.DieWithParent(cmd)
		if err := cmd.Start(); err != nil {
			logf.Close()
			return nil, fmt.Errorf("start kvselect (%s): %w; build it with `make build`", c.kvselectBin, err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); logf.Close(); close(exited) }()
		pk.stop = func() { stopCmd(cmd, exited) }
		pk.pid = cmd.Process.Pid
		pk.rest = "http://127.0.0.1:" + strconv.Itoa(ports[0])
		pk.metrics, pk.hist = pk.rest+"/metrics", "kvselect_extproc_pick_duration_seconds"
		addr = "127.0.0.1:" + strconv.Itoa(ports[1])
		if err := waitHTTP(ctx, hc, pk.rest+"/health", 30*time.Second); err != nil {
			pk.stop()
			return nil, fmt.Errorf("kvselect did not come up: %w", err)
		}
		fmt.Fprintf(logf, "kvbench vs-epp: kvselect REST on %s, ext_proc on %s\n", pk.rest, addr)
	default:
		profile := peerproc.EPPDefault
		if picker == pickerEPPTuned {
			profile = peerproc.EPPTuned
		}
		p, err := peerproc.StartEPP(ctx, peerproc.EPP{
			Binary: c.eppBin, Dir: dir, Endpoints: endpoints, ZMQEndpoint: collector, Model: simModel,
			BlockSize: c.blockSize, Profile: profile, GRPCPort: ports[0], HealthPort: ports[1], MetricsPort: ports[2],
			Secure: secure, Wrap: wrap, Log: logf, Extra: c.eppArgs,
		})
		if err != nil {
			logf.Close()
			return nil, err
		}
		pk.stop = func() { p.Stop(); logf.Close() }
		pk.pid = p.Pid()
		pk.metrics, pk.hist = p.MetricsURL(), "llm_d_epp_scheduler_e2e_duration_seconds"
		addr = p.Addr()
	}
	creds := grpc.WithTransportCredentials(insecure.NewCredentials())
	if secure {
		creds = envoysim.InsecureTLS()
	}
	pk.conn, err = grpc.NewClient(addr, append(envoysim.DialOptions(), creds)...)
	if err != nil {
		pk.stop()
		return nil, err
	}
	stopPicker := pk.stop
	pk.stop = func() { pk.conn.Close(); stopPicker() }
	return pk, nil
}

// vsEngine is a running engine of either family.
type vsEngine interface {
	URL() string
	ReplayEndpoint() string
	Stop()
}

// startEngines starts c.sims engines of c.family on the given HTTP ports,
// their PUB sockets dialing collector, each with a replay endpoint, and waits
// until each answers /health. On error it returns the ones that started, for
// the caller to stop.
func (c *vsConfig) startEngines(ctx context.Context, reqs []mooncake.Request, collector, dir string, ports []int) ([]vsEngine, error) {
	var engines []vsEngine
	modelLen := simModelLen(reqs, c.blockTokens, c.maxOutput)
	if c.family == familySim {
		sims, err := startSims(ctx, simFleetConfig{
			bin: c.simBin, n: c.sims, collector: collector, blockSize: c.blockSize, kvBlocks: c.kvBlocks,
			prefillPerToken: c.prefillPerToken, interToken: c.interToken, maxNumSeqs: c.maxNumSeqs,
			maxModelLen: modelLen, logDir: dir, ports: ports,
		})
		for _, s := range sims {
			engines = append(engines, s)
		}
		return engines, err
	}
	for i, port := range ports {
		replay, err := peerproc.FreePort()
		if err != nil {
			return engines, err
		}
		logPath := filepath.Join(dir, fmt.Sprintf("mockworker-%d.log", i+1))
		logf, err := os.Create(logPath)
		if err != nil {
			return engines, err
		}
		// The simulator's timing model in the mock's terms: prefill per
		// uncached prompt token, a fixed time per output token, at most
		// -max-num-seqs running.
		p, err := peerproc.StartMockWorker(ctx, peerproc.MockWorker{
			Binary: c.mockBin, Model: simModel, Port: port, Collector: collector, ReplayPort: replay,
			BlockSize: c.blockSize, KVBlocks: c.kvBlocks, PrefillPerToken: c.prefillPerToken, DecodePerToken: c.interToken,
			MaxNumSeqs: c.maxNumSeqs, MaxModelLen: modelLen, Log: logf,
		})
		if err != nil {
			logf.Close()
			return engines, fmt.Errorf("start kvselect-mockworker %d (log %s): %w; build it with `make build`", i+1, logPath, err)
		}
		engines = append(engines, vsMock{p, logf})
	}
	return engines, nil
}

// vsMock is a mock worker process and its log file.
type vsMock struct {
	*peerproc.MockWorkerProcess
	log *os.File
}

func (m vsMock) Stop() {
	m.MockWorkerProcess.Stop()
	m.log.Close()
}

func stopCmd(cmd *exec.Cmd, exited chan struct{}) {
	select {
	case <-exited:
		return
	default:
	}
	_ = cmd.Process.Signal(os.Interrupt)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// traffic calls one(i) for every request, open or closed loop.
func (c *vsConfig) traffic(ctx context.Context, reqs []mooncake.Request, one func(int)) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	if c.loop == "closed" {
		var next atomic.Int64
		for range c.concurrency {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					i := int(next.Add(1) - 1)
					if i >= len(reqs) {
						return
					}
					one(i)
				}
			}()
		}
		wg.Wait()
		return ctx.Err()
	}
	sem := make(chan struct{}, c.concurrency)
	start := time.Now()
	for i, r := range reqs {
		var at time.Time
		if c.rate > 0 {
			at = start.Add(time.Duration(float64(i) / c.rate * float64(time.Second)))
		} else {
			at = start.Add(time.Duration(float64(time.Duration(r.Timestamp-reqs[0].Timestamp)*time.Millisecond) / c.compress))
		}
		if d := time.Until(at); d > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(d):
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case sem <- struct{}{}:
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			one(i)
		}()
	}
	return nil
}

// vsResult is one request through a picker.
type vsResult struct {
	decision, ttft time.Duration
	endpoint       string
	scores         bool
	rewritten      bool // the body came back re-encoded, same JSON
	refused        []string
}

func sameJSON(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}

// vsRequest is one request as Envoy runs it with the ext_proc filter in
// front of an InferencePool: the picker decides from the headers and the
// body, Envoy forwards the body the picker streamed back to the endpoint in
// the destination header, with the headers the picker set, and every chunk of
// the engine's SSE response goes through the picker on its way to the client
// — which must receive exactly what the engine sent (neither picker rewrites
// a response whose model name is the requested one).
func vsRequest(ctx context.Context, client *envoysim.Client, hc *http.Client, body []byte, id string) (vsResult, error) {
	begin := time.Now()
	x, d, err := client.Start(ctx, &envoysim.Request{Path: "/v1/completions", Body: body, Modes: envoysim.GIE,
		Headers: []envoysim.Header{{Key: "content-type", Value: "application/json"}, {Key: "x-request-id", Value: id}}})
	if err != nil {
		return vsResult{}, err
	}
	if d.Immediate != nil {
		return vsResult{}, fmt.Errorf("picker answered %d: %s", d.Immediate.Status, d.Immediate.Body)
	}
	res := vsResult{decision: time.Since(begin), endpoint: d.Endpoint, scores: d.EndpointScores != nil, refused: d.RejectedHeaders}
	if d.Endpoint == "" {
		x.Abort()
		return res, errors.New("no destination endpoint in the picker's answer")
	}
	if d.MetadataDestination != "" && d.MetadataDestination != d.Destination {
		x.Abort()
		return res, fmt.Errorf("destination header %q and envoy.lb metadata %q differ", d.Destination, d.MetadataDestination)
	}
	if !bytes.Equal(d.Body, body) {
		// A processor may replace the body in FULL_DUPLEX_STREAMED; one
		// that re-encodes the same JSON (the EPP does, keys sorted) is
		// counted, anything else is an error.
		if !sameJSON(d.Body, body) {
			x.Abort()
			return res, fmt.Errorf("the picker changed the request body's content (%d bytes in, %d out)", len(body), len(d.Body))
		}
		res.rewritten = true
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+d.Endpoint+"/v1/completions", bytes.NewReader(d.Body))
	if err != nil {
		x.Abort()
		return res, err
	}
	for k, v := range d.SetHeaders {
		if !strings.HasPrefix(k, ":") && k != "content-length" {
			req.Header.Set(k, v)
		}
	}
	resp, err := hc.Do(req)
	if err != nil {
		x.Abort()
		return res, err
	}
	defer resp.Body.Close()
	hs := make([]envoysim.Header, 0, len(resp.Header))
	for k, vs := range resp.Header {
		hs = append(hs, envoysim.Header{Key: strings.ToLower(k), Value: vs[0]})
	}
	if _, err := x.ResponseHeaders(envoysim.Response{Status: resp.StatusCode, Headers: hs, Served: d.Endpoint}, false); err != nil {
		x.Abort()
		return res, fmt.Errorf("response headers: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		x.Abort()
		return res, fmt.Errorf("engine %s answered %s: %s", d.Endpoint, resp.Status, b)
	}
	var sent, got []byte
	buf := make([]byte, 4096)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if res.ttft == 0 && bytes.Contains(buf[:n], []byte("data:")) {
				res.ttft = time.Since(begin)
			}
			sent = append(sent, buf[:n]...)
			fwd, err := x.ResponseBody(buf[:n], false)
			if err != nil {
				x.Abort()
				return res, fmt.Errorf("response body: %w", err)
			}
			got = append(got, fwd...)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			x.Abort()
			return res, rerr
		}
	}
	fwd, err := x.ResponseBody(nil, true)
	if err != nil {
		x.Abort()
		return res, fmt.Errorf("response end: %w", err)
	}
	got = append(got, fwd...)
	x.Close()
	if res.ttft == 0 {
		return res, fmt.Errorf("engine %s sent no data", d.Endpoint)
	}
	if !bytes.Equal(sent, got) {
		return res, fmt.Errorf("the client got %d bytes through the picker, the engine sent %d", len(got), len(sent))
	}
	return res, nil
}

// saturation is a closed loop of whole ext_proc exchanges with no engine
// behind them: the decision, then a synthesised SSE response (headers, one
// chunk, end) through the picker, as fast as the load generator goes. Its
// rate is the picker's maximum on one core when the picker's CPU is near
// 100 %; lower, the load generator on the other core was the limit.
func (c *vsConfig) saturation(ctx context.Context, pk *vsPicker, client *envoysim.Client, bodies [][]byte, run *vsRun) error {
	chunk := []byte("data: {\"choices\":[{\"index\":0,\"text\":\"x\"}]}\n\ndata: [DONE]\n\n")
	sse := []envoysim.Header{{Key: "content-type", Value: "text/event-stream"}}
	var (
		next, completed, failed atomic.Int64
		stop                    atomic.Bool
		wg                      sync.WaitGroup
		firstErr                atomic.Pointer[string]
	)
	// The window ends by not starting new requests: the ones in flight
	// finish normally, so that the end of the window cancels nothing (a
	// cancelled exchange would look like an error) and every booking is
	// freed the way a response end frees it.
	timer := time.AfterFunc(c.saturate, func() { stop.Store(true) })
	defer timer.Stop()
	cpu0, err := procCPU(pk.pid)
	if err != nil {
		return err
	}
	start := time.Now()
	for range c.saturateStreams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() && ctx.Err() == nil {
				i := int(next.Add(1)-1) % len(bodies)
				err := func() error {
					// A picker that never answers fails the request instead
					// of holding the loop.
					rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
					defer cancel()
					x, d, err := client.Start(rctx, &envoysim.Request{Path: "/v1/completions", Body: bodies[i], Modes: envoysim.GIE,
						Headers: []envoysim.Header{{Key: "content-type", Value: "application/json"}, {Key: "x-request-id", Value: "sat-" + strconv.Itoa(i)}}})
					if err != nil {
						return err
					}
					defer x.Close()
					if d.Immediate != nil {
						return fmt.Errorf("picker answered %d", d.Immediate.Status)
					}
					if _, err := x.ResponseHeaders(envoysim.Response{Headers: sse, Served: d.Endpoint}, false); err != nil {
						return err
					}
					_, err = x.ResponseBody(chunk, true)
					return err
				}()
				switch {
				case err == nil:
					completed.Add(1)
				case ctx.Err() == nil:
					failed.Add(1)
					msg := err.Error()
					firstErr.CompareAndSwap(nil, &msg)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu1, err := procCPU(pk.pid)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	run.MaxRPS = float64(completed.Load()) / elapsed.Seconds()
	run.SaturationCPUPercent = 100 * float64(cpu1-cpu0) / float64(elapsed)
	if n := completed.Load(); n > 0 {
		run.SaturationCPUPerRequestUs = float64(cpu1-cpu0) / float64(n) / 1e3
	}
	run.SaturationErrors = int(failed.Load())
	if p := firstErr.Load(); p != nil {
		run.SaturationError = *p
	}
	return nil
}

// settledLoad waits up to 5 s for kvselect's active requests to drain (a
// booking is freed when the picker sees the response end, which can trail
// the client's last byte) and returns what is left.
func (fl *fleet) settledLoad(ctx context.Context) (uint64, error) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, err := fl.activeRequests()
		if err != nil || n == 0 || time.Now().After(deadline) {
			return n, err
		}
		select {
		case <-ctx.Done():
			return n, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// procCPU is a process's user + system CPU time, all threads, from
// /proc/<pid>/stat (clock ticks of 1/100 s, Linux's USER_HZ).
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("picker CPU time: %w", err)
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// count fields after its closing one. utime and stime are fields 14 and
	// 15 of the line, 12 and 13 after the name.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("picker CPU time: malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("picker CPU time: short /proc/%d/stat", pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("picker CPU time: /proc/%d/stat: %v %v", pid, err1, err2)
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}
