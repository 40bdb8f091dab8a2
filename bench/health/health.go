// Package health measures what kvselect does with what the engines say, on
// real processes. kvselect and N mock workers on loopback; an open loop of
// requests through the ext_proc picker (envoysim sends each to the chosen
// worker and streams the response back through the picker, so the picker
// sees every status); optionally an open loop of direct requests that
// bypass kvselect and land on the first DirectWorkers workers (a second
// gateway, direct callers); and, mid-run, one worker switched to fail every
// request (the mock worker's POST /admin/faults) and later healed.
//
// Three phases: healthy, fault (the failing worker answers 500), recover.
// A poller reads GET /workers every 20 ms and timestamps the failing
// worker's health states; the report gives the time to eject (fault on →
// ejected), the requests kvselect routed to the worker after the ejection
// (each should be a trial: one per ejection after the first), and the time
// to restore (fault off → healthy). Each of several engine-metrics intervals
// is its own run on fresh processes, so that routing with and without
// engine metrics can be compared under the same direct load.
package health

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/kvselect/kvselect/bench/demo"
	"github.com/kvselect/kvselect/bench/fleet"
	"github.com/kvselect/kvselect/bench/relay"
	"github.com/kvselect/kvselect/bench/report"
	"github.com/kvselect/kvselect/bench/stats"
	"github.com/kvselect/kvselect/envoysim"
)

// Config is one run of the comparison.
type Config struct {
	// Spec is the mock workers, the demo's by default; Out receives the
	// processes' logs.
	fleet.Spec
	Rate         float64 // requests per second through the picker (open loop)
	Concurrency  int     // most routed requests in flight
	PromptTokens int     // random ids, so no prefix is shared
	MaxTokens    int     // output tokens per request
	// Healthy, Fault and Recover are the phases' lengths: every worker
	// healthy, FailWorker answering every request 500, the worker healthy
	// again.
	Healthy, Fault, Recover time.Duration
	FailWorker              int // worker id (1..Workers); 0: none
	// DirectRate is requests per second sent straight to workers
	// 1..DirectWorkers, bypassing kvselect (open loop).
	DirectRate    float64
	DirectWorkers int
	// Intervals are kvselect's --engine-metrics-interval, each its own run
	// on fresh processes (0 disables scraping).
	Intervals    []time.Duration
	EjectBase    time.Duration // kvselect's --eject-base
	KVSelectArgs []string      // more kvselect flags
	Seed         uint64        // seeds the prompts
	report.Files
}

// Defaults is the ejection run of `make bench-health`.
func Defaults() Config {
	return Config{Spec: fleet.Spec{Family: fleet.FamilyMock, Workers: 4, Engine: demo.Engine(), Out: "bench/out/health"},
		Rate: 40, Concurrency: 128, PromptTokens: 1024, MaxTokens: 8,
		Healthy: 5 * time.Second, Fault: 12 * time.Second, Recover: 10 * time.Second, FailWorker: 1, DirectWorkers: 2,
		Intervals: []time.Duration{200 * time.Millisecond}, EjectBase: 5 * time.Second, Seed: 1}
}

// Phase is one phase's figures for the requests kvselect routed.
type Phase struct {
	Name      string  `json:"name"`
	Routed    int     `json:"routed"`
	Failed    int     `json:"failed"` // 5xx from the worker, or no answer
	Refused   int     `json:"refused"`
	PerWorker []int   `json:"per_worker"`
	TTFTP50Ms float64 `json:"ttft_p50_ms"`
	TTFTP90Ms float64 `json:"ttft_p90_ms"`
	ttfts     []time.Duration
}

// Run is one run (one engine-metrics interval).
type Run struct {
	EngineMetricsInterval string  `json:"engine_metrics_interval"`
	Phases                []Phase `json:"phases"`
	Direct                int     `json:"direct_requests"`
	DirectFailed          int     `json:"direct_failed"`
	// DirectShare is the share of the routed requests (all phases) that
	// landed on the workers the direct traffic loads.
	DirectShare float64 `json:"routed_share_on_direct_workers"`
	// The failing worker, when there is one.
	FailWorker int `json:"fail_worker,omitempty"`
	// EjectAfterMs: fault on → GET /workers says ejected (20 ms polling).
	EjectAfterMs float64 `json:"eject_after_ms,omitempty"`
	// FailuresBeforeEjection: routed requests that failed on the worker
	// before it was ejected (the consecutive failures that ejected it, and
	// any in flight).
	FailuresBeforeEjection int `json:"failures_before_ejection,omitempty"`
	// RoutedAfterEjection: requests routed to the worker after its first
	// ejection that failed there (it still failed); Trials of them were probation trials
	// (ejections after the first), Beyond = RoutedAfterEjection − Trials.
	RoutedAfterEjection int `json:"routed_after_ejection"`
	Trials              int `json:"trials"`
	Beyond              int `json:"beyond_trials"`
	// RestoreAfterMs: fault off → GET /workers says healthy again.
	RestoreAfterMs float64 `json:"restore_after_ms,omitempty"`
	Ejected        bool    `json:"ejected"`
	Restored       bool    `json:"restored"`
	ActiveAfterRun uint64  `json:"active_requests_after_run"`
	// FirstError is the first routed request that got no answer at all
	// (counted in its phase's Failed).
	FirstError string `json:"first_error,omitempty"`
}

// Report is every run (kvbench health -json).
type Report struct {
	Workers       int     `json:"workers"`
	Rate          float64 `json:"rate_rps"`
	DirectRate    float64 `json:"direct_rate_rps"`
	DirectWorkers int     `json:"direct_workers"`
	Runs          []Run   `json:"runs"`
}

// Validate checks the configuration before anything starts.
func (c *Config) Validate() error {
	switch {
	case c.Workers < 1 || c.Concurrency < 1 || c.PromptTokens < 1 || c.MaxTokens < 1:
		return errors.New("-workers, -concurrency, -prompt-tokens and -max-tokens must be positive")
	case !(c.Rate > 0) || c.DirectRate < 0 || !(c.Engine.Speedup > 0):
		return errors.New("-rate and -speedup must be positive, -direct-rate not negative")
	case c.FailWorker < 0 || c.FailWorker > c.Workers:
		return fmt.Errorf("-fail-worker %d: want 0 (none) or 1..%d", c.FailWorker, c.Workers)
	case c.DirectWorkers < 1 || c.DirectWorkers > c.Workers:
		return fmt.Errorf("-direct-workers %d: want 1..%d", c.DirectWorkers, c.Workers)
	case c.Healthy <= 0 || c.Fault <= 0 || c.Recover <= 0 || c.EjectBase <= 0:
		return errors.New("-healthy, -fault, -recover and -eject-base must be positive")
	case len(c.Intervals) == 0:
		return errors.New("-engine-metrics-interval: no interval")
	}
	return nil
}

// Measure runs once per engine-metrics interval, each on fresh processes,
// prints the table and writes c.Files.
func Measure(ctx context.Context, c Config, stdout, stderr io.Writer) (*Report, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(c.Out, 0o755); err != nil {
		return nil, err
	}
	rep := &Report{Workers: c.Workers, Rate: c.Rate, DirectRate: c.DirectRate, DirectWorkers: c.DirectWorkers}
	for _, iv := range c.Intervals {
		run, err := c.runOnce(ctx, iv, stderr)
		if err != nil {
			return nil, err
		}
		rep.Runs = append(rep.Runs, run)
	}
	if err := rep.Table(stdout, &c); err != nil {
		return rep, err
	}
	return rep, c.Files.Write(rep, "", nil)
}

// healthRec is one routed request.
type healthRec struct {
	begin  time.Time // when the request reached the picker
	worker int       // index into the fleet's workers; -1 when refused
	status int       // the worker's status, or the picker's immediate one
	ttft   time.Duration
	err    error
}

// healthEvent is a state of the failing worker seen by the poller.
type healthEvent struct {
	at        time.Time
	state     string
	ejections int
}

// runOnce is one run on fresh processes with kvselect scraping the engines
// every interval: the paced requests through the picker, the failing
// worker's health polled and the direct load beside them.
func (c *Config) runOnce(ctx context.Context, interval time.Duration, stderr io.Writer) (Run, error) {
	run := Run{EngineMetricsInterval: interval.String(), FailWorker: c.FailWorker}
	fl, err := c.startFleet(ctx, interval, stderr)
	if err != nil {
		return run, err
	}
	defer fl.Stop()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		pollWG sync.WaitGroup
		events []healthEvent
	)
	if c.FailWorker > 0 {
		pollWG.Go(func() { events = pollHealth(ctx, fl, uint64(c.FailWorker)) })
	}
	var directWG sync.WaitGroup
	var directN, directFailed int
	if c.DirectRate > 0 {
		directWG.Go(func() { directN, directFailed = c.directLoad(ctx, fl) })
	}
	recs, tl, err := c.sendPaced(ctx, fl)
	if err != nil {
		return run, err
	}
	// Let the last outcome reach the poller, then stop the side loops.
	time.Sleep(100 * time.Millisecond)
	cancel()
	pollWG.Wait()
	directWG.Wait()
	run.Direct, run.DirectFailed = directN, directFailed

	for _, r := range recs {
		if r.err != nil && r.status == 0 && run.FirstError == "" {
			run.FirstError = r.err.Error()
		}
	}
	if run.ActiveAfterRun, err = fl.KV.Settle(context.Background(), 5*time.Second); err != nil {
		return run, err
	}
	c.summarize(&run, recs, events, tl, len(fl.Workers))
	return run, nil
}

// startFleet starts kvselect, scraping the engines every interval, and the
// mock workers, logging into their own folder of c.Out.
func (c *Config) startFleet(ctx context.Context, interval time.Duration, stderr io.Writer) (*fleet.Fleet, error) {
	dir := filepath.Join(c.Out, "metrics-"+interval.String())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return fleet.Start(ctx, fleet.Config{Binaries: c.Binaries, Family: fleet.FamilyMock, Workers: c.Workers, Engine: c.Engine,
		Dir: dir, Progress: stderr, HTTP: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c.Concurrency, MaxIdleConns: 4 * c.Concurrency}},
		KVSelectArgs: append([]string{"--engine-metrics-interval", interval.String(), "--eject-base", c.EjectBase.String()}, c.KVSelectArgs...)})
}

// timeline is a run's phases: healthy from start, the fault from faultOn,
// recovering from faultOff until end.
type timeline struct {
	start, faultOn, faultOff, end time.Time
}

// sendPaced sends requests through the picker at c.Rate, at most
// c.Concurrency in flight, for the whole timeline, turning the fault on and
// off on the way, and returns once every answer is in.
func (c *Config) sendPaced(ctx context.Context, fl *fleet.Fleet) ([]healthRec, timeline, error) {
	rl := fl.Relay()
	rng := rand.New(rand.NewPCG(c.Seed, 0x4ea17))
	var (
		mu   sync.Mutex
		recs []healthRec
		wg   sync.WaitGroup
		sem  = make(chan struct{}, c.Concurrency)
	)
	start := time.Now()
	tl := timeline{start: start, faultOn: start.Add(c.Healthy), faultOff: start.Add(c.Healthy + c.Fault)}
	tl.end = tl.faultOff.Add(c.Recover)
	fault := faultSwitch{worker: c.FailWorker}
	gap := time.Duration(float64(time.Second) / c.Rate)
	for i := 0; ; i++ {
		at := start.Add(time.Duration(i) * gap)
		if !at.Before(tl.end) {
			break
		}
		if err := fault.update(ctx, fl, at, &tl); err != nil {
			return nil, tl, err
		}
		if d := time.Until(at); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return nil, tl, ctx.Err()
			}
		}
		body, err := json.Marshal(relay.Completion{Model: fl.Model, Prompt: randomPrompt(rng, c.PromptTokens), MaxTokens: c.MaxTokens, Stream: true})
		if err != nil {
			return nil, tl, err
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return nil, tl, ctx.Err()
		}
		wg.Go(func() {
			defer func() { <-sem }()
			r := routedRequest(ctx, fl, rl, body, i)
			mu.Lock()
			recs = append(recs, r)
			mu.Unlock()
		})
	}
	wg.Wait()
	return recs, tl, nil
}

// faultSwitch turns the failing worker's fault on and off.
type faultSwitch struct {
	worker       int // 1..Workers; 0: none
	set, cleared bool
}

// update turns the fault on, or off, before the first request paced at or
// after the timeline's faultOn, or faultOff, and moves that bound to the
// moment it took effect: the fault phase starts when the fault is asked for
// (no request can fail before) and the recover phase when the worker has
// answered that it is healed (no request after can fail).
func (f *faultSwitch) update(ctx context.Context, fl *fleet.Fleet, at time.Time, tl *timeline) error {
	if f.worker > 0 && !f.set && !at.Before(tl.faultOn) {
		f.set, tl.faultOn = true, time.Now()
		if err := fl.SetFailRate(ctx, f.worker, 1); err != nil {
			return err
		}
	}
	if f.worker > 0 && !f.cleared && !at.Before(tl.faultOff) {
		f.cleared = true
		if err := fl.SetFailRate(ctx, f.worker, 0); err != nil {
			return err
		}
		tl.faultOff = time.Now()
	}
	return nil
}

// summarize places each routed request in its phase of tl and fills run's
// figures from them and from the failing worker's health events.
func (c *Config) summarize(run *Run, recs []healthRec, events []healthEvent, tl timeline, workers int) {
	names := []string{"healthy", "fault", "recover"}
	bounds := []time.Time{tl.start, tl.faultOn, tl.faultOff, tl.end.Add(time.Hour)}
	if c.FailWorker == 0 {
		names, bounds = []string{"run"}, []time.Time{tl.start, tl.end.Add(time.Hour)}
	}
	for _, n := range names {
		run.Phases = append(run.Phases, Phase{Name: n, PerWorker: make([]int, workers)})
	}
	ejectedAt, restoredAt, maxEjections := ejection(events, tl.faultOn)
	onDirect := 0
	routed := 0
	fw := c.FailWorker - 1
	// Requests are placed by when they reached the picker: one that
	// reached it after the poller saw the ejection was decided after it.
	for _, r := range recs {
		p := 0
		for p+1 < len(names) && !r.begin.Before(bounds[p+1]) {
			p++
		}
		ph := &run.Phases[p]
		if r.worker < 0 {
			ph.Refused++
			continue
		}
		ph.Routed++
		routed++
		ph.PerWorker[r.worker]++
		if c.DirectRate > 0 && r.worker < c.DirectWorkers {
			onDirect++
		}
		if r.status != http.StatusOK {
			ph.Failed++
		} else {
			ph.ttfts = append(ph.ttfts, r.ttft)
		}
		// Only failed requests count: one that reached the worker after
		// the fault was lifted was not routed to a failing worker. Every
		// failure there is the fault's, whichever phase it began in.
		if c.FailWorker > 0 && r.worker == fw && r.status >= 500 {
			if ejectedAt.IsZero() || r.begin.Before(ejectedAt) {
				run.FailuresBeforeEjection++
			} else {
				run.RoutedAfterEjection++
			}
		}
	}
	for i := range run.Phases {
		ph := &run.Phases[i]
		ph.TTFTP50Ms = ms(stats.Quantile(ph.ttfts, 0.5))
		ph.TTFTP90Ms = ms(stats.Quantile(ph.ttfts, 0.9))
	}
	if routed > 0 {
		run.DirectShare = float64(onDirect) / float64(routed)
	}
	if !ejectedAt.IsZero() {
		run.Ejected = true
		run.EjectAfterMs = ms(ejectedAt.Sub(tl.faultOn))
		run.Trials = max(maxEjections-1, 0)
		run.Beyond = run.RoutedAfterEjection - run.Trials
	}
	if !restoredAt.IsZero() {
		run.Restored = true
		run.RestoreAfterMs = ms(restoredAt.Sub(tl.faultOff))
	}
}

// ejection finds in the worker's health events the first ejection after
// the fault began at faultOn, the restoration after it, and the most
// ejections in between (the count resets on restoration): each after the
// first was a failed trial.
func ejection(events []healthEvent, faultOn time.Time) (ejectedAt, restoredAt time.Time, maxEjections int) {
	for _, e := range events {
		switch {
		case ejectedAt.IsZero():
			if e.state == "ejected" && !e.at.Before(faultOn) {
				ejectedAt, maxEjections = e.at, e.ejections
			}
		case restoredAt.IsZero():
			if e.state == "healthy" {
				restoredAt = e.at
			} else {
				maxEjections = max(maxEjections, e.ejections)
			}
		}
	}
	return ejectedAt, restoredAt, maxEjections
}

func randomPrompt(rng *rand.Rand, n int) []uint32 {
	p := make([]uint32, n)
	for i := range p {
		p[i] = uint32(rng.IntN(32000))
	}
	return p
}

// routedRequest is one request through the picker to the worker it chose,
// with the worker's status whatever it is (or the picker's own answer).
func routedRequest(ctx context.Context, fl *fleet.Fleet, rl *relay.Relay, body []byte, i int) healthRec {
	begin := time.Now()
	res, err := rl.Do(ctx, "/v1/completions", body, envoysim.Header{Key: "x-request-id", Value: fmt.Sprintf("health-%d", i)})
	rec := healthRec{begin: begin, worker: -1, status: res.Status, ttft: res.TTFT}
	if d := res.Decision; d != nil {
		if d.Immediate != nil {
			rec.status, rec.ttft = int(d.Immediate.Status), 0
		} else {
			rec.worker = fl.Worker(d.Endpoint)
		}
	}
	if err != nil && rec.status == 0 {
		rec.err = err
	}
	return rec
}

// pollHealth records the worker's health state every 20 ms until ctx ends:
// one event per change of state or ejection count.
func pollHealth(ctx context.Context, fl *fleet.Fleet, id uint64) []healthEvent {
	var out []healthEvent
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var ws []struct {
			WorkerID uint64 `json:"worker_id"`
			Health   *struct {
				State     string `json:"state"`
				Ejections int    `json:"ejections"`
			} `json:"health"`
		}
		if err := fleet.GetJSON(ctx, fl.HTTP, fl.KV.REST+"/workers", &ws); err == nil {
			for _, w := range ws {
				if w.WorkerID != id {
					continue
				}
				e := healthEvent{at: time.Now(), state: "healthy"}
				if w.Health != nil {
					e.state, e.ejections = w.Health.State, w.Health.Ejections
				}
				if n := len(out); n == 0 || out[n-1].state != e.state || out[n-1].ejections != e.ejections {
					out = append(out, e)
				}
			}
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return out
		}
	}
}

// directLoad sends requests straight to workers 1..directWorkers at
// directRate until ctx ends: traffic kvselect never books.
func (c *Config) directLoad(ctx context.Context, fl *fleet.Fleet) (sent, failed int) {
	rng := rand.New(rand.NewPCG(c.Seed, 0xd1ec7))
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	gap := time.Duration(float64(time.Second) / c.DirectRate)
	tick := time.NewTicker(gap)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-tick.C:
		case <-ctx.Done():
			wg.Wait()
			return sent, failed
		}
		body, err := json.Marshal(relay.Completion{Model: fl.Model, Prompt: randomPrompt(rng, c.PromptTokens), MaxTokens: c.MaxTokens, Stream: true})
		if err != nil {
			continue
		}
		ep := fl.Workers[i%c.DirectWorkers]
		wg.Go(func() {
			// Not the run's context: a request in flight when the run ends
			// finishes rather than counting as a failure.
			_, err := relay.Direct(context.Background(), fl.HTTP, "http://"+ep+"/v1/completions", body)
			mu.Lock()
			sent++
			if err != nil {
				failed++
			}
			mu.Unlock()
		})
	}
}

// Table prints each run's phases and the ejection figures.
func (rep *Report) Table(w io.Writer, c *Config) error {
	fmt.Fprintf(w, "%d mock workers, %.0f routed req/s", rep.Workers, rep.Rate)
	if rep.DirectRate > 0 {
		fmt.Fprintf(w, ", %.0f direct req/s to workers 1..%d", rep.DirectRate, rep.DirectWorkers)
	}
	if c.FailWorker > 0 {
		fmt.Fprintf(w, "; worker %d fails every request from %s for %s", c.FailWorker, c.Healthy, c.Fault)
	}
	fmt.Fprintln(w)
	for _, run := range rep.Runs {
		fmt.Fprintf(w, "\nengine metrics every %s:\n", run.EngineMetricsInterval)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "phase\trouted\tfailed\trefused\tTTFT p50 ms\tTTFT p90 ms\tper worker\t")
		for _, ph := range run.Phases {
			per := make([]string, len(ph.PerWorker))
			for i, n := range ph.PerWorker {
				per[i] = strconv.Itoa(n)
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.1f\t%.1f\t%s\t\n", ph.Name, ph.Routed, ph.Failed, ph.Refused, ph.TTFTP50Ms, ph.TTFTP90Ms, strings.Join(per, " "))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if rep.DirectRate > 0 {
			fmt.Fprintf(w, "direct requests: %d (%d failed); routed share on workers 1..%d: %.3f\n",
				run.Direct, run.DirectFailed, rep.DirectWorkers, run.DirectShare)
		}
		if c.FailWorker > 0 {
			if run.Ejected {
				fmt.Fprintf(w, "worker %d ejected %.0f ms after its fault began, after %d failed requests; routed to it after the ejection while failing: %d (%d trials, %d beyond)\n",
					run.FailWorker, run.EjectAfterMs, run.FailuresBeforeEjection, run.RoutedAfterEjection, run.Trials, run.Beyond)
			} else {
				fmt.Fprintf(w, "worker %d was never ejected\n", run.FailWorker)
			}
			if run.Restored {
				fmt.Fprintf(w, "restored %.0f ms after the fault ended\n", run.RestoreAfterMs)
			} else {
				fmt.Fprintln(w, "not restored before the run ended")
			}
		}
		fmt.Fprintf(w, "kvselect active requests after the run: %d\n", run.ActiveAfterRun)
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
