package scheduler

import (
	"math"
	"math/rand/v2"
)

// SoftmaxPicker is Dynamo's default picker (selector/default.rs): at
// temperature 0 the minimum cost, ties broken uniformly at random by
// reservoir sampling; above 0 one sample of a softmax over min-max normalised
// costs. It reads the temperature from the request's
// weights.
type SoftmaxPicker struct{}

// Pick implements Picker.
func (SoftmaxPicker) Pick(rnd *rand.Rand, ctx *Context, scored []Scored) (int, error) {
	if t := ctx.Request.Weights.Temperature; t > 0 {
		return softmaxRow(scored, t, rnd.Float64()), nil
	}
	return argminRow(rnd, scored), nil
}

// argminRow is the row of the lowest cost, ties drawn uniformly.
func argminRow(rnd *rand.Rand, scored []Scored) int {
	return argminBy(rnd, scored, func(s *Scored) (float64, bool) { return s.Cost, true })
}

// argminBy is the row with the lowest key among those key admits (-1 when
// it admits none). It keeps the k-th tied minimum with probability 1/k,
// which leaves each of the tied rows chosen with equal probability.
func argminBy(rnd *rand.Rand, scored []Scored, key func(*Scored) (float64, bool)) int {
	best, ties := -1, 0
	bestKey := math.Inf(1)
	for i := range scored {
		k, ok := key(&scored[i])
		switch {
		case !ok:
		case best < 0 || k < bestKey:
			best, bestKey, ties = i, k, 1
		case k == bestKey:
			ties++
			if rnd.IntN(ties) == 0 {
				best = i
			}
		}
	}
	return best
}

// softmaxRow returns the row the sample in [0, 1) falls on under
// p_i ∝ exp(−((c_i − c_min)/(c_max − c_min)) / t). Equal costs give a uniform
// choice. When c_max − c_min overflows, costs are first divided by the larger
// magnitude so extreme but finite costs still order correctly (Dynamo's
// softmax_sample_index). The unnormalised weights are kept in the scratch
// rows, so the pick allocates nothing.
func softmaxRow(scored []Scored, t, sample float64) int {
	n := len(scored)
	lo, hi := math.Inf(1), math.Inf(-1)
	for i := range scored {
		lo = min(lo, scored[i].Cost)
		hi = max(hi, scored[i].Cost)
	}
	sum := 0.0
	if lo == hi {
		for i := range scored {
			scored[i].weight = 1 / float64(n)
			sum += scored[i].weight
		}
	} else {
		magnitude := 1.0
		if math.IsInf(hi-lo, 0) {
			magnitude = max(math.Abs(lo), math.Abs(hi))
		}
		loN := lo / magnitude
		scale := -1 / ((hi/magnitude - loN) * t)
		shift := loN * scale
		for i := range scored {
			scored[i].weight = math.Exp(scored[i].Cost/magnitude*scale - shift)
			sum += scored[i].weight
		}
	}
	cumulative := 0.0
	for i := range scored {
		cumulative += scored[i].weight / sum
		if sample <= cumulative {
			return i
		}
	}
	return n - 1
}

// ArgminPicker picks the lowest cost, ties broken uniformly at random,
// whatever the request's router_temperature: the picker of the policies whose
// cost is a plain ranking (least-loaded, longest-prefix, random).
type ArgminPicker struct{}

// Pick implements Picker.
func (ArgminPicker) Pick(rnd *rand.Rand, _ *Context, scored []Scored) (int, error) {
	return argminRow(rnd, scored), nil
}

// FirstMinPicker picks the lowest cost, ties to the first row in (worker id,
// dp rank) order, drawing nothing: the picker of a deterministic order such
// as round-robin's.
type FirstMinPicker struct{}

// Pick implements Picker.
func (FirstMinPicker) Pick(_ *rand.Rand, _ *Context, scored []Scored) (int, error) {
	best := 0
	for i := range scored {
		if scored[i].Cost < scored[best].Cost {
			best = i
		}
	}
	return best, nil
}
