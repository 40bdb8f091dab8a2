package loads

import (
	"fmt"

	"github.com/kvselect/kvselect/selection/index"
)

// Move re-homes a live booking on another registered rank: its prompt path,
// remaining prefill and output blocks (with their decay weight) leave the old
// rank exactly as Free would take them and join the new one as Add and
// AddOutputBlock would put them; its admission time and id stay. The ext_proc
// front uses it when the gateway reports that a fallback endpoint, not the
// chosen one, served the request (GIE protocol 004 "served" metadata). It
// returns the booking's remaining counted prefill, which a replica publisher
// needs to re-announce the booking on its new rank.
func (t *Tracker) Move(id string, to index.WorkerKey) (remainingPrefill int, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	rq, ok := t.reqs[id]
	if !ok {
		return 0, fmt.Errorf("move %q: %w", id, ErrRequestNotFound)
	}
	dst, ok := t.ranks[to]
	if !ok {
		return 0, fmt.Errorf("move %q to %v: %w", id, to, ErrWorkerNotFound)
	}
	src := rq.rank
	if src == dst {
		return rq.prefill, nil
	}
	src.drop(rq)

	rq.rank = dst
	dst.acquire(rq.keys)
	dst.prefill += rq.prefill
	if !rq.prefilled {
		dst.prefilling++
	}
	dst.requests++
	dst.unit += rq.outUnit
	if rq.outFrac > 0 {
		dst.fracN += rq.outFrac
		dst.fracSum += float64(rq.outFrac) * rq.outFracVal
		dst.setExclusiveFraction(rq.keys, rq.outFracVal)
	}
	return rq.prefill, nil
}
