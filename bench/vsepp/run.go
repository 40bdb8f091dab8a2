package vsepp

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"google.golang.org/grpc"

	"github.com/kvselect/kvselect/bench/fleet"
	"github.com/kvselect/kvselect/bench/floorpicker"
	"github.com/kvselect/kvselect/bench/mooncake"
	"github.com/kvselect/kvselect/bench/promtext"
	"github.com/kvselect/kvselect/bench/report"
	"github.com/kvselect/kvselect/bench/stats"
	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/internal/peerproc"
)

// picker is a running picker.
type picker struct {
	pid     int
	metrics string          // Prometheus URL
	hist    string          // its decision histogram
	kv      *fleet.KVSelect // nil for the EPP and the floor
	conn    *grpc.ClientConn
	stop    func()
}

// runOne is one picker's run: the picker first (the engines dial its KV
// events socket), fresh engines, an idle window, the trace, then the
// saturating loop.
func (c *Config) runOne(ctx context.Context, name, transport string, reqs []mooncake.Request, bodies [][]byte, stderr io.Writer) (PickerRun, error) {
	run := PickerRun{Picker: name, Transport: transport, Requests: len(reqs), PerEngine: make([]int, c.Workers)}
	label := name + "-" + transport
	f, err := c.startRunFleet(ctx, name, transport == "tls", filepath.Join(c.Out, label), reqs)
	if err != nil {
		return run, err
	}
	defer f.stop()
	idleRate, err := c.idleCPU(ctx, f.pk.pid)
	if err != nil {
		return run, err
	}
	run.IdleCPUPercent = 100 * idleRate
	rss, _, err := fleet.ProcessMemory(f.pk.pid)
	if err != nil {
		return run, err
	}
	run.RSSIdleMiB = mib(rss)
	if err := c.runTrace(ctx, f, label, reqs, bodies, idleRate, &run, stderr); err != nil {
		return run, err
	}
	if err := c.afterTrace(ctx, f, &run); err != nil {
		return run, err
	}
	// Memory back where it was: the resident set an idle window after the
	// trace (Go returns freed heap to the system in the background), and
	// the peak, which that window cannot raise.
	if _, err := c.idleCPU(ctx, f.pk.pid); err != nil {
		return run, err
	}
	rss, peak, err := fleet.ProcessMemory(f.pk.pid)
	if err != nil {
		return run, err
	}
	run.RSSAfterMiB, run.PeakRSSMiB = mib(rss), mib(peak)
	if c.Profile > 0 && f.pk.kv != nil {
		// What the resident memory after the run holds: the heap in use
		// after a collection (the index, bookings) against what the
		// runtime has not yet returned to the system.
		if err := savePprof(ctx, f.hc, f.pk.kv.REST+"/debug/pprof/heap?gc=1", filepath.Join(c.Out, label, "heap.pprof")); err != nil {
			return run, err
		}
	}
	if c.Saturate > 0 {
		if err := c.saturation(ctx, f.pk, f.client, bodies, &run); err != nil {
			return run, err
		}
		if f.pk.kv != nil {
			n, err := f.pk.kv.Settle(ctx, 5*time.Second)
			if err != nil {
				return run, err
			}
			*run.LeakedBookings += n
		}
	}
	return run, nil
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// runFleet is what one picker's run stands on: the picker, its engines,
// the HTTP client that talks to both and the Envoy double in front.
type runFleet struct {
	hc        *http.Client
	endpoints []string // the engines' host:port, in worker order
	pk        *picker
	engines   []fleet.CollectorEngine
	client    *envoysim.Client
}

// stop stops the engines before the picker whose collector they publish to.
func (f *runFleet) stop() {
	for _, e := range f.engines {
		e.Stop()
	}
	if f.pk != nil {
		f.pk.stop()
	}
	f.hc.CloseIdleConnections()
}

// startRunFleet starts the picker, then fresh engines that dial its KV
// events socket, in dir; on an error it stops what it started.
func (c *Config) startRunFleet(ctx context.Context, name string, secure bool, dir string, reqs []mooncake.Request) (_ *runFleet, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f := &runFleet{hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c.Concurrency, MaxIdleConns: 4 * c.Concurrency}}}
	defer func() {
		if err != nil {
			f.stop()
		}
	}()
	// The engines' ports, the collector's and the picker's three, known
	// before anything starts: the EPP reads its endpoints from a file.
	ports, err := fleet.FreePorts(c.Workers + 4)
	if err != nil {
		return nil, err
	}
	f.endpoints = make([]string, c.Workers)
	for i, p := range ports[:c.Workers] {
		f.endpoints[i] = "127.0.0.1:" + strconv.Itoa(p)
	}
	collector := "tcp://127.0.0.1:" + strconv.Itoa(ports[c.Workers])
	if f.pk, err = c.startPicker(ctx, name, secure, dir, f.endpoints, collector, ports[c.Workers+1:], f.hc); err != nil {
		return nil, err
	}
	f.client = envoysim.New(f.pk.conn)
	eng := c.Engine
	eng.MaxModelLen = fleet.SimModelLen(reqs, c.BlockTokens, c.MaxOutput)
	// The mock worker takes the simulator's timing model in its own terms:
	// prefill per uncached prompt token, a fixed time per output token, at
	// most MaxNumSeqs running.
	f.engines, err = fleet.StartCollectorEngines(ctx, fleet.CollectorEngines{Binaries: c.Binaries, Family: c.Family, N: c.Workers,
		Collector: collector, Engine: eng, Dir: dir, Ports: ports[:c.Workers]})
	if err != nil {
		return nil, err
	}
	if f.pk.kv != nil {
		for i, e := range f.engines {
			if err := f.pk.kv.RegisterCollectorEngine(ctx, uint64(i+1), e, c.Engine.BlockSize, c.Engine.PoolBlocks); err != nil {
				return nil, err
			}
		}
		if err := f.pk.kv.WaitWorkers(ctx, c.Workers, 60*time.Second); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// idleCPU waits out the idle window and returns the picker's CPU seconds per
// second over it. Meanwhile the engines' PUB sockets dial the collector (they
// retry every second), the EPP scrapes every engine's metrics, kvselect's
// listeners wait: both pickers get the same window before the first request.
func (c *Config) idleCPU(ctx context.Context, pid int) (float64, error) {
	cpu0, err := fleet.ProcessCPU(pid)
	if err != nil {
		return 0, err
	}
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(c.Idle):
	}
	cpu1, err := fleet.ProcessCPU(pid)
	if err != nil {
		return 0, err
	}
	return float64(cpu1-cpu0) / float64(c.Idle), nil
}

// runTrace sends the trace's bodies through the picker at the trace's pace
// and fills run's traffic figures: throughput, the picker's CPU per request
// (gross, and net of its idleRate), decision and TTFT quantiles, the
// picker's own decision histogram, the spread over the engines.
func (c *Config) runTrace(ctx context.Context, f *runFleet, label string, reqs []mooncake.Request, bodies [][]byte, idleRate float64, run *PickerRun, stderr io.Writer) error {
	h0, err := promtext.Scrape(ctx, f.hc, f.pk.metrics)
	if err != nil {
		return err
	}
	var bar *report.Progress
	if !c.Quiet {
		bar = report.NewProgress(stderr, label)
	}
	start := time.Now()
	cpuStart, err := fleet.ProcessCPU(f.pk.pid)
	if err != nil {
		return err
	}
	profiled := make(chan error, 1)
	if c.Profile > 0 && f.pk.kv != nil {
		go func() {
			profiled <- profile(ctx, f.hc, f.pk.kv.REST, c.Profile, filepath.Join(c.Out, label, "cpu.pprof"))
		}()
	} else {
		profiled <- nil
	}
	var (
		mu       sync.Mutex
		done     atomic.Int64
		firstErr error
	)
	one := func(i int) {
		res, err := exchange(ctx, f.client, f.hc, bodies[i], fmt.Sprintf("vs-%s-%d", label, i))
		mu.Lock()
		if err := run.add(res, err, f.endpoints); err != nil && firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
		bar.Update(int(done.Add(1)), len(reqs))
	}
	if err := c.traffic(ctx, reqs, one); err != nil {
		return err
	}
	wall := time.Since(start)
	cpuEnd, err := fleet.ProcessCPU(f.pk.pid)
	if err != nil {
		return err
	}
	if err := <-profiled; err != nil {
		return err
	}
	if firstErr != nil {
		run.ErrorSample = firstErr.Error()
		fmt.Fprintf(stderr, "%s: first error: %v\n", label, firstErr)
	}
	routed := len(run.decisions)
	run.WallSeconds = wall.Seconds()
	run.Throughput = float64(routed) / wall.Seconds()
	if routed > 0 {
		gross := float64(cpuEnd - cpuStart)
		run.CPUPerRequestGrossUs = gross / float64(routed) / 1e3
		run.CPUPerRequestUs = math.Max(0, gross-idleRate*float64(wall)) / float64(routed) / 1e3
	}
	run.CPUCores = float64(cpuEnd-cpuStart) / float64(wall)
	h1, err := promtext.Scrape(ctx, f.hc, f.pk.metrics)
	if err != nil {
		return err
	}
	delta := h1.Minus(h0)
	run.Histogram = delta.Summarize(f.pk.hist)
	if prompt := delta.Sum("kvselect_selection_prompt_tokens_total"); prompt > 0 {
		run.IndexHitRate = delta.Sum("kvselect_selection_cached_tokens_total") / prompt
		run.IndexBestHitRate = delta.Sum("kvselect_selection_best_cached_tokens_total") / prompt
	}
	q := func(d []time.Duration, p, unit float64) float64 { return float64(stats.Quantile(d, p)) / unit }
	run.Decision = Pct{P50: q(run.decisions, 0.5, 1e3), P90: q(run.decisions, 0.9, 1e3), P95: q(run.decisions, 0.95, 1e3), P99: q(run.decisions, 0.99, 1e3)}
	run.TTFTP50Ms, run.TTFTP90Ms, run.TTFTP99Ms = q(run.ttfts, 0.5, 1e6), q(run.ttfts, 0.9, 1e6), q(run.ttfts, 0.99, 1e6)
	run.ITLP90Ms = q(run.itls, 0.9, 1e6)
	run.goodput(c.GoodputTTFT, c.GoodputITL, wall)
	run.LoadCV = stats.CV(run.PerEngine)
	return nil
}

// profile saves kvselect's CPU profile over d (net/http/pprof's
// /debug/pprof/profile) at path.
func profile(ctx context.Context, hc *http.Client, rest string, d time.Duration, path string) error {
	secs := max(1, int(d.Round(time.Second)/time.Second))
	return savePprof(ctx, hc, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", rest, secs), path)
}

// savePprof saves one of kvselect's net/http/pprof profiles at path.
func savePprof(ctx context.Context, hc *http.Client, url, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("kvselect's profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("kvselect's profile %s: %s: %s (run it with -kvselect-args --enable-pprof)", url, resp.Status, b)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("kvselect's profile %s: %w", url, err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("kvselect's profile: %w", err)
	}
	return nil
}

// add counts one exchange's outcome (res, or its error err) and returns the
// error it counted, if any: err, or a route to none of endpoints.
func (run *PickerRun) add(res result, err error, endpoints []string) error {
	if err != nil {
		run.Errors++
		return err
	}
	run.decisions = append(run.decisions, res.decision)
	run.ttfts = append(run.ttfts, res.ttft)
	run.itls = append(run.itls, res.itl)
	var misrouted error
	if k := slices.Index(endpoints, res.endpoint); k >= 0 {
		run.PerEngine[k]++
	} else {
		run.Errors++
		misrouted = fmt.Errorf("routed to %q, not one of the engines", res.endpoint)
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
	return misrouted
}

// afterTrace reads the figures of the trace run that need it over: the
// engines' prefix-cache hit rate and, for kvselect, the bookings it still
// holds and its tokenizer fallbacks.
func (c *Config) afterTrace(ctx context.Context, f *runFleet, run *PickerRun) error {
	queries, hits, err := fleet.CacheCounters(ctx, f.hc, f.endpoints)
	if err != nil {
		return err
	}
	if queries > 0 {
		run.HitRate = hits / queries
	}
	if f.pk.kv == nil {
		return nil
	}
	n, err := f.pk.kv.Settle(ctx, 5*time.Second)
	if err != nil {
		return err
	}
	run.LeakedBookings = &n
	if err := run.latencyModel(ctx, f.hc, f.pk.kv.REST); err != nil {
		return err
	}
	if c.Prompts == PromptsText {
		return run.tokenizeFigures(ctx, f.hc, f.pk.metrics)
	}
	return nil
}

// goodput counts the routed requests that met both objectives: TTFT at
// most ttft and mean ITL at most itl (a request of one token has no ITL and
// meets that one).
func (run *PickerRun) goodput(ttft, itl time.Duration, wall time.Duration) {
	good := 0
	for i, t := range run.ttfts {
		if t <= ttft && run.itls[i] <= itl {
			good++
		}
	}
	if n := len(run.ttfts); n > 0 {
		run.GoodputShare = float64(good) / float64(n)
	}
	if wall > 0 {
		run.Goodput = float64(good) / wall.Seconds()
	}
}

// latencyModel reads kvselect's latency model (GET /policy).
func (run *PickerRun) latencyModel(ctx context.Context, hc *http.Client, rest string) error {
	var v struct {
		LatencyModel json.RawMessage `json:"latency_model"`
	}
	if err := fleet.GetJSON(ctx, hc, rest+"/policy", &v); err != nil {
		return fmt.Errorf("kvselect's latency model: %w", err)
	}
	var m struct {
		PredictionError struct {
			Window      int     `json:"window"`
			RelativeP50 float64 `json:"relative_p50"`
			RelativeP90 float64 `json:"relative_p90"`
		} `json:"prediction_error"`
	}
	if err := json.Unmarshal(v.LatencyModel, &m); err != nil {
		return fmt.Errorf("kvselect's latency model: %w", err)
	}
	run.LatencyModel = v.LatencyModel
	if e := m.PredictionError; e.Window > 0 {
		run.PredictionError = &[2]float64{e.RelativeP50, e.RelativeP90}
	}
	return nil
}

// tokenizeFigures reads how many text prompts kvselect routed on its text
// index for want of the engine's ids, and why.
func (run *PickerRun) tokenizeFigures(ctx context.Context, hc *http.Client, metricsURL string) error {
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

// startPicker starts kvselect or the EPP (on CPU 0 when pinned) on ports
// (three) and dials its ext_proc port as Envoy would.
func (c *Config) startPicker(ctx context.Context, name string, secure bool, dir string, endpoints []string, collector string, ports []int, hc *http.Client) (*picker, error) {
	var wrap []string
	if c.Pin {
		wrap = []string{"taskset", "-c", "0"}
	}
	pk := &picker{}
	var addr string
	switch name {
	case pickerKvselect, pickerKvselectLatency, pickerKvselectCost, pickerKvselectPrefix:
		args := []string{"--kv-events-bind", collector}
		if secure {
			args = append(args, "--extproc-secure-serving")
		}
		if pol := kvselectPolicies[name]; pol != "" {
			args = append(args, "--policy", pol)
		}
		if c.Prompts == PromptsText {
			args = append(args, "--tokenize", "pool")
		}
		k, err := fleet.StartKVSelect(ctx, fleet.KVSelectConfig{Binary: c.KVSelect, Name: name, Dir: dir, Port: ports[0], ExtProcPort: ports[1],
			Args: append(args, c.KVSelectArgs...), Wrap: wrap, HTTP: hc})
		if err != nil {
			return nil, err
		}
		pk.kv, pk.stop, pk.pid = k, k.Stop, k.Proc.Pid()
		pk.metrics, pk.hist, addr = k.REST+"/metrics", "kvselect_extproc_pick_duration_seconds", k.ExtProc
	case PickerFloor:
		cfg := floorpicker.Config{ExtProcPort: ports[0], HTTPPort: ports[1], Endpoints: endpoints}
		logf, err := os.Create(filepath.Join(dir, name+".log"))
		if err != nil {
			return nil, err
		}
		// The engines' PUB sockets dial the collector (the mock worker
		// fails without a listener). The floor indexes nothing: a SUB
		// socket that subscribes to no topic accepts them, and nothing
		// is published to it.
		sink := zmq4.NewSub(context.WithoutCancel(ctx))
		if err := sink.Listen(collector); err != nil {
			sink.Close()
			logf.Close()
			return nil, fmt.Errorf("the floor's KV events sink: %w", err)
		}
		h, err := floorpicker.Start(ctx, append(slices.Clone(wrap), c.FloorPicker...), cfg, logf)
		if err != nil {
			sink.Close()
			logf.Close()
			return nil, err
		}
		pk.stop, pk.pid = func() { h.Stop(); sink.Close(); logf.Close() }, h.Pid()
		pk.metrics, pk.hist, addr = cfg.MetricsURL(), floorpicker.HistogramName, cfg.ExtProcAddr()
	default:
		profile := peerproc.EPPDefault
		if name == pickerEPPTuned {
			profile = peerproc.EPPTuned
		}
		p, stop, err := fleet.StartEPP(ctx, fleet.EPP{Name: name, EPP: peerproc.EPP{
			Binary: c.EPP, Dir: dir, Endpoints: endpoints, ZMQEndpoint: collector, Model: fleet.SimModel,
			BlockSize: c.Engine.BlockSize, Profile: profile, GRPCPort: ports[0], HealthPort: ports[1], MetricsPort: ports[2],
			Secure: secure, Wrap: wrap, Extra: c.EPPArgs,
		}})
		if err != nil {
			return nil, err
		}
		pk.stop, pk.pid = stop, p.Pid()
		pk.metrics, pk.hist, addr = p.MetricsURL(), "llm_d_epp_scheduler_e2e_duration_seconds", p.Addr()
	}
	conn, err := fleet.Dial(addr, secure)
	if err != nil {
		pk.stop()
		return nil, err
	}
	stopPicker := pk.stop
	pk.conn, pk.stop = conn, func() { conn.Close(); stopPicker() }
	return pk, nil
}
