package selection

import (
	"sync"
	"sync/atomic"
	"time"
)

// DefaultRecentDecisions is how many decisions RecentDecisions keeps when
// Config.RecentDecisions is zero.
const DefaultRecentDecisions = 256

// MatchedPrefixBuckets are the upper bounds of the matched-prefix fraction
// histogram RoutingStats reports: the share of a prompt's tokens the chosen
// rank had cached, 0 (nothing) to 1 (all).
var MatchedPrefixBuckets = [...]float64{0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1}

// DecisionRecord is one selection as the decision log keeps it: what was
// asked, where it went, and what the pick weighed.
type DecisionRecord struct {
	Time time.Time `json:"time"`
	// Op is "select" (POST /select) or "select_and_reserve" (the REST call
	// and every ext_proc pick).
	Op           string    `json:"op"`
	SelectionID  string    `json:"selection_id,omitempty"`
	Model        string    `json:"model"`
	RoutingGroup string    `json:"routing_group"`
	WorkerID     uint64    `json:"worker_id"`
	DPRank       uint32    `json:"dp_rank"`
	Endpoint     string    `json:"endpoint"`
	ISLTokens    int       `json:"isl_tokens"`
	CachedTokens int       `json:"cached_tokens"`
	Candidates   int       `json:"candidates"`
	Cost         float64   `json:"cost"`
	RunnerUp     *RankCost `json:"runner_up"`
	QueueWaitMS  float64   `json:"queue_wait_ms"`
	// PrefillWorkerID is the remote prefill worker of a disaggregated
	// decision, nil when the decode worker prefills itself.
	PrefillWorkerID *uint64 `json:"prefill_worker_id,omitempty"`
}

// MatchedFraction is the share of the prompt the chosen rank had cached.
func (d DecisionRecord) MatchedFraction() float64 {
	return matchedFraction(d.CachedTokens, d.ISLTokens)
}

func matchedFraction(cached, isl int) float64 {
	if isl <= 0 {
		return 0
	}
	return float64(min(cached, isl)) / float64(isl)
}

// decisionLog is a bounded ring of the latest decisions, for the status
// page. Its mutex is a leaf (Service's lock order).
type decisionLog struct {
	mu   sync.Mutex
	ring []DecisionRecord
	next int  // where the next record goes
	full bool // ring has wrapped
}

func newDecisionLog(n int) *decisionLog {
	if n == 0 {
		n = DefaultRecentDecisions
	}
	if n < 0 {
		return nil
	}
	return &decisionLog{ring: make([]DecisionRecord, n)}
}

func (l *decisionLog) add(r DecisionRecord) {
	if l == nil {
		return
	}
	l.mu.Lock()
	l.ring[l.next] = r
	l.next++
	if l.next == len(l.ring) {
		l.next, l.full = 0, true
	}
	l.mu.Unlock()
}

// latest copies up to n records, newest first.
func (l *decisionLog) latest(n int) []DecisionRecord {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	have := l.next
	if l.full {
		have = len(l.ring)
	}
	if n <= 0 || n > have {
		n = have
	}
	out := make([]DecisionRecord, n)
	for i := range out {
		out[i] = l.ring[(l.next-1-i+len(l.ring))%len(l.ring)]
	}
	return out
}

// routingCounters are a partition's cumulative routing-quality totals;
// atomics, so that recording a decision takes no lock.
type routingCounters struct {
	decisions, promptTokens, cachedTokens atomic.Uint64
	matched                               [len(MatchedPrefixBuckets)]atomic.Uint64 // per bucket, not cumulative
	matchedSumMicros                      atomic.Uint64
}

func (c *routingCounters) observe(isl, cached int) {
	c.decisions.Add(1)
	c.promptTokens.Add(uint64(max(isl, 0)))
	c.cachedTokens.Add(uint64(max(min(cached, isl), 0)))
	f := matchedFraction(cached, isl)
	c.matchedSumMicros.Add(uint64(f * 1e6))
	for i, ub := range MatchedPrefixBuckets {
		if f <= ub {
			c.matched[i].Add(1)
			return
		}
	}
}

// PartitionRouting is one partition's routing-quality totals since start.
type PartitionRouting struct {
	Model, RoutingGroup string
	// Decisions counts selections; PromptTokens their prompts' tokens and
	// CachedTokens the part of those the chosen ranks had cached, so
	// CachedTokens/PromptTokens over an interval is the hit rate.
	Decisions, PromptTokens, CachedTokens uint64
	// MatchedBuckets[i] counts decisions whose matched fraction is at most
	// MatchedPrefixBuckets[i] (cumulative, as a Prometheus histogram's
	// buckets are); MatchedSum is the sum of the fractions.
	MatchedBuckets [len(MatchedPrefixBuckets)]uint64
	MatchedSum     float64
}

// RoutingStats returns every partition's routing-quality totals.
func (s *Service) RoutingStats() []PartitionRouting {
	parts := s.partitions()
	out := make([]PartitionRouting, 0, len(parts))
	for _, p := range parts {
		c := &p.routing
		r := PartitionRouting{
			Model: p.key.Model, RoutingGroup: p.key.RoutingGroup,
			Decisions: c.decisions.Load(), PromptTokens: c.promptTokens.Load(), CachedTokens: c.cachedTokens.Load(),
			MatchedSum: float64(c.matchedSumMicros.Load()) / 1e6,
		}
		var cum uint64
		for i := range c.matched {
			cum += c.matched[i].Load()
			r.MatchedBuckets[i] = cum
		}
		out = append(out, r)
	}
	return out
}

// RecentDecisions returns up to n of the latest decisions (all it keeps when
// n ≤ 0), newest first; nil when the log is off (Config.RecentDecisions < 0).
func (s *Service) RecentDecisions(n int) []DecisionRecord { return s.decisions.latest(n) }

// noteDecision records a decision a caller received: its partition's
// routing-quality totals and the decision log.
func (s *Service) noteDecision(p *partition, op string, resp *SelectResponse) {
	d := &resp.Decision
	p.routing.observe(d.ISLTokens, d.CachedTokens)
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
	s.decisions.add(r)
}
