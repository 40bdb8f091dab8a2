package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
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

	"github.com/kvselect/kvselect/bench/report"
	"github.com/kvselect/kvselect/bench/stats"
	"github.com/kvselect/kvselect/envoysim"
)

// kvbench health: what kvselect does with what the engines say, on real
// processes. kvselect and N mock workers on loopback; an open loop of
// requests through the ext_proc picker (envoysim sends each to the chosen
// worker and streams the response back through the picker, so the picker
// sees every status); optionally an open loop of direct requests that
// bypass kvselect and land on the first -direct-workers workers (a second
// gateway, direct callers); and, mid-run, one worker switched to fail every
// request (the mock worker's POST /admin/faults) and later healed.
//
// Three phases: healthy, fault (the failing worker answers 500), recover.
// A poller reads GET /workers every 20 ms and timestamps the failing
// worker's health states; the report gives the time to eject (fault on →
// ejected), the requests kvselect routed to the worker after the ejection
// (each should be a trial: one per ejection after the first), and the time
// to restore (fault off → healthy). With -engine-metrics-interval given as a
// list, each value is its own run on fresh processes, so that routing with
// and without engine metrics can be compared under the same direct load.

type healthConfig struct {
	kvselectBin, workerBin string
	workers                int
	rate                   float64
	concurrency            int
	promptTokens           int
	maxTokens              int
	healthy, fault, heal   time.Duration
	failWorker             int
	directRate             float64
	directWorkers          int
	intervals              []time.Duration
	ejectBase              time.Duration
	kvselectArgs           []string
	speedup                float64
	prefillPerToken        time.Duration
	decodePerToken         time.Duration
	seed                   uint64
	out                    string
	jsonOut                string
}

// healthPhase is one phase's figures for the requests kvselect routed.
type healthPhase struct {
	Name      string  `json:"name"`
	Routed    int     `json:"routed"`
	Failed    int     `json:"failed"` // 5xx from the worker, or no answer
	Refused   int     `json:"refused"`
	PerWorker []int   `json:"per_worker"`
	TTFTP50Ms float64 `json:"ttft_p50_ms"`
	TTFTP90Ms float64 `json:"ttft_p90_ms"`
	ttfts     []time.Duration
}

// healthRun is one run (one engine-metrics interval).
type healthRun struct {
	EngineMetricsInterval string        `json:"engine_metrics_interval"`
	Phases                []healthPhase `json:"phases"`
	Direct                int           `json:"direct_requests"`
	DirectFailed          int           `json:"direct_failed"`
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

type healthReport struct {
	Workers       int         `json:"workers"`
	Rate          float64     `json:"rate_rps"`
	DirectRate    float64     `json:"direct_rate_rps"`
	DirectWorkers int         `json:"direct_workers"`
	Runs          []healthRun `json:"runs"`
}

func runHealth(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvbench health", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c healthConfig
	binaryFlags(fs, &c.kvselectBin, &c.workerBin)
	fs.IntVar(&c.workers, "workers", 4, "mock `workers`")
	fs.Float64Var(&c.rate, "rate", 40, "requests per second through the picker (open loop)")
	fs.IntVar(&c.concurrency, "concurrency", 128, "most routed requests in flight")
	fs.IntVar(&c.promptTokens, "prompt-tokens", 1024, "prompt `tokens` per request (random ids, so no prefix is shared)")
	fs.IntVar(&c.maxTokens, "max-tokens", 8, "output `tokens` per request")
	fs.DurationVar(&c.healthy, "healthy", 5*time.Second, "first phase: every worker healthy")
	fs.DurationVar(&c.fault, "fault", 12*time.Second, "second phase: -fail-worker answers every request 500")
	fs.DurationVar(&c.heal, "recover", 10*time.Second, "third phase: the worker healthy again")
	fs.IntVar(&c.failWorker, "fail-worker", 1, "worker `id` (1..workers) that fails in the second phase; 0: none")
	fs.Float64Var(&c.directRate, "direct-rate", 0, "requests per second sent straight to the workers, bypassing kvselect (open loop, spread over -direct-workers)")
	fs.IntVar(&c.directWorkers, "direct-workers", 2, "the direct traffic goes to workers 1..`n`")
	intervals := fs.String("engine-metrics-interval", "200ms", "kvselect's --engine-metrics-interval; a comma-separated `list` runs each on fresh processes (0 disables scraping)")
	fs.DurationVar(&c.ejectBase, "eject-base", 5*time.Second, "kvselect's --eject-base (first ejection's length)")
	extra := fs.String("kvselect-args", "", "more kvselect `flags`, space-separated")
	fs.Float64Var(&c.speedup, "speedup", demoSpeedup, "mock workers' --speedup (the demo's)")
	fs.DurationVar(&c.prefillPerToken, "prefill-time-per-token", demoPrefillPerToken, "mock workers' prefill time per uncached token (before -speedup)")
	fs.DurationVar(&c.decodePerToken, "decode-time-per-token", demoDecodePerToken, "mock workers' decode time per output token (before -speedup)")
	fs.Uint64Var(&c.seed, "seed", 1, "seeds the prompts")
	fs.StringVar(&c.out, "out", "bench/out/health", "`directory` for the processes' logs")
	fs.StringVar(&c.jsonOut, "json", "", "write the report as JSON to this `file`")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	case c.workers < 1 || c.concurrency < 1 || c.promptTokens < 1 || c.maxTokens < 1:
		return errors.New("-workers, -concurrency, -prompt-tokens and -max-tokens must be positive")
	case !(c.rate > 0) || c.directRate < 0 || !(c.speedup > 0):
		return errors.New("-rate and -speedup must be positive, -direct-rate not negative")
	case c.failWorker < 0 || c.failWorker > c.workers:
		return fmt.Errorf("-fail-worker %d: want 0 (none) or 1..%d", c.failWorker, c.workers)
	case c.directWorkers < 1 || c.directWorkers > c.workers:
		return fmt.Errorf("-direct-workers %d: want 1..%d", c.directWorkers, c.workers)
	case c.healthy <= 0 || c.fault <= 0 || c.heal <= 0 || c.ejectBase <= 0:
		return errors.New("-healthy, -fault, -recover and -eject-base must be positive")
	}
	for _, s := range strings.Split(*intervals, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil || d < 0 {
			return fmt.Errorf("-engine-metrics-interval %q: want durations >= 0", s)
		}
		c.intervals = append(c.intervals, d)
	}
	c.kvselectArgs = strings.Fields(*extra)
	if err := os.MkdirAll(c.out, 0o755); err != nil {
		return err
	}
	rep := healthReport{Workers: c.workers, Rate: c.rate, DirectRate: c.directRate, DirectWorkers: c.directWorkers}
	for _, iv := range c.intervals {
		run, err := c.runOnce(ctx, iv, stderr)
		if err != nil {
			return err
		}
		rep.Runs = append(rep.Runs, run)
	}
	if err := healthTable(stdout, &c, &rep); err != nil {
		return err
	}
	if c.jsonOut != "" {
		if err := report.WriteJSON(c.jsonOut, rep); err != nil {
			return err
		}
	}
	return nil
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

func (c *healthConfig) runOnce(ctx context.Context, interval time.Duration, stderr io.Writer) (healthRun, error) {
	run := healthRun{EngineMetricsInterval: interval.String(), FailWorker: c.failWorker}
	dc := demoConfig{engines: engineMock, kvselectBin: c.kvselectBin, workerBin: c.workerBin, workers: c.workers,
		concurrency: c.concurrency, blockSize: 16, poolBlocks: 8192, speedup: c.speedup,
		prefillPerToken: c.prefillPerToken, decodePerToken: c.decodePerToken,
		out: filepath.Join(c.out, "metrics-"+interval.String()),
		kvselectArgs: append([]string{"--engine-metrics-interval", interval.String(), "--eject-base", c.ejectBase.String()},
			c.kvselectArgs...)}
	if err := os.MkdirAll(dc.out, 0o755); err != nil {
		return run, err
	}
	fl, err := startFleet(ctx, &dc, stderr)
	if err != nil {
		return run, err
	}
	defer fl.stop()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		pollWG sync.WaitGroup
		events []healthEvent
	)
	if c.failWorker > 0 {
		pollWG.Go(func() { events = fl.pollHealth(ctx, uint64(c.failWorker)) })
	}
	var directWG sync.WaitGroup
	var directN, directFailed int
	if c.directRate > 0 {
		directWG.Go(func() { directN, directFailed = c.directLoad(ctx, fl) })
	}

	client := envoysim.New(fl.conn)
	rng := rand.New(rand.NewPCG(c.seed, 0x4ea17))
	var (
		mu   sync.Mutex
		recs []healthRec
		wg   sync.WaitGroup
		sem  = make(chan struct{}, c.concurrency)
	)
	start := time.Now()
	faultOn, faultOff := start.Add(c.healthy), start.Add(c.healthy+c.fault)
	end := faultOff.Add(c.heal)
	faultSet, faultCleared := false, false
	gap := time.Duration(float64(time.Second) / c.rate)
	for i := 0; ; i++ {
		at := start.Add(time.Duration(i) * gap)
		if !at.Before(end) {
			break
		}
		// The fault phase starts when the fault is asked for (no request
		// can fail before) and the recover phase when the worker has
		// answered that it is healed (no request after can fail).
		if c.failWorker > 0 && !faultSet && !at.Before(faultOn) {
			faultSet, faultOn = true, time.Now()
			if err := fl.setFaults(ctx, c.failWorker, 1); err != nil {
				return run, err
			}
		}
		if c.failWorker > 0 && !faultCleared && !at.Before(faultOff) {
			faultCleared = true
			if err := fl.setFaults(ctx, c.failWorker, 0); err != nil {
				return run, err
			}
			faultOff = time.Now()
		}
		if d := time.Until(at); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return run, ctx.Err()
			}
		}
		body, err := json.Marshal(demoBody{Model: fl.model, Prompt: randomPrompt(rng, c.promptTokens), MaxTokens: c.maxTokens, Stream: true})
		if err != nil {
			return run, err
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return run, ctx.Err()
		}
		wg.Go(func() {
			defer func() { <-sem }()
			r := fl.routedRequest(ctx, client, body, i)
			mu.Lock()
			recs = append(recs, r)
			mu.Unlock()
		})
	}
	wg.Wait()
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
	if run.ActiveAfterRun, err = fl.settledLoad(context.Background()); err != nil {
		return run, err
	}
	c.summarize(&run, recs, events, start, faultOn, faultOff, end, len(fl.workers))
	return run, nil
}

func (c *healthConfig) summarize(run *healthRun, recs []healthRec, events []healthEvent, start, faultOn, faultOff, end time.Time, workers int) {
	names := []string{"healthy", "fault", "recover"}
	bounds := []time.Time{start, faultOn, faultOff, end.Add(time.Hour)}
	if c.failWorker == 0 {
		names, bounds = []string{"run"}, []time.Time{start, end.Add(time.Hour)}
	}
	for _, n := range names {
		run.Phases = append(run.Phases, healthPhase{Name: n, PerWorker: make([]int, workers)})
	}
	// The first ejection after the fault began, the restoration after it,
	// and the ejections in between (the count resets on restoration): each
	// after the first was a failed trial.
	var ejectedAt, restoredAt time.Time
	maxEjections := 0
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
	onDirect := 0
	routed := 0
	fw := c.failWorker - 1
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
		if c.directRate > 0 && r.worker < c.directWorkers {
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
		if c.failWorker > 0 && r.worker == fw && r.status >= 500 {
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
		run.EjectAfterMs = ms(ejectedAt.Sub(faultOn))
		run.Trials = max(maxEjections-1, 0)
		run.Beyond = run.RoutedAfterEjection - run.Trials
	}
	if !restoredAt.IsZero() {
		run.Restored = true
		run.RestoreAfterMs = ms(restoredAt.Sub(faultOff))
	}
}

func randomPrompt(rng *rand.Rand, n int) []uint32 {
	p := make([]uint32, n)
	for i := range p {
		p[i] = uint32(rng.IntN(32000))
	}
	return p
}

// routedRequest is one request through the picker to the worker it chose,
// with the worker's status whatever it is.
func (fl *fleet) routedRequest(ctx context.Context, client *envoysim.Client, body []byte, i int) healthRec {
	begin := time.Now()
	res, status, err := fl.throughPicker(ctx, client, body, fmt.Sprintf("health-%d", i))
	rec := healthRec{begin: begin, worker: res.worker, status: status, ttft: res.ttft}
	if err != nil && status == 0 {
		rec.err = err
	}
	return rec
}

// setFaults switches a mock worker's failure rate (POST /admin/faults).
func (fl *fleet) setFaults(ctx context.Context, worker int, failRate float64) error {
	body := fmt.Sprintf(`{"fail_rate":%g}`, failRate)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+fl.workers[worker-1]+"/admin/faults", strings.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := fl.hc.Do(req)
	if err != nil {
		return fmt.Errorf("set faults of worker %d: %w", worker, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("set faults of worker %d: %s: %s", worker, resp.Status, b)
	}
	return nil
}

// pollHealth records the worker's health state every 20 ms until ctx ends:
// one event per change of state or ejection count.
func (fl *fleet) pollHealth(ctx context.Context, id uint64) []healthEvent {
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
		if err := getJSON(fl.hc, fl.rest+"/workers", &ws); err == nil {
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
func (c *healthConfig) directLoad(ctx context.Context, fl *fleet) (sent, failed int) {
	rng := rand.New(rand.NewPCG(c.seed, 0xd1ec7))
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	gap := time.Duration(float64(time.Second) / c.directRate)
	tick := time.NewTicker(gap)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-tick.C:
		case <-ctx.Done():
			wg.Wait()
			return sent, failed
		}
		body, err := json.Marshal(demoBody{Model: fl.model, Prompt: randomPrompt(rng, c.promptTokens), MaxTokens: c.maxTokens, Stream: true})
		if err != nil {
			continue
		}
		ep := fl.workers[i%c.directWorkers]
		wg.Go(func() {
			// Not the run's context: a request in flight when the run ends
			// finishes rather than counting as a failure.
			_, err := fl.direct(context.Background(), ep, body)
			mu.Lock()
			sent++
			if err != nil {
				failed++
			}
			mu.Unlock()
		})
	}
}

func healthTable(w io.Writer, c *healthConfig, rep *healthReport) error {
	fmt.Fprintf(w, "%d mock workers, %.0f routed req/s", rep.Workers, rep.Rate)
	if rep.DirectRate > 0 {
		fmt.Fprintf(w, ", %.0f direct req/s to workers 1..%d", rep.DirectRate, rep.DirectWorkers)
	}
	if c.failWorker > 0 {
		fmt.Fprintf(w, "; worker %d fails every request from %s for %s", c.failWorker, c.healthy, c.fault)
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
		if c.failWorker > 0 {
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
