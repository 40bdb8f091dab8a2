package selection

import (
	"slices"
	"strings"
	"sync"
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

// conditions holds the service's external readiness conditions by name; the
// zero value is empty.
type conditions struct {
	mu sync.Mutex
	m  map[string]Condition
}

// SetCondition adds or replaces the condition named c.Name.
func (s *Service) SetCondition(c Condition) {
	s.conds.mu.Lock()
	defer s.conds.mu.Unlock()
	if s.conds.m == nil {
		s.conds.m = make(map[string]Condition)
	}
	s.conds.m[c.Name] = c
}

// RemoveCondition drops the named condition; an absent name is a no-op.
func (s *Service) RemoveCondition(name string) {
	s.conds.mu.Lock()
	defer s.conds.mu.Unlock()
	delete(s.conds.m, name)
}

// Conditions lists the conditions sorted by name.
func (s *Service) Conditions() []Condition {
	s.conds.mu.Lock()
	out := make([]Condition, 0, len(s.conds.m))
	for _, c := range s.conds.m {
		out = append(out, c)
	}
	s.conds.mu.Unlock()
	slices.SortFunc(out, func(a, b Condition) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// conditionsReady reports whether every condition in cs is Ready.
func conditionsReady(cs []Condition) bool {
	for _, c := range cs {
		if !c.Ready {
			return false
		}
	}
	return true
}
