// Package health is passive health ejection, after the outlier detection of
// Envoy and the circuit breakers of sglang's router: the fronts report each
// served request's outcome (the picker the response status it sees, REST
// callers through POST /workers/{id}/health_report, the active prober its GET
// /health), and a worker with EjectAfter consecutive failures inside Window
// is ejected for Base × 2^(ejections−1), at most Max. Then it is on
// probation: it is a candidate again, but once one selection has chosen it
// (the trial) it is held back until that trial's outcome is reported;
// success restores it (ejections reset), failure ejects it again for twice as
// long. A trial whose outcome never comes is given up after Base, and another
// is let through.
//
// Ejection only removes the worker from the candidates: its catalog record,
// index, listeners and bookings stay. With every worker of a partition
// ejected, selection answers 503 naming the ejections, never routing to
// nothing. The Table is the state; time is the caller's.
package health

import (
	"fmt"
	"sync"
	"time"

	"github.com/kvselect/kvselect/selection/catalog"
)

// Config is the ejection policy.
type Config struct {
	// EjectAfter consecutive failures eject a worker (default 5); 0 disables
	// ejection.
	EjectAfter int
	// Window bounds how far apart the first and the last of those failures
	// may be (default 30 s); a failure after a longer quiet restarts the count.
	Window time.Duration
	// Base is the first ejection's length (default 5 s); each further one
	// doubles, up to Max (default 5 min).
	Base, Max time.Duration
}

// DefaultConfig returns the documented ejection defaults.
func DefaultConfig() Config {
	return Config{EjectAfter: 5, Window: 30 * time.Second, Base: 5 * time.Second, Max: 5 * time.Minute}
}

// Validate refuses a negative EjectAfter and, with ejection on, times that
// are not positive or a maximum below the base.
func (c *Config) Validate() error {
	switch {
	case c.EjectAfter < 0:
		return fmt.Errorf("eject-after must be 0 (off) or positive, not %d", c.EjectAfter)
	case c.EjectAfter > 0 && (c.Base <= 0 || c.Max < c.Base || c.Window <= 0):
		return fmt.Errorf("ejection times must be positive with the maximum at least the base (window %s, base %s, max %s)",
			c.Window, c.Base, c.Max)
	}
	return nil
}

// Outcome is one request's or probe's result on a worker.
type Outcome struct {
	// OK: the worker answered (any status below 500). A failure is a 5xx, a
	// refused or reset connection, or a timeout.
	OK bool
	// Detail describes a failure ("status 503", "connect: refused").
	Detail string
	// Source says who observed it: extproc, report or probe (for metrics).
	Source string
}

// Health states as GET /workers shows them.
const (
	Healthy   = "healthy"
	Ejected   = "ejected"
	Probation = "probation"
)

// Transition is what an outcome did to a worker's state.
type Transition int

// Transitions, for the fronts' metrics.
const (
	Unchanged Transition = iota
	Ejection
	Restoration
)

// Stats are the health checks' totals since the table was made.
type Stats struct {
	// Ejections and Restorations count transitions; Ejected is the workers
	// ejected now.
	Ejections, Restorations uint64
	Ejected                 int
	// Failures and Successes count the outcomes reported.
	Failures, Successes uint64
}

// Table holds the workers' ejection state. The zero value is an empty table,
// safe for concurrent use; its mutex is a leaf.
type Table struct {
	mu                      sync.Mutex
	by                      map[uint64]*worker
	ejections, restorations uint64 // totals, for metrics
	failures, successes     uint64
}

type worker struct {
	failures     int       // consecutive failures
	firstFailure time.Time // of the current run of failures
	ejections    int       // since the last restoration
	ejectedUntil time.Time // zero when not ejected
	trialSince   time.Time // a trial was chosen at; zero when none
	lastFailure  string
}

// Report records an outcome on worker id at now and returns what it changed.
func (t *Table) Report(id uint64, o Outcome, now time.Time, cfg *Config) Transition {
	t.mu.Lock()
	defer t.mu.Unlock()
	if o.OK {
		t.successes++
	} else {
		t.failures++
	}
	if cfg.EjectAfter <= 0 {
		return Unchanged
	}
	h := t.by[id]
	if h == nil {
		if o.OK {
			return Unchanged // nothing to remember about a healthy worker
		}
		if t.by == nil {
			t.by = make(map[uint64]*worker)
		}
		h = &worker{}
		t.by[id] = h
	}
	if o.OK {
		return t.succeeded(id, h, now)
	}
	return t.failed(h, o.Detail, now, cfg)
}

func (t *Table) succeeded(id uint64, h *worker, now time.Time) Transition {
	if h.ejections > 0 && now.Before(h.ejectedUntil) {
		// A request booked before the ejection finished well: it says
		// nothing of the worker now, and does not cut the ejection short.
		return Unchanged
	}
	restored := h.ejections > 0
	delete(t.by, id)
	if restored {
		t.restorations++
		return Restoration
	}
	return Unchanged
}

func (t *Table) failed(h *worker, detail string, now time.Time, cfg *Config) Transition {
	h.lastFailure = detail
	if h.ejections > 0 {
		if now.Before(h.ejectedUntil) {
			return Unchanged // already out
		}
		// The probation's trial (or a request that slipped through) failed.
		h.failures++
		h.eject(now, cfg)
		t.ejections++
		return Ejection
	}
	if h.failures == 0 || now.Sub(h.firstFailure) > cfg.Window {
		h.failures, h.firstFailure = 0, now
	}
	h.failures++
	if h.failures >= cfg.EjectAfter {
		h.eject(now, cfg)
		t.ejections++
		return Ejection
	}
	return Unchanged
}

func (h *worker) eject(now time.Time, cfg *Config) {
	h.ejections++
	d := cfg.Base
	for i := 1; i < h.ejections && d < cfg.Max; i++ {
		d *= 2
	}
	h.ejectedUntil = now.Add(min(d, cfg.Max))
	h.trialSince = time.Time{}
}

// Excluded lists the workers that must not be candidates now: ejected, or on
// probation with their trial in flight (trialTimeout gives up a trial whose
// outcome never came). any is false when no worker is ejected or on
// probation, the usual case.
func (t *Table) Excluded(now time.Time, trialTimeout time.Duration) (out map[uint64]bool, any bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, h := range t.by {
		if h.ejections == 0 {
			continue
		}
		any = true
		if now.Before(h.ejectedUntil) || (!h.trialSince.IsZero() && now.Sub(h.trialSince) < trialTimeout) {
			if out == nil {
				out = make(map[uint64]bool)
			}
			out[id] = true
		}
	}
	return out, any
}

// Chosen marks a probation worker's trial as in flight: a selection chose it
// at now.
func (t *Table) Chosen(id uint64, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if h := t.by[id]; h != nil && h.ejections > 0 && !now.Before(h.ejectedUntil) {
		h.trialSince = now
	}
}

// Forget drops a worker's state (it left the catalog).
func (t *Table) Forget(id uint64) {
	t.mu.Lock()
	delete(t.by, id)
	t.mu.Unlock()
}

// View is GET /workers' health of one worker, nil while nothing was reported
// against it; reason is its not-schedulable reason while ejected.
func (t *Table) View(id uint64, now time.Time) (v *catalog.HealthView, reason string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.by[id]
	if h == nil {
		return nil, ""
	}
	v = &catalog.HealthView{State: Healthy, ConsecutiveFailures: h.failures, Ejections: h.ejections, LastFailure: h.lastFailure}
	switch {
	case h.ejections > 0 && now.Before(h.ejectedUntil):
		v.State = Ejected
		until := h.ejectedUntil
		v.EjectedUntil = &until
		reason = fmt.Sprintf("ejected: %d consecutive failures", h.failures)
	case h.ejections > 0:
		v.State = Probation
	}
	return v, reason
}

// Stats reports the totals, and the workers ejected at now.
func (t *Table) Stats(now time.Time) Stats {
	n := t.ejectedCount(now)
	t.mu.Lock()
	defer t.mu.Unlock()
	return Stats{Ejections: t.ejections, Restorations: t.restorations, Ejected: n, Failures: t.failures, Successes: t.successes}
}

func (t *Table) ejectedCount(now time.Time) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, h := range t.by {
		if h.ejections > 0 && now.Before(h.ejectedUntil) {
			n++
		}
	}
	return n
}
