package scheduler

import "math"

func init() { Register(DefaultPolicyName, newKVCost) }

// costParams are the kv-cost policy's parameters, named as Dynamo's
// KvRouterConfig names the knobs (lib/kv-router/src/scheduling/config.rs in
// ai-dynamo/dynamo), with the ranges the DYN_ROUTER_* variables accept.
var costParams = []struct {
	key    string
	lo, hi float64
	field  func(*CostWeights) *float64
}{
	{"overlap_score_credit", 0, math.MaxFloat64, func(w *CostWeights) *float64 { return &w.OverlapScoreCredit }},
	{"overlap_score_credit_decay", 0, math.MaxFloat64, func(w *CostWeights) *float64 { return &w.OverlapScoreCreditDecay }},
	{"prefill_load_scale", 0, math.MaxFloat64, func(w *CostWeights) *float64 { return &w.PrefillLoadScale }},
	{"decode_active_request_weight", 0, math.MaxFloat64, func(w *CostWeights) *float64 { return &w.DecodeActiveRequestWeight }},
	{"host_cache_hit_weight", 0, 1, func(w *CostWeights) *float64 { return &w.HostCacheHitWeight }},
	{"disk_cache_hit_weight", 0, 1, func(w *CostWeights) *float64 { return &w.DiskCacheHitWeight }},
	{"router_temperature", 0, math.MaxFloat64, func(w *CostWeights) *float64 { return &w.Temperature }},
}

// CostParamNames are the kv-cost policy's parameter names.
func CostParamNames() []string {
	out := make([]string, len(costParams))
	for i, c := range costParams {
		out[i] = c.key
	}
	return out
}

// CostParams writes w as kv-cost parameters.
func CostParams(w CostWeights) Params {
	p := make(Params, len(costParams))
	for _, c := range costParams {
		p[c.key] = *c.field(&w)
	}
	return p
}

// newKVCost is Dynamo's cost policy (DefaultPolicy). Without parameters it
// scores with the cost weights of the caller's router configuration; with
// any, Policy.Costs holds Dynamo's default weights with those replaced.
func newKVCost(p Params) (Policy, error) {
	pol := DefaultPolicy()
	if len(p) == 0 {
		return pol, nil
	}
	w := DefaultWeights().CostWeights
	r := readParams(p)
	for _, c := range costParams {
		if v, ok := r.float(c.key, c.lo, c.hi); ok {
			*c.field(&w) = v
		}
	}
	if err := r.err(); err != nil {
		return Policy{}, err
	}
	pol.Costs = &w
	return pol, nil
}
