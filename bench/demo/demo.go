// Package demo measures what KV-aware routing buys on real processes:
// kvselect and N engines on loopback, a slice of the Mooncake conversation
// trace replayed twice at its (compressed) arrival times, or evenly spaced
// at a steady rate (-rate) — once through
// kvselect's ext_proc picker with the Envoy-faithful client (the way Envoy
// reaches a worker behind an InferencePool), once round-robin (Envoy's plain
// load balancing, no picker) — each from empty prefix caches. It reports the
// engines' prefix-cache hit rate (their own counters), TTFT, throughput and
// the picker's decision time, as a table, JSON and an SVG chart.
//
// With -gateway nginx a third phase, between the two, replays the same trace
// through NGINX Gateway Fabric's endpoint-picker path (Debian's NGINX running
// NGF's epp.js, NGF's shim, kvselect's ext_proc picker; bench/ngf), and the
// report compares the two picker paths on the figures a gateway can change:
// hit rate, p90 TTFT, how well kvselect's booked requests track the requests
// actually in flight (NGF never sends the response phase, so kvselect ends
// those bookings at an estimate), and kvselect's CPU per request.
//
// Two engine families: kvselect's mock workers, which register themselves,
// publish KV events on a socket kvselect subscribes to, and have their caches
// reset between phases; or the llm-d project's vLLM simulator,
// llm-d-inference-sim, an engine kvselect's authors did not write: its KV
// events dial kvselect's collector (--kv-events-bind, llm-d's topology), the
// demo registers each simulator over REST, and every phase starts fresh
// simulators, since they have no prefix-cache reset. With a gateway every
// phase starts a fresh fleet whichever the family, kvselect included: what
// kvselect learns from the responses of envoysim's phase must not help the
// phase behind a gateway that shows it none.
package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvselect/kvselect/bench/fleet"
	"github.com/kvselect/kvselect/bench/floorpicker"
	"github.com/kvselect/kvselect/bench/mooncake"
	"github.com/kvselect/kvselect/bench/ngf"
	"github.com/kvselect/kvselect/bench/promtext"
	"github.com/kvselect/kvselect/bench/relay"
	"github.com/kvselect/kvselect/bench/report"
	"github.com/kvselect/kvselect/bench/stats"
	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/internal/peerproc"
)

// Config is one demo.
type Config struct {
	// Spec is the fleet; Engine.MaxNumSeqs is the simulators' alone, and
	// Out receives demo.json, demo.svg and the processes' logs.
	fleet.Spec
	mooncake.Slice
	Compress float64 // trace time is divided by this
	// Rate, when positive, sends the requests at this many a second,
	// evenly spaced, instead of at the trace's (compressed) times: a
	// steady arrival stream, without the trace's bursts, of the same
	// prompts in the same order.
	Rate        float64
	Concurrency int // most requests in flight
	// BlockTokens is the prompt tokens per trace block (the trace's blocks
	// are 512 tokens; fewer keeps the demo quick).
	BlockTokens int
	// MaxOutput caps the output tokens per request (the trace's lengths
	// scaled like the prompts, then capped: every streamed chunk is an
	// ext_proc round trip).
	MaxOutput int
	Quiet     bool // no progress bars
	// Gateway adds a phase through a gateway beside envoysim's: "" (none)
	// or GatewayNGINX, whose shim, epp.js and nginx.example.conf are in
	// NGFShimDir.
	Gateway    string
	NGFShimDir string
	// ExtProcTLS serves kvselect's picker over TLS (self-signed) and has
	// every picker path reach it so, unverified.
	ExtProcTLS bool
	// GatewayFloor, with a gateway, adds two phases with the floor picker
	// in kvselect's place (FloorPicker serves it: round-robin, nothing read
	// or booked), one through envoysim and one through the gateway. The
	// TTFT the gateway adds to a picker that costs nothing is the path's
	// own, which no picker can take back.
	GatewayFloor bool
	FloorPicker  []string
}

// GatewayNGINX is -gateway nginx: NGINX Gateway Fabric's endpoint-picker
// path.
const GatewayNGINX = "nginx"

// Defaults is the demo of `make demo`. A trace block is 512 tokens; with 64
// tokens per block each prompt token stands for 8, so the per-token times
// are 8x engine-like ones: 100 µs of prefill per real token (10k prefill
// tokens/s, a large model on one GPU) and 10 ms per output token, divided by
// the speed-up (with -compress 20 and 4 workers, each worker sees the load
// one of 8 would see at the trace's own pace).
func Defaults() Config {
	return Config{Spec: fleet.Spec{Family: fleet.FamilyMock, Workers: 4, Engine: Engine(), Out: "bench/out/demo"},
		Slice: mooncake.Slice{Trace: mooncake.DefaultTrace, Requests: 1000}, Compress: 20, Concurrency: 128, BlockTokens: 64, MaxOutput: 16}
}

// Engine is the demo's engine, which kvbench health and observe reuse.
// llm-d-inference-sim can chain a stored block to the wrong parent when it
// evicts blocks of the request it is storing, which happens when the cache
// is small next to one prompt: 8,192 blocks hold dozens of the longest
// prompts (older blocks still get evicted between requests).
func Engine() fleet.Engine {
	return fleet.Engine{BlockSize: 16, PoolBlocks: 8192, PrefillPerToken: 800 * time.Microsecond, DecodePerToken: 80 * time.Millisecond,
		Speedup: 40, MaxNumSeqs: 4, Extra: []string{"--prefill-slots", "1"}}
}

// Validate checks the configuration before anything starts.
func (c *Config) Validate() error {
	switch {
	case c.Family != fleet.FamilyMock && c.Family != fleet.FamilySim:
		return fmt.Errorf("-engine-family %q: want %s or %s", c.Family, fleet.FamilyMock, fleet.FamilySim)
	case c.Family == fleet.FamilySim && c.Sim == "":
		return fmt.Errorf("-engine-family %s needs llm-d-inference-sim: set -sim-bin or $%s (build it from github.com/llm-d/llm-d-inference-sim)", fleet.FamilySim, peerproc.EnvSim)
	case c.Engine.MaxNumSeqs < 1:
		return errors.New("-max-num-seqs must be positive")
	case c.Workers < 1 || c.Requests < 1 || c.Concurrency < 1 || c.BlockTokens < 1 || c.Engine.BlockSize < 1 || c.Engine.PoolBlocks < 1 || c.MaxOutput < 1:
		return errors.New("-workers, -requests, -concurrency, -block-tokens, -block-size, -pool-blocks and -max-output must be positive")
	case !(c.Compress > 0) || !(c.Engine.Speedup > 0):
		return errors.New("-compress and -speedup must be positive")
	case !(c.Rate >= 0) || math.IsInf(c.Rate, 1):
		return fmt.Errorf("-rate %g: want a finite number of requests per second, or 0 for the trace's times", c.Rate)
	}
	switch {
	case !c.GatewayFloor:
	case c.Gateway == "":
		return errors.New("-gateway-floor measures a gateway's path: it needs -gateway")
	case c.ExtProcTLS:
		return errors.New("-gateway-floor: the floor picker serves plaintext only (drop -extproc-tls)")
	case len(c.FloorPicker) == 0:
		return errors.New("-gateway-floor needs the command that serves the floor picker (kvbench floor-picker)")
	}
	switch c.Gateway {
	case "":
	case GatewayNGINX:
		if err := ngf.Check(c.NGFShimDir); err != nil {
			return fmt.Errorf("-gateway nginx: %w", err)
		}
	default:
		return fmt.Errorf("-gateway %q: want %s (or none)", c.Gateway, GatewayNGINX)
	}
	if c.Family == fleet.FamilySim {
		if st, err := os.Stat(c.Sim); err != nil || st.IsDir() {
			return fmt.Errorf("-sim-bin %q is not a file (set -sim-bin or $%s)", c.Sim, peerproc.EnvSim)
		}
	}
	return nil
}

// Phase is one policy's run.
type Phase struct {
	Policy    string  `json:"policy"`
	Requests  int     `json:"requests"`
	Errors    int     `json:"errors"`
	HitRate   float64 `json:"prefix_cache_hit_rate"` // cached prompt tokens / prompt tokens, from the workers' metrics
	TTFTP50Ms float64 `json:"ttft_p50_ms"`
	TTFTP90Ms float64 `json:"ttft_p90_ms"`
	// TLS says the picker phases reached kvselect over TLS.
	TLS         bool    `json:"extproc_tls,omitempty"`
	Throughput  float64 `json:"throughput_rps"`
	SelectP50Us float64 `json:"select_p50_us,omitempty"` // ext_proc decision latency as the client saw it
	SelectP99Us float64 `json:"select_p99_us,omitempty"`
	// ServerPick is the picker's own decision time (kvselect's
	// pick-duration histogram over the phase, or the floor's): what the
	// picker spends, without the gRPC round trips and the scheduling of
	// every process on the machine.
	ServerPick *promtext.Summary `json:"server_pick,omitempty"`
	// HitRateOverTime is the workers' prefix-cache hit rate per second of
	// the phase.
	HitRateOverTime []Point `json:"hit_rate_over_time"`
	WallSeconds     float64 `json:"wall_seconds"`
	PerWorker       []int   `json:"requests_per_worker"`
	LoadAfterRun    uint64  `json:"active_requests_after_run,omitempty"`
	// Path is how a picker phase reached its picker: PathEnvoysim or
	// PathNGINX.
	Path string `json:"path,omitempty"`
	// InFlight compares kvselect's bookings with the client's requests in
	// flight over the phase (picker phases only).
	InFlight *InFlight `json:"in_flight,omitempty"`
	// Routing is what kvselect's decisions expected (its phases only).
	Routing *Routing `json:"routing,omitempty"`
	// CPUPerRequestUs is the picker's CPU time (user + system, /proc):
	// kvselect's, or the floor's in its phases, over the phase divided by
	// its requests (picker phases only).
	CPUPerRequestUs float64 `json:"kvselect_cpu_per_request_us,omitempty"`
	// KVSelectAsideCPUPerRequestUs is kvselect's CPU per request over a
	// floor phase, where it picks nothing but still indexes the engines'
	// KV events and answers the demo's samples: the part of its own phases'
	// CPU that is not the picking.
	KVSelectAsideCPUPerRequestUs float64 `json:"kvselect_aside_cpu_per_request_us,omitempty"`
	ttfts, selDur                []time.Duration
}

// Point is one sample of a series over a phase.
type Point struct {
	Seconds float64 `json:"seconds"`
	Value   float64 `json:"value"`
}

// Report is what demo.json holds.
type Report struct {
	Engines  fleet.Family `json:"engines"`
	Trace    string       `json:"trace"`
	Requests int          `json:"requests"`
	Workers  int          `json:"workers"`
	// Arrivals says when the requests were sent (Config.pace).
	Arrivals string  `json:"arrivals"`
	Phases   []Phase `json:"phases"`
	// Gateway compares the NGINX path with envoysim's (-gateway nginx).
	Gateway *GatewayGoals `json:"gateway,omitempty"`
}

// Policies are the demo's phases: kvselect's picker, then Envoy's
// round-robin.
const (
	PolicyKVSelect   = "kvselect"
	PolicyRoundRobin = "round-robin"
	// PolicyKVSelectNGINX is kvselect's picker reached through NGINX
	// Gateway Fabric (-gateway nginx).
	PolicyKVSelectNGINX = "kvselect-nginx"
	// PolicyFloor and PolicyFloorNGINX are the floor picker reached as
	// kvselect is in the two phases above (-gateway-floor).
	PolicyFloor      = "floor"
	PolicyFloorNGINX = "floor-nginx"
)

// The picker phases' paths to their picker.
const (
	PathEnvoysim = "envoysim"
	PathNGINX    = "nginx"
)

// pickHistogram is kvselect's server-side decision time.
const pickHistogram = "kvselect_extproc_pick_duration_seconds"

// Run runs both phases, prints the table to stdout, writes demo.json and
// demo.svg into c.Out, and fails when a request failed.
func Run(ctx context.Context, c Config, stdout, stderr io.Writer) (*Report, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	reqs, err := c.Slice.Load()
	if err != nil {
		return nil, err
	}
	rep := &Report{Engines: c.Family, Trace: c.Trace, Requests: len(reqs), Workers: c.Workers, Arrivals: c.pace()}
	var fl *fleet.Fleet
	defer func() {
		if fl != nil {
			fl.Stop()
		}
	}()
	policies := []string{PolicyKVSelect}
	if c.Gateway == GatewayNGINX {
		policies = append(policies, PolicyKVSelectNGINX)
		if c.GatewayFloor {
			policies = append(policies, PolicyFloor, PolicyFloorNGINX)
		}
	}
	policies = append(policies, PolicyRoundRobin)
	for _, policy := range policies {
		switch {
		case c.Family == fleet.FamilySim || c.Gateway != "":
			// The simulator cannot empty its cache: fresh processes (and a
			// fresh kvselect, whose index they feed) for every phase. Behind
			// a gateway, too: kvselect learns from the responses it sees
			// (its latency model, the output lengths it expects), and a
			// phase behind a gateway that shows it none must not start
			// from what envoysim's phase taught it, as no deployment behind
			// that gateway would.
			if fl != nil {
				fl.Stop()
			}
			if fl, err = StartFleet(ctx, c, reqs, policy, stderr); err != nil {
				return nil, err
			}
		case fl == nil:
			if fl, err = StartFleet(ctx, c, reqs, "", stderr); err != nil {
				return nil, err
			}
			fallthrough
		default:
			if err := fl.ResetCaches(ctx); err != nil {
				return nil, err
			}
		}
		ph, err := replayVia(ctx, fl, c, policy, reqs, stderr)
		if err != nil {
			return nil, err
		}
		rep.Phases = append(rep.Phases, ph)
	}
	rep.Gateway = compareGateway(rep.Phases)
	if err := rep.Table(stdout); err != nil {
		return rep, err
	}
	jsonPath, svg := filepath.Join(c.Out, "demo.json"), filepath.Join(c.Out, "demo.svg")
	if err := report.WriteJSON(jsonPath, rep); err != nil {
		return rep, err
	}
	title := fmt.Sprintf("kvselect demo: %d %s, %d trace requests", c.Workers, c.Family.Noun(), len(reqs))
	if err := report.WriteSVG(svg, title, rep.Charts()...); err != nil {
		return rep, err
	}
	fmt.Fprintf(stdout, "\nwrote %s and %s (logs in %s)\n", jsonPath, svg, c.Out)
	for _, ph := range rep.Phases {
		if ph.Errors > 0 {
			return rep, fmt.Errorf("%s: %d of %d requests failed (see %s)", ph.Policy, ph.Errors, ph.Requests, c.Out)
		}
	}
	return rep, nil
}

// replayVia starts what the phase's requests pass through besides the
// engines (the floor picker, the gateway), replays, and stops them.
func replayVia(ctx context.Context, fl *fleet.Fleet, c Config, policy string, reqs []mooncake.Request, stderr io.Writer) (Phase, error) {
	var via Via
	extProc := fl.KV.ExtProc
	if policy == PolicyFloor || policy == PolicyFloorNGINX {
		f, err := StartFloor(ctx, c, fl, "demo-"+policy)
		if err != nil {
			return Phase{Policy: policy}, err
		}
		defer f.Stop()
		via.Floor, extProc = f, f.ExtProc()
	}
	if policy == PolicyKVSelectNGINX || policy == PolicyFloorNGINX {
		// Started per phase, after its picker: the configuration names the
		// picker's port, and the shim's fixed port is held only while the
		// demo uses it.
		gw, err := ngf.Start(ctx, ngf.Config{ShimDir: c.NGFShimDir, Dir: c.Out, Prefix: "demo-" + policy, ExtProc: extProc, TLS: c.ExtProcTLS})
		if err != nil {
			return Phase{Policy: policy}, err
		}
		defer gw.Stop()
		via.Gateway = gw
	}
	return Replay(ctx, fl, via, c, policy, reqs, stderr)
}

// Via is what a phase's requests pass through besides the engines: the
// gateway (the NGINX phases) and the floor picker (the floor phases).
type Via struct {
	Gateway *ngf.Gateway
	Floor   *Floor
}

// StartFleet starts kvselect and c's engines; prefix names the logs of a
// phase's own processes.
func StartFleet(ctx context.Context, c Config, reqs []mooncake.Request, prefix string, stderr io.Writer) (*fleet.Fleet, error) {
	e := c.Engine
	e.MaxModelLen = fleet.SimModelLen(reqs, c.BlockTokens, c.MaxOutput)
	return fleet.Start(ctx, fleet.Config{Binaries: c.Binaries, Family: c.Family, Workers: c.Workers, Engine: e,
		Dir: c.Out, Prefix: prefix, Progress: stderr, ExtProcTLS: c.ExtProcTLS,
		HTTP: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c.Concurrency, MaxIdleConns: 4 * c.Concurrency}}})
}

// Replay runs one phase: open loop at the trace's (compressed) arrival
// times, at most c.Concurrency requests in flight, through a picker
// (kvselect's or the floor, with envoysim or through via.Gateway) or
// round-robin straight to the engines.
func Replay(ctx context.Context, fl *fleet.Fleet, via Via, c Config, policy string, reqs []mooncake.Request, stderr io.Writer) (Phase, error) {
	ph := Phase{Policy: policy, Requests: len(reqs), PerWorker: make([]int, len(fl.Workers))}
	pk, err := pickerOf(fl, via, policy)
	if err != nil {
		return ph, err
	}
	picker := pk != nil
	ph.TLS = picker && c.ExtProcTLS
	q0, h0, err := fl.CacheCounters(ctx)
	if err != nil {
		return ph, err
	}
	var pick0 promtext.Samples
	if picker {
		if pick0, err = pk.metrics(ctx); err != nil {
			return ph, err
		}
	}
	bodies, err := completionBodies(fl.Model, c, reqs)
	if err != nil {
		return ph, err
	}
	var bar *report.Progress
	if !c.Quiet {
		bar = report.NewProgress(stderr, policy)
	}
	send := sender(fl, via, policy)
	var (
		mu       sync.Mutex
		done     atomic.Int64
		inFlight atomic.Int64 // the client's requests between send and last byte
		firstErr error
		lifeSum  time.Duration // the client's requests' send to last byte, summed
	)
	one := func(i int) {
		inFlight.Add(1)
		sent := time.Now()
		res, worker, err := send(ctx, i, bodies[i])
		life := time.Since(sent)
		inFlight.Add(-1)
		mu.Lock()
		lifeSum += life
		// The client sees the decision's time only on envoysim's path.
		if err := ph.add(res, worker, picker && via.Gateway == nil, err); err != nil && firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
		bar.Update(int(done.Add(1)), len(reqs))
	}
	var cpu0, kvCPU0 time.Duration
	if picker {
		if cpu0, err = fleet.ProcessCPU(pk.pid); err != nil {
			return ph, err
		}
		if kvCPU0, err = fleet.ProcessCPU(fl.KV.Proc.Pid()); err != nil {
			return ph, err
		}
	}
	start := time.Now()
	sampling := make(chan struct{})
	sampled := make(chan []Point)
	go func() { sampled <- sampleHitRate(ctx, fl, start, q0, h0, sampling) }()
	// Every picker phase samples, so that the machine carries the same
	// reads (kvselect's /loads, the engines' metrics) whichever picker it
	// measures; a picker that books nothing has no figures to keep.
	tracked := make(chan *InFlight, 1)
	if picker {
		go func() { tracked <- sampleInFlight(ctx, fl.KV, &inFlight, fl.EngineRequests, inFlightEvery, sampling) }()
	} else {
		tracked <- nil
	}
	err = relay.OpenLoop(ctx, start, len(reqs), mooncake.Arrivals(reqs, c.Compress, c.Rate), c.Concurrency, one)
	wall := time.Since(start)
	var cpu1, kvCPU1 time.Duration
	if picker {
		cpu1, _ = fleet.ProcessCPU(pk.pid)
		kvCPU1, _ = fleet.ProcessCPU(fl.KV.Proc.Pid())
	}
	close(sampling)
	hitRates := <-sampled
	if ph.InFlight = <-tracked; pk != nil && !pk.books {
		ph.InFlight = nil
	}
	if err != nil {
		return ph, err
	}
	if ph.InFlight != nil {
		ph.InFlight.ClientLifetimeMs = float64(lifeSum) / 1e6 / float64(len(reqs))
	}
	ph.HitRateOverTime = hitRates
	if picker && cpu1 > cpu0 {
		ph.CPUPerRequestUs = float64(cpu1-cpu0) / 1e3 / float64(len(reqs))
	}
	if picker && !pk.books && kvCPU1 > kvCPU0 {
		ph.KVSelectAsideCPUPerRequestUs = float64(kvCPU1-kvCPU0) / 1e3 / float64(len(reqs))
	}
	if firstErr != nil {
		fmt.Fprintf(stderr, "%s: first error: %v\n", policy, firstErr)
	}
	err = ph.summarize(ctx, fl, pk, q0, h0, pick0, wall)
	return ph, err
}

// phasePicker is what a phase measures of its picker.
type phasePicker struct {
	pid     int
	metrics func(context.Context) (promtext.Samples, error)
	hist    string // its decision-time histogram
	// books says it books requests, which kvselect does (its bookings are
	// tracked against the requests in flight) and the floor does not.
	books bool
}

// pickerOf is the phase's picker, nil for round-robin, checking that via
// holds what the policy passes through.
func pickerOf(fl *fleet.Fleet, via Via, policy string) (*phasePicker, error) {
	nginx := policy == PolicyKVSelectNGINX || policy == PolicyFloorNGINX
	switch {
	case nginx && via.Gateway == nil:
		return nil, fmt.Errorf("the %s phase needs a running gateway", policy)
	case !nginx && via.Gateway != nil:
		return nil, fmt.Errorf("the %s phase does not pass through a gateway", policy)
	}
	switch policy {
	case PolicyRoundRobin:
		return nil, nil
	case PolicyKVSelect, PolicyKVSelectNGINX:
		return &phasePicker{pid: fl.KV.Proc.Pid(), metrics: fl.KV.Metrics, hist: pickHistogram, books: true}, nil
	case PolicyFloor, PolicyFloorNGINX:
		if via.Floor == nil {
			return nil, fmt.Errorf("the %s phase needs a running floor picker", policy)
		}
		f := via.Floor
		return &phasePicker{pid: f.Pid(), metrics: func(ctx context.Context) (promtext.Samples, error) { return f.Metrics(ctx, fl) },
			hist: floorpicker.HistogramName}, nil
	}
	return nil, fmt.Errorf("unknown phase policy %q", policy)
}

// pace describes the phases' arrivals (mooncake.Arrivals) for the report.
func (c *Config) pace() string {
	if c.Rate > 0 {
		return fmt.Sprintf("%g per second, evenly spaced", c.Rate)
	}
	return fmt.Sprintf("the trace's times, %gx faster", c.Compress)
}

// completionBodies are the phase's streamed completion requests, one per
// trace request, its blocks turned into c.BlockTokens tokens each.
func completionBodies(model string, c Config, reqs []mooncake.Request) ([][]byte, error) {
	bodies := make([][]byte, len(reqs))
	for i, r := range reqs {
		b, err := json.Marshal(relay.Completion{Model: model, Prompt: mooncake.Tokens(r.HashIDs, c.BlockTokens),
			MaxTokens: min(max(1, r.OutputLength*c.BlockTokens/512), c.MaxOutput), Stream: true,
			StreamOptions: &relay.StreamOptions{IncludeUsage: true}})
		if err != nil {
			return nil, err
		}
		bodies[i] = b
	}
	return bodies, nil
}

// sender is how the phase sends request i: through the picker as Envoy
// does, through NGINX (which asks the picker through NGF's shim), or
// round-robin straight to an engine. It returns the result and the worker
// that served it (-1 when it is not known: the picker named none of them,
// or NGINX does not say).
func sender(fl *fleet.Fleet, via Via, policy string) func(ctx context.Context, i int, body []byte) (relay.Result, int, error) {
	switch policy {
	case PolicyKVSelectNGINX, PolicyFloorNGINX:
		return func(ctx context.Context, _ int, body []byte) (relay.Result, int, error) {
			res, err := relay.Direct(ctx, fl.HTTP, via.Gateway.URL+"/v1/completions", body)
			return res, fl.WorkerByID(res.WorkerID), err
		}
	case PolicyKVSelect, PolicyFloor:
		var rl *relay.Relay
		if policy == PolicyFloor {
			rl = via.Floor.Relay(fl)
		} else {
			rl = fl.Relay()
		}
		return func(ctx context.Context, i int, body []byte) (relay.Result, int, error) {
			res, err := rl.Do(ctx, "/v1/completions", body, envoysim.Header{Key: "x-request-id", Value: fmt.Sprintf("demo-%d-%d", time.Now().UnixNano(), i)})
			worker := -1
			if d := res.Decision; d != nil && d.Immediate == nil {
				worker = fl.Worker(d.Endpoint)
			}
			return res, worker, err
		}
	}
	var rr atomic.Int64
	return func(ctx context.Context, _ int, body []byte) (relay.Result, int, error) {
		worker := int(rr.Add(1)-1) % len(fl.Workers)
		res, err := relay.Direct(ctx, fl.HTTP, "http://"+fl.Workers[worker]+"/v1/completions", body)
		return res, worker, err
	}
}

// add counts one request's outcome on the worker that served it and
// returns err.
func (ph *Phase) add(res relay.Result, worker int, picker bool, err error) error {
	if err != nil {
		ph.Errors++
		return err
	}
	ph.ttfts = append(ph.ttfts, res.TTFT)
	if picker {
		ph.selDur = append(ph.selDur, res.Pick)
	}
	if worker >= 0 && worker < len(ph.PerWorker) {
		ph.PerWorker[worker]++
	}
	return nil
}

// summarize fills the phase's figures once its requests, sent over wall,
// are done: the hit rate since the engines' counters read q0 and h0, the
// quantiles, and for a picker (pk) the bookings it still holds, if it books,
// and its decision time since its metrics read pick0.
func (ph *Phase) summarize(ctx context.Context, fl *fleet.Fleet, pk *phasePicker, q0, h0 float64, pick0 promtext.Samples, wall time.Duration) error {
	q1, h1, err := fl.CacheCounters(ctx)
	if err != nil {
		return err
	}
	if prompt := q1 - q0; prompt > 0 {
		ph.HitRate = (h1 - h0) / prompt
	}
	switch ph.Policy {
	case PolicyKVSelectNGINX, PolicyFloorNGINX:
		ph.Path = PathNGINX
	case PolicyKVSelect, PolicyFloor:
		ph.Path = PathEnvoysim
	}
	ph.TTFTP50Ms, ph.TTFTP90Ms = float64(stats.Quantile(ph.ttfts, 0.5))/1e6, float64(stats.Quantile(ph.ttfts, 0.9))/1e6
	ph.SelectP50Us, ph.SelectP99Us = float64(stats.Quantile(ph.selDur, 0.5))/1e3, float64(stats.Quantile(ph.selDur, 0.99))/1e3
	ph.WallSeconds = wall.Seconds()
	ph.Throughput = float64(len(ph.ttfts)) / wall.Seconds()
	if pk == nil {
		return nil
	}
	if pk.books {
		if ph.LoadAfterRun, err = fl.KV.ActiveRequests(ctx); err != nil {
			return err
		}
	}
	if ph.InFlight != nil {
		// Bookings kvselect ends at an estimate (NGF's path) may trail the
		// last response a little; what is still held after a grace is a
		// leak.
		t0 := time.Now()
		if ph.InFlight.BookingsLeft, err = fl.KV.Settle(ctx, settleLimit); err != nil {
			return err
		}
		ph.InFlight.DrainMs = float64(time.Since(t0)) / 1e6
	}
	pick1, err := pk.metrics(ctx)
	if err != nil {
		return err
	}
	delta := pick1.Minus(pick0)
	sp := delta.Summarize(pk.hist)
	ph.ServerPick = &sp
	if ph.InFlight != nil {
		ph.InFlight.lifetimes(delta)
	}
	if prompt := delta.Sum(promptTokens); pk.books && prompt > 0 {
		cached, best := delta.Sum(cachedTokens), delta.Sum(bestCachedTokens)
		ph.Routing = &Routing{CachedShare: cached / prompt, GivenUpForLoad: (best - cached) / prompt}
	}
	return nil
}

// Routing is what kvselect's decisions over a phase expected of the
// engines' caches, from its selection counters.
type Routing struct {
	// CachedShare is the prompt tokens its index held on the chosen
	// engines over the prompt tokens: the hit rate it routed for.
	CachedShare float64 `json:"cached_share"`
	// GivenUpForLoad is what the best-cached candidates held beyond the
	// chosen ones, over the prompt tokens: cache traded for load.
	GivenUpForLoad float64 `json:"given_up_for_load"`
}

// kvselect's selection counters Routing reads.
const (
	promptTokens     = "kvselect_selection_prompt_tokens_total"
	cachedTokens     = "kvselect_selection_cached_tokens_total"
	bestCachedTokens = "kvselect_selection_best_cached_tokens_total"
)

// sampleHitRate reads the workers' prefix-cache counters every second until
// stop closes: the hit rate of each second of the phase (seconds without
// prompt tokens are left out).
func sampleHitRate(ctx context.Context, fl *fleet.Fleet, start time.Time, q, h float64, stop <-chan struct{}) []Point {
	out := []Point{}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return out
		case now := <-tick.C:
			q1, h1, err := fl.CacheCounters(ctx)
			if err != nil {
				continue
			}
			if q1 > q {
				out = append(out, Point{Seconds: now.Sub(start).Seconds(), Value: (h1 - h) / (q1 - q)})
			}
			q, h = q1, h1
		}
	}
}
