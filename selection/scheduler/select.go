package scheduler

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/kvselect/kvselect/selection/index"
)

// Policy is a worker-selection policy: policy filters, one scorer and one
// picker. Host eligibility (allowed workers, required taints, busy
// rejection), pinned workers and error classification are not part of it:
// Select applies them for every policy, as Dynamo's host does
// (selector/mod.rs select_worker_with_policy).
//
// One Policy value serves every partition of a service at once, each under
// its own lock, so its filters, scorer and picker must be safe for
// concurrent use; what a policy remembers between picks of one partition
// belongs in that partition's Scratch (Context.Last).
type Policy struct {
	// Filters drop host-eligible candidates; if they drop all, Select fails
	// with ErrAllFiltered.
	Filters []Filter
	Scorer  Scorer
	Picker  Picker
	// ExclusiveAffinity restricts ranking to an eligible affinity target's
	// ranks (Dynamo's default selector). Without it the target is advisory:
	// the picker may read ctx.Request.AffinityTarget.
	ExclusiveAffinity bool
	// PredictsLatency asks the caller to fill Candidate.Latency (the
	// predicted-latency policy); other policies leave it nil.
	PredictsLatency bool
	// Costs, when set, replace the cost weights the caller derives from its
	// router configuration (the kv-cost policy's parameters); a request's own
	// router_config_override still applies on top of them.
	Costs *CostWeights
}

// DefaultPolicy is Dynamo's default policy: no policy filters, CostScorer,
// SoftmaxPicker, exclusive affinity.
func DefaultPolicy() Policy {
	return Policy{Scorer: CostScorer{}, Picker: SoftmaxPicker{}, ExclusiveAffinity: true}
}

// Eligible reports host eligibility of a candidate, overload aside: its
// worker is allowed and carries every required taint (filter.rs
// RoutingEligibility::allows_worker_ignoring_overload).
func Eligible(req *Request, c *Candidate) bool {
	return allowed(req, c.Worker.WorkerID) && hasTaints(c.Taints, req.RequiredTaints)
}

func allowed(req *Request, workerID uint64) bool {
	return req.AllowedWorkers == nil || slices.Contains(req.AllowedWorkers, workerID)
}

func hasTaints(have, required []string) bool {
	for _, t := range required {
		if !slices.Contains(have, t) {
			return false
		}
	}
	return true
}

func matchesTarget(t *Target, c *Candidate) bool {
	return c.Worker.WorkerID == t.WorkerID && (t.DPRank == nil || c.Worker.DPRank == *t.DPRank)
}

// affinityEligible: the target names a candidate rank that is eligible and
// not overloaded (filter.rs affinity_target_is_eligible; overload is per
// worker, so any matching rank answers for the worker).
func affinityEligible(req *Request, cands []Candidate) bool {
	for i := range cands {
		c := &cands[i]
		if matchesTarget(req.AffinityTarget, c) && !c.Overloaded && !c.Saturated && Eligible(req, c) {
			return true
		}
	}
	return false
}

// Select chooses the rank that serves req among cands. Order of cands does
// not matter: ranking runs in (worker id, dp rank) order, so a seeded rnd
// gives the same choice for the same set. s may be nil (then Select
// allocates); reusing one Scratch per caller makes Select allocation-free
// and lets a cycling policy continue where it left off (Context.Last).
//
// Errors: ErrInvalidRequest; *PinnedError (ErrPinnedNotAllowed,
// ErrPinnedOverloaded); ErrNoEndpoints when nothing is eligible (including a
// pinned rank that is not an eligible candidate); ErrAllOverloaded;
// ErrAllFiltered; *CostError (ErrNonFiniteCost); *PickerRowError
// (ErrInvalidPickerRow); and whatever the scorer or picker return.
func (p Policy) Select(rnd *rand.Rand, req *Request, cands []Candidate, s *Scratch) (Scored, error) {
	if err := checkRequest(rnd, req); err != nil {
		return Scored{}, err
	}
	if s == nil {
		s = new(Scratch)
	}
	s.start(rnd, req, len(cands))
	if req.Pinned != nil {
		return p.selectPinned(req, cands, s)
	}
	if err := p.collect(req, cands, s); err != nil {
		return Scored{}, err
	}
	sortByWorker(s.scored)
	return p.rank(rnd, req, s)
}

// checkRequest refuses what Select cannot rank with.
func checkRequest(rnd *rand.Rand, req *Request) error {
	if req.ISL <= 0 {
		// Dynamo asserts isl > 0 here; the HTTP layer rejects it with this text.
		return fmt.Errorf("%w: isl_tokens must be greater than 0", ErrInvalidRequest)
	}
	if req.BlockSize == 0 {
		return fmt.Errorf("%w: block size must be greater than 0", ErrInvalidRequest)
	}
	if rnd == nil {
		return fmt.Errorf("%w: nil random source", ErrInvalidRequest)
	}
	return nil
}

// start readies s for one selection of req among n candidates.
func (s *Scratch) start(rnd *rand.Rand, req *Request, n int) {
	s.ctx = Context{Request: req, RequestBlocks: RequestBlocks(req.ISL, req.BlockSize), Rand: rnd}
	if s.hasLast {
		s.ctx.Last = &s.last
	}
	if cap(s.scored) < n {
		s.scored = make([]Scored, 0, n) // grow once, not by doubling
	}
	s.scored = s.scored[:0]
}

// collect puts the candidates to rank into s.scored: the host-eligible ones
// (only the affinity target's, when it is eligible and affinity is
// exclusive) that are not overloaded and that the policy's filters keep;
// saturated ones only when no rank has room and req serves saturated ranks.
// With none left it says why.
func (p Policy) collect(req *Request, cands []Candidate, s *Scratch) error {
	affinity := p.ExclusiveAffinity && req.AffinityTarget != nil && affinityEligible(req, cands)
	inScope := func(c *Candidate) bool {
		return Eligible(req, c) && (!affinity || matchesTarget(req.AffinityTarget, c))
	}
	eligible, filtered, saturated := false, false, false
	for i := range cands {
		c := &cands[i]
		if !inScope(c) {
			continue
		}
		eligible = true
		if c.Overloaded {
			continue
		}
		if c.Saturated {
			saturated = true
			continue
		}
		if !p.keep(req, c) {
			filtered = true
			continue
		}
		s.scored = append(s.scored, Scored{Candidate: *c})
	}
	if len(s.scored) == 0 && saturated && req.ServeSaturated {
		// No rank has room: rank the saturated ones.
		for i := range cands {
			c := &cands[i]
			if inScope(c) && c.Saturated && !c.Overloaded {
				if !p.keep(req, c) {
					filtered = true
					continue
				}
				s.scored = append(s.scored, Scored{Candidate: *c})
			}
		}
	}
	if len(s.scored) == 0 {
		switch {
		case filtered:
			return ErrAllFiltered
		case eligible:
			return ErrAllOverloaded
		}
		return ErrNoEndpoints
	}
	return nil
}

// rank scores the collected rows and lets the picker choose one.
func (p Policy) rank(rnd *rand.Rand, req *Request, s *Scratch) (Scored, error) {
	if w := &req.Weights; w.TrackPrefillTokens && w.OverlapScoreCreditDecay > 0 {
		floor := math.MaxInt
		for i := range s.scored {
			floor = min(floor, s.scored[i].ActivePrefillTokens)
		}
		s.ctx.MinActivePrefillTokens = floor
	}
	for i := range s.scored {
		if err := p.score(&s.ctx, &s.scored[i], i); err != nil {
			return Scored{}, err
		}
	}
	row, err := p.Picker.Pick(rnd, &s.ctx, s.scored)
	if err != nil {
		return Scored{}, err
	}
	if row < 0 || row >= len(s.scored) {
		return Scored{}, &PickerRowError{Row: row, Rows: len(s.scored)}
	}
	s.last, s.hasLast = s.scored[row].Worker, true
	return s.scored[row], nil
}

// selectPinned short-circuits ranking (filter.rs validate_worker_rank and
// selector/mod.rs): outside the allow list is a bad request, a missing or
// taint-incompatible rank is "no endpoints", a busy one is overloaded.
func (p Policy) selectPinned(req *Request, cands []Candidate, s *Scratch) (Scored, error) {
	pin := *req.Pinned
	if !allowed(req, pin.WorkerID) {
		return Scored{}, &PinnedError{WorkerID: pin.WorkerID, Err: ErrPinnedNotAllowed}
	}
	var c *Candidate
	for i := range cands {
		if cands[i].Worker == pin {
			c = &cands[i]
			break
		}
	}
	if c == nil || !Eligible(req, c) {
		return Scored{}, fmt.Errorf("%w (pinned worker %s is not an eligible candidate)", ErrNoEndpoints, pin)
	}
	if c.Overloaded || (c.Saturated && !req.ServeSaturated) {
		return Scored{}, &PinnedError{WorkerID: pin.WorkerID, Err: ErrPinnedOverloaded}
	}
	if !p.keep(req, c) {
		return Scored{}, ErrAllFiltered
	}
	s.ctx.Pinned = true
	s.ctx.MinActivePrefillTokens = c.ActivePrefillTokens
	s.scored = append(s.scored, Scored{Candidate: *c})
	if err := p.score(&s.ctx, &s.scored[0], 0); err != nil {
		return Scored{}, err
	}
	return s.scored[0], nil
}

func (p Policy) keep(req *Request, c *Candidate) bool {
	for _, f := range p.Filters {
		if !f.Filter(req, c) {
			return false
		}
	}
	return true
}

// score fills one row: its cost and the values the selection response
// reports for the rank.
func (p Policy) score(ctx *Context, sc *Scored, row int) error {
	cost, err := p.Scorer.Score(ctx, &sc.Candidate)
	if err != nil {
		return err
	}
	if math.IsNaN(cost) || math.IsInf(cost, 0) {
		return &CostError{Row: row, Cost: cost}
	}
	req := ctx.Request
	w := &req.Weights
	sc.Cost = cost
	sc.CachedTokens = CachedTokens(sc.Overlap, req.BlockSize, w.HostCacheHitWeight, w.DiskCacheHitWeight)
	sc.EffectivePrefillTokens = EffectivePrefillTokens(req.ISL, sc.CachedTokens)
	if w.TrackActiveBlocks {
		sc.PotentialDecodeBlocks = PotentialDecodeBlocks(sc.ActiveDecodeBlocks, sc.AdditionalBlocks, req.ISL, req.BlockSize, req.TrackedBlocks)
	} else {
		// Nothing is tracked: no active blocks, every request block untracked.
		sc.PotentialDecodeBlocks = PotentialDecodeBlocks(0, 0, req.ISL, req.BlockSize, 0)
	}
	return nil
}

// sortByWorker orders rows by (worker id, dp rank), the order Dynamo's seeded
// selector ranks in, so the random tie-break and the softmax sample do not
// depend on catalog iteration order. Already-sorted input (the usual case)
// costs one pass.
func sortByWorker(rows []Scored) {
	byWorker := func(a, b Scored) int { return index.CompareWorkerKeys(a.Worker, b.Worker) }
	if !slices.IsSortedFunc(rows, byWorker) {
		slices.SortFunc(rows, byWorker)
	}
}
