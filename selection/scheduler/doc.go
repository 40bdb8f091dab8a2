// Package scheduler is kvselect's worker-selection decision: given the
// candidate (worker, dp_rank) pairs of one partition with their KV overlap and
// a snapshot of their in-flight load, it says which rank serves a request. It
// is pure: no goroutines, sockets, timers or clock reads. Time enters as
// now time.Time parameters and randomness as an injected *rand.Rand, so a
// seeded source makes every choice reproducible.
//
// # The policy seam
//
// A [Policy] is policy [Filter]s, one [Scorer] and one [Picker], one-method
// interfaces in the manner of GIE's scheduler plugins. [Policy.Select] does
// what every policy shares, as Dynamo's selector host does
// (lib/kv-router/src/scheduling/selector/mod.rs and scheduling/filter.rs in
// github.com/ai-dynamo/dynamo): host eligibility (allowed_worker_ids,
// required taints, busy rejection), pinned_worker, an exclusive
// affinity_target, the error classes of Dynamo's KvSchedulerError, and the
// response values of the chosen rank. The policy only ranks what is left:
// the scorer gives every rank a cost (lower is better) and the picker chooses
// a row. The cost also orders the gateway's fallback endpoints
// ([Scratch.Ranked]), so every policy's cost is meaningful, not only its
// pick. The caller (selection.Service) owns the catalog, the loads tracker,
// bookings and the waiting itself; this package only decides.
//
// # Named policies
//
// Policies are chosen by name (the server's --policy flag, the config file's
// policy.name) from a registry: [Register] adds a [Factory], [New] builds a
// policy from its name and [Params], [Names] lists them. A factory validates
// its parameters and names every unknown or invalid one. One Policy value
// serves every partition of a service and Select runs under a per-partition
// lock only, so a policy keeps no mutable state of its own; what it must
// remember between picks (round-robin's position) lives in the caller's
// per-partition [Scratch]. The built-ins, registered in this package's init:
//
//   - kv-cost ([DefaultPolicyName], [DefaultPolicy]): Dynamo's default
//     policy (scheduling/selector/default.rs), the cost of [CostScorer] —
//     prefill blocks left after the cache credit, plus decode blocks, plus a
//     per-request charge — and the argmin or temperature softmax of
//     [SoftmaxPicker]. Its parameters are Dynamo's KvRouterConfig cost
//     weights ([CostParamNames]); without any it uses the router
//     configuration's weights.
//   - round-robin: the eligible ranks in turn, in (worker id, dp rank) order
//     ([CycleScorer], [FirstMinPicker]).
//   - random: uniform over the eligible ranks ([RandomScorer],
//     [ArgminPicker]).
//   - least-loaded: the fewest active prefill tokens, then the fewest active
//     requests, ties at random ([LoadScorer]); the cache is ignored.
//   - longest-prefix: the longest device-cached prefix whatever the load,
//     ties at random ([PrefixScorer]); the greedy cache baseline.
//
// Every built-in treats an eligible affinity target as exclusive, so a
// session binding stays a hard steer whichever policy ranks. Only kv-cost
// takes parameters.
//
// A program adds its own policy by calling Register (typically from an
// init function) before it builds the service, after which the name works
// wherever a built-in's does. A Go program may instead hand a Policy value
// straight to the service (selection.Config.Policy, or server.WithPolicy).
//
// # Formulas
//
// Beside the policies the package holds Dynamo's arithmetic the service
// reports and queues by: [CachedTokens], [EffectivePrefillTokens],
// [PotentialDecodeBlocks], [DecodeBusy] and [PrefillBusy] for the selection
// response; the router queue's ordering and busy test, [Queue], [Busy],
// [AllBusy] and [OverlapRefreshDue] (scheduling/queue.rs).
package scheduler
