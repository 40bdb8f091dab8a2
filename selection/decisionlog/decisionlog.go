// Package decisionlog keeps what selection decided, for the status page and
// the metrics: a bounded ring of the latest decisions, each partition's
// routing-quality totals (how much of the prompts the chosen ranks had
// cached), and the disaggregated prefill decisions by reason. Recording takes
// no lock but the ring's, a leaf.
package decisionlog

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvselect/kvselect/selection/scheduler"
)

// DefaultRecent is how many decisions a Log keeps when asked for zero.
const DefaultRecent = 256

// MatchedPrefixBuckets are the upper bounds of the matched-prefix fraction
// histogram Routing reports: the share of a prompt's tokens the chosen rank
// had cached, 0 (nothing) to 1 (all).
var MatchedPrefixBuckets = [...]float64{0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1}

// RankCost is one scored rank.
type RankCost struct {
	WorkerID uint64  `json:"worker_id"`
	DPRank   uint32  `json:"dp_rank"`
	Cost     float64 `json:"cost"`
}

// Record is one selection as the log keeps it: what was asked, where it
// went, and what the pick weighed.
type Record struct {
	Time time.Time `json:"time"`
	// Op is "select" (POST /select) or "select_and_reserve" (the REST call
	// and every ext_proc pick).
	Op           string `json:"op"`
	SelectionID  string `json:"selection_id,omitempty"`
	Model        string `json:"model"`
	RoutingGroup string `json:"routing_group"`
	WorkerID     uint64 `json:"worker_id"`
	DPRank       uint32 `json:"dp_rank"`
	Endpoint     string `json:"endpoint"`
	ISLTokens    int    `json:"isl_tokens"`
	CachedTokens int    `json:"cached_tokens"`
	// BestCachedTokens is the most any candidate rank had cached: above
	// CachedTokens when the pick gave cache up for load.
	BestCachedTokens int       `json:"best_cached_tokens"`
	Candidates       int       `json:"candidates"`
	Cost             float64   `json:"cost"`
	RunnerUp         *RankCost `json:"runner_up"`
	QueueWaitMS      float64   `json:"queue_wait_ms"`
	// PrefillWorkerID is the remote prefill worker of a disaggregated
	// decision, nil when the decode worker prefills itself.
	PrefillWorkerID *uint64 `json:"prefill_worker_id,omitempty"`
}

// MatchedFraction is the share of the prompt the chosen rank had cached.
func (d Record) MatchedFraction() float64 {
	return matchedFraction(d.CachedTokens, d.ISLTokens)
}

func matchedFraction(cached, isl int) float64 {
	if isl <= 0 {
		return 0
	}
	return float64(min(cached, isl)) / float64(isl)
}

// Log is a bounded ring of the latest decisions. A nil *Log is a log that
// is off: it keeps nothing.
type Log struct {
	mu   sync.Mutex
	ring []Record
	next int  // where the next record goes
	full bool // ring has wrapped
}

// New returns a log of the n latest decisions: DefaultRecent when n is zero,
// nil (off) when negative.
func New(n int) *Log {
	if n == 0 {
		n = DefaultRecent
	}
	if n < 0 {
		return nil
	}
	return &Log{ring: make([]Record, n)}
}

// Add records r, dropping the oldest record when the ring is full.
func (l *Log) Add(r Record) {
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

// Latest copies up to n records (all when n ≤ 0), newest first; nil when the
// log is off.
func (l *Log) Latest(n int) []Record {
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
	out := make([]Record, n)
	for i := range out {
		out[i] = l.ring[(l.next-1-i+len(l.ring))%len(l.ring)]
	}
	return out
}

// Counters are a partition's cumulative routing-quality totals; atomics, so
// that recording a decision takes no lock. The zero value is ready.
type Counters struct {
	decisions, promptTokens, cachedTokens atomic.Uint64
	bestCachedTokens                      atomic.Uint64
	matched                               [len(MatchedPrefixBuckets)]atomic.Uint64 // per bucket, not cumulative
	matchedSumMicros                      atomic.Uint64
}

// Observe counts one decision of a prompt of isl tokens of which the chosen
// rank had cached tokens and the best-cached candidate best (at least
// cached).
func (c *Counters) Observe(isl, cached, best int) {
	c.decisions.Add(1)
	c.promptTokens.Add(uint64(max(isl, 0)))
	c.cachedTokens.Add(uint64(max(min(cached, isl), 0)))
	c.bestCachedTokens.Add(uint64(max(min(max(best, cached), isl), 0)))
	f := matchedFraction(cached, isl)
	c.matchedSumMicros.Add(uint64(f * 1e6))
	for i, ub := range MatchedPrefixBuckets {
		if f <= ub {
			c.matched[i].Add(1)
			return
		}
	}
}

// Routing is one partition's routing-quality totals since start.
type Routing struct {
	Model, RoutingGroup string
	// Decisions counts selections; PromptTokens their prompts' tokens and
	// CachedTokens the part of those the chosen ranks had cached, so
	// CachedTokens/PromptTokens over an interval is the hit rate.
	Decisions, PromptTokens, CachedTokens uint64
	// BestCachedTokens is the part of the prompts the best-cached candidate
	// rank of each selection had cached: BestCachedTokens/PromptTokens is
	// the hit rate a pick by the cache alone would have had on the same
	// index, and the distance to CachedTokens the cache the policy traded
	// for load.
	BestCachedTokens uint64
	// MatchedBuckets[i] counts decisions whose matched fraction is at most
	// MatchedPrefixBuckets[i] (cumulative, as a Prometheus histogram's
	// buckets are); MatchedSum is the sum of the fractions.
	MatchedBuckets [len(MatchedPrefixBuckets)]uint64
	MatchedSum     float64
}

// Totals reads the counters as the partition (model, group)'s Routing.
func (c *Counters) Totals(model, group string) Routing {
	r := Routing{
		Model: model, RoutingGroup: group,
		Decisions: c.decisions.Load(), PromptTokens: c.promptTokens.Load(), CachedTokens: c.cachedTokens.Load(),
		BestCachedTokens: c.bestCachedTokens.Load(),
		MatchedSum:       float64(c.matchedSumMicros.Load()) / 1e6,
	}
	var cum uint64
	for i := range c.matched {
		cum += c.matched[i].Load()
		r.MatchedBuckets[i] = cum
	}
	return r
}

// Disagg counts the disaggregated decisions by reason and remembers, per
// model, whether the prefill pool was usable at the last one. The zero value
// is ready; its mutex is a leaf.
type Disagg struct {
	// OnPool, when set, is told each time a model's prefill pool changes
	// between usable and not (a pool first seen unusable counts as a
	// change), with the reason; called with no lock held.
	OnPool func(model string, usable bool, reason string)

	counts [len(scheduler.DisaggReasons)]atomic.Uint64 // by scheduler.DisaggReasons index

	mu     sync.Mutex
	usable map[string]bool
}

// Record counts one decision of model's for reason and tells OnPool when it
// changed the pool's usability.
func (d *Disagg) Record(model, reason string) {
	if usable, changed := d.count(model, reason); changed && d.OnPool != nil {
		d.OnPool(model, usable, reason)
	}
}

func (d *Disagg) count(model, reason string) (usable, changed bool) {
	for i, r := range scheduler.DisaggReasons {
		if r == reason {
			d.counts[i].Add(1)
		}
	}
	usable = reason != scheduler.ReasonNoPrefillWorkers && reason != scheduler.ReasonPrefillUnavailable
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.usable == nil {
		d.usable = make(map[string]bool)
	}
	prev, seen := d.usable[model]
	d.usable[model] = usable
	return usable, (seen && prev != usable) || (!seen && !usable)
}

// Counts returns the decisions by reason, every scheduler.DisaggReasons entry
// present.
func (d *Disagg) Counts() map[string]uint64 {
	out := make(map[string]uint64, len(scheduler.DisaggReasons))
	for i, r := range scheduler.DisaggReasons {
		out[r] = d.counts[i].Load()
	}
	return out
}
