package partition

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/kvselect/kvselect/selection/affinity"
	"github.com/kvselect/kvselect/selection/apierr"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/engine"
	"github.com/kvselect/kvselect/selection/health"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/loads"
	"github.com/kvselect/kvselect/selection/routerconfig"
	"github.com/kvselect/kvselect/selection/scheduler"
)

// Judge is what ranks are judged by besides their loads and overlaps: the
// health checks, the engines' own figures and the busy-rejection thresholds.
// One Judge serves every partition of a service.
type Judge struct {
	Health  *health.Table
	Engines *engine.Table
	Engine  *engine.Config
	// Router holds the busy-rejection thresholds.
	Router *routerconfig.Config
	// Clock is the service's clock.
	Clock func() time.Time
}

// Candidates joins the schedulable ranks with their load projection, overlap
// and engine figures, leaves out ejected workers, and marks busy workers: as
// in Dynamo's busy rejection, a worker is overloaded only when all its ranks
// are over a configured threshold. It appends to out one row per candidate,
// only its Candidate set (the rows scheduler.Policy.SelectRows ranks), for
// the request's LoRA adapter lora, at now. ejected is the number of ranks
// left out by health ejection, or -1 when no worker has ever been ejected
// (the check was skipped).
func (ws *Workers) Candidates(out []scheduler.Scored, projs []loads.Projection, overlaps []index.Overlap,
	j *Judge, lora string, now time.Time) ([]scheduler.Scored, int) {
	ejected := -1
	excluded, anyEjected := j.Health.Excluded(now, j.Engine.Health.Base)
	if anyEjected {
		ejected = 0
	}
	// Projections and overlap rows both come sorted by rank, so one cursor
	// joins them in O(ranks + rows): a binary search per rank cost a tenth
	// of a 4,096-rank selection (kvbench scale).
	// Should the projections ever come out of order, the rest of them
	// fall back to the binary search: the cursor would have passed rows
	// they need.
	next, sorted := 0, true
	joinRecs := len(ws.recs) == len(ws.Ranks)
	nextRank := 0
	for i, pj := range projs {
		var ov index.Overlap
		if sorted && i > 0 && index.CompareWorkerKeys(projs[i-1].Worker, pj.Worker) >= 0 {
			sorted = false
		}
		if !sorted {
			ov = OverlapOf(overlaps, pj.Worker)
		} else {
			for next < len(overlaps) && index.CompareWorkerKeys(overlaps[next].Worker, pj.Worker) < 0 {
				next++
			}
			if next < len(overlaps) && overlaps[next].Worker == pj.Worker {
				ov = overlaps[next]
			}
		}
		var rec *catalog.Record
		if sorted && joinRecs {
			// The same cursor join for the records: the schedulable
			// ranks are sorted too.
			for nextRank < len(ws.Ranks) && index.CompareWorkerKeys(ws.Ranks[nextRank], pj.Worker) < 0 {
				nextRank++
			}
			if nextRank == len(ws.Ranks) || ws.Ranks[nextRank] != pj.Worker {
				continue
			}
			rec = ws.recs[nextRank]
		} else {
			var ok bool
			if rec, ok = ws.Rank(pj.Worker); !ok {
				continue
			}
		}
		if excluded[pj.Worker.WorkerID] {
			ejected++
			continue
		}
		out = append(out, scheduler.Scored{Candidate: scheduler.Candidate{
			Worker: pj.Worker, ActivePrefillTokens: pj.ActivePrefillTokens, ActiveDecodeBlocks: pj.ActiveDecodeBlocks,
			ActiveRequests: pj.ActiveRequests, PrefillingRequests: pj.PrefillingRequests, AdditionalBlocks: pj.AdditionalBlocks, Taints: rec.Taints,
			MaxNumBatchedTokens: rec.MaxNumBatchedTokens, Overlap: ov,
		}})
	}
	j.Engines.Annotate(out, func(i int) int { return int(ws.ByID[out[i].Worker.WorkerID].DPSize()) }, lora, now, j.Engine)
	if busyRejection(j.Router) {
		ws.markOverloaded(out, j.Router)
	}
	return out, ejected
}

func busyRejection(r *routerconfig.Config) bool {
	return r.ActiveDecodeBlocksThreshold.IsSet() || r.ActivePrefillTokensThreshold.IsSet() || r.ActivePrefillTokensThresholdFrac.IsSet()
}

// markOverloaded marks the candidates of workers whose every rank is busy.
func (ws *Workers) markOverloaded(cands []scheduler.Scored, r *routerconfig.Config) {
	busyRanks, ranks := map[uint64]int{}, map[uint64]int{}
	for i := range cands {
		id := cands[i].Worker.WorkerID
		ranks[id]++
		if rankBusy(&cands[i].Candidate, ws.ByID[id], r) {
			busyRanks[id]++
		}
	}
	for i := range cands {
		id := cands[i].Worker.WorkerID
		cands[i].Overloaded = busyRanks[id] == ranks[id]
	}
}

// rankBusy applies the busy-rejection thresholds to one rank.
func rankBusy(c *scheduler.Candidate, rec *catalog.Record, r *routerconfig.Config) bool {
	if t, ok := r.ActiveDecodeBlocksThreshold.Get(); ok && rec.TotalKVBlocks != nil && *rec.TotalKVBlocks > 0 &&
		float64(c.ActiveDecodeBlocks)/float64(*rec.TotalKVBlocks) > t {
		return true
	}
	if t, ok := r.ActivePrefillTokensThreshold.Get(); ok && c.ActivePrefillTokens > t {
		return true
	}
	if t, ok := r.ActivePrefillTokensThresholdFrac.Get(); ok &&
		float64(c.ActivePrefillTokens) > t*float64(scheduler.PrefillTokenCapacity(rec.MaxNumBatchedTokens)) {
		return true
	}
	return false
}

// HasRoom reports whether some rank is neither busy (the queue's threshold)
// nor saturated (its engine's fresh figures).
func (ws *Workers) HasRoom(projs []loads.Projection, threshold float64, j *Judge) bool {
	for _, pj := range projs {
		rec, ok := ws.Rank(pj.Worker)
		if !ok {
			continue
		}
		if !scheduler.Busy(pj.ActivePrefillTokens, rec.MaxNumBatchedTokens, threshold) &&
			!j.Engines.Saturated(pj.Worker.WorkerID, pj.Worker.DPRank, int(rec.DPSize()), j.Clock(), j.Engine) {
			return true
		}
	}
	return false
}

// SessionLive is the liveness test a session's binding gets when a request
// of the session is booked: Schedulable, and the worker not held out by the
// health check. An ejected worker is gone for its sessions as a deleted one
// is: they fail over to the worker the selection chose instead of failing
// with a Hard-mode conflict for as long as the ejection lasts (found by the
// soak run: session requests answered 400 while their worker was dead).
func (ws *Workers) SessionLive(j *Judge) func(t affinity.Target) bool {
	excluded, _ := j.Health.Excluded(j.Clock(), j.Engine.Health.Base)
	return func(t affinity.Target) bool { return !excluded[t.WorkerID] && ws.Schedulable(t) }
}

// EjectedError is the 503 of partition key whose every schedulable worker is
// ejected by the health checks: it names them, so the operator sees why.
func (ws *Workers) EjectedError(key index.Partition, h *health.Table, now time.Time) error {
	var why []string
	for _, id := range slices.Sorted(maps.Keys(ws.ByID)) {
		if _, reason := h.View(id, now); reason != "" {
			why = append(why, fmt.Sprintf("worker %d %s", id, reason))
		}
		if len(why) == 8 {
			why = append(why, "...")
			break
		}
	}
	return apierr.New(apierr.Unavailable, "%s: every schedulable worker of %s is ejected by health checks or awaiting its trial (%s)",
		scheduler.ErrNoEndpoints, Name(key), strings.Join(why, "; "))
}
