package selection

import (
	"time"

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
	parts := s.partitions()
	out := make([]PartitionRouting, 0, len(parts))
	for _, p := range parts {
		out = append(out, p.routing.Totals(p.key.Model, p.key.RoutingGroup))
	}
	return out
}

// RecentDecisions returns up to n of the latest decisions (all it keeps when
// n ≤ 0), newest first; nil when the log is off (Config.RecentDecisions < 0).
func (s *Service) RecentDecisions(n int) []DecisionRecord { return s.decisions.Latest(n) }

// noteDecision records a decision a caller received: its partition's
// routing-quality totals and the decision log.
func (s *Service) noteDecision(p *partition, op string, resp *SelectResponse) {
	d := &resp.Decision
	p.routing.Observe(d.ISLTokens, d.CachedTokens)
	if s.decisions == nil {
		return
	}
	r := DecisionRecord{
		Time: s.clock(), Op: op, SelectionID: deref(resp.SelectionID, ""),
		Model: resp.ModelName, RoutingGroup: resp.RoutingGroup,
		WorkerID: resp.WorkerID, DPRank: resp.DPRank, Endpoint: resp.Endpoint,
		ISLTokens: d.ISLTokens, CachedTokens: d.CachedTokens, Candidates: d.Candidates,
		Cost: d.Cost, RunnerUp: d.RunnerUp, QueueWaitMS: float64(d.QueueWait) / float64(time.Millisecond),
	}
	if pf := resp.Prefill.Selection; pf != nil {
		id := pf.WorkerID
		r.PrefillWorkerID = &id
	}
	s.decisions.Add(r)
}
