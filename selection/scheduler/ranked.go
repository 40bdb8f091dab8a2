package scheduler

import (
	"cmp"
	"slices"

	"github.com/kvselect/kvselect/selection/index"
)

// Ranked returns up to n of the rows the last successful Select scored, other
// than the chosen rank, cheapest first (ties in (worker id, dp rank) order):
// the ordered fallbacks a gateway may retry when the chosen rank fails (GIE
// protocol 004's fallback endpoints). The rows obey the same eligibility as
// the pick — allowed workers, taints, busy rejection, policy filters, an
// exclusive affinity target, a pinned rank (which leaves none). The result is
// a fresh slice; the scratch stays the caller's.
func (s *Scratch) Ranked(chosen index.WorkerKey, n int) []Scored {
	if n <= 0 || len(s.scored) <= 1 {
		return nil
	}
	out := make([]Scored, 0, len(s.scored)-1)
	for _, r := range s.scored {
		if r.Worker != chosen {
			out = append(out, r)
		}
	}
	// scored is in (worker, rank) order already; a stable sort by cost keeps
	// that order among equal costs.
	slices.SortStableFunc(out, func(a, b Scored) int { return cmp.Compare(a.Cost, b.Cost) })
	if len(out) > n {
		out = out[:n]
	}
	return out
}

// RunnerUp returns the cheapest row the last successful Select scored other
// than the chosen rank — the alternative the pick beat, which tracing and the
// decision log report beside the chosen cost — and false when the chosen rank
// was the only candidate. It allocates nothing.
func (s *Scratch) RunnerUp(chosen index.WorkerKey) (Scored, bool) {
	var best Scored
	found := false
	for _, r := range s.scored {
		if r.Worker != chosen && (!found || r.Cost < best.Cost) {
			best, found = r, true
		}
	}
	return best, found
}

// MostCached is the most cached tokens of any row the last successful Select
// scored: what a pick by the cache alone would have been credited, against
// which the chosen row's CachedTokens shows the cache the policy gave up for
// load. Select keeps it as it scores the rows: reading it costs nothing on
// a fleet of thousands of ranks.
func (s *Scratch) MostCached() int { return s.mostCached }

// Candidates is how many rows the last successful Select scored.
func (s *Scratch) Candidates() int { return len(s.scored) }
