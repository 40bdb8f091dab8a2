// Package readiness holds what gates GET /ready and admission besides the
// catalog: the shutdown flag, the state of startup index recovery from peers,
// and the external conditions discovery sources report.
package readiness

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/kvselect/kvselect/selection/apierr"
	"github.com/kvselect/kvselect/selection/catalog"
)

// Condition is a readiness input from outside the catalog: a discovery source
// reports whether the catalog it feeds is trustworthy (an InferencePool that
// does not exist, a workers file never read successfully). GET /ready lists
// every condition and stays false while any is not Ready, so an operator reads
// why from the same body a probe sees.
type Condition struct {
	// Name identifies the condition's owner, e.g. "discovery".
	Name string `json:"name"`
	// Ready is false while the owner holds readiness back.
	Ready bool `json:"ready"`
	// Reason is a CamelCase word for machines ("InferencePoolNotFound").
	Reason string `json:"reason,omitempty"`
	// Message is the sentence for people.
	Message string `json:"message,omitempty"`
}

// IndexRecovery is the state of startup index recovery from peers
// (--indexer-peers: replaying a peer's /dump before serving, as Dynamo's
// lib/kv-router/src/services/indexer/recovery.rs does). GET /ready stays false
// while it is pending.
type IndexRecovery int32

// Recovery states.
const (
	RecoveryNone      IndexRecovery = iota // not configured
	RecoveryPending                        // fetching and replaying a peer's /dump
	RecoveryRecovered                      // a peer's dump was replayed
	RecoveryFailed                         // no peer answered with a usable dump: started empty
)

var recoveryNames = [...]string{RecoveryNone: "", RecoveryPending: "pending", RecoveryRecovered: "recovered", RecoveryFailed: "failed"}

// String is the state as /ready reports it ("" when not configured).
func (r IndexRecovery) String() string {
	if r >= 0 && int(r) < len(recoveryNames) {
		return recoveryNames[r]
	}
	return fmt.Sprintf("recovery(%d)", int32(r))
}

// Gate is the service's readiness state. The zero value is a running service
// with no recovery configured and no conditions. It is safe for concurrent
// use; its mutex guards only the conditions and is a leaf.
type Gate struct {
	shutting atomic.Bool
	recovery atomic.Int32 // IndexRecovery

	mu    sync.Mutex
	conds map[string]Condition
}

// ShutDown makes Admit fail from now on; it cannot be undone.
func (g *Gate) ShutDown() { g.shutting.Store(true) }

// Admit is the check of every mutating and selection call: nil while the
// service runs, the 503 of a service shutting down after ShutDown.
func (g *Gate) Admit() error {
	if g.shutting.Load() {
		return apierr.New(apierr.NotReady, "selection service is shutting down")
	}
	return nil
}

// SetRecovery records the startup recovery state.
func (g *Gate) SetRecovery(state IndexRecovery) { g.recovery.Store(int32(state)) }

// Recovery reports the startup recovery state.
func (g *Gate) Recovery() IndexRecovery { return IndexRecovery(g.recovery.Load()) }

// SetCondition adds or replaces the condition named c.Name.
func (g *Gate) SetCondition(c Condition) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.conds == nil {
		g.conds = make(map[string]Condition)
	}
	g.conds[c.Name] = c
}

// RemoveCondition drops the named condition; an absent name is a no-op.
func (g *Gate) RemoveCondition(name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.conds, name)
}

// Conditions lists the conditions sorted by name.
func (g *Gate) Conditions() []Condition {
	g.mu.Lock()
	out := make([]Condition, 0, len(g.conds))
	for _, c := range g.conds {
		out = append(out, c)
	}
	g.mu.Unlock()
	slices.SortFunc(out, func(a, b Condition) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Status is the readiness verdict and what it was made of.
type Status struct {
	Ready       bool
	Schedulable int // schedulable catalog records
	Recovery    IndexRecovery
	Conditions  []Condition
}

// Status is /ready for the catalog records ws: ready while the service runs,
// some worker is schedulable, startup recovery is not pending (it holds
// readiness until it finished, successfully or not) and every condition is
// ready (a discovery source holds readiness back while its view is unknown or
// broken). It does not certify a complete KV cache view.
func (g *Gate) Status(ws []*catalog.Record) Status {
	n := 0
	for _, w := range ws {
		if w.Lifecycle == catalog.Schedulable {
			n++
		}
	}
	rec := g.Recovery()
	conds := g.Conditions()
	return Status{
		Ready:       !g.shutting.Load() && n > 0 && rec != RecoveryPending && allReady(conds),
		Schedulable: n, Recovery: rec, Conditions: conds,
	}
}

// allReady reports whether every condition in cs is Ready.
func allReady(cs []Condition) bool {
	for _, c := range cs {
		if !c.Ready {
			return false
		}
	}
	return true
}
