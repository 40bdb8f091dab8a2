package server

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvselect/kvselect/engines/metrics"
	"github.com/kvselect/kvselect/selection"
)

// engineFlags are the engine-metrics, saturation and health flags
// (engines/metrics scrapes and probes; selection/engine and selection/health
// decide what the figures mean).
type engineFlags struct {
	interval, timeout, staleAfter time.Duration
	concurrency                   int
	maxBody                       int

	queueDepth    int
	kvUtil        float64
	whenSaturated string
	requestW      float64
	kvUsageW      float64
	loraMissW     float64
	ejectAfter    int
	ejectWindow   time.Duration
	ejectBase     time.Duration
	ejectMax      time.Duration
	probeEvery    time.Duration
	probeTimeout  time.Duration
}

// The --when-saturated values.
const (
	whenSaturatedRoute  = "route"
	whenSaturatedReject = "reject"
)

func (e *engineFlags) register(fs *flag.FlagSet) {
	d := selection.DefaultEngineConfig()
	fs.DurationVar(&e.interval, "engine-metrics-interval", metrics.DefaultInterval, "how often each schedulable worker's engine metrics endpoint (metrics_endpoint, else <endpoint>/metrics) is scraped (`duration`; 0 disables scraping). The figures enter selection: unbooked requests and KV usage as costs, saturation as busy")
	fs.DurationVar(&e.timeout, "engine-metrics-timeout", metrics.DefaultTimeout, "budget of one engine metrics scrape, connection and body included (`duration`, > 0)")
	fs.IntVar(&e.concurrency, "engine-metrics-concurrency", metrics.DefaultConcurrency, "engine metrics scrapes and health probes in flight at once (`n`, >= 1)")
	fs.IntVar(&e.maxBody, "engine-metrics-max-bytes", metrics.DefaultMaxBodyBytes, "largest engine metrics payload read, in `bytes` (>= 1024); larger ones are refused and counted")
	fs.DurationVar(&e.staleAfter, "engine-metrics-stale-after", d.StaleAfter, "figures older than this (`duration`, > 0) are not used: the worker is judged on kvselect's bookings alone, and GET /workers says engine_metrics.stale")
	fs.IntVar(&e.queueDepth, "queue-depth-threshold", d.QueueDepthThreshold, "a rank whose engine has at least this many waiting `requests` is saturated: skipped while another rank is not, see --when-saturated (GIE's default; -1 disables)")
	fs.StringVar(&e.whenSaturated, "when-saturated", whenSaturatedRoute, "what a request gets when every eligible rank is saturated and the scheduler queue is off (with the queue on it waits for room): "+whenSaturatedRoute+" (the cheapest saturated rank, whose engine queues it: GIE's behaviour for non-sheddable requests) or "+whenSaturatedReject+" (429, like the busy thresholds)")
	fs.Float64Var(&e.kvUtil, "kv-cache-util-threshold", d.KVCacheUtilThreshold, "a rank whose engine reports at least this KV-cache usage `fraction` is saturated; unlike a full queue it stays a candidate until every rank is saturated, then --when-saturated applies (GIE's default; -1 disables)")
	fs.Float64Var(&e.requestW, "engine-request-weight", d.RequestWeight, "cost in `blocks` of each request an engine holds that no booking accounts for: max(0, waiting + running - booked) (>= 0; 0 ignores them)")
	fs.Float64Var(&e.kvUsageW, "engine-kv-usage-weight", d.KVUsageWeight, "cost in `blocks` per unit of an engine's KV-cache usage (>= 0)")
	fs.Float64Var(&e.loraMissW, "engine-lora-miss-weight", d.LoRAMissWeight, "cost in `blocks` of a rank that has not loaded the request's LoRA adapter but has a free slot (twice that with no free slot) (>= 0)")
	fs.IntVar(&e.ejectAfter, "eject-after", d.Health.EjectAfter, "consecutive failures (5xx seen by the picker, health reports, failed probes) that eject a worker from selection (`n`; 0 disables ejection)")
	fs.DurationVar(&e.ejectWindow, "eject-window", d.Health.Window, "the --eject-after failures must fall within this `duration`")
	fs.DurationVar(&e.ejectBase, "eject-base", d.Health.Base, "first ejection's length (`duration`); each further one doubles, up to --eject-max; then one trial request decides")
	fs.DurationVar(&e.ejectMax, "eject-max", d.Health.Max, "longest ejection (`duration`, >= --eject-base)")
	fs.DurationVar(&e.probeEvery, "health-probe-interval", 0, "actively GET each schedulable worker's <endpoint>/health this often (`duration`; 0 disables): failures count towards --eject-after, a success after an ejection restores")
	fs.DurationVar(&e.probeTimeout, "health-probe-timeout", time.Second, "budget of one health probe (`duration`, > 0)")
}

func (e *engineFlags) validate(set map[string]bool) []error {
	var errs []error
	errs = append(errs, inertFlags(set, e.interval == 0, "--engine-metrics-interval 0 (scraping off)",
		"engine-metrics-timeout", "engine-metrics-max-bytes", "engine-metrics-stale-after")...)
	// Concurrency bounds scrapes and health probes alike.
	errs = append(errs, inertFlags(set, e.interval == 0 && e.probeEvery == 0, "--engine-metrics-interval 0 and --health-probe-interval 0 (nothing scraped or probed)",
		"engine-metrics-concurrency")...)
	errs = append(errs, inertFlags(set, e.probeEvery == 0, "--health-probe-interval 0 (probes off)", "health-probe-timeout")...)
	errs = append(errs, inertFlags(set, e.ejectAfter == 0, "--eject-after 0 (ejection off)", "eject-window", "eject-base", "eject-max")...)
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	switch {
	case e.interval < 0:
		add("--engine-metrics-interval %s: must be 0 (off) or positive", e.interval)
	case e.timeout <= 0:
		add("--engine-metrics-timeout %s: must be positive", e.timeout)
	case e.staleAfter <= 0:
		add("--engine-metrics-stale-after %s: must be positive", e.staleAfter)
	}
	if e.concurrency < 1 {
		add("--engine-metrics-concurrency %d: must be at least 1", e.concurrency)
	}
	if e.maxBody < 1024 {
		add("--engine-metrics-max-bytes %d: must be at least 1024", e.maxBody)
	}
	if e.queueDepth < -1 {
		add("--queue-depth-threshold %d: must be -1 (off) or >= 0", e.queueDepth)
	}
	if e.whenSaturated != whenSaturatedRoute && e.whenSaturated != whenSaturatedReject {
		add("--when-saturated %q: must be %s or %s", e.whenSaturated, whenSaturatedRoute, whenSaturatedReject)
	}
	if e.kvUtil != -1 && (math.IsNaN(e.kvUtil) || e.kvUtil < 0 || e.kvUtil > 1) {
		add("--kv-cache-util-threshold %g: must be a fraction in [0, 1], or -1 (off)", e.kvUtil)
	}
	for _, w := range []struct {
		name string
		v    float64
	}{{"engine-request-weight", e.requestW}, {"engine-kv-usage-weight", e.kvUsageW}, {"engine-lora-miss-weight", e.loraMissW}} {
		if math.IsNaN(w.v) || math.IsInf(w.v, 0) || w.v < 0 {
			add("--%s %g: must be finite and >= 0", w.name, w.v)
		}
	}
	if e.ejectAfter < 0 {
		add("--eject-after %d: must be 0 (off) or positive", e.ejectAfter)
	}
	if e.ejectAfter > 0 {
		if e.ejectWindow <= 0 || e.ejectBase <= 0 {
			add("--eject-window and --eject-base must be positive")
		}
		if e.ejectMax < e.ejectBase {
			add("--eject-max %s: must be at least --eject-base %s", e.ejectMax, e.ejectBase)
		}
	}
	if e.probeEvery < 0 {
		add("--health-probe-interval %s: must be 0 (off) or positive", e.probeEvery)
	}
	if e.probeTimeout <= 0 {
		add("--health-probe-timeout %s: must be positive", e.probeTimeout)
	}
	return errs
}

// config is the selection core's engine configuration.
func (e *engineFlags) config() *selection.EngineConfig {
	return &selection.EngineConfig{
		StaleAfter: e.staleAfter, QueueDepthThreshold: e.queueDepth, KVCacheUtilThreshold: e.kvUtil,
		RejectSaturated: e.whenSaturated == whenSaturatedReject,
		RequestWeight:   e.requestW, KVUsageWeight: e.kvUsageW, LoRAMissWeight: e.loraMissW,
		Health: selection.HealthConfig{EjectAfter: e.ejectAfter, Window: e.ejectWindow, Base: e.ejectBase, Max: e.ejectMax},
	}
}

// startEngines runs the scraper and the prober (each when enabled) until ctx
// ends; the returned wait blocks until both have stopped.
func (e *engineFlags) startEngines(ctx context.Context, svc *selection.Service, reg prometheus.Registerer, log *slog.Logger) (wait func()) {
	m := metrics.NewMetrics()
	reg.MustRegister(m, healthMetrics{svc: svc})
	var wg sync.WaitGroup
	if e.interval > 0 {
		s := metrics.NewScraper(svc, m, metrics.Options{Interval: e.interval, Timeout: e.timeout, Concurrency: e.concurrency, MaxBodyBytes: e.maxBody, Logger: log})
		wg.Go(func() { s.Run(ctx) })
		log.Info("engine metrics: scraping schedulable workers", "interval", e.interval, "stale_after", e.staleAfter)
	}
	if e.probeEvery > 0 {
		p := metrics.NewProber(svc, m, metrics.Options{Interval: e.probeEvery, Timeout: e.probeTimeout, Concurrency: e.concurrency, Logger: log})
		wg.Go(func() { p.Run(ctx) })
		log.Info("health probes: GET /health of schedulable workers", "interval", e.probeEvery)
	}
	return wg.Wait
}
