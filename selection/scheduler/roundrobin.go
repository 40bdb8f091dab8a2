package scheduler

import "github.com/kvselect/kvselect/selection/index"

func init() { Register("round-robin", newRoundRobin) }

// CycleScorer is round-robin's cost: 0 for a rank that comes after the
// previous pick (Context.Last) in (worker id, dp rank) order, 1 for a rank
// the cycle reaches only after wrapping around. With FirstMinPicker the pick
// is the next eligible rank of the cycle, and the gateway's fallbacks
// (Scratch.Ranked, stable among equal costs) follow it in cycle order.
//
// The cycle is over whichever ranks are eligible at each pick, so a rank that
// joins, leaves or is filtered out does not reset it. It continues only when
// the caller passes the same Scratch to every Select of a partition; without
// one every pick starts the cycle afresh.
type CycleScorer struct{}

// Score implements Scorer.
func (CycleScorer) Score(ctx *Context, c *Candidate) (float64, error) {
	if ctx.Last == nil || index.CompareWorkerKeys(c.Worker, *ctx.Last) > 0 {
		return 0, nil
	}
	return 1, nil
}

// newRoundRobin cycles through the eligible ranks. It takes no parameters.
func newRoundRobin(p Params) (Policy, error) {
	if err := readParams(p).err(); err != nil {
		return Policy{}, err
	}
	return Policy{Scorer: CycleScorer{}, Picker: FirstMinPicker{}, ExclusiveAffinity: true}, nil
}
