package scheduler

import "time"

// DefaultMaxNumBatchedTokens stands in for an unknown max_num_batched_tokens
// in the busy test and the advisory prefill capacity; it makes such a worker
// effectively never busy (queue.rs DEFAULT_MAX_BATCHED_TOKENS).
const DefaultMaxNumBatchedTokens uint64 = 10_000_000

// PrefillTokenCapacity is a worker's prefill token capacity:
// max_num_batched_tokens, or DefaultMaxNumBatchedTokens when unknown: the
// selection response's worker_load.prefill_token_capacity (Dynamo's
// AdvisoryWorkerLoad).
func PrefillTokenCapacity(maxNumBatchedTokens *uint64) uint64 {
	if maxNumBatchedTokens == nil {
		return DefaultMaxNumBatchedTokens
	}
	return *maxNumBatchedTokens
}

// Busy is the router queue's per-rank busy test (Dynamo's
// scheduling/queue.rs): active prefill tokens > threshold ×
// max_num_batched_tokens.
func Busy(activePrefill int, maxNumBatchedTokens *uint64, threshold float64) bool {
	return float64(activePrefill) > threshold*float64(PrefillTokenCapacity(maxNumBatchedTokens))
}

// AllBusy reports whether the request must wait: every rank it could run on is
// busy or saturated (Candidate.Saturated); one rank with room lets it through. The
// ranks considered are the pinned one if any, else the host-eligible ones
// (allowed workers, required taints). With no such rank it returns false, so
// the request goes on to Select and fails there with ErrNoEndpoints
// (queue.rs all_workers_busy).
func AllBusy(req *Request, cands []Candidate, threshold float64) bool {
	checked := false
	for i := range cands {
		c := &cands[i]
		if req.Pinned != nil && c.Worker != *req.Pinned {
			continue
		}
		if !Eligible(req, c) {
			continue
		}
		checked = true
		if !c.Saturated && !Busy(c.ActivePrefillTokens, c.MaxNumBatchedTokens, threshold) {
			return false
		}
	}
	return checked
}

// DecodeBusy is the selection response's decode_busy: potential decode blocks
// > threshold × total_kv_blocks, or nil (omitted) when the threshold or the
// capacity is unknown. Dynamo's embedded router compares active decode
// blocks for the same veto of conditional disaggregation; the standalone
// selection service compares the potential ones, with this request
// admitted, and so does kvselect.
func DecodeBusy(potentialDecodeBlocks int, totalKVBlocks *uint64, threshold *float64) *bool {
	if totalKVBlocks == nil || threshold == nil {
		return nil
	}
	busy := float64(potentialDecodeBlocks) > *threshold*float64(*totalKVBlocks)
	return &busy
}

// PrefillBusy is the advisory worker_load.prefill_busy: active prefill tokens
// > threshold × prefill token capacity, nil (omitted) when the threshold is
// unset (Dynamo's AdvisoryWorkerLoad::prefill_load_exceeds).
// An unknown max_num_batched_tokens counts as DefaultMaxNumBatchedTokens.
func PrefillBusy(activePrefill int, maxNumBatchedTokens *uint64, threshold *float64) *bool {
	if threshold == nil {
		return nil
	}
	busy := float64(activePrefill) > *threshold*float64(PrefillTokenCapacity(maxNumBatchedTokens))
	return &busy
}

// DefaultOverlapRefreshAfter is DYN_ROUTER_OVERLAP_REFRESH_AFTER_SECS' default.
const DefaultOverlapRefreshAfter = 10 * time.Second

// OverlapRefreshDue reports whether a request dequeued at now, after waiting
// since enqueued, should have its overlaps re-queried before scoring
// (DYN_ROUTER_OVERLAP_REFRESH_AFTER_SECS): a long wait makes the
// enqueue-time overlap stale. after <= 0 disables the refresh. Dynamo
// refreshes once the wait reaches the threshold (queue.rs: skip only if wait
// < after).
func OverlapRefreshDue(enqueued, now time.Time, after time.Duration) bool {
	return after > 0 && now.Sub(enqueued) >= after
}
