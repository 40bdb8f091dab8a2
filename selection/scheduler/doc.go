// Package scheduler is kvselect's worker-selection decision: given the
// candidate (worker, dp_rank) pairs of one partition with their KV overlap and
// a snapshot of their in-flight load, it says which rank serves a request. It
// is pure: no goroutines, sockets, timers or clock reads. Time enters as
// now time.Time parameters and randomness as an injected *rand.Rand, so a
// seeded source makes every choice reproducible.
//
// The package re-implements the default selection policy of NVIDIA Dynamo's
// KV router (lib/kv-router/src/scheduling/selector/{mod,default,policy}.rs,
// scheduling/filter.rs, scheduling/overlap.rs, scheduling/types.rs), as
// summarised in router-core §5 and api spec §10:
//
//   - host eligibility (allowed_worker_ids, required taints, busy rejection),
//     pinned_worker and affinity_target handling, and the error classes of
//     Dynamo's KvSchedulerError: [Policy.Select];
//   - the cost (logit) formula, router-core §5.3: [CostScorer];
//   - argmin with uniform random tie-break, or min-max normalised softmax
//     sampling at router_temperature > 0, router-core §5.4: [SoftmaxPicker];
//   - the response formulas of api spec §3.9: [CachedTokens],
//     [EffectivePrefillTokens], [PotentialDecodeBlocks], [DecodeBusy],
//     [PrefillBusy];
//   - queue ordering and the busy test of router-core §5.6: [Queue], [Busy],
//     [AllBusy], [OverlapRefreshDue].
//
// The policy seam follows GIE's plugin framework: [Filter], [Scorer] and
// [Picker] are one-method interfaces and [DefaultPolicy] composes Dynamo's
// implementations of them. The caller (selection.Service) owns the catalog,
// the loads tracker, bookings and the waiting itself; this package only
// decides.
package scheduler
