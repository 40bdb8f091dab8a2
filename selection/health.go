package selection

import (
	"fmt"
	"sync"
	"time"

	"github.com/kvselect/kvselect/selection/apierr"
	"github.com/kvselect/kvselect/selection/catalog"
)

// Health ejection, after the outlier detection of Envoy and the circuit
// breakers of sglang's router: the fronts report each served request's
// outcome (the picker the response status it sees, REST callers through
// POST /workers/{id}/health_report, the active prober its GET /health), and
// a worker with EjectAfter consecutive failures inside Window is ejected for
// Base × 2^(ejections−1), at most Max. Then it is on probation: it is a
// candidate again, but once one selection has chosen it (the trial) it is
// held back until that trial's outcome is reported; success restores it
// (ejections reset), failure ejects it again for twice as long. A trial
// whose outcome never comes is given up after Base, and another is let
// through.
//
// Ejection only removes the worker from the candidates: its catalog record,
// index, listeners and bookings stay. With every worker of a partition
// ejected, selection answers 503 naming the ejections, never routing to
// nothing.

// HealthConfig is the ejection policy.
type HealthConfig struct {
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

// DefaultHealthConfig returns the documented ejection defaults.
func DefaultHealthConfig() HealthConfig {
	return HealthConfig{EjectAfter: 5, Window: 30 * time.Second, Base: 5 * time.Second, Max: 5 * time.Minute}
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
	HealthHealthy   = "healthy"
	HealthEjected   = "ejected"
	HealthProbation = "probation"
)

// HealthTransition is what an outcome did to a worker's state.
type HealthTransition int

// Transitions, for the fronts' metrics.
const (
	HealthUnchanged HealthTransition = iota
	HealthEjection
	HealthRestoration
)

// ReportOutcome records an outcome on a worker and returns what it changed.
// A worker the catalog does not hold is a KindNotFound error. Restoring a
// worker wakes its partition's queue.
func (s *Service) ReportOutcome(workerID uint64, o Outcome) (HealthTransition, error) {
	rec, ok := s.record(workerID)
	if !ok {
		return HealthUnchanged, apierr.New(KindNotFound, "worker %d not found", workerID)
	}
	tr := s.health.report(workerID, o, s.clock(), &s.engineCfg.Health)
	if tr == HealthRestoration {
		if p := s.partition(partitionOfRecord(rec)); p != nil {
			p.wake()
		}
	}
	return tr, nil
}

// WorkerHealth is the worker's health as GET /workers shows it; nil when
// nothing was reported against it since its last restoration.
func (s *Service) WorkerHealth(workerID uint64) *catalog.HealthView {
	v, _ := s.health.view(workerID, s.clock())
	return v
}

// healthTable holds the workers' ejection state. A leaf lock.
type healthTable struct {
	mu                      sync.Mutex
	by                      map[uint64]*workerHealth
	ejections, restorations uint64 // totals, for metrics
	failures, successes     uint64
}

// HealthStats are the health checks' totals since the service started.
type HealthStats struct {
	// Ejections and Restorations count transitions; Ejected is the workers
	// ejected now.
	Ejections, Restorations uint64
	Ejected                 int
	// Failures and Successes count the outcomes reported.
	Failures, Successes uint64
}

// HealthStats reports the health checks' totals (for metrics).
func (s *Service) HealthStats() HealthStats {
	now := s.clock()
	t := &s.health
	n := t.ejectedCount(now)
	t.mu.Lock()
	defer t.mu.Unlock()
	return HealthStats{Ejections: t.ejections, Restorations: t.restorations, Ejected: n, Failures: t.failures, Successes: t.successes}
}

type workerHealth struct {
	failures     int       // consecutive failures
	firstFailure time.Time // of the current run of failures
	ejections    int       // since the last restoration
	ejectedUntil time.Time // zero when not ejected
	trialSince   time.Time // a trial was chosen at; zero when none
	lastFailure  string
}

func (t *healthTable) report(id uint64, o Outcome, now time.Time, cfg *HealthConfig) HealthTransition {
	t.mu.Lock()
	defer t.mu.Unlock()
	if o.OK {
		t.successes++
	} else {
		t.failures++
	}
	if cfg.EjectAfter <= 0 {
		return HealthUnchanged
	}
	h := t.by[id]
	if h == nil {
		if o.OK {
			return HealthUnchanged // nothing to remember about a healthy worker
		}
		if t.by == nil {
			t.by = make(map[uint64]*workerHealth)
		}
		h = &workerHealth{}
		t.by[id] = h
	}
	if o.OK {
		if h.ejections > 0 && now.Before(h.ejectedUntil) {
			// A request booked before the ejection finished well: it says
			// nothing of the worker now, and does not cut the ejection short.
			return HealthUnchanged
		}
		restored := h.ejections > 0
		delete(t.by, id)
		if restored {
			t.restorations++
			return HealthRestoration
		}
		return HealthUnchanged
	}
	h.lastFailure = o.Detail
	if h.ejections > 0 {
		if now.Before(h.ejectedUntil) {
			return HealthUnchanged // already out
		}
		// The probation's trial (or a request that slipped through) failed.
		h.failures++
		h.eject(now, cfg)
		t.ejections++
		return HealthEjection
	}
	if h.failures == 0 || now.Sub(h.firstFailure) > cfg.Window {
		h.failures, h.firstFailure = 0, now
	}
	h.failures++
	if h.failures >= cfg.EjectAfter {
		h.eject(now, cfg)
		t.ejections++
		return HealthEjection
	}
	return HealthUnchanged
}

func (h *workerHealth) eject(now time.Time, cfg *HealthConfig) {
	h.ejections++
	d := cfg.Base
	for i := 1; i < h.ejections && d < cfg.Max; i++ {
		d *= 2
	}
	h.ejectedUntil = now.Add(min(d, cfg.Max))
	h.trialSince = time.Time{}
}

// excludedWorkers lists the workers that must not be candidates now:
// ejected, or on probation with their trial in flight (trialTimeout gives up
// a trial whose outcome never came). any is false when no worker is ejected
// or on probation, the usual case.
func (t *healthTable) excludedWorkers(now time.Time, trialTimeout time.Duration) (out map[uint64]bool, any bool) {
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

// chosen marks a probation worker's trial as in flight.
func (t *healthTable) chosen(id uint64, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if h := t.by[id]; h != nil && h.ejections > 0 && !now.Before(h.ejectedUntil) {
		h.trialSince = now
	}
}

func (t *healthTable) forget(id uint64) {
	t.mu.Lock()
	delete(t.by, id)
	t.mu.Unlock()
}

// view is GET /workers' health of one worker, nil while nothing was
// reported against it; reason is its not-schedulable reason while ejected.
func (t *healthTable) view(id uint64, now time.Time) (v *catalog.HealthView, reason string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.by[id]
	if h == nil {
		return nil, ""
	}
	v = &catalog.HealthView{State: HealthHealthy, ConsecutiveFailures: h.failures, Ejections: h.ejections, LastFailure: h.lastFailure}
	switch {
	case h.ejections > 0 && now.Before(h.ejectedUntil):
		v.State = HealthEjected
		until := h.ejectedUntil
		v.EjectedUntil = &until
		reason = fmt.Sprintf("ejected: %d consecutive failures", h.failures)
	case h.ejections > 0:
		v.State = HealthProbation
	}
	return v, reason
}

// ejectedCount counts the workers ejected now.
func (t *healthTable) ejectedCount(now time.Time) int {
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
