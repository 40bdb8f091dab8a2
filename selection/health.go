package selection

import (
	"github.com/kvselect/kvselect/selection/apierr"
	"github.com/kvselect/kvselect/selection/health"
)

// HealthConfig is the health ejection policy (package health describes it).
type HealthConfig = health.Config

// DefaultHealthConfig returns the documented ejection defaults.
func DefaultHealthConfig() HealthConfig { return health.DefaultConfig() }

// Outcome is one request's or probe's result on a worker.
type Outcome = health.Outcome

// Health states as GET /workers shows them.
const (
	HealthHealthy   = health.Healthy
	HealthEjected   = health.Ejected
	HealthProbation = health.Probation
)

// HealthTransition is what an outcome did to a worker's state.
type HealthTransition = health.Transition

// Transitions, for the fronts' metrics.
const (
	HealthUnchanged   = health.Unchanged
	HealthEjection    = health.Ejection
	HealthRestoration = health.Restoration
)

// HealthStats are the health checks' totals since the service started.
type HealthStats = health.Stats

// ReportOutcome records an outcome on a worker and returns what it changed.
// A worker the catalog does not hold is a KindNotFound error. Restoring a
// worker wakes its partition's queue.
func (s *Service) ReportOutcome(workerID uint64, o Outcome) (HealthTransition, error) {
	rec, ok := s.cat.record(workerID)
	if !ok {
		return HealthUnchanged, apierr.New(KindNotFound, "worker %d not found", workerID)
	}
	tr := s.health.Report(workerID, o, s.clock(), &s.engineCfg.Health)
	if tr == HealthRestoration {
		if p := s.parts.Get(partitionOfRecord(rec)); p != nil {
			p.Wake()
		}
	}
	return tr, nil
}
