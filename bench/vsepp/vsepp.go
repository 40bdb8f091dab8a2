// Package vsepp measures kvselect's endpoint picker and llm-d's
// (llm-d-router's EPP) side by side, each driven through envoysim exactly as
// Envoy's ext_proc filter drives a GIE endpoint picker — FULL_DUPLEX_STREAMED
// both ways, the body, the destination from the picker's header, the request
// forwarded to that engine and the engine's real SSE response streamed back
// through the picker — against the same engines and the same Mooncake trace
// slice. The engines are llm-d-inference-sim processes or kvselect's mock
// workers dialing the collector the same way. Every picker run starts fresh
// engines, so each begins with empty caches and an empty index.
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
// With text prompts the trace goes out as text: kvselect runs with
// --tokenize pool (its registered engines answer POST /tokenize), the EPP's
// token producer renders each prompt through the first engine's
// /v1/completions/render, which only llm-d-inference-sim serves.
package vsepp

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvselect/kvselect/bench/fleet"
	"github.com/kvselect/kvselect/bench/mooncake"
	"github.com/kvselect/kvselect/bench/promtext"
	"github.com/kvselect/kvselect/bench/relay"
	"github.com/kvselect/kvselect/bench/report"
	"github.com/kvselect/kvselect/bench/workload"
	"github.com/kvselect/kvselect/internal/peerproc"
)

const (
	// pickerKvselect is kvselect with its defaults.
	pickerKvselect = "kvselect"
	// pickerKvselectLatency, pickerKvselectCost and pickerKvselectPrefix
	// are kvselect with one policy named: predicted-latency, kv-cost
	// (Dynamo's cost) and longest-prefix (greedy on the cached prefix,
	// ignoring load).
	pickerKvselectLatency = "kvselect-latency"
	pickerKvselectCost    = "kvselect-kvcost"
	pickerKvselectPrefix  = "kvselect-prefix"
	pickerEPP             = "epp"
	pickerEPPTuned        = "epp-tuned"
	// PickerFloor is bench/floorpicker: only what the protocol requires,
	// round-robin. Its figures are the floor under both pickers' (the
	// messages on the same gRPC stack as kvselect's); not run by default.
	PickerFloor = "floor"
)

// kvselectPolicies are the policy each of kvselect's pickers names ("":
// the default).
var kvselectPolicies = map[string]string{
	pickerKvselect:        "",
	pickerKvselectLatency: "predicted-latency",
	pickerKvselectCost:    "kv-cost",
	pickerKvselectPrefix:  "longest-prefix",
}

// Prompt forms.
const (
	PromptsTokens = "tokens" // token ids
	PromptsText   = "text"   // a text per trace block
)

// Pickers are every picker run, in the default order.
var Pickers = []string{pickerKvselect, pickerKvselectCost, pickerKvselectPrefix, pickerEPP, pickerEPPTuned}

// IsEPP reports whether a picker name is one of llm-d's endpoint picker's runs.
func IsEPP(picker string) bool { return picker == pickerEPP || picker == pickerEPPTuned }

// IsKvselect reports whether a picker name is one of kvselect's runs.
func IsKvselect(picker string) bool {
	_, ok := kvselectPolicies[picker]
	return ok
}

// Config is one comparison.
type Config struct {
	// Spec is the engines: their block size (both pickers are told the
	// same), KV pool, timing and --max-num-seqs; Out receives vs-epp.json,
	// vs-epp.svg, the EPP configurations and the logs.
	fleet.Spec
	Prompts string // PromptsTokens or PromptsText
	// KVSelectArgs and EPPArgs are more flags for the pickers.
	KVSelectArgs, EPPArgs []string
	// FloorPicker is the command that serves the picker "floor" (kvbench
	// floor-picker: the harness adds its ports and the engines).
	FloorPicker []string
	mooncake.Slice
	// SharedPrefix, when set, replaces the trace: inference-perf's
	// shared_prefix workload, prompts of exactly its token lengths, arrivals
	// at its stages' pace; Requests, when positive, caps it.
	SharedPrefix *workload.SharedPrefix
	// Profile, when positive, takes a CPU profile of kvselect
	// (/debug/pprof/profile, which needs --enable-pprof) over the first
	// Profile of the trace run, into <out>/<picker>-<transport>/cpu.pprof,
	// and its heap after the idle window that follows the trace, into
	// heap.pprof beside it.
	Profile             time.Duration
	Loop                string  // "open" or "closed"
	Compress            float64 // open loop: trace time is divided by this
	Rate                float64 // open loop: fixed arrivals per second instead of the trace's
	Concurrency         int     // closed loop: clients; open loop: most in flight
	BlockTokens         int     // prompt tokens per trace block
	MaxOutput           int
	Pickers, Transports []string
	Idle, Saturate      time.Duration
	SaturateStreams     int
	Pin                 bool // the picker on CPU 0, this process with the engines on CPU 1
	// GoodputTTFT and GoodputITL are the objectives goodput counts against
	// (0: DefaultGoodputTTFT, DefaultGoodputITL).
	GoodputTTFT, GoodputITL time.Duration
	Quiet                   bool
	Args                    string // the command line, recorded in the report
}

// The objectives goodput is counted against by default: a first token
// within half a second and 20 ms between tokens (ten times these engines'
// inter-token latency), an interactive service's.
const (
	DefaultGoodputTTFT = 500 * time.Millisecond
	DefaultGoodputITL  = 20 * time.Millisecond
)

// Defaults is `make bench-vs-epp` over plaintext: every picker, 1,000
// requests of the conversation trace at 10x its pace on four simulators.
// The KV cache is large next to one prompt: the simulator mis-chains blocks
// when it evicts within a request. Engines run few requests at once, so
// that piling requests on one engine costs TTFT.
func Defaults() Config {
	return Config{Spec: fleet.Spec{Family: fleet.FamilySim, Workers: 4, Out: "bench/out/vs-epp",
		Engine: fleet.Engine{BlockSize: 16, PoolBlocks: 8192, PrefillPerToken: 20 * time.Microsecond, DecodePerToken: 2 * time.Millisecond, MaxNumSeqs: 4}},
		Prompts: PromptsTokens, Slice: mooncake.Slice{Trace: mooncake.DefaultTrace, Requests: 1000},
		Loop: "open", Compress: 10, Concurrency: 64, BlockTokens: 64,
		MaxOutput: 16, Pickers: slices.Clone(Pickers), Transports: []string{"plain"}, Idle: 5 * time.Second, Saturate: 5 * time.Second,
		SaturateStreams: 64, Pin: true, GoodputTTFT: DefaultGoodputTTFT, GoodputITL: DefaultGoodputITL}
}

// PickerRun is one picker's run on one transport.
type PickerRun struct {
	Picker    string `json:"picker"`
	Transport string `json:"transport"`
	Requests  int    `json:"requests"`
	Errors    int    `json:"errors"`
	// ErrorSample is the first error, to read when Errors > 0.
	ErrorSample string `json:"error_sample,omitempty"`
	// Decision is client-side: envoysim's Start (request headers sent) to
	// the routing decision (destination known, body streamed back), µs.
	Decision Pct `json:"decision_us"`
	// CPUCores is the picker's CPU over the trace run per second of it,
	// gross: the cores it used at the run's rate.
	CPUCores float64 `json:"cpu_cores"`
	// RSSIdleMiB is the picker's resident memory before the trace,
	// PeakRSSMiB its peak since it started (VmHWM) read after the trace,
	// RSSAfterMiB its resident memory an idle window after the trace.
	RSSIdleMiB  float64 `json:"rss_idle_mib"`
	PeakRSSMiB  float64 `json:"peak_rss_mib"`
	RSSAfterMiB float64 `json:"rss_after_mib"`
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
	HitRate float64 `json:"prefix_cache_hit_rate"`
	// IndexHitRate is the share of the prompts kvselect's index credited
	// the chosen engines with, and IndexBestHitRate the share the
	// best-cached candidate of each decision had: what a pick by the cache
	// alone would have had on the same index (kvselect only).
	IndexHitRate     float64 `json:"index_hit_rate,omitempty"`
	IndexBestHitRate float64 `json:"index_best_cached_hit_rate,omitempty"`
	TTFTP50Ms        float64 `json:"ttft_p50_ms"`
	TTFTP90Ms        float64 `json:"ttft_p90_ms"`
	TTFTP99Ms        float64 `json:"ttft_p99_ms"`
	// ITLP90Ms is the p90 over requests of each one's mean inter-token
	// latency (time between its SSE events after the first).
	ITLP90Ms float64 `json:"itl_p90_ms"`
	// Goodput is the routed requests per second that met both objectives
	// of Config.GoodputTTFT / GoodputITL; GoodputShare their share.
	Goodput      float64 `json:"goodput_rps"`
	GoodputShare float64 `json:"goodput_share"`
	PerEngine    []int   `json:"requests_per_engine"`
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
	// LatencyModel is, for kvselect, its latency model after the trace run
	// (GET /policy's latency_model): coefficients and prediction error.
	LatencyModel json.RawMessage `json:"latency_model,omitempty"`
	// PredictionError is that model's TTFT prediction error over its latest
	// predictions: |predicted − observed| / observed at p50 and p90.
	PredictionError *[2]float64 `json:"ttft_prediction_error_p50_p90,omitempty"`

	decisions, ttfts, itls []time.Duration
}

type Pct struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
}

// Report is vs-epp.json.
type Report struct {
	Date     string `json:"date"`
	CPUs     int    `json:"cpus"`
	Pinned   bool   `json:"pinned"`
	Trace    string `json:"trace"`
	Requests int    `json:"requests"`
	Engines  int    `json:"engines"`
	// EngineFamily is llmd-sim (llm-d-inference-sim) or mock
	// (kvselect-mockworker); Prompts is tokens (token-id prompts) or text.
	EngineFamily string `json:"engine_family"`
	Prompts      string `json:"prompts"`
	Loop         string `json:"loop"`
	Args         string `json:"args"`
	EPPConfig    string `json:"epp_config_default,omitempty"`
	// GoodputTTFT and GoodputITL are the objectives of the runs' goodput.
	GoodputTTFT time.Duration `json:"goodput_ttft_ns"`
	GoodputITL  time.Duration `json:"goodput_itl_ns"`
	Runs        []PickerRun   `json:"runs"`
}

// Run runs every picker on every transport, each with fresh engines, prints
// the table and the goals, writes vs-epp.json and vs-epp.svg into c.Out and
// fails when a request failed or kvselect kept a booking.
func Run(ctx context.Context, c Config, stdout, stderr io.Writer) (*Report, error) {
	c.GoodputTTFT = cmp.Or(c.GoodputTTFT, DefaultGoodputTTFT)
	c.GoodputITL = cmp.Or(c.GoodputITL, DefaultGoodputITL)
	if err := c.Validate(); err != nil {
		return nil, err
	}
	reqs, err := c.requests()
	if err != nil {
		return nil, err
	}
	if c.Pin {
		if err := pinSelf(1); err != nil {
			fmt.Fprintf(stderr, "vs-epp: not pinned: %v\n", err)
			c.Pin = false
		} else {
			fmt.Fprintln(stderr, "vs-epp: each picker on CPU 0; this load generator and the engines on CPU 1")
		}
	}
	rep := &Report{Date: time.Now().UTC().Format(time.RFC3339), CPUs: runtime.NumCPU(), Pinned: c.Pin, Trace: c.traceName(),
		Requests: len(reqs), Engines: c.Workers, EngineFamily: string(c.Family), Prompts: c.Prompts, Loop: c.loopName(), Args: c.Args,
		GoodputTTFT: c.GoodputTTFT, GoodputITL: c.GoodputITL}
	bodies, err := c.bodies(reqs)
	if err != nil {
		return nil, err
	}
	c.Engine.SimExtra = append(slices.Clone(c.Engine.SimExtra), simBodyLimit(bodies)...)
	for _, tr := range c.Transports {
		for _, p := range c.Pickers {
			fmt.Fprintf(stderr, "vs-epp: %s over %s...\n", p, tr)
			run, err := c.runOne(ctx, p, tr, reqs, bodies, stderr)
			if err != nil {
				return nil, fmt.Errorf("%s/%s: %w (logs in %s)", p, tr, err, c.Out)
			}
			rep.Runs = append(rep.Runs, run)
		}
	}
	if b, err := os.ReadFile(filepath.Join(c.Out, pickerEPP+"-plain", "epp-config.yaml")); err == nil {
		rep.EPPConfig = string(b)
	}
	if err := rep.Table(stdout); err != nil {
		return rep, err
	}
	if err := report.WriteJSON(filepath.Join(c.Out, "vs-epp.json"), rep); err != nil {
		return rep, err
	}
	svg := filepath.Join(c.Out, "vs-epp.svg")
	title := fmt.Sprintf("kvselect vs llm-d EPP: %d %s, %d trace requests (%s prompts), %s", c.Workers, familyNoun(c.Family), len(reqs), c.Prompts, rep.Loop)
	if err := report.WriteSVG(svg, title, rep.Charts()...); err != nil {
		return rep, err
	}
	fmt.Fprintf(stdout, "\nwrote %s and %s (logs and EPP configurations in %s)\n", filepath.Join(c.Out, "vs-epp.json"), svg, c.Out)
	for _, r := range rep.Runs {
		if r.Errors > 0 || r.SaturationErrors > 0 {
			return rep, fmt.Errorf("%s/%s: %d of %d requests failed (first: %s), %d in the saturating loop (first: %s)",
				r.Picker, r.Transport, r.Errors, r.Requests, r.ErrorSample, r.SaturationErrors, r.SaturationError)
		}
		if r.LeakedBookings != nil && *r.LeakedBookings != 0 {
			return rep, fmt.Errorf("%s/%s: %d bookings left after the run", r.Picker, r.Transport, *r.LeakedBookings)
		}
	}
	return rep, nil
}

// Validate checks the configuration before anything starts.
func (c *Config) Validate() error {
	switch {
	case (c.Requests < 1 && c.SharedPrefix == nil) || c.Requests < 0 || c.Concurrency < 1 || c.Workers < 1 || c.BlockTokens < 1 || c.Engine.BlockSize < 1 || c.Engine.PoolBlocks < 1 ||
		c.Engine.MaxNumSeqs < 1 || c.MaxOutput < 1 || c.SaturateStreams < 1:
		return errors.New("-requests, -concurrency, -workers, -block-tokens, -block-size, -pool-blocks, -max-num-seqs, -max-output and -saturate-streams must be positive")
	case c.Loop != "open" && c.Loop != "closed":
		return fmt.Errorf("-loop %q: want open or closed", c.Loop)
	case !(c.Compress > 0) || c.Rate < 0:
		return errors.New("-compress must be positive and -rate not negative")
	case c.SharedPrefix != nil && (c.Rate != 0 || c.Compress != 1 || c.BlockTokens != workload.BlockTokens):
		return fmt.Errorf("a shared_prefix workload paces itself and sends its own token lengths: -rate 0, -compress 1 and -block-tokens %d, not %g, %g and %d",
			workload.BlockTokens, c.Rate, c.Compress, c.BlockTokens)
	case c.Profile < 0:
		return errors.New("-profile must not be negative")
	case c.Idle <= 0 || c.Saturate < 0:
		return errors.New("-idle must be positive and -saturate not negative")
	case c.GoodputTTFT < 0 || c.GoodputITL < 0:
		return errors.New("-goodput-ttft and -goodput-itl must not be negative (0: the defaults)")
	case len(c.Pickers) == 0 || len(c.Transports) == 0:
		return errors.New("-pickers and -transports name at least one each")
	}
	for _, p := range c.Pickers {
		if !IsKvselect(p) && !IsEPP(p) && p != PickerFloor {
			return fmt.Errorf("-pickers: unknown picker %q", p)
		}
		if p == PickerFloor && len(c.FloorPicker) == 0 {
			return errors.New("picker floor needs the command that serves it (kvbench floor-picker)")
		}
		if IsEPP(p) && c.EPP == "" {
			return fmt.Errorf("picker %s needs llm-d's endpoint picker: set -epp-bin or $%s (build it from github.com/llm-d/llm-d-router, cmd/epp)", p, peerproc.EnvEPP)
		}
	}
	for _, t := range c.Transports {
		if t != "plain" && t != "tls" {
			return fmt.Errorf("-transports: unknown transport %q", t)
		}
		if t == "tls" && slices.Contains(c.Pickers, PickerFloor) {
			return errors.New("picker floor serves plaintext only: -transports plain")
		}
	}
	switch c.Family {
	case fleet.FamilySim:
		if c.Sim == "" {
			return fmt.Errorf("vs-epp needs llm-d-inference-sim: set -sim-bin or $%s (build it from github.com/llm-d/llm-d-inference-sim)", peerproc.EnvSim)
		}
	case fleet.FamilyMock:
		if c.MockWorker == "" {
			return errors.New("-engine-family mock needs -mockworker (build it with `make build`)")
		}
	default:
		return fmt.Errorf("-engine-family %q: want %s or %s", c.Family, fleet.FamilySim, fleet.FamilyMock)
	}
	switch c.Prompts {
	case PromptsTokens:
	case PromptsText:
		for _, p := range c.Pickers {
			// The EPP's token producer renders text through an engine's
			// /v1/completions/render, which the mock worker does not serve.
			if IsEPP(p) && c.Family == fleet.FamilyMock {
				return fmt.Errorf("-prompts text with picker %s needs -engine-family %s: the EPP renders text prompts through an engine's /v1/completions/render, which kvselect-mockworker does not serve", p, fleet.FamilySim)
			}
		}
	default:
		return fmt.Errorf("-prompts %q: want %s or %s", c.Prompts, PromptsTokens, PromptsText)
	}
	return nil
}

// familyNoun names the engines of a family in the report.
func familyNoun(family fleet.Family) string {
	if family == fleet.FamilyMock {
		return "kvselect-mockworker engines"
	}
	return "llm-d-inference-sim engines"
}

// requests is the trace slice, or the generated shared_prefix trace cut to
// Requests.
func (c *Config) requests() ([]mooncake.Request, error) {
	if c.SharedPrefix == nil {
		return c.Slice.Load()
	}
	reqs, err := c.SharedPrefix.Generate()
	if err != nil {
		return nil, err
	}
	if c.Requests > 0 && len(reqs) > c.Requests {
		reqs = reqs[:c.Requests]
	}
	return reqs, nil
}

// bodies are the trace's requests as the client sends them, token ids or
// text. A shared_prefix trace repeats its prompts: each distinct prompt is
// encoded once and its bytes shared (a 1M-token body is ~6 MB).
func (c *Config) bodies(reqs []mooncake.Request) ([][]byte, error) {
	bodies := make([][]byte, len(reqs))
	type key struct {
		first *uint64
		n     int
	}
	seen := map[key][]byte{}
	for i, r := range reqs {
		maxTokens := min(max(1, r.OutputLength*c.BlockTokens/512), c.MaxOutput)
		k := key{n: len(r.HashIDs)}
		if k.n > 0 {
			k.first = &r.HashIDs[0]
		}
		if b, ok := seen[k]; ok {
			bodies[i] = b
			continue
		}
		body := relay.Completion{Model: fleet.SimModel, MaxTokens: maxTokens, Stream: true}
		var err error
		switch {
		case c.SharedPrefix != nil && c.Prompts == PromptsText:
			body.Prompt, err = c.SharedPrefix.Text(r.HashIDs)
		case c.SharedPrefix != nil:
			body.Prompt, err = c.SharedPrefix.Tokens(r.HashIDs)
		case c.Prompts == PromptsText:
			body.Prompt = mooncake.Text(r.HashIDs, c.BlockTokens)
		default:
			body.Prompt = mooncake.Tokens(r.HashIDs, c.BlockTokens)
		}
		if err != nil {
			return nil, fmt.Errorf("request %d: %w", i, err)
		}
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("request %d: %w", i, err)
		}
		bodies[i] = b
		if c.SharedPrefix != nil {
			seen[k] = b // Generate shares one id slice per prompt
		}
	}
	return bodies, nil
}

// simDefaultBodyMB is llm-d-inference-sim's --max-request-body-size-mb
// default (4, fasthttp's own): a 1M-token prompt as token ids (~6 MB)
// is over it.
const simDefaultBodyMB = 4

// simBodyLimit is the simulator flag that admits the largest body, when the
// default does not (llm-d-router's 1M-context simulators run
// --max-request-body-size-mb 10: test/perf/config/
// llm-d-sim-deployment-1m-context.yaml).
func simBodyLimit(bodies [][]byte) []string {
	largest := 0
	for _, b := range bodies {
		largest = max(largest, len(b))
	}
	mb := (largest + 1<<20 - 1) >> 20
	if mb <= simDefaultBodyMB {
		return nil
	}
	return []string{"--max-request-body-size-mb", strconv.Itoa(mb + 1)}
}

// traceName names the trace in the report.
func (c *Config) traceName() string {
	sp := c.SharedPrefix
	if sp == nil {
		return c.Trace
	}
	stages := fmt.Sprintf("%g/s", sp.Rate)
	if len(sp.Stages) > 0 {
		var parts []string
		for _, s := range sp.Stages {
			parts = append(parts, fmt.Sprintf("%g/s for %v", s.Rate, s.Duration))
		}
		stages = strings.Join(parts, " then ")
	}
	return fmt.Sprintf("shared_prefix (%d groups × %d prompts, system %d + question %d tokens, output %d; %s)",
		sp.Groups, sp.PromptsPerGroup, sp.SystemTokens, sp.QuestionTokens, sp.OutputTokens, stages)
}

func (c *Config) loopName() string {
	switch {
	case c.Loop == "closed":
		return fmt.Sprintf("closed loop, %d clients", c.Concurrency)
	case c.Rate > 0:
		return fmt.Sprintf("open loop, %.0f req/s, at most %d in flight", c.Rate, c.Concurrency)
	}
	return fmt.Sprintf("open loop at %gx the trace's pace, at most %d in flight", c.Compress, c.Concurrency)
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
