package scheduler

import (
	"math"

	"github.com/kvselect/kvselect/selection/index"
)

// RequestBlocks is ceil(isl / blockSize), Dynamo's request_blocks.
func RequestBlocks(isl int, blockSize uint32) int {
	if isl <= 0 || blockSize == 0 {
		return 0
	}
	bs := int(blockSize)
	return (isl + bs - 1) / bs
}

// EffectiveOverlapBlocks is the tier-weighted cached prefix in blocks: device
// blocks count 1, host extension blocks hostW, disk and external extension
// blocks diskW. The terms are added in Dynamo's order
// (scheduling/overlap.rs: device, then each lower tier) so the float result
// matches.
func EffectiveOverlapBlocks(o index.Overlap, hostW, diskW float64) float64 {
	eff := float64(o.Device)
	eff += float64(o.Host) * hostW
	eff += float64(o.Disk) * diskW
	eff += float64(o.External) * diskW
	return eff
}

// CachedTokens is round(effective overlap blocks × block size) with device
// weight 1.0, not overlap_score_credit, as the selection response computes
// it (services/selection/scoring.rs). It is not clamped to
// the prompt; EffectivePrefillTokens clamps.
//
// Worked example (scheduling/overlap.rs test): device 2, host 3, disk 4,
// external 5 with weights 0.5 / 0.25 give 5.75 blocks, 92 tokens at bs 16.
func CachedTokens(o index.Overlap, blockSize uint32, hostW, diskW float64) int {
	if o.Device|o.Host|o.Disk|o.External == 0 {
		// Most ranks of a large fleet hold none of a given prompt: the
		// float arithmetic below cost a fifth of scoring them.
		return 0
	}
	t := math.Round(EffectiveOverlapBlocks(o, hostW, diskW) * float64(blockSize))
	if t <= 0 {
		return 0
	}
	return int(t)
}

// EffectivePrefillTokens is isl − min(cached, isl): the prefill load booked for
// the request and the selection response's effective_prefill_tokens.
func EffectivePrefillTokens(isl, cached int) int {
	if isl <= 0 {
		return 0
	}
	return isl - min(max(cached, 0), isl)
}

// PotentialDecodeBlocks is a rank's projected decode blocks once the request
// is admitted: its active blocks, plus the request's tracked blocks not yet
// active there, plus the request blocks that have no tracking hash (a partial
// last block, or all of them when nothing is tracked). This is the newest
// Dynamo form (types.rs potential_decode_blocks_after_admission), in which
// tracked blocks are not counted twice; older selection services added all
// request blocks on top of the additional ones.
func PotentialDecodeBlocks(activeDecode, additional, isl int, blockSize uint32, tracked int) int {
	untracked := max(RequestBlocks(isl, blockSize)-tracked, 0)
	return activeDecode + additional + untracked
}

// CreditBlocks is the router credit of a rank's cached prefix without the
// decay: credit × device + host weight × host ext + disk weight × (disk ext +
// external ext) + shared multiplier × shared hits past the device prefix. It is
// /overlap_scores' router_credit_blocks.
func (w Weights) CreditBlocks(o index.Overlap, sharedBeyondDevice uint32) float64 {
	return creditBlocks(w.OverlapScoreCredit, w, o, sharedBeyondDevice)
}

func creditBlocks(credit float64, w Weights, o index.Overlap, shared uint32) float64 {
	// Dynamo sums disk and external as integers before weighting
	// (tier_overlap_blocks.disk), then adds left to right.
	lower := float64(uint64(o.Disk) + uint64(o.External))
	return credit*float64(o.Device) +
		w.HostCacheHitWeight*float64(o.Host) +
		w.DiskCacheHitWeight*lower +
		w.SharedCacheMultiplier*float64(shared)
}

// PreferredTaintMultiplier is exp(-tanh(Σ weights of the worker's taints that
// are preferred)), in [e^-1, e]; ok is false when the request prefers no taints
// and the cost is left alone (routing_constraints.preferred_taints, protocols.rs
// RoutingConstraints::preferred_taint_multiplier). Weights pass through
// float32 first because Dynamo's preferred_taints values are f32.
func PreferredTaintMultiplier(preferred map[string]float64, taints []string) (m float64, ok bool) {
	if len(preferred) == 0 {
		return 1, false
	}
	sum := 0.0
	for i, t := range taints {
		w, found := preferred[t]
		if !found || seenBefore(taints, i) {
			continue
		}
		sum += float64(float32(w))
	}
	return math.Exp(-math.Tanh(sum)), true
}

// seenBefore guards a duplicated taint: Dynamo's worker taints are a set.
func seenBefore(taints []string, i int) bool {
	for _, t := range taints[:i] {
		if t == taints[i] {
			return true
		}
	}
	return false
}

// CostScorer is Dynamo's cost (logit) function (selector/default.rs
// worker_logit and worker_cost): prefill_load_scale × the prompt blocks left
// after the cache credit, plus the decode blocks with this request admitted,
// plus decode_active_request_weight per active request, times the preferred
// taint multiplier. The weights come from the request, so one value serves
// every request.
type CostScorer struct {
	// DecodeRole selects Dynamo's decode-worker variant (worker_type
	// "decode"): without prefill tracking and with a positive credit the cost
	// is max(0, decode blocks − credit) + active-request cost. The standalone
	// selection service runs aggregated, so the default policy leaves it off.
	DecodeRole bool
}

// Score implements Scorer.
func (s CostScorer) Score(ctx *Context, c *Candidate) (float64, error) {
	w := &ctx.Request.Weights
	return s.cost(ctx, c, CachedTokens(c.Overlap, ctx.Request.BlockSize, w.HostCacheHitWeight, w.DiskCacheHitWeight)), nil
}

// cost is Score with the rank's cached tokens (CachedTokens) given: Select
// computes them once per row for the response as well.
func (s CostScorer) cost(ctx *Context, c *Candidate, cached int) float64 {
	req := ctx.Request
	w := &req.Weights
	bs := float64(req.BlockSize)

	rawPrefillTokens := 0
	if w.TrackPrefillTokens {
		if c.NoLoadEntry {
			rawPrefillTokens = req.ISL
		} else {
			// Dynamo's operation order: active + uncached + cached, which is
			// active + max(isl, cached).
			rawPrefillTokens = c.ActivePrefillTokens + EffectivePrefillTokens(req.ISL, cached) + cached
		}
	}
	rawPrefillBlocks := float64(rawPrefillTokens) / bs

	// The rational decay trades cache locality for prefill balance: a rank at
	// the eligible load floor keeps its full device credit.
	decay := 1.0
	if w.TrackPrefillTokens && w.OverlapScoreCreditDecay > 0 && ctx.RequestBlocks > 0 {
		excess := float64(max(c.ActivePrefillTokens-ctx.MinActivePrefillTokens, 0)) / bs
		decay = 1 / (1 + w.OverlapScoreCreditDecay*(excess/float64(ctx.RequestBlocks)))
	}
	credit := creditBlocks(w.OverlapScoreCredit*decay, *w, c.Overlap, c.SharedBeyondDevice)

	decode := 0.0
	if w.TrackActiveBlocks {
		decode = float64(c.ActiveDecodeBlocks + c.AdditionalBlocks)
	}
	requestCost := w.DecodeActiveRequestWeight * float64(c.ActiveRequests)

	var logit float64
	if s.DecodeRole && !w.TrackPrefillTokens && w.OverlapScoreCredit > 0 {
		// Clamped at zero because the taint multiplier assumes a non-negative score.
		logit = max(decode-credit, 0) + requestCost
	} else {
		logit = w.PrefillLoadScale*max(rawPrefillBlocks-credit, 0) + decode + requestCost
	}
	logit += EngineCost(&w.EngineWeights, c)
	if !ctx.Pinned {
		if m, ok := PreferredTaintMultiplier(req.PreferredTaints, c.Taints); ok {
			logit *= m
		}
	}
	return logit
}

// EngineCost is the cost, in blocks, of what the rank's engine reports
// beyond the bookings: its unbooked requests and KV usage (fresh figures
// only) and the request's LoRA misfit. Zero without engine figures.
//
// The unbooked requests are max(0, waiting + running − ActiveRequests): the
// engine counts every request it holds, the booked ones that reached it
// included, so subtracting the bookings counts each request once. A booking
// still on its way to the engine makes the estimate smaller, never larger.
func EngineCost(w *EngineWeights, c *Candidate) float64 {
	cost := w.LoRAMiss * float64(c.LoRAFit)
	if c.EngineFresh {
		unbooked := max(c.EngineWaiting+c.EngineRunning-float64(c.ActiveRequests), 0)
		cost += w.UnbookedRequest*unbooked + w.KVUsage*c.EngineKVUsage
	}
	return cost
}
