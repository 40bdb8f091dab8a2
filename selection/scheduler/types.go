package scheduler

import (
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/latency"
)

// Weights is the effective router configuration of one request: the partition's
// KvRouterConfig (scheduling/config.rs) with the request's
// router_config_override applied.
type Weights struct {
	CostWeights
	// SharedCacheMultiplier credits cluster-shared-cache hits past the device prefix.
	SharedCacheMultiplier float64
	// TrackPrefillTokens includes prompt-side load in the cost.
	TrackPrefillTokens bool
	// TrackActiveBlocks includes decode blocks in the cost. When Dynamo does not
	// track active blocks it books no tracking hashes, so every rank's decode
	// blocks and this request's additional blocks are zero; the scorer applies
	// that directly.
	TrackActiveBlocks bool
	// EngineWeights price what a rank's engine reports of itself; they apply
	// only to candidates with fresh engine figures (Candidate.EngineFresh)
	// or a LoRA misfit, so Dynamo's cost is unchanged without them.
	EngineWeights
}

// EngineWeights are the cost, in blocks, of what an engine's own metrics
// show beyond this service's bookings (not Dynamo's; kvselect scrapes
// engines as GIE's and llm-d's pickers do).
type EngineWeights struct {
	// UnbookedRequest is charged per request the engine holds that no booking
	// accounts for: max(0, engine waiting + running − ActiveRequests).
	UnbookedRequest float64
	// KVUsage is charged per unit of the engine's KV-cache usage (0..1).
	KVUsage float64
	// LoRAMiss is charged once per step of Candidate.LoRAFit.
	LoRAMiss float64
}

// CostWeights are the weights of the cost terms and the pick's temperature:
// the parameters of the kv-cost policy (Policy.Costs), which a config file
// names as Dynamo's KvRouterConfig does (overlap_score_credit,
// router_temperature, ...).
type CostWeights struct {
	// OverlapScoreCredit is the credit per device-resident prefix block.
	OverlapScoreCredit float64
	// OverlapScoreCreditDecay shrinks the device credit of ranks whose active
	// prefill exceeds the least-loaded eligible rank (0 = off).
	OverlapScoreCreditDecay float64
	// PrefillLoadScale weighs the adjusted prefill blocks against decode blocks.
	PrefillLoadScale float64
	// DecodeActiveRequestWeight is the block-equivalent charged per active request.
	DecodeActiveRequestWeight float64
	// HostCacheHitWeight and DiskCacheHitWeight credit the lower-tier extension
	// blocks (disk also covers external).
	HostCacheHitWeight, DiskCacheHitWeight float64
	// Temperature 0 picks the argmin; > 0 samples a softmax.
	Temperature float64
}

// DefaultWeights returns Dynamo's KvRouterConfig defaults (scheduling/config.rs).
func DefaultWeights() Weights {
	return Weights{
		CostWeights: CostWeights{
			OverlapScoreCredit: 1.0,
			PrefillLoadScale:   1.0,
			HostCacheHitWeight: 0.75,
			DiskCacheHitWeight: 0.25,
		},
		TrackPrefillTokens: true,
		TrackActiveBlocks:  true,
	}
}

// Candidate is one (worker, dp_rank) with its cache overlap and load snapshot,
// all taken at one instant, so the cost compares ranks at the same moment.
type Candidate struct {
	Worker index.WorkerKey
	// Overlap is the rank's cached prefix of this prompt (zero if none).
	Overlap index.Overlap
	// SharedBeyondDevice counts cluster-shared-cache hits past the rank's device
	// prefix (SGLang HiCache; 0 without a shared cache).
	SharedBeyondDevice uint32
	// ActivePrefillTokens, ActiveDecodeBlocks and ActiveRequests are the rank's
	// current load, excluding this request.
	ActivePrefillTokens, ActiveDecodeBlocks, ActiveRequests int
	// AdditionalBlocks counts this prompt's tracking-hash blocks not already
	// active on the rank (additional_active_blocks).
	AdditionalBlocks int
	// NoLoadEntry marks a rank the loads table has never seen. Dynamo then
	// charges raw prefill as isl alone instead of active + max(isl, cached)
	// (selector/mod.rs); the two differ only when cached exceeds isl.
	NoLoadEntry bool
	// Overloaded is busy rejection (DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD and the
	// prefill thresholds): every rank of the worker is over the busy
	// thresholds. Set it on all ranks of such a worker.
	Overloaded bool
	// Taints are the worker's taints, a set (no duplicates).
	Taints []string
	// MaxNumBatchedTokens is the worker's advertised max_num_batched_tokens,
	// nil if unknown; only the queue's busy test (AllBusy) reads it.
	MaxNumBatchedTokens *uint64
	// EngineFresh says the engine's own figures below are known and fresh.
	EngineFresh bool
	// EngineWaiting, EngineRunning and EngineKVUsage are what the rank's
	// engine reports: waiting and running requests, KV-cache usage (0..1).
	EngineWaiting, EngineRunning, EngineKVUsage float64
	// Saturated marks a rank whose engine is saturated: its waiting queue at
	// the threshold, or the whole partition saturated (the caller decides).
	// Select skips it as it skips an overloaded worker while another rank has
	// room: saturated and busy are one concept with two sources.
	Saturated bool
	// LoRAFit is how the rank suits the request's LoRA adapter: 0 loaded
	// there (or unknown, or no adapter), 1 a free adapter slot, 2 none free.
	LoRAFit int
	// PrefillingRequests is how many of ActiveRequests have not produced a
	// first token (queued or prefilling on the engine).
	PrefillingRequests int
	// Latency is the rank's fitted latency model, for the policies that
	// predict latency (Policy.PredictsLatency); nil reads as latency.Prior.
	Latency *latency.Coeffs
	// Concurrency is the requests the rank's engine runs at once, as the
	// latency model estimates it (0: not known yet).
	Concurrency float64
}

// Target is an affinity target: a worker and optionally one of its ranks
// (the request's affinity_target).
type Target struct {
	WorkerID uint64
	DPRank   *uint32 // nil = any rank of the worker
}

// Request is what the scheduler needs to know about one request.
type Request struct {
	ISL       int    // prompt tokens, > 0
	BlockSize uint32 // partition block size, > 0
	Weights   Weights
	// TrackedBlocks is the number of tracking hashes booked for this prompt
	// (len(sequence_hashes)); request blocks beyond it, such as a partial last
	// block, count towards PotentialDecodeBlocks on top of the rank's load.
	TrackedBlocks int
	// Pinned forces this rank (pinned_worker); ranking is skipped.
	Pinned *index.WorkerKey
	// ServeSaturated ranks the saturated candidates when every eligible one
	// is saturated and none is overloaded by the busy thresholds, instead of
	// answering ErrAllOverloaded: the request then queues on the cheapest
	// engine, as GIE's picker schedules non-sheddable requests on a
	// saturated pool. While any candidate has room, saturated ones are
	// skipped either way.
	ServeSaturated bool
	// AffinityTarget steers to this worker (or rank) while it is eligible and
	// not overloaded; the default policy then ranks only its ranks. Otherwise
	// the request is ranked over all eligible candidates (Dynamo's default
	// selector treats an eligible target as exclusive, filter.rs).
	AffinityTarget *Target
	// AllowedWorkers restricts candidates to these worker ids; nil = all, and
	// an empty non-nil list allows none.
	AllowedWorkers []uint64
	// RequiredTaints must all be present on a worker (routing_constraints).
	RequiredTaints []string
	// PreferredTaints multiply a worker's cost by exp(-tanh(Σ weights of its
	// matching taints)).
	PreferredTaints map[string]float64
	// SLOTTFT and SLOTPOT are the request's latency objectives in seconds
	// (0: none): the time to first token and the time per output token. Only
	// the policies that predict latency read them.
	SLOTTFT, SLOTPOT float64
	// PoolRequests is the mean active requests per rank over the
	// request's candidates, the latency model's pool-wide control
	// (PoolRequests of latency.Features); the caller sets it.
	PoolRequests float64
	// Sheddable marks a request that may be refused rather than served late
	// (a negative priority): with objectives no candidate is predicted to
	// meet, the predicted-latency policy refuses it (ErrSLOUnattainable).
	Sheddable bool
}

// Scored is a candidate with its cost and the per-rank values the selection
// response reports.
type Scored struct {
	Candidate
	Cost float64 // lower is better
	// CachedTokens is round(effective overlap blocks × block size), device weight 1.
	CachedTokens int
	// EffectivePrefillTokens is isl − min(CachedTokens, isl), the booked prefill.
	EffectivePrefillTokens int
	// PotentialDecodeBlocks is the rank's projected decode blocks with this
	// request admitted (the response's potential_decode_blocks).
	PotentialDecodeBlocks int

	weight float64 // softmax scratch
}

// Context is what Select knows beyond one candidate. Scorers and pickers read
// it; it lives in the caller's Scratch so passing it costs no allocation.
type Context struct {
	Request *Request
	// RequestBlocks is ceil(ISL / BlockSize).
	RequestBlocks int
	// MinActivePrefillTokens is the least active prefill over the ranked
	// candidates; the credit decay measures backlog above it. Computed only
	// when the decay is on and prefill is tracked, as Dynamo does.
	MinActivePrefillTokens int
	// Pinned is set when the request's pinned rank is being scored: Dynamo
	// scores it without the preferred-taint multiplier.
	Pinned bool
	// Rand is Select's random source, for scorers that draw (the random
	// policy). Drawing from it changes every later choice of a seeded run.
	Rand *rand.Rand
	// Last is the rank the previous ranked pick with the same Scratch chose,
	// nil before the first (pinned requests do not count). A cycling policy
	// (round-robin) continues after it; the caller keeps one Scratch per
	// partition, so each partition cycles on its own and the policy value
	// itself stays stateless.
	Last *index.WorkerKey
}

// Filter keeps (true) or drops a host-eligible candidate. Filters are policy
// filters on top of the host eligibility Select always applies.
type Filter interface {
	Filter(req *Request, c *Candidate) bool
}

// Scorer returns a candidate's cost; lower is better. A non-finite cost makes
// Select fail with ErrNonFiniteCost (HTTP 500, as in Dynamo).
type Scorer interface {
	Score(ctx *Context, c *Candidate) (float64, error)
}

// Picker returns the row of the chosen candidate in scored (never empty).
type Picker interface {
	Pick(rnd *rand.Rand, ctx *Context, scored []Scored) (int, error)
}

// Scratch is reusable working memory for Select. With one Scratch per caller
// (not shared between goroutines) scoring and picking allocate nothing. It
// also remembers the rank the last ranked pick chose (Context.Last), so a
// caller that serves several partitions keeps one Scratch for each.
type Scratch struct {
	rows   []Scored // the row buffer (Rows)
	scored []Scored // the rows the last Select ranked, within rows
	// mostCached is the most CachedTokens of a scored row, kept as the rows
	// are scored so that MostCached needs no pass over a fleet's rows.
	mostCached int
	ctx        Context
	last       index.WorkerKey
	hasLast    bool
}

// Errors of Select. Their texts are Dynamo's KvSchedulerError texts
// (scheduling/types.rs); the HTTP class each maps to is in the comment
// (Dynamo's RouterRejection mapping, services/selection/error.rs).
var (
	// ErrNoEndpoints: no candidate is eligible (allowed, taints, registered
	// rank). Unavailable, 503.
	ErrNoEndpoints = errors.New("no endpoints available to route work")
	// ErrAllOverloaded: every eligible candidate is busy-rejected. Overloaded, 429.
	ErrAllOverloaded = errors.New("all eligible workers are overloaded")
	// ErrAllFiltered: policy filters rejected every eligible candidate. Unavailable, 503.
	ErrAllFiltered = errors.New("all eligible workers were rejected by policy filters")
	// ErrPinnedOverloaded: the pinned worker is busy-rejected. Overloaded, 429.
	// Returned inside a *PinnedError.
	ErrPinnedOverloaded = errors.New("pinned worker is overloaded")
	// ErrPinnedNotAllowed: the pinned worker is outside allowed_worker_ids.
	// Bad request, 400. Returned inside a *PinnedError.
	ErrPinnedNotAllowed = errors.New("pinned worker is not in allowed worker set")
	// ErrNonFiniteCost: the scorer returned NaN or ±Inf. Internal, 500.
	ErrNonFiniteCost = errors.New("non-finite cost")
	// ErrInvalidPickerRow: the picker returned a row outside the table. Internal, 500.
	ErrInvalidPickerRow = errors.New("invalid picker row")
	// ErrInvalidRequest: the request cannot be scheduled as given. Bad request, 400.
	ErrInvalidRequest = errors.New("invalid scheduling request")
	// ErrSLOUnattainable: a sheddable request's objectives are predicted to
	// be missed on every candidate. Overloaded, 429, with Retry-After;
	// returned inside an *SLOError.
	ErrSLOUnattainable = errors.New("no worker is predicted to meet the request's latency objectives")
)

// PinnedError reports a pinned worker that cannot take the request, with
// Dynamo's message ("pinned worker 7 is overloaded").
type PinnedError struct {
	WorkerID uint64
	Err      error // ErrPinnedOverloaded or ErrPinnedNotAllowed
}

func (e *PinnedError) Error() string {
	switch e.Err {
	case ErrPinnedOverloaded:
		return fmt.Sprintf("pinned worker %d is overloaded", e.WorkerID)
	case ErrPinnedNotAllowed:
		return fmt.Sprintf("pinned worker %d is not in allowed worker set", e.WorkerID)
	}
	return fmt.Sprintf("pinned worker %d: %v", e.WorkerID, e.Err)
}

func (e *PinnedError) Unwrap() error { return e.Err }

// CostError reports a non-finite cost with Dynamo's message
// (WorkerSelectionPolicyError::NonFiniteCost; there is one scorer, index 0).
type CostError struct {
	Row  int
	Cost float64
}

func (e *CostError) Error() string {
	return fmt.Sprintf("scorer 0 produced a non-finite cost for candidate row %d", e.Row)
}

func (e *CostError) Unwrap() error { return ErrNonFiniteCost }

// PickerRowError reports an out-of-range picker result with Dynamo's message
// (WorkerSelectionPolicyError::InvalidPickerRow).
type PickerRowError struct {
	Row, Rows int
}

func (e *PickerRowError) Error() string {
	return fmt.Sprintf("picker returned candidate row %d, but the candidate table contains %d rows", e.Row, e.Rows)
}

func (e *PickerRowError) Unwrap() error { return ErrInvalidPickerRow }
