// Package loads is the active-load accounting of one selection partition:
// Dynamo's ActiveSequences / slot tracker, which backs the booking lifecycle
// (reservations, prefill_complete, output_block, free), GET /loads and
// POST /potential_loads. For every schedulable (worker, dp_rank) it tracks
//
//   - active prefill tokens: the remaining effective prefill of bookings whose
//     prefill has not completed;
//   - active decode blocks: the KV blocks held by live bookings, prompt blocks
//     de-duplicated by tracking-hash path, plus output blocks, with the decay
//     weighting of exclusive blocks;
//   - active requests.
//
// It also projects a prompt onto every rank in one consistent snapshot, which is
// what the scheduler's cost formula consumes (active prefill tokens, active
// decode blocks plus the prompt's additional blocks, active requests;
// scheduling/selector/default.rs).
//
// The package does no I/O: the caller passes the clock in (Add, Expire) and
// owns the periodic expiry sweep and any replica publishing. Expiry never
// publishes anything: as in Dynamo, only an explicit free sends Free to
// replicas; the caller gets the reclaimed ids so it can drop its own index rows.
//
// Dynamo sources read for this package (repo ai-dynamo/dynamo):
// lib/kv-router/src/sequences/{README.md, single.rs, block_tracker.rs,
// prompt_registry.rs, multi_worker.rs, mod.rs},
// lib/kv-router/src/scheduling/{types.rs, selector/mod.rs},
// lib/kv-router/src/services/selection/core/{mod.rs, run.rs},
// lib/llm/src/kv_router/push_router.rs (output-block emission).
package loads

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/kvselect/kvselect/selection/index"
)

// DefaultExpiry is DYN_ROUTER_ACTIVE_REQUEST_EXPIRY_SECS's default: the absolute
// age since admission after which a booking whose free never arrived is
// reclaimed (DEFAULT_ACTIVE_REQUEST_EXPIRY_DURATION in sequences/single.rs; the
// selection service measures absolute age, the embedded router does not).
const DefaultExpiry = 300 * time.Second

// Errors. ErrDecayFraction is returned bare because the REST front sends
// err.Error() as the 400 body and that text is Dynamo's; the others are
// wrapped with the request or worker they concern.
var (
	ErrInvalidConfig    = errors.New("invalid loads config")
	ErrInvalidBooking   = errors.New("invalid booking")
	ErrWorkerNotFound   = errors.New("worker not found")
	ErrDuplicateRequest = errors.New("request already exists")
	ErrRequestNotFound  = errors.New("request not found")
	ErrDecayFraction    = errors.New("decay_fraction must be between 0.0 and 1.0")
)

// Config is the partition's accounting configuration. The zero value is not
// Dynamo's default (router_track_active_blocks defaults to true): start from
// DefaultConfig.
type Config struct {
	BlockSize uint32
	// TrackActiveBlocks is router_track_active_blocks. When false, bookings
	// carry no prompt blocks and projections add none, as Dynamo's
	// compute_seq_hashes_for_tracking returns None (scheduling/config.rs).
	TrackActiveBlocks bool
	// TrackOutputBlocks is router_track_output_blocks; it requires
	// TrackActiveBlocks (Dynamo's config validation). It gates only
	// RecordOutputTokens, the automatic per-block emission the embedded router
	// does while streaming. AddOutputBlock always adds a block: the selection
	// service's /output_block calls add_output_block without consulting this
	// flag (services/selection/core/mod.rs), which is why Dynamo's HTTP test
	// output_block_endpoint_updates_reserved_load sees +1 with the standalone
	// defaults.
	TrackOutputBlocks bool
	// Expiry is DYN_ROUTER_ACTIVE_REQUEST_EXPIRY_SECS; 0 means DefaultExpiry.
	Expiry time.Duration
}

// DefaultConfig returns Dynamo's defaults for a partition of the given block
// size: active blocks tracked, output blocks not, 300 s expiry.
func DefaultConfig(blockSize uint32) Config {
	return Config{BlockSize: blockSize, TrackActiveBlocks: true, Expiry: DefaultExpiry}
}

// Booking is one admission (select_and_reserve, a reservation, or a replica's
// AddRequest).
type Booking struct {
	RequestID string
	Worker    index.WorkerKey
	// TrackingHashes has one tracking hash per complete prompt block, in order.
	TrackingHashes []uint64
	// ISL is the prompt length in tokens. Only RecordOutputTokens uses it, to
	// find output-block boundaries as Dynamo's push router does.
	ISL int
	// PrefillTokens is the initial effective prefill; it is counted only when
	// TrackPrefill is set and it is positive (single.rs drops a zero hint).
	PrefillTokens int
	TrackPrefill  bool
	// ExpectedOutputTokens, when set, makes RecordOutputTokens attach the decay
	// fraction 1 − generated/expected to each output block. Dynamo's tracker
	// stores it but never reads it: the decay fraction is computed by whoever
	// emits the output block (push_router.rs) or sent by the client
	// (/output_block's decay_fraction).
	ExpectedOutputTokens *uint32
}

// WorkerLoad is one rank's current load. ActiveDecodeBlocks is /loads'
// potential_decode_blocks and ActivePrefillTokens its potential_prefill_tokens.
type WorkerLoad struct {
	Worker              index.WorkerKey
	ActivePrefillTokens int
	// ActiveDecodeBlocks is round(Σ block weights), prompt blocks counted once
	// per distinct tracking-hash path, as BlockTracker::active_blocks.
	ActiveDecodeBlocks int
	ActiveRequests     int
	// PrefillingRequests is how many of ActiveRequests have not reported
	// prefill completion (no first token yet), whether or not their prefill
	// tokens are tracked.
	PrefillingRequests int
}

// Projection is a rank's load with one prompt hypothetically admitted
// (Dynamo's WorkerLoadProjection).
type Projection struct {
	WorkerLoad
	// AdditionalBlocks is the number of the prompt's blocks not already active
	// on this rank: the prompt length minus the depth of its prefix walk over
	// the rank's active tracking-hash paths (prompt_registry.rs).
	AdditionalBlocks int
	// TrackedBlocks is how many of the prompt's blocks the projection looked
	// at: len(trackingHashes), or 0 when active blocks are not tracked.
	TrackedBlocks int
}

// PotentialDecodeBlocks is the scheduler's decode_cost_blocks (selector/default.rs)
// and /potential_loads' potential_decode_blocks: active blocks plus the
// prompt's additional blocks.
func (p Projection) PotentialDecodeBlocks() int {
	return p.ActiveDecodeBlocks + p.AdditionalBlocks
}

// decayFraction is the output-block decay weight Dynamo's push router sends
// after generated output tokens of an expected total: 1 − generated/expected,
// floored at 0, expected clamped to at least 1. Nil when nothing is expected.
func decayFraction(generated int, expected *uint32) *float64 {
	if expected == nil {
		return nil
	}
	f := max(0, 1-float64(generated)/float64(max(*expected, 1)))
	return &f
}

// Tracker accounts active load for the schedulable ranks of one partition. It
// is safe for concurrent use.
type Tracker struct {
	mu     sync.Mutex
	cfg    Config
	ranks  map[index.WorkerKey]*rank
	sorted []*rank // by (worker_id, dp_rank)
	reqs   map[string]*request
	// spare holds recycled request records, with their path-key buffers, so
	// steady-state Add does not allocate.
	spare []*request
	keys  []uint64 // Project scratch: the prompt's path keys
}

// request is one live booking.
type request struct {
	id   string
	rank *rank
	// keys are the path keys of the booking's prompt blocks (none when active
	// blocks are not tracked): Free and decay revisit them on the rank without
	// the caller's hashes, which the booking does not retain.
	keys    []uint64
	prefill int // remaining counted prefill tokens
	// prefilled is set by prefill completion: the request no longer counts
	// in its rank's prefilling requests.
	prefilled bool
	admitted  time.Time
	isl       int
	expected  *uint32
	// blocks is ceil((isl + generated)/block_size) at the last output block
	// RecordOutputTokens emitted.
	blocks int
	// streamed counts the output blocks AddStreamedOutput added.
	streamed int
	// Output blocks: outUnit at weight 1, outFrac at weight outFracVal. A decay
	// fraction re-weights every output block of the request at once
	// (set_unique_suffix_fractional), so two groups suffice.
	outUnit, outFrac int
	outFracVal       float64
}

// New returns an empty tracker with no registered ranks.
func New(cfg Config) (*Tracker, error) {
	if cfg.BlockSize == 0 {
		return nil, fmt.Errorf("block_size must be greater than 0: %w", ErrInvalidConfig)
	}
	if cfg.TrackOutputBlocks && !cfg.TrackActiveBlocks {
		return nil, fmt.Errorf("router_track_output_blocks requires router_track_active_blocks=true: %w", ErrInvalidConfig)
	}
	if cfg.Expiry < 0 {
		return nil, fmt.Errorf("expiry %v must not be negative: %w", cfg.Expiry, ErrInvalidConfig)
	}
	if cfg.Expiry == 0 {
		cfg.Expiry = DefaultExpiry
	}
	return &Tracker{
		cfg:   cfg,
		ranks: make(map[index.WorkerKey]*rank),
		reqs:  make(map[string]*request),
	}, nil
}

// Config returns the tracker's configuration, with Expiry resolved.
func (t *Tracker) Config() Config { return t.cfg }

// SetWorkers replaces the set of schedulable ranks. Ranks that stay keep their
// state; new ranks start empty; bookings on ranks that disappear are dropped
// (Dynamo's topology update removes the rank's ActiveSequences whole) and their
// ids returned, sorted, so the caller can drop its reservation rows.
func (t *Tracker) SetWorkers(ws []index.WorkerKey) (dropped []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	keep := make(map[index.WorkerKey]bool, len(ws))
	for _, w := range ws {
		keep[w] = true
	}
	for id, rq := range t.reqs {
		if !keep[rq.rank.key] {
			dropped = append(dropped, id)
		}
	}
	slices.Sort(dropped)
	for _, id := range dropped {
		t.free(t.reqs[id])
	}
	sorted := t.sorted[:0]
	changed := false
	for _, r := range t.sorted {
		if keep[r.key] {
			sorted = append(sorted, r)
		} else {
			delete(t.ranks, r.key)
			changed = true
		}
	}
	for w := range keep {
		if _, ok := t.ranks[w]; !ok {
			r := newRank(w)
			t.ranks[w] = r
			sorted = append(sorted, r)
			changed = true
		}
	}
	slices.SortFunc(sorted, func(a, b *rank) int { return compareKeys(a.key, b.key) })
	t.sorted = sorted
	if changed {
		t.pack()
	}
	return dropped
}

// pack moves every rank into one array in (worker_id, dp_rank) order.
// Project reads every rank on every selection: ranks allocated one by one,
// as workers came, lay scattered over the heap, and on a 16,384-rank fleet
// reading them cost half again as much from one run to the next
// (kvbench scale). Live bookings are pointed at their rank's new place.
func (t *Tracker) pack() {
	slab := make([]rank, len(t.sorted))
	for i, r := range t.sorted {
		slab[i] = *r
		t.sorted[i] = &slab[i]
		t.ranks[r.key] = &slab[i]
	}
	for _, rq := range t.reqs {
		rq.rank = t.ranks[rq.rank.key]
	}
}

// HasWorker reports whether w is a registered rank.
func (t *Tracker) HasWorker(w index.WorkerKey) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.ranks[w]
	return ok
}

// Add books b at now. It fails with ErrWorkerNotFound for an unregistered rank
// (bookings never create ranks: an explicit reservation books strictly, and
// replica events use Dynamo's RequireRegistered policy, so replica traffic
// never creates workers) and ErrDuplicateRequest for a live id.
func (t *Tracker) Add(now time.Time, b Booking) error {
	if b.RequestID == "" || b.ISL < 0 || b.PrefillTokens < 0 {
		return fmt.Errorf("request %q (isl %d, prefill %d): %w", b.RequestID, b.ISL, b.PrefillTokens, ErrInvalidBooking)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.ranks[b.Worker]
	if !ok {
		return fmt.Errorf("book %q on %v: %w", b.RequestID, b.Worker, ErrWorkerNotFound)
	}
	if old, ok := t.reqs[b.RequestID]; ok {
		return fmt.Errorf("book %q (live on %v): %w", b.RequestID, old.rank.key, ErrDuplicateRequest)
	}
	rq := t.newRequest()
	rq.id, rq.rank, rq.admitted, rq.isl = b.RequestID, r, now, b.ISL
	rq.blocks = ceilDiv(b.ISL, int(t.cfg.BlockSize))
	if b.ExpectedOutputTokens != nil {
		e := *b.ExpectedOutputTokens
		rq.expected = &e
	}
	if t.cfg.TrackActiveBlocks {
		if cap(rq.keys) < len(b.TrackingHashes) {
			// Sized once rather than by append's doublings, each a copy:
			// a long prompt has tens of thousands of blocks.
			rq.keys = make([]uint64, 0, len(b.TrackingHashes))
		}
		rq.keys = appendPathKeys(rq.keys[:0], b.TrackingHashes)
		r.acquire(rq.keys)
	}
	if b.TrackPrefill && b.PrefillTokens > 0 {
		rq.prefill = b.PrefillTokens
		r.prefill += b.PrefillTokens
	}
	rq.prefilled = false
	r.prefilling++
	r.requests++
	t.reqs[b.RequestID] = rq
	return nil
}

// PrefillComplete clears the booking's remaining prefill tokens; its blocks
// stay. Repeating it on a live booking is a successful no-op, as Dynamo answers
// a repeated prefill_complete with 200.
func (t *Tracker) PrefillComplete(id string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	rq, ok := t.reqs[id]
	if !ok {
		return fmt.Errorf("prefill complete %q: %w", id, ErrRequestNotFound)
	}
	rq.rank.prefill -= rq.prefill
	rq.prefill = 0
	if !rq.prefilled {
		rq.prefilled = true
		rq.rank.prefilling--
	}
	return nil
}

// AddOutputBlock adds one output block to the booking. With a decay fraction,
// every block only this booking holds (its output blocks and the exclusive
// suffix of its prompt path) is re-weighted to that fraction; shared prompt
// blocks keep their weight (block_tracker.rs set_unique_suffix_fractional). The
// fraction is checked before the lookup, as the service does.
func (t *Tracker) AddOutputBlock(id string, fraction *float64) error {
	if fraction != nil && !(*fraction >= 0 && *fraction <= 1) {
		return ErrDecayFraction
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	rq, ok := t.reqs[id]
	if !ok {
		return fmt.Errorf("output block %q: %w", id, ErrRequestNotFound)
	}
	t.addOutput(rq, fraction)
	return nil
}

// RecordOutputTokens reports that the booking has generated generated output
// tokens in total. When TrackOutputBlocks is set and isl+generated crosses into
// a new block since the last output block, it adds one output block (one per
// call, however many boundaries were crossed) weighted by decayFraction, and
// reports true: the embedded router's rule in push_router.rs.
func (t *Tracker) RecordOutputTokens(id string, generated int) (added bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	rq, ok := t.reqs[id]
	if !ok {
		return false, fmt.Errorf("output tokens %q: %w", id, ErrRequestNotFound)
	}
	if !t.cfg.TrackOutputBlocks || generated < 0 {
		return false, nil
	}
	blocks := ceilDiv(rq.isl+generated, int(t.cfg.BlockSize))
	if blocks <= rq.blocks {
		return false, nil
	}
	rq.blocks = blocks
	t.addOutput(rq, decayFraction(generated, rq.expected))
	return true, nil
}

// MaxStreamedOutputBlocks bounds the output blocks AddStreamedOutput adds to
// one booking: a response that streams without end cannot grow a rank's load
// without bound before the booking expires.
const MaxStreamedOutputBlocks = 1 << 16

// AddStreamedOutput reports that the booking's response has streamed
// generated output tokens in total, as a gateway counts them on the response
// path. It adds one output block for every whole BlockSize tokens not counted
// by an earlier call (at most MaxStreamedOutputBlocks per booking), block n
// weighted by decayFraction(n × BlockSize, expected output tokens), as Dynamo's
// frontend does per generated block; it returns how many it added. Unlike
// RecordOutputTokens it does not depend on TrackOutputBlocks: the gateway asked
// for the blocks, as the REST API's output_block route does.
func (t *Tracker) AddStreamedOutput(id string, generated int) (added int, err error) {
	if generated < 0 {
		return 0, fmt.Errorf("streamed output %q: %d tokens: %w", id, generated, ErrInvalidBooking)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	rq, ok := t.reqs[id]
	if !ok {
		return 0, fmt.Errorf("streamed output %q: %w", id, ErrRequestNotFound)
	}
	bs := int(t.cfg.BlockSize)
	want := min(generated/bs, MaxStreamedOutputBlocks)
	for ; rq.streamed < want; added++ {
		rq.streamed++
		t.addOutput(rq, decayFraction(rq.streamed*bs, rq.expected))
	}
	return added, nil
}

// Free releases the booking. A second free of the same id fails with
// ErrRequestNotFound and changes nothing.
func (t *Tracker) Free(id string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	rq, ok := t.reqs[id]
	if !ok {
		return fmt.Errorf("free %q: %w", id, ErrRequestNotFound)
	}
	t.free(rq)
	return nil
}

// Expire reclaims every booking whose age since admission exceeds the expiry
// (strictly, as single.rs's started_at < now − expiry) and returns their ids,
// sorted. Progress does not refresh the age: the standalone service measures
// absolute age since admission. The caller runs the sweep (Dynamo: every 60 s)
// and must not publish Free for these.
func (t *Tracker) Expire(now time.Time) (reclaimed []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, rq := range t.reqs {
		if now.Sub(rq.admitted) > t.cfg.Expiry {
			reclaimed = append(reclaimed, id)
		}
	}
	slices.Sort(reclaimed)
	for _, id := range reclaimed {
		t.free(t.reqs[id])
	}
	longTables := false
	for _, r := range t.sorted {
		if r.booked {
			r.booked, r.lastBooked = false, now
		} else if r.requests == 0 && cap(r.held) > shrinkSlots && now.Sub(r.lastBooked) >= longTableHold {
			// A drained rank gives a long prompt's table back, so
			// memory returns to what it was before the prompt. Not at
			// the drain itself, nor at the next upkeep: at a low rate
			// every request drains its rank, and the next long prompt
			// would allocate (and fault in) the table again.
			r.held, r.shift = nil, 0
		}
		longTables = longTables || cap(r.held) > shrinkSlots
	}
	if !longTables {
		// A long prompt's path keys (half a megabyte at 1M tokens) go
		// with the last long table: a long booking's rank holds one for
		// as long as the keys are worth keeping.
		for i, rq := range t.spare {
			if cap(rq.keys) > shrinkSlots {
				t.spare[i].keys = nil
			}
		}
	}
	return reclaimed
}

// Has reports whether id is a live booking, and on which rank.
func (t *Tracker) Has(id string) (index.WorkerKey, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	rq, ok := t.reqs[id]
	if !ok {
		return index.WorkerKey{}, false
	}
	return rq.rank.key, true
}

// Loads returns every registered rank's current load, sorted by (worker_id,
// dp_rank), idle ranks included (GET /loads lists every rank, zeros too).
func (t *Tracker) Loads() []WorkerLoad {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]WorkerLoad, len(t.sorted))
	for i, r := range t.sorted {
		out[i] = r.load()
	}
	return out
}

// Project appends to dst[:0] the projection of a prompt with the given
// tracking hashes onto every registered rank, sorted by (worker_id, dp_rank),
// all read under one lock, as Dynamo takes every candidate's load from one
// snapshot.
func (t *Tracker) Project(trackingHashes []uint64, dst []Projection) []Projection {
	t.mu.Lock()
	defer t.mu.Unlock()
	q := t.query(trackingHashes)
	dst = dst[:0]
	for _, r := range t.sorted {
		dst = append(dst, t.project(r, q))
	}
	return dst
}

// Project1 is Project for one rank; ok is false if w is not registered.
func (t *Tracker) Project1(w index.WorkerKey, trackingHashes []uint64) (Projection, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.ranks[w]
	if !ok {
		return Projection{}, false
	}
	return t.project(r, t.query(trackingHashes)), true
}

// query computes the prompt's path keys into t.keys, once for every rank, and
// returns the prompt length that counts.
func (t *Tracker) query(hashes []uint64) int {
	t.keys = t.keys[:0]
	if !t.cfg.TrackActiveBlocks {
		return 0
	}
	t.keys = appendPathKeys(t.keys, hashes)
	return len(hashes)
}

func (t *Tracker) project(r *rank, queryLen int) Projection {
	return Projection{
		WorkerLoad:       r.load(),
		AdditionalBlocks: queryLen - r.depth(t.keys),
		TrackedBlocks:    queryLen,
	}
}

func (t *Tracker) addOutput(rq *request, decay *float64) {
	r := rq.rank
	rq.outUnit++
	r.unit++
	if decay == nil {
		return
	}
	f := *decay
	// Every output block of the request takes the new weight.
	r.fracSum += float64(rq.outFrac)*(f-rq.outFracVal) + float64(rq.outUnit)*f
	r.unit -= rq.outUnit
	r.fracN += rq.outUnit
	rq.outFrac += rq.outUnit
	rq.outUnit = 0
	rq.outFracVal = f
	r.setExclusiveFraction(rq.keys, f)
}

func (t *Tracker) free(rq *request) {
	rq.rank.drop(rq)
	delete(t.reqs, rq.id)
	*rq = request{keys: rq.keys[:0]}
	t.spare = append(t.spare, rq)
}

func (t *Tracker) newRequest() *request {
	if n := len(t.spare); n > 0 {
		rq := t.spare[n-1]
		t.spare = t.spare[:n-1]
		return rq
	}
	return new(request)
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

func compareKeys(a, b index.WorkerKey) int {
	return cmp.Or(cmp.Compare(a.WorkerID, b.WorkerID), cmp.Compare(a.DPRank, b.DPRank))
}

// roundHalfAway matches Rust's f64::round, which BlockTracker::active_blocks
// uses (halves round away from zero; math.Round does the same).
func roundHalfAway(x float64) int { return int(math.Round(x)) }

// drop takes rq's whole contribution off r: its prefill, its blocks and its
// output. Free and Move both go through it.
func (r *rank) drop(rq *request) {
	r.prefill -= rq.prefill
	if r.requests == 1 && cap(r.held) <= 16*len(rq.keys) {
		// The last booking leaves, and its path fills the table enough
		// that a pass over it is cheaper than a probe per block.
		r.releaseAll()
	} else {
		r.release(rq.keys)
	}
	r.unit -= rq.outUnit
	r.fracN -= rq.outFrac
	r.fracSum -= float64(rq.outFrac) * rq.outFracVal
	r.settle()
	if !rq.prefilled {
		r.prefilling--
	}
	r.requests--
}
