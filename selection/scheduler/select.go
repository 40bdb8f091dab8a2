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
func affinityEligible(req *Request, rows []Scored) bool {
	for i := range rows {
		c := &rows[i].Candidate
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
	if s == nil {
		s = new(Scratch)
	}
	rows := s.Rows(len(cands))
	for i := range cands {
		rows = append(rows, Scored{Candidate: cands[i]})
	}
	return p.SelectRows(rnd, req, rows, s)
}

// Rows returns s's row buffer, empty, with room for n rows. A caller that
// builds its candidates there, each a row with only its Candidate set, and
// hands them to SelectRows spares Select's copy of every candidate: on a
// fleet of thousands of ranks that copy, and the memory it streams
// through, cost as much as scoring them.
func (s *Scratch) Rows(n int) []Scored {
	if cap(s.rows) < n {
		s.rows = make([]Scored, 0, n) // grow once, not by doubling
	}
	return s.rows[:0]
}

// SelectRows is Select over candidates built as rows in s.Rows' buffer. It
// filters and scores them in place: afterwards they belong to s, and only
// the rows Select ranked are left, in (worker id, dp rank) order.
func (p Policy) SelectRows(rnd *rand.Rand, req *Request, rows []Scored, s *Scratch) (Scored, error) {
	if err := checkRequest(rnd, req); err != nil {
		return Scored{}, err
	}
	s.start(rnd, req)
	s.rows = rows[:0] // keep the buffer, even if the caller's appends moved it
	if req.Pinned != nil {
		return p.selectPinned(req, rows, s)
	}
	if err := p.collect(req, rows, s); err != nil {
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

// start readies s for one selection of req.
func (s *Scratch) start(rnd *rand.Rand, req *Request) {
	s.ctx = Context{Request: req, RequestBlocks: RequestBlocks(req.ISL, req.BlockSize), Rand: rnd}
	if s.hasLast {
		s.ctx.Last = &s.last
	}
	s.scored, s.mostCached = nil, 0
}

// collect keeps, at the front of rows, the candidates to rank and makes them
// s.scored: the host-eligible ones (only the affinity target's, when it is
// eligible and affinity is exclusive) that are not overloaded and that the
// policy's filters keep; saturated ones only when no rank has room and req
// serves saturated ranks. With none left it says why.
func (p Policy) collect(req *Request, rows []Scored, s *Scratch) error {
	affinity := p.ExclusiveAffinity && req.AffinityTarget != nil && affinityEligible(req, rows)
	inScope := func(c *Candidate) bool {
		return Eligible(req, c) && (!affinity || matchesTarget(req.AffinityTarget, c))
	}
	eligible, filtered, saturated := false, false, false
	kept := 0
	for i := range rows {
		c := &rows[i].Candidate
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
		if kept != i {
			rows[kept] = rows[i]
		}
		kept++
	}
	if kept == 0 && saturated && req.ServeSaturated {
		// No rank has room: rank the saturated ones. Nothing was moved
		// above, so every row is still in place.
		for i := range rows {
			c := &rows[i].Candidate
			if inScope(c) && c.Saturated && !c.Overloaded {
				if !p.keep(req, c) {
					filtered = true
					continue
				}
				if kept != i {
					rows[kept] = rows[i]
				}
				kept++
			}
		}
	}
	s.scored = rows[:kept]
	if kept == 0 {
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
		s.mostCached = max(s.mostCached, s.scored[i].CachedTokens)
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
func (p Policy) selectPinned(req *Request, rows []Scored, s *Scratch) (Scored, error) {
	pin := *req.Pinned
	if !allowed(req, pin.WorkerID) {
		return Scored{}, &PinnedError{WorkerID: pin.WorkerID, Err: ErrPinnedNotAllowed}
	}
	var c *Candidate
	row := 0
	for i := range rows {
		if rows[i].Worker == pin {
			c, row = &rows[i].Candidate, i
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
	s.scored = rows[row : row+1]
	if err := p.score(&s.ctx, &s.scored[0], 0); err != nil {
		return Scored{}, err
	}
	s.mostCached = s.scored[0].CachedTokens
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
	req := ctx.Request
	w := &req.Weights
	cached := CachedTokens(sc.Overlap, req.BlockSize, w.HostCacheHitWeight, w.DiskCacheHitWeight)
	var cost float64
	if cs, ok := p.Scorer.(CostScorer); ok {
		// The default scorer, called directly: on a fleet of thousands of
		// ranks the interface call and a second CachedTokens per row showed
		// in the selection's profile.
		cost = cs.cost(ctx, &sc.Candidate, cached)
	} else {
		var err error
		if cost, err = p.Scorer.Score(ctx, &sc.Candidate); err != nil {
			return err
		}
	}
	if math.IsNaN(cost) || math.IsInf(cost, 0) {
		return &CostError{Row: row, Cost: cost}
	}
	sc.Cost = cost
	sc.CachedTokens = cached
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
