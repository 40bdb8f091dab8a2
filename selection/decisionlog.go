package selection

import (
	"github.com/kvselect/kvselect/selection/decisionlog"
)

// DefaultRecentDecisions is how many decisions RecentDecisions keeps when
// Config.RecentDecisions is zero.
const DefaultRecentDecisions = decisionlog.DefaultRecent

// MatchedPrefixBuckets are the upper bounds of the matched-prefix fraction
// histogram RoutingStats reports: the share of a prompt's tokens the chosen
// rank had cached, 0 (nothing) to 1 (all).
var MatchedPrefixBuckets = decisionlog.MatchedPrefixBuckets

// DecisionRecord is one selection as the decision log keeps it: what was
// asked, where it went, and what the pick weighed.
type DecisionRecord = decisionlog.Record

// PartitionRouting is one partition's routing-quality totals since start.
type PartitionRouting = decisionlog.Routing

// RankCost is one scored rank.
type RankCost = decisionlog.RankCost

// RoutingStats returns every partition's routing-quality totals.
func (s *Service) RoutingStats() []PartitionRouting {
	parts := s.parts.All()
	out := make([]PartitionRouting, 0, len(parts))
	for _, p := range parts {
		out = append(out, p.Routing().Totals(p.Key().Model, p.Key().RoutingGroup))
	}
	return out
}

// RecentDecisions returns up to n of the latest decisions (all it keeps when
// n ≤ 0), newest first; nil when the log is off (Config.RecentDecisions < 0).
func (s *Service) RecentDecisions(n int) []DecisionRecord { return s.decisions.Latest(n) }
