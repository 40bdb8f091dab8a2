package scheduler

import "fmt"

func init() { Register("random", newRandom) }

// RandomScorer is the random policy's cost: an independent uniform draw in
// [0, 1) from Context.Rand for every rank. Under ArgminPicker each eligible
// rank is then equally likely to be chosen, and the gateway's fallbacks
// (Scratch.Ranked) come in random order too rather than in worker-id order,
// which would send every retry to the same low-numbered workers.
type RandomScorer struct{}

// Score implements Scorer.
func (RandomScorer) Score(ctx *Context, _ *Candidate) (float64, error) {
	if ctx.Rand == nil {
		return 0, fmt.Errorf("%w: random scorer without a random source", ErrInvalidRequest)
	}
	return ctx.Rand.Float64(), nil
}

// newRandom picks uniformly among the eligible ranks with the injected
// random source, so a seeded source repeats the choices. It takes no
// parameters.
func newRandom(p Params) (Policy, error) {
	if err := readParams(p).err(); err != nil {
		return Policy{}, err
	}
	return Policy{Scorer: RandomScorer{}, Picker: ArgminPicker{}, ExclusiveAffinity: true}, nil
}
