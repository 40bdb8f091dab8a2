package metrics

import (
	"context"
	"fmt"

	"github.com/valyala/fasthttp"

	"github.com/kvselect/kvselect/selection"
)

// Prober is the active health check: it GETs each worker's /health every
// interval and reports the outcome to the core's health checks (2xx is a
// success; another status, a refused connection or a timeout a failure).
type Prober struct {
	opts Options
	core Core
	m    *Metrics
}

// NewProber returns a prober of core's targets.
func NewProber(core Core, m *Metrics, opts Options) *Prober {
	opts.defaults()
	return &Prober{opts: opts, core: core, m: m}
}

// Run probes until ctx ends.
func (p *Prober) Run(ctx context.Context) {
	newRounds(p.core, p.opts, func(ctx context.Context, t selection.EngineTarget) { p.ProbeOnce(ctx, t) },
		func() { p.m.probe("skipped_busy") }).run(ctx)
}

// ProbeOnce probes one target and reports the outcome.
func (p *Prober) ProbeOnce(ctx context.Context, t selection.EngineTarget) selection.Outcome {
	o := selection.Outcome{OK: true, Source: "probe"}
	if t.HealthURL == "" {
		return o
	}
	if err := p.get(ctx, t.HealthURL); err != nil {
		o = selection.Outcome{Detail: err.Error(), Source: "probe"}
		p.m.probe("failure")
	} else {
		p.m.probe("ok")
	}
	if ctx.Err() != nil {
		return o // shutting down: a cancelled probe says nothing of the worker
	}
	if tr, err := p.core.ReportOutcome(t.WorkerID, o); err == nil && tr == selection.HealthEjection {
		p.opts.Logger.Warn("health probe: worker ejected", "worker_id", t.WorkerID, "last", o.Detail)
	}
	return o
}

func (p *Prober) get(ctx context.Context, url string) error {
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	if err := get(ctx, p.opts.Client, url, "", p.opts.Timeout, resp); err != nil {
		return fmt.Errorf("probe %s: %w", url, err)
	}
	if code := resp.StatusCode(); code < 200 || code > 299 {
		return fmt.Errorf("probe %s: status %d", url, code)
	}
	return nil
}
