package selection

import "github.com/kvselect/kvselect/selection/readiness"

// Condition is a readiness input from outside the catalog: a discovery source
// reports whether the catalog it feeds is trustworthy. GET /ready lists every
// condition and stays false while any is not Ready.
type Condition = readiness.Condition

// IndexRecovery is the state of startup index recovery from peers
// (--indexer-peers); GET /ready stays false while it is pending.
type IndexRecovery = readiness.IndexRecovery

// Recovery states.
const (
	RecoveryNone      = readiness.RecoveryNone      // not configured
	RecoveryPending   = readiness.RecoveryPending   // fetching and replaying a peer's /dump
	RecoveryRecovered = readiness.RecoveryRecovered // a peer's dump was replayed
	RecoveryFailed    = readiness.RecoveryFailed    // no peer answered with a usable dump: started empty
)

// Ready reports readiness (GET /ready): not shutting down, at least one
// schedulable worker in any partition, startup index recovery over and every
// external condition ready. It does not certify a complete KV cache view.
func (s *Service) Ready() ReadyStatus {
	ws := s.Workers(nil, nil)
	st := s.gate.Status(ws)
	return ReadyStatus{Ready: st.Ready, SchedulableWorkers: st.Schedulable, Workers: ws,
		IndexRecovery: st.Recovery.String(), Conditions: st.Conditions}
}

// SetCondition adds or replaces the condition named c.Name.
func (s *Service) SetCondition(c Condition) { s.gate.SetCondition(c) }
