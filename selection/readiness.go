package selection

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/kvselect/kvselect/selection/catalog"
)

// readiness holds what gates GET /ready and admission besides the catalog:
// the shutdown flag, the state of startup index recovery from peers, and the
// external conditions discovery sources report. The zero value is a running
// service with no recovery configured and no conditions. It is safe for
// concurrent use; its mutex guards only the conditions and is a leaf (see the
// lock order on Service).
type readiness struct {
	shutting atomic.Bool
	recovery atomic.Int32 // IndexRecovery

	mu    sync.Mutex
	conds map[string]Condition
}

// shutDown makes admit fail from now on; it cannot be undone.
func (r *readiness) shutDown() { r.shutting.Store(true) }

// admit is the check of every mutating and selection call: nil while the
// service runs, the 503 of a service shutting down after shutDown.
func (r *readiness) admit() error {
	if r.shutting.Load() {
		return errShuttingDown()
	}
	return nil
}

func (r *readiness) setRecovery(state IndexRecovery) { r.recovery.Store(int32(state)) }

func (r *readiness) recoveryState() IndexRecovery { return IndexRecovery(r.recovery.Load()) }

func (r *readiness) setCondition(c Condition) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conds == nil {
		r.conds = make(map[string]Condition)
	}
	r.conds[c.Name] = c
}

func (r *readiness) removeCondition(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.conds, name)
}

// conditions lists the conditions sorted by name.
func (r *readiness) conditions() []Condition {
	r.mu.Lock()
	out := make([]Condition, 0, len(r.conds))
	for _, c := range r.conds {
		out = append(out, c)
	}
	r.mu.Unlock()
	slices.SortFunc(out, func(a, b Condition) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// status is /ready for the catalog records ws: ready while the service runs,
// some worker is schedulable, startup recovery is not pending (it holds
// readiness until it finished, successfully or not) and every condition is
// ready (a discovery source holds readiness back while its view is unknown or
// broken). It does not certify a complete KV cache view.
func (r *readiness) status(ws []*catalog.Record) ReadyStatus {
	n := 0
	for _, w := range ws {
		if w.Lifecycle == catalog.Schedulable {
			n++
		}
	}
	rec := r.recoveryState()
	conds := r.conditions()
	return ReadyStatus{
		Ready:              !r.shutting.Load() && n > 0 && rec != RecoveryPending && conditionsReady(conds),
		SchedulableWorkers: n, Workers: ws, IndexRecovery: rec.String(), Conditions: conds,
	}
}

// Ready reports readiness (GET /ready): not shutting down, at least one
// schedulable worker in any partition, startup index recovery over and every
// external condition ready. It does not certify a complete KV cache view.
func (s *Service) Ready() ReadyStatus { return s.gate.status(s.Workers(nil, nil)) }

// SetCondition adds or replaces the condition named c.Name.
func (s *Service) SetCondition(c Condition) { s.gate.setCondition(c) }

// RemoveCondition drops the named condition; an absent name is a no-op.
func (s *Service) RemoveCondition(name string) { s.gate.removeCondition(name) }

// Conditions lists the conditions sorted by name.
func (s *Service) Conditions() []Condition { return s.gate.conditions() }

// SetIndexRecovery records the startup recovery state; readiness waits while it
// is RecoveryPending.
func (s *Service) SetIndexRecovery(r IndexRecovery) { s.gate.setRecovery(r) }

// IndexRecoveryState reports the startup recovery state.
func (s *Service) IndexRecoveryState() IndexRecovery { return s.gate.recoveryState() }
