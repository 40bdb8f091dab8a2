// Package routerconfig holds every knob of the KV router and of the standalone
// selection service: Dynamo's KvRouterConfig, the environment variables the
// selection service reads, the per-request router_config_override of its
// selection API, and the rules that tie them together. Load layers a config
// file's router section under the environment.
//
// It does no I/O. Load and FromEnv take a lookup function (tests pass a map,
// the server passes os.LookupEnv) and the file's values already read; reading
// the keyed-tracking key file is the server's job. EnvTable is the one place
// every variable and file key is documented; --help prints it and
// docs/configuration.md holds what EnvMarkdown renders.
//
// # Sources
//
// Defaults, names and rules were read in ai-dynamo/dynamo (newest stored
// versions; the file ids are those of the search index):
//
//   - lib/kv-router/src/scheduling/config.rs (id 68360530388): KvRouterConfig
//     defaults, kv_router_config_from_lookup (env names, deprecated-alias order),
//     RouterConfigOverride and both validate
//     functions. An older version (0243c51b) capped overlap_score_credit at 1.0
//     and defaulted router_queue_threshold to 16.0; the newest accepts any
//     finite credit >= 0 and leaves the queue off. kvselect follows the newest.
//   - lib/kv-router/src/conditional_disagg.rs (088ca50b): eff-ISL threshold 2048,
//     ratio 0.7, the three policies.
//   - the dynamo truthy crate (id 55137891179): the boolean vocabulary.
//   - lib/kv-router/src/sequences/multi_worker.rs (id 66059442295): active
//     request expiry, whole seconds > 0, default 300.
//   - lib/kv-router/src/scheduling/overlap_refresh.rs (id 57552633972): overlap
//     refresh after 10 s, 0 disables.
//   - the Python frontend's shared router ArgGroup (id 58189046033): session
//     affinity and busy-rejection variables, their ranges, min initial workers.
//
// # Where kvselect deliberately differs from Dynamo
//
//   - An unparsable value is an error. Dynamo ignores an unparsable number or
//     boolean (and an unknown conditional-disagg policy, active-request expiry
//     or overlap-refresh value) and keeps the default, so a typo silently
//     changes routing. kvselect's standard is that nothing silently drops data
//     and invalid values are clear errors.
//   - Out-of-range values are rejected instead of replaced: active request
//     expiry 0 (Dynamo: default), a negative or non-finite overlap refresh
//     (Dynamo: off). Every float knob must be finite; Dynamo lets +Inf through
//     several ">= 0" checks.
//   - A variable that is set but empty (or only whitespace) counts as unset,
//     for every knob. Dynamo does this for booleans so that a variable declared
//     without a value in a Kubernetes manifest does not override a default;
//     kvselect applies the same rule everywhere rather than failing on numbers.
//   - FromEnv reports deprecated names, and the settings Dynamo itself
//     ignores (DYN_ADMISSION_CONTROL, DYN_ENFORCE_DISAGG: Dynamo's
//     components/src/dynamo/common/configuration/groups/router_args.py warns
//     and sets nothing), as warnings instead of only logging them.
//   - A setting kvselect does not implement is refused ("not supported by
//     kvselect"), where Dynamo would act on it: DYN_ROUTER_POLICY_CONFIG,
//     custom worker-selection instances, the aic prefill load model, the
//     hicache shared tier and a non-zero shared-cache multiplier, the remote
//     indexer, DYN_ROUTER_MODE other than kv, DYN_KV_CACHE_BLOCK_SIZE and
//     DYN_SERVE_INDEXER=true. Accepting them silently would route otherwise
//     than the operator asked. The server refuses DYN_ROUTER_REPLICA_SYNC=true
//     without --replica-sync-port for the same reason.
//
// FromEnv checks each value on its own. The cross-field rules live in
// Config.Validate, because command-line flags (--router-tracking-key-file and
// friends) may still override the environment before the service starts.
package routerconfig
