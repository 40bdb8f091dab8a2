// Package soak runs kvselect for a long time under load and faults and checks
// that nothing accumulates or drifts: real processes on loopback (kvselect
// replicas with replica sync, session affinity and index recovery; mock
// workers publishing KV events, some through a lossy proxy), traffic through
// both fronts at fixed open-loop rates, and a seeded schedule of worker,
// publisher, replica and client faults. At the end it checks that no load
// leaked, that every replica's index equals every worker's cache, that
// memory, goroutines and file descriptors did not grow, that kvselect never
// answered a 5xx other than the documented 503, and how much routing quality
// the churn cost against a fault-free run of the same traffic.
//
// `kvbench soak` is the command line; docs/reliability.md has the figures of
// an hour's run.
package soak

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvselect/kvselect/bench/fleet"
	"github.com/kvselect/kvselect/bench/promtext"
	"github.com/kvselect/kvselect/bench/report"
	"github.com/kvselect/kvselect/bench/stats"
)

// Config is one soak run.
type Config struct {
	KVSelect, MockWorker string // binaries
	// Sim is the llm-d-inference-sim binary; Sims of them join the mock
	// workers (none without the binary).
	Sim  string
	Sims int
	Out  string // logs, JSON and SVG go here

	Duration time.Duration // the faulted phase
	Baseline time.Duration // the fault-free phase before it; 0 skips it
	Seed     uint64

	Replicas, Workers int
	ProxiedWorkers    int // the last ones: KV events through the lossy proxy
	ExtprocRate       float64
	RESTRate          float64
	Docs              int // shared prompt prefixes

	FaultEvery  time.Duration // mean gap between injected faults
	SampleEvery time.Duration // resource and hit-rate sampling
	Expiry      time.Duration // DYN_ROUTER_ACTIVE_REQUEST_EXPIRY_SECS, whole seconds

	// Growth bounds over the last half of the faulted phase, per hour; they
	// are judged only when that half is at least JudgeAfter long (a few
	// minutes of a short run say nothing about a slope).
	MaxRSSSlope, MaxGoroutineSlope, MaxFDSlope float64
	JudgeAfter                                 time.Duration
}

// Defaults is an hour's soak.
func Defaults() Config {
	return Config{KVSelect: "bin/kvselect", MockWorker: "bin/kvselect-mockworker", Out: "bench/out/soak",
		Duration: time.Hour, Baseline: 5 * time.Minute, Seed: 1,
		Replicas: 3, Workers: 8, ProxiedWorkers: 2, ExtprocRate: 12, RESTRate: 6, Docs: 48,
		FaultEvery: 20 * time.Second, SampleEvery: 10 * time.Second, Expiry: 20 * time.Second,
		MaxRSSSlope: 64, MaxGoroutineSlope: 100, MaxFDSlope: 50, JudgeAfter: 10 * time.Minute}
}

// Shorten makes c the compressed run CI does: 150 s under faults after a
// 45 s baseline, a fault every 4 s, samples every 3 s, an 8 s expiry — but
// for the settings explicit names as given (by their kvbench soak flags:
// duration, baseline, fault-every, sample-every, expiry).
func (c *Config) Shorten(explicit func(flag string) bool) {
	for _, s := range []struct {
		flag  string
		field *time.Duration
		short time.Duration
	}{
		{"duration", &c.Duration, 150 * time.Second},
		{"baseline", &c.Baseline, 45 * time.Second},
		{"fault-every", &c.FaultEvery, 4 * time.Second},
		{"sample-every", &c.SampleEvery, 3 * time.Second},
		{"expiry", &c.Expiry, 8 * time.Second},
	} {
		if !explicit(s.flag) {
			*s.field = s.short
		}
	}
}

func (c *Config) validate() error {
	switch {
	case c.Duration <= 0:
		return errors.New("duration must be positive")
	case c.Baseline < 0:
		return errors.New("baseline must not be negative")
	case c.Replicas < 1 || c.Replicas > 26:
		return fmt.Errorf("replicas must be in [1, 26], got %d", c.Replicas)
	case c.Workers < 2:
		return fmt.Errorf("workers must be at least 2, got %d", c.Workers)
	case c.ProxiedWorkers < 0 || c.ProxiedWorkers > c.Workers:
		return fmt.Errorf("proxied workers must be in [0, workers], got %d", c.ProxiedWorkers)
	case c.ExtprocRate < 0 || c.RESTRate < 0 || c.ExtprocRate+c.RESTRate == 0:
		return errors.New("request rates must not be negative, and one must be positive")
	case c.Sims < 0 || (c.Sims > 0 && c.Sim == ""):
		return fmt.Errorf("sims must be 0 without a simulator binary, got %d", c.Sims)
	case c.Docs < 1:
		return errors.New("docs must be at least 1")
	case c.FaultEvery <= 0 || c.SampleEvery <= 0:
		return errors.New("fault and sample intervals must be positive")
	case c.Expiry < time.Second || c.Expiry%time.Second != 0:
		return fmt.Errorf("expiry must be whole seconds, at least 1s, got %s", c.Expiry)
	}
	return nil
}

// Run runs the baseline (when set) and the faulted phase and checks the
// invariants; the error is non-nil when one fails or the run could not be
// carried out. Progress goes to progress, the summary table to out.
func Run(ctx context.Context, cfg Config, out, progress io.Writer) (*Report, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	rep := &Report{Config: cfg}
	if cfg.Baseline > 0 {
		ph, err := runPhase(ctx, &cfg, "baseline", cfg.Baseline, false, progress)
		if err != nil {
			return nil, fmt.Errorf("baseline: %w", err)
		}
		rep.Baseline = ph
	}
	ph, err := runPhase(ctx, &cfg, "faulted", cfg.Duration, true, progress)
	if err != nil {
		return nil, fmt.Errorf("faulted phase: %w", err)
	}
	rep.Faulted = ph
	rep.finish()
	if err := rep.write(cfg.Out); err != nil {
		return rep, err
	}
	rep.table(out)
	if n := rep.failed(); n > 0 {
		return rep, fmt.Errorf("%d invariants failed (details above, logs in %s)", n, cfg.Out)
	}
	return rep, nil
}

// phaseRun is the state of one phase while it runs.
type phaseRun struct {
	cfg      *Config
	name     string
	fl       *cluster
	rec      *recorder
	inj      *injector
	progress io.Writer
	// stopping is set once the phase stops the cluster itself: exits after
	// that are expected.
	stopping atomic.Bool

	mu         sync.Mutex
	violations []Violation
	samples    []Sample
	prevHits   map[int][2]float64 // worker id → last queries, hits
}

func (p *phaseRun) violate(name, detail string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.violations = append(p.violations, Violation{Invariant: name, Detail: detail, At: time.Since(p.rec.begin)})
	fmt.Fprintf(p.progress, "\nVIOLATION %s: %s\n", name, detail)
}

// runPhase starts a fresh cluster, runs the traffic (and with faulted the
// faults) for d, then checks the invariants the phase can judge.
func runPhase(ctx context.Context, cfg *Config, name string, d time.Duration, faulted bool, progress io.Writer) (*Phase, error) {
	p := &phaseRun{cfg: cfg, name: name, progress: progress, prevHits: map[int][2]float64{}}
	p.rec = &recorder{}
	out := cfg.Out + "/" + name
	fmt.Fprintf(progress, "%s: starting %d kvselect replicas, %d mock workers and %d llm-d-inference-sim (logs in %s)\n", name, cfg.Replicas, cfg.Workers, cfg.Sims, out)
	fl, err := startCluster(ctx, cfg, out, p.exited)
	if err != nil {
		return nil, err
	}
	p.fl = fl
	defer func() {
		p.stopping.Store(true)
		fl.stop()
	}()
	fmt.Fprintf(progress, "%s: status pages %s/ui/ …; %s of traffic at %.0f ext_proc + %.0f REST requests/s\n",
		name, fl.replicas[0].kv.REST, d, cfg.ExtprocRate, cfg.RESTRate)

	trafficEnd := p.drive(ctx, d, faulted)
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	ph := &Phase{Name: name, Duration: d, Faults: p.inj.snapshot()}
	if faulted {
		p.checkAfterFaults(ctx, ph)
	}
	p.mu.Lock()
	ph.Samples = p.samples
	ph.Violations = p.violations
	p.mu.Unlock()
	ph.summarize(p.rec.snapshot(), trafficEnd, cfg)
	if faulted {
		ph.judge(p.rec.snapshot())
	}
	return ph, nil
}

// exited is the cluster's report of a process that exited: a violation
// unless the phase is stopping it.
func (p *phaseRun) exited(proc string, err error) {
	if !p.stopping.Load() {
		p.violate("no unexpected exits", fmt.Sprintf("%s exited on its own: %v", proc, err))
	}
}

// drive runs the traffic, the fault schedule when faulted, and the
// sampling for d (or until ctx ends), then stops the faults (each one is
// undone while the traffic still flows), the traffic, and the sampling
// last. It returns when the traffic ended, since the phase began.
func (p *phaseRun) drive(ctx context.Context, d time.Duration, faulted bool) time.Duration {
	cfg := p.cfg
	p.rec.begin = time.Now()
	tr := &traffic{fl: p.fl, seed: cfg.Seed, nonce: fmt.Sprintf("%s-%d", p.name, time.Now().UnixNano()), rec: p.rec, docs: cfg.Docs}
	p.inj = &injector{fl: p.fl, cfg: cfg, begin: p.rec.begin, busy: map[string]bool{}}
	trafficCtx, stopTraffic := context.WithCancel(ctx)
	faultCtx, stopFaults := context.WithCancel(ctx)
	var bg sync.WaitGroup
	bg.Go(func() { tr.run(trafficCtx, "extproc", cfg.ExtprocRate, tr.extproc) })
	bg.Go(func() { tr.run(trafficCtx, "rest", cfg.RESTRate, tr.rest) })
	bg.Go(func() { tr.slowReader(trafficCtx) })
	faultsDone := make(chan struct{})
	if faulted {
		go func() { p.inj.schedule(faultCtx); close(faultsDone) }()
	} else {
		close(faultsDone)
	}
	sampleCtx, stopSampling := context.WithCancel(context.Background())
	sampled := make(chan struct{})
	go func() { p.sampleLoop(sampleCtx); close(sampled) }()

	p.showProgress(ctx, d)
	stopFaults()
	fmt.Fprintf(p.progress, "%s: undoing the faults still running…\n", p.name)
	<-faultsDone
	stopTraffic()
	bg.Wait()
	tr.wg.Wait()
	trafficEnd := time.Since(p.rec.begin)
	stopSampling()
	<-sampled
	return trafficEnd
}

// showProgress updates the phase's progress bar every second until d has
// passed since the phase began or ctx ends.
func (p *phaseRun) showProgress(ctx context.Context, d time.Duration) {
	bar := report.NewProgress(p.progress, p.name)
	end := p.rec.begin.Add(d)
	for now := time.Now(); now.Before(end) && ctx.Err() == nil; now = time.Now() {
		bar.Update(int(now.Sub(p.rec.begin)/time.Second), int(d/time.Second))
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	bar.Update(int(d/time.Second), int(d/time.Second))
}

// checkAfterFaults checks, once the faults are undone and the traffic
// stopped, the index against every worker's cache, the leaked bookings, the
// logs and that every fault was undone.
func (p *phaseRun) checkAfterFaults(ctx context.Context, ph *Phase) {
	fmt.Fprintf(p.progress, "%s: checking the index against every worker's cache…\n", p.name)
	ph.IndexTruth = p.checkIndexTruth(ctx)
	fmt.Fprintf(p.progress, "%s: waiting out the booking expiry (%s), then reading every replica's loads…\n", p.name, p.cfg.Expiry)
	ph.Leaks = p.checkLeaks(ctx)
	p.checkLogs()
	for _, f := range ph.Faults {
		if f.Err != "" {
			p.violate("faults undone", fmt.Sprintf("%s on %s at %s: %s", f.Kind, f.Target, f.Start.Round(time.Second), f.Err))
		}
	}
}

// judge adds the violations the summarized phase shows: a resource that
// grew beyond its bound, and any 5xx among records.
func (ph *Phase) judge(records []result) {
	for _, rs := range ph.Resources {
		if rs.Judged && !rs.OK {
			ph.Violations = append(ph.Violations, Violation{Invariant: "bounded resources", Detail: rs.String()})
		}
	}
	for _, r := range records {
		if r.Outcome == out5xx {
			ph.Violations = append(ph.Violations, Violation{Invariant: "availability", At: r.At,
				Detail: fmt.Sprintf("%s via %s answered %d: %s", r.Front, r.Replica, r.Status, r.Detail)})
		}
	}
}

// sampleLoop samples every SampleEvery until ctx ends.
func (p *phaseRun) sampleLoop(ctx context.Context) {
	t := time.NewTicker(p.cfg.SampleEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.sample(ctx)
		}
	}
}

// Sample is one moment of the run.
type Sample struct {
	At       time.Duration            `json:"at"`
	Replicas map[string]ReplicaSample `json:"replicas"`
	// Hit rate of the workers' prefix caches since the previous sample
	// (vLLM's prefix_cache_hits / prefix_cache_queries, in tokens).
	Hits    float64 `json:"hits_tokens"`
	Queries float64 `json:"queries_tokens"`
	// PickP99 is the 99th percentile of the picker's decision time as the
	// ext_proc client saw it, over the requests since the previous sample.
	PickP99  time.Duration `json:"pick_p99"`
	Requests int           `json:"requests"`
}

// ReplicaSample is one replica's resources; zero when it was down or paused.
type ReplicaSample struct {
	PID        int     `json:"pid"`
	RSSMiB     float64 `json:"rss_mib"`
	FDs        int     `json:"fds"`
	Goroutines int     `json:"goroutines"`
	Bookings   uint64  `json:"bookings"`
}

func (p *phaseRun) sample(ctx context.Context) {
	s := Sample{At: time.Since(p.rec.begin), Replicas: map[string]ReplicaSample{}}
	for _, r := range p.fl.replicas {
		pid := r.kv.Proc.Pid()
		if pid == 0 || paused(r) {
			continue
		}
		rs := ReplicaSample{PID: pid, RSSMiB: rssMiB(pid), FDs: openFDs(pid)}
		if m, err := promtext.Scrape(ctx, p.fl.hc, r.kv.REST+"/metrics"); err == nil {
			rs.Goroutines = int(m.Sum("go_goroutines"))
		}
		rs.Bookings, _ = r.kv.ActiveRequests(ctx)
		s.Replicas[r.name] = rs
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range p.fl.workers {
		m, err := promtext.Scrape(ctx, p.fl.hc, w.url()+"/metrics")
		if err != nil {
			continue
		}
		q, h := m.Sum("vllm:prefix_cache_queries_total"), m.Sum("vllm:prefix_cache_hits_total")
		prev := p.prevHits[w.id]
		dq, dh := q-prev[0], h-prev[1]
		if dq < 0 || dh < 0 { // the worker restarted: its counters began again
			dq, dh = q, h
		}
		s.Queries += dq
		s.Hits += dh
		p.prevHits[w.id] = [2]float64{q, h}
	}
	var picks []time.Duration
	prevAt := time.Duration(0)
	if n := len(p.samples); n > 0 {
		prevAt = p.samples[n-1].At
	}
	for _, r := range p.rec.snapshot() {
		if r.At >= prevAt && r.At < s.At {
			s.Requests++
			if r.Front == "extproc" && r.Pick > 0 {
				picks = append(picks, r.Pick)
			}
		}
	}
	s.PickP99 = stats.Quantile(picks, 0.99)
	p.samples = append(p.samples, s)
}

var vmRSS = regexp.MustCompile(`(?m)^VmRSS:\s+(\d+) kB`)

func rssMiB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	m := vmRSS.FindSubmatch(b)
	if m == nil {
		return 0
	}
	kb, _ := strconv.ParseFloat(string(m[1]), 64)
	return kb / 1024
}

func openFDs(pid int) int {
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0
	}
	return len(es)
}

// checkLeaks waits out the booking expiry (plus the 5 s maintenance tick)
// and then wants every replica's loads empty.
func (p *phaseRun) checkLeaks(ctx context.Context) map[string]string {
	deadline := time.Now().Add(p.cfg.Expiry + 10*time.Second)
	out := map[string]string{}
	for {
		bad := false
		for _, r := range p.fl.replicas {
			var loads []map[string]any
			if err := fleet.GetJSON(ctx, p.fl.hc, r.kv.REST+"/loads", &loads); err != nil {
				out[r.name], bad = err.Error(), true
				continue
			}
			left := leftover(loads)
			out[r.name] = "empty"
			if left != "" {
				out[r.name], bad = left, true
			}
		}
		if !bad {
			return out
		}
		if time.Now().After(deadline) {
			for name, v := range out {
				if v != "empty" {
					p.violate("no leaked load", fmt.Sprintf("replica %s %s after traffic stopped and the %s expiry passed", name, v, p.cfg.Expiry))
				}
			}
			return out
		}
		time.Sleep(time.Second)
	}
}

// leftover describes every non-zero active_* field of a /loads answer.
func leftover(loads []map[string]any) string {
	var parts []string
	for _, m := range loads {
		ls, _ := m["loads"].([]any)
		for _, l := range ls {
			e, _ := l.(map[string]any)
			for k, v := range e {
				if f, ok := v.(float64); ok && strings.HasPrefix(k, "active_") && f != 0 {
					parts = append(parts, fmt.Sprintf("worker %v rank %v %s=%v", e["worker_id"], e["dp_rank"], k, f))
				}
			}
		}
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// checkLogs looks for panics and fatal errors in every kvselect log.
func (p *phaseRun) checkLogs() {
	for _, r := range p.fl.replicas {
		b, err := os.ReadFile(r.kv.Proc.Log)
		if err != nil {
			continue
		}
		for _, marker := range []string{"panic:", "fatal error:", "DATA RACE"} {
			if i := strings.Index(string(b), marker); i >= 0 {
				p.violate("no panics", fmt.Sprintf("%s log: %.400s", r.kv.Proc.Name, b[i:]))
			}
		}
	}
}

// slope is the least-squares slope of ys over xs.
func slope(xs, ys []float64) float64 {
	n := float64(len(xs))
	if n < 2 {
		return math.NaN()
	}
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
		sxx += xs[i] * xs[i]
		sxy += xs[i] * ys[i]
	}
	den := n*sxx - sx*sx
	if den == 0 {
		return math.NaN()
	}
	return (n*sxy - sx*sy) / den
}
