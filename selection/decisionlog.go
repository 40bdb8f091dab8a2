package selection

import (
	"github.com/kvselect/kvselect/selection/decisionlog"
)

// DefaultRecentDecisions is how many decisions the decision log keeps when
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
