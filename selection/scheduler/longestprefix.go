package scheduler

func init() { Register("longest-prefix", newLongestPrefix) }

// PrefixScorer is the longest-prefix policy's cost: the request blocks the
// rank's device-cached prefix leaves to prefill, ceil(isl / block size) −
// Overlap.Device. Lower tiers (host, disk, external) and load do not count.
// It is not clamped at zero, so the order follows the device prefix even
// when a hash-only request claims fewer tokens than its block hashes cover.
type PrefixScorer struct{}

// Score implements Scorer.
func (PrefixScorer) Score(ctx *Context, c *Candidate) (float64, error) {
	return float64(ctx.RequestBlocks) - float64(c.Overlap.Device), nil
}

// newLongestPrefix is the greedy cache pick: the rank holding the longest
// prefix of the prompt on its device, whatever its load, ties at random. It
// shows what prefix affinity alone buys, and how it piles requests sharing a
// prefix onto one rank. It takes no parameters.
func newLongestPrefix(p Params) (Policy, error) {
	if err := readParams(p).err(); err != nil {
		return Policy{}, err
	}
	return Policy{Scorer: PrefixScorer{}, Picker: ArgminPicker{}, ExclusiveAffinity: true}, nil
}
