package scheduler

func init() { Register("least-loaded", newLeastLoaded) }

// LoadScorer is the least-loaded policy's cost: the rank's active prefill
// tokens plus r/(r+1) for its r active requests. The fraction stays below 1,
// so ranks order by prefill tokens first and, at equal prefill, by active
// requests; it keeps that order exactly while a rank has fewer than about a
// million prefill tokens and ten thousand requests in flight. The load is
// the caller's booked view (select_and_reserve bookings), not the engines'
// true queues. With prefill tracking off (router_track_prefill_tokens) the
// bookings carry no prefill and active requests alone decide.
type LoadScorer struct{}

// Score implements Scorer.
func (LoadScorer) Score(_ *Context, c *Candidate) (float64, error) {
	r := float64(c.ActiveRequests)
	return float64(c.ActivePrefillTokens) + r/(r+1), nil
}

// newLeastLoaded picks the rank with the fewest active prefill tokens, then
// the fewest active requests, ties at random; the cache is ignored. It takes
// no parameters.
func newLeastLoaded(p Params) (Policy, error) {
	if err := readParams(p).err(); err != nil {
		return Policy{}, err
	}
	return Policy{Scorer: LoadScorer{}, Picker: ArgminPicker{}, ExclusiveAffinity: true}, nil
}
