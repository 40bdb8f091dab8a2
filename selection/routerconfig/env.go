package routerconfig

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// EnvVar documents one environment variable. EnvTable lists them all; the
// README and --help print it.
type EnvVar struct {
	Name    string // the variable
	Field   string // the Config field it sets; "" if kvselect accepts but ignores it
	Default string // as written in the environment; "unset" = absent
	Meaning string
	// Key names the knob in a config file's router section (Load): Dynamo's
	// KvRouterConfig field name where it has one. "" for deprecated aliases,
	// the per-process worker-selection overrides and the variables Dynamo
	// reads outside KvRouterConfig, which a file does not take.
	Key string
	// Status says whether kvselect acts on the variable: "works", which
	// values Load refuses ("not supported by kvselect"), or "warned" for
	// what Dynamo itself ignores. Nothing is accepted and silently ignored.
	Status string
}

// knob is an EnvVar plus how FromEnv reads it. A nil apply means FromEnv
// handles the variable in its own code (deprecated aliases, ignored names).
type knob struct {
	EnvVar
	apply func(r *reader, c *Config, name, raw string)
}

// EnvTable returns every variable FromEnv reads, in reading order.
func EnvTable() []EnvVar {
	out := make([]EnvVar, len(knobs))
	for i, k := range knobs {
		out[i] = k.EnvVar
	}
	return out
}

// EnvMarkdown renders EnvTable as a Markdown table for the README.
func EnvMarkdown() string {
	var b strings.Builder
	b.WriteString("| Variable | Config file key | Default | Meaning | Status |\n|---|---|---|---|---|\n")
	for _, k := range knobs {
		key := "—"
		if k.Key != "" {
			key = "`" + k.Key + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s |\n", k.Name, key, k.Default, strings.ReplaceAll(k.Meaning, "|", `\|`), k.Status)
	}
	return b.String()
}

// Names of the variables FromEnv treats specially.
const (
	envPrefillLoadScale   = "DYN_ROUTER_PREFILL_LOAD_SCALE"
	envOverlapWeight      = "DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT"
	envOverlapWeightOld   = "DYN_OVERLAP_SCORE_WEIGHT"
	envUseKVEvents        = "DYN_ROUTER_USE_KV_EVENTS"
	envUseKVEventsAlias   = "DYN_USE_KV_EVENTS"
	envSharedMultiplier   = "DYN_SHARED_CACHE_MULTIPLIER"
	envSessionAffinityTTL = "DYN_ROUTER_SESSION_AFFINITY_TTL_SECS"
	envSessionAffinityMod = "DYN_ROUTER_SESSION_AFFINITY_MODE"
)

// knobs is the single table behind FromEnv and EnvTable. Order follows
// Dynamo's kv_router_config_from_lookup, then the variables Dynamo reads
// elsewhere, then the ones kvselect accepts and ignores.
var knobs = []knob{
	{EnvVar{"DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT", "OverlapScoreCredit", "1", "Credit per device-cached prefix block against the request's prefill (finite, >= 0; above 1 over-credits). 0 ignores prefix overlap and turns the KV-event index off.", "overlap_score_credit", "works"},
		floatKnob(checkNonNegative, func(c *Config, v float64) { c.OverlapScoreCredit = v })},
	{EnvVar{"DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT_DECAY", "OverlapScoreCreditDecay", "0", "Shrinks the device credit of a worker by 1 / (1 + decay × its active prefill blocks above the least-loaded candidate's, per request block). 0 = off.", "overlap_score_credit_decay", "works"},
		floatKnob(checkNonNegative, func(c *Config, v float64) { c.OverlapScoreCreditDecay = v })},
	{EnvVar{envPrefillLoadScale, "PrefillLoadScale", "1", "Weight of the adjusted prefill blocks in the cost.", "prefill_load_scale", "works"},
		floatKnob(checkNonNegative, func(c *Config, v float64) { c.PrefillLoadScale = v })},
	{EnvVar{"DYN_ROUTER_DECODE_ACTIVE_REQUEST_WEIGHT", "DecodeActiveRequestWeight", "0", "Block-equivalents added per active request (experimental).", "decode_active_request_weight", "works"},
		floatKnob(checkNonNegative, func(c *Config, v float64) { c.DecodeActiveRequestWeight = v })},
	{EnvVar{envOverlapWeight, "PrefillLoadScale", "unset", "Deprecated alias of DYN_ROUTER_PREFILL_LOAD_SCALE and wins over it; 0 also sets the overlap credit to 0.", "", "works; deprecated: warned, as Dynamo warns"}, nil},
	{EnvVar{envOverlapWeightOld, "PrefillLoadScale", "unset", "Older deprecated alias, read only when DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT is unset.", "", "works; deprecated: warned, as Dynamo warns"}, nil},
	{EnvVar{"DYN_ROUTER_TEMPERATURE", "RouterTemperature", "0", "0 picks the cheapest worker (random among ties); > 0 samples a softmax over normalised costs.", "router_temperature", "works"},
		floatKnob(checkNonNegative, func(c *Config, v float64) { c.RouterTemperature = v })},
	{EnvVar{envUseKVEvents, "UseKVEvents", "true", "Index worker KV events; false keeps an approximate index learned from routing decisions.", "use_kv_events", "works"}, nil},
	{EnvVar{envUseKVEventsAlias, "UseKVEvents", "unset", "Alias of DYN_ROUTER_USE_KV_EVENTS, read only when that is unset.", "", "works; alias: warned"}, nil},
	{EnvVar{"DYN_ROUTER_REPLICA_SYNC", "ReplicaSync", "false", "Share active-request load across router replicas. kvselect's replica sync needs a port and peers: true requires --replica-sync-port (and --replica-sync-peers), which turn it on; true without them is refused. false leaves the flags in charge (a flag wins over the environment).", "router_replica_sync", "works with --replica-sync-port; true without it is refused"},
		boolKnob(func(c *Config, v bool) { c.ReplicaSync = v })},
	{EnvVar{"DYN_ROUTER_TRACK_ACTIVE_BLOCKS", "TrackActiveBlocks", "true", "Count in-flight KV blocks (decode load) in the cost.", "router_track_active_blocks", "works"},
		boolKnob(func(c *Config, v bool) { c.TrackActiveBlocks = v })},
	{EnvVar{"DYN_ROUTER_TRACK_OUTPUT_BLOCKS", "TrackOutputBlocks", "false", "Add a placeholder block per block_size generated tokens, with decay toward the expected output length. Requires active-block tracking.", "router_track_output_blocks", "works"},
		boolKnob(func(c *Config, v bool) { c.TrackOutputBlocks = v })},
	{EnvVar{"DYN_ROUTER_ASSUME_KV_REUSE", "AssumeKVReuse", "true", "Derive tracking hashes from content so identical prefixes share active blocks; false gives random hashes.", "router_assume_kv_reuse", "works"},
		boolKnob(func(c *Config, v bool) { c.AssumeKVReuse = v })},
	{EnvVar{"DYN_ROUTER_TRACK_PREFILL_TOKENS", "TrackPrefillTokens", "true", "Count in-flight prompt tokens (prefill load) in the cost and the queue.", "router_track_prefill_tokens", "works"},
		boolKnob(func(c *Config, v bool) { c.TrackPrefillTokens = v })},
	{EnvVar{"DYN_ROUTER_TRACKING_HASH", "TrackingHash", "public-xxh3-v1", "Tracking-hash algorithm: public-xxh3-v1 or keyed-xxh3-v1 (needs a key file and key id).", "router_tracking_hash", "works"},
		choiceKnob([]string{string(TrackingPublic), string(TrackingKeyed)}, func(c *Config, v string) { c.TrackingHash = TrackingHash(v) })},
	{EnvVar{"DYN_ROUTER_TRACKING_KEY_FILE", "TrackingKeyFile", "unset", "Path of the 32-byte key for keyed-xxh3-v1.", "router_tracking_key_file", "works"},
		stringKnob(func(c *Config, v string) { c.TrackingKeyFile = Some(v) })},
	{EnvVar{"DYN_ROUTER_TRACKING_KEY_ID", "TrackingKeyID", "unset", "Key epoch mixed into keyed-xxh3-v1 derivations.", "router_tracking_key_id", "works"},
		stringKnob(func(c *Config, v string) { c.TrackingKeyID = Some(v) })},
	{EnvVar{"DYN_ROUTER_QUEUE_THRESHOLD", "QueueThreshold", "unset", "Queue requests while every worker's active prefill exceeds this fraction of its max_num_batched_tokens (>= 0). Unset = no queue.", "router_queue_threshold", "works"},
		floatKnob(checkNonNegative, func(c *Config, v float64) { c.QueueThreshold = Some(v) })},
	{EnvVar{"DYN_ROUTER_POLICY_CONFIG", "PolicyConfig", "unset", "Path of Dynamo's policy-class / custom worker-selection YAML. Refused: kvselect implements neither policy classes (their queues, 429/529 shedding and Retry-After) nor custom worker selection; use DYN_ROUTER_QUEUE_THRESHOLD / DYN_ROUTER_QUEUE_POLICY, the DYN_ACTIVE_* thresholds and --policy.", "router_policy_config", "refused: not supported by kvselect"},
		stringKnob(func(c *Config, v string) { c.PolicyConfig = Some(v) })},
	{EnvVar{"DYN_ROUTER_WORKER_SELECTION_POLICY", "WorkerSelectionPolicy", "unset", "Custom worker-selection instance (\"default\" = built-in). Any other value is refused: kvselect's policies are chosen with --policy (KVSELECT_POLICY).", "", "works for default; any other value is refused"},
		stringKnob(func(c *Config, v string) { c.WorkerSelectionPolicy = Some(v) })},
	{EnvVar{"DYN_ROUTER_PREFILL_POLICY", "PrefillPolicy", "unset", "Custom worker-selection instance for prefill workers. Any other value than \"default\" is refused; use --policy.", "", "works for default; any other value is refused"},
		stringKnob(func(c *Config, v string) { c.PrefillPolicy = Some(v) })},
	{EnvVar{"DYN_ROUTER_DECODE_POLICY", "DecodePolicy", "unset", "Custom worker-selection instance for decode workers. Any other value than \"default\" is refused; use --policy.", "", "works for default; any other value is refused"},
		stringKnob(func(c *Config, v string) { c.DecodePolicy = Some(v) })},
	{EnvVar{"DYN_ROUTER_CONDITIONAL_DISAGG", "ConditionalDisagg", "false", "For disaggregated requests (docs/disaggregation.md): let the decode worker prefill locally when the policy allows; false prefills every request of a model with a prefill pool remotely.", "conditional_disagg_enabled", "works"},
		boolKnob(func(c *Config, v bool) { c.ConditionalDisagg = v })},
	{EnvVar{"DYN_ROUTER_CONDITIONAL_DISAGG_POLICY", "ConditionalDisaggPolicy", "isl_bounding", "isl_bounding, prefill_load (needs a prefill busy threshold or the queue threshold) or isl_or_load.", "conditional_disagg_policy", "works"},
		choiceKnob([]string{string(DisaggISLBounding), string(DisaggPrefillLoad), string(DisaggISLOrLoad)}, func(c *Config, v string) { c.ConditionalDisaggPolicy = ConditionalDisaggPolicy(v) })},
	{EnvVar{"DYN_ROUTER_CONDITIONAL_DISAGG_EFF_ISL_THRESHOLD", "ConditionalDisaggEffISLThreshold", "2048", "isl_bounding: prefill locally only if the uncached prompt is below this many tokens.", "conditional_disagg_eff_isl_threshold", "works"},
		intKnob(0, math.MaxInt, func(c *Config, v int) { c.ConditionalDisaggEffISLThreshold = v })},
	{EnvVar{"DYN_ROUTER_CONDITIONAL_DISAGG_EFF_ISL_RATIO_THRESHOLD", "ConditionalDisaggEffISLRatioThreshold", "0.7", "isl_bounding: ... and the uncached share of the prompt is below this fraction (0-1).", "conditional_disagg_eff_isl_ratio_threshold", "works"},
		floatKnob(checkUnit, func(c *Config, v float64) { c.ConditionalDisaggEffISLRatioThreshold = v })},
	{EnvVar{"DYN_ROUTER_CONDITIONAL_DISAGG_PREFILL_BUSY_THRESHOLD", "ConditionalDisaggPrefillBusyThreshold", "unset", "prefill_load: busy line of the chosen prefill worker, as a fraction of max_num_batched_tokens; unset falls back to the queue threshold.", "conditional_disagg_prefill_busy_threshold", "works"},
		floatKnob(checkNonNegative, func(c *Config, v float64) { c.ConditionalDisaggPrefillBusyThreshold = Some(v) })},
	{EnvVar{"DYN_ROUTER_CONDITIONAL_DISAGG_DECODE_BUSY_THRESHOLD", "ConditionalDisaggDecodeBusyThreshold", "unset", "Veto local prefill when the decode worker's load exceeds this fraction of its KV blocks; unset = no veto.", "conditional_disagg_decode_busy_threshold", "works"},
		floatKnob(checkNonNegative, func(c *Config, v float64) { c.ConditionalDisaggDecodeBusyThreshold = Some(v) })},
	{EnvVar{"DYN_ROUTER_PREDICTED_TTL_SECS", "PredictedTTL", "unset", "Seconds a routing decision stays in the predict-on-route side index; unset = no side index. Requires KV events.", "router_predicted_ttl_secs", "works"},
		secondsKnob(func(c *Config, v time.Duration) { c.PredictedTTL = Some(v) })},
	{EnvVar{"DYN_ROUTER_APPROXIMATE_CACHE_POLICY", "ApproximateCachePolicy", "ttl", "Approximate index retention: ttl, or lru (requires DYN_ROUTER_USE_KV_EVENTS=false).", "router_approximate_cache_policy", "works"},
		choiceKnob([]string{string(ApproximateTTL), string(ApproximateLRU)}, func(c *Config, v string) { c.ApproximateCachePolicy = ApproximateCachePolicy(v) })},
	{EnvVar{"DYN_ROUTER_TTL_SECS", "RouterTTL", "120", "Seconds an approximate-index entry lives (ttl policy).", "router_ttl_secs", "works"},
		secondsKnob(func(c *Config, v time.Duration) { c.RouterTTL = v })},
	{EnvVar{"DYN_ROUTER_EVENT_THREADS", "EventThreads", "4", "KV event writer lanes (>= 1; at most 256 are started): events of one worker rank stay in order; the selection service's --threads.", "router_event_threads", "works"},
		intKnob(1, maxEventThreads, func(c *Config, v int) { c.EventThreads = v })},
	{EnvVar{"DYN_ROUTER_QUEUE_POLICY", "QueuePolicy", "fcfs", "Queue order: fcfs (priority boost in seconds), wspt (shortest uncached prefill first) or lcfs (testing).", "router_queue_policy", "works"},
		choiceKnob([]string{string(QueueFCFS), string(QueueWSPT), string(QueueLCFS)}, func(c *Config, v string) { c.QueuePolicy = QueuePolicy(v) })},
	{EnvVar{"DYN_USE_REMOTE_INDEXER", "UseRemoteIndexer", "false", "Query a remote indexer instead of a local one. true is refused: kvselect always keeps its own index (seed it from peers with --indexer-peers).", "use_remote_indexer", "works for false; true is refused"},
		boolKnob(func(c *Config, v bool) { c.UseRemoteIndexer = v })},
	{EnvVar{envSharedMultiplier, "SharedCacheMultiplier", "0", "Credit per block found only in the shared cache tier (0-1). Any value but 0 is refused: kvselect has no shared tier, so the credit could never apply.", "shared_cache_multiplier", "works for 0; any other value is refused"},
		floatKnob(checkUnit, func(c *Config, v float64) { c.SharedCacheMultiplier = v })},
	{EnvVar{"DYN_SHARED_CACHE_TYPE", "SharedCacheType", "none", "Shared cache tier: none or hicache. hicache is refused: kvselect does not query a shared tier.", "shared_cache_type", "works for none; hicache is refused"},
		choiceKnob([]string{string(SharedCacheNone), string(SharedCacheHiCache)}, func(c *Config, v string) { c.SharedCacheType = SharedCacheType(v) })},
	{EnvVar{"DYN_ROUTER_HOST_CACHE_HIT_WEIGHT", "HostCacheHitWeight", "0.75", "Credit per host-memory continuation block (0-1).", "host_cache_hit_weight", "works"},
		floatKnob(checkUnit, func(c *Config, v float64) { c.HostCacheHitWeight = v })},
	{EnvVar{"DYN_ROUTER_DISK_CACHE_HIT_WEIGHT", "DiskCacheHitWeight", "0.25", "Credit per disk or external continuation block (0-1).", "disk_cache_hit_weight", "works"},
		floatKnob(checkUnit, func(c *Config, v float64) { c.DiskCacheHitWeight = v })},
	{EnvVar{"DYN_ROUTER_PREFILL_LOAD_MODEL", "PrefillLoadModel", "none", "none: in-flight prefill load counts in full until the first token. aic (Dynamo: decay the oldest prefill over its AIC-predicted duration) is refused: kvselect has no AIC model.", "router_prefill_load_model", "works for none; aic is refused"},
		choiceKnob([]string{string(PrefillLoadNone), string(PrefillLoadAIC)}, func(c *Config, v string) { c.PrefillLoadModel = PrefillLoadModel(v) })},

	// Read outside KvRouterConfig in Dynamo (sequences, queue, frontend args).
	{EnvVar{"DYN_ROUTER_ACTIVE_REQUEST_EXPIRY_SECS", "ActiveRequestExpiry", "300", "Whole seconds after admission at which a booking whose free never arrived is reclaimed (> 0).", "active_request_expiry_secs", "works"},
		wholeSecondsKnob(1, math.MaxInt64/int64(time.Second), func(c *Config, v time.Duration) { c.ActiveRequestExpiry = v })},
	{EnvVar{"DYN_ROUTER_OVERLAP_REFRESH_AFTER_SECS", "OverlapRefreshAfter", "10", "Re-query a queued request's overlaps if it waited at least this long (seconds); 0 = never.", "overlap_refresh_after_secs", "works"},
		secondsKnob(func(c *Config, v time.Duration) { c.OverlapRefreshAfter = v })},
	{EnvVar{envSessionAffinityTTL, "SessionAffinityTTL", "unset", "Enable session affinity: idle seconds a session stays bound to its worker (1-31536000). Unset = off.", "session_affinity_ttl_secs", "works"},
		wholeSecondsKnob(1, int64(MaxSessionAffinityTTL/time.Second), func(c *Config, v time.Duration) { c.SessionAffinityTTL = Some(v) })},
	{EnvVar{envSessionAffinityMod, "SessionAffinityMode", "hard", "hard: a bound session goes to its worker; soft: the binding is only a preference.", "session_affinity_mode", "works; warned when session affinity is off (no effect, as in Dynamo)"},
		choiceKnob([]string{string(AffinityHard), string(AffinitySoft)}, func(c *Config, v string) { c.SessionAffinityMode = SessionAffinityMode(v) })},
	{EnvVar{"DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD", "ActiveDecodeBlocksThreshold", "unset", "Busy when active decode blocks exceed this fraction (0-1) of the worker's KV blocks; busy workers are not selected. Unset or None = check off.", "active_decode_blocks_threshold", "works"},
		nullableFloatKnob(checkUnit, func(c *Config, v float64) { c.ActiveDecodeBlocksThreshold = Some(v) })},
	{EnvVar{"DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD", "ActivePrefillTokensThreshold", "unset", "Busy when active prefill tokens exceed this count (>= 0). Unset or None = check off.", "active_prefill_tokens_threshold", "works"},
		nullableIntKnob(func(c *Config, v int) { c.ActivePrefillTokensThreshold = Some(v) })},
	{EnvVar{"DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC", "ActivePrefillTokensThresholdFrac", "unset", "Busy when active prefill tokens exceed this fraction of max_num_batched_tokens (>= 0). Unset or None = check off.", "active_prefill_tokens_threshold_frac", "works"},
		nullableFloatKnob(checkNonNegative, func(c *Config, v float64) { c.ActivePrefillTokensThresholdFrac = Some(v) })},
	{EnvVar{"DYN_ROUTER_MIN_INITIAL_WORKERS", "MinInitialWorkers", "0", "Workers required before the service reports ready (>= 0).", "min_initial_workers", "works"},
		intKnob(0, math.MaxInt, func(c *Config, v int) { c.MinInitialWorkers = v })},

	// Read by Dynamo's frontend or EPP outside KvRouterConfig: kvselect acts on
	// the values that mean what it does, refuses the others, and warns about the
	// two Dynamo itself ignores (see ignoredOrUnsupported).
	{EnvVar{"DYN_ROUTER_MODE", "", "unset", "Frontend routing mode. kv is what kvselect does; any other value is refused: choose a kvselect policy with --policy (round-robin, random, least-loaded are close to, not the same as, Dynamo's modes).", "", "works for kv; any other value is refused"}, nil},
	{EnvVar{"DYN_KV_CACHE_BLOCK_SIZE", "", "unset", "Block-size override of Dynamo's EPP. Refused: each worker carries its own block size (block_size in POST /register or --workers-file, the block-size annotation on Kubernetes).", "", "refused: not supported by kvselect"}, nil},
	{EnvVar{"DYN_SERVE_INDEXER", "", "unset", "Frontend setting: serve the index over Dynamo's request plane. true is refused: kvselect does not speak the request plane; its index is readable at GET /dump.", "", "works for false; true is refused"}, nil},
	{EnvVar{"DYN_ADMISSION_CONTROL", "", "unset", "Removed from Dynamo, which warns and ignores it; so does kvselect. Use the DYN_ACTIVE_* thresholds.", "", "warned: ignored by Dynamo too"}, nil},
	{EnvVar{"DYN_ENFORCE_DISAGG", "", "unset", "Deprecated and ignored by Dynamo (worker types decide the topology); kvselect warns and ignores it too.", "", "warned: ignored by Dynamo too"}, nil},
}

// File is the router section of a config file: raw values by EnvVar.Key,
// written as they would be in the environment ("120", "true", "0.5").
type File struct {
	Values map[string]string
	// Label names a key in errors and warnings, e.g.
	// "kvselect.yaml: router.router_ttl_secs"; the bare key when nil.
	Label func(key string) string
}

// FileKeys lists the keys a config file's router section takes, in
// EnvTable order.
func FileKeys() []string {
	var out []string
	for _, k := range knobs {
		if k.Key != "" {
			out = append(out, k.Key)
		}
	}
	return out
}

// FromEnv is Load without a config file.
func FromEnv(lookup func(string) (string, bool)) (Config, []string, error) {
	return Load(File{}, lookup)
}

// Load builds a Config from Default, then the config file's values, then the
// variables in EnvTable read through lookup (os.LookupEnv in the binary): a
// variable that is set wins over the file's value for the same knob, which
// wins over the default. Booleans take Dynamo's truthy
// vocabulary: 1/0, true/false, yes/no, on/off, any case, surrounding space
// ignored. An empty value counts as unset. Deprecated aliases follow Dynamo's
// precedence: DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT, else DYN_OVERLAP_SCORE_WEIGHT,
// wins over DYN_ROUTER_PREFILL_LOAD_SCALE (and 0 also zeroes the overlap
// credit); DYN_ROUTER_USE_KV_EVENTS wins over DYN_USE_KV_EVENTS.
//
// It returns warnings for deprecated names, shadowed aliases and the settings
// Dynamo itself ignores. A
// setting kvselect does not implement is an error ("not supported by
// kvselect"), not a warning: taken and ignored, it would route otherwise
// than the operator asked. Every unparsable or out-of-range value is an
// error naming the variable and value (all of them, joined; each wraps
// ErrInvalid); the Config is then the zero value. Cross-field rules are left
// to Validate, to run after command-line flags are applied. A file key that
// is not in FileKeys is an error too.
func Load(file File, lookup func(string) (string, bool)) (Config, []string, error) {
	r := &reader{lookup: lookup, file: file, keyOf: map[string]string{}}
	for _, k := range knobs {
		if k.Key != "" {
			r.keyOf[k.Name] = k.Key
		}
	}
	r.unknownFileKeys()
	c := Default()
	for _, k := range knobs {
		if k.apply == nil {
			continue
		}
		if raw, ok := r.get(k.Name); ok {
			k.apply(r, &c, k.Name, raw)
		}
	}
	r.aliases(&c)
	r.ignoredOrUnsupported(c)
	if err := errors.Join(r.errs...); err != nil {
		return Config{}, r.warnings, err
	}
	return c, r.warnings, nil
}

type reader struct {
	lookup   func(string) (string, bool)
	file     File
	keyOf    map[string]string // variable → file key, for those a file can set
	seen     map[string]bool
	fromFile map[string]bool // variables whose value came from the file
	errs     []error
	warnings []string
}

// get returns a variable's raw value: the environment's, else the file's
// value for its key. Set-but-blank counts as unset (see the package doc).
func (r *reader) get(name string) (string, bool) {
	if r.seen == nil {
		r.seen, r.fromFile = map[string]bool{}, map[string]bool{}
	}
	if raw, ok := r.lookup(name); ok && strings.TrimSpace(raw) != "" {
		r.seen[name] = true
		return raw, true
	}
	if key := r.keyOf[name]; key != "" {
		if raw, ok := r.file.Values[key]; ok && strings.TrimSpace(raw) != "" {
			r.seen[name], r.fromFile[name] = true, true
			return raw, true
		}
	}
	return "", false
}

// label names where a variable's value came from: the variable, or the file
// key that set it.
func (r *reader) label(name string) string {
	if !r.fromFile[name] {
		return name
	}
	key := r.keyOf[name]
	if r.file.Label != nil {
		return r.file.Label(key)
	}
	return key
}

// unknownFileKeys reports the file keys no knob takes.
func (r *reader) unknownFileKeys() {
	known := FileKeys()
	for _, key := range slices.Sorted(maps.Keys(r.file.Values)) {
		if !slices.Contains(known, key) {
			label := key
			if r.file.Label != nil {
				label = r.file.Label(key)
			}
			r.errs = append(r.errs, &Error{Name: label, Value: strconv.Quote(r.file.Values[key]),
				Reason: "unknown router knob (docs/configuration.md lists the keys)"})
		}
	}
}

func (r *reader) fail(name, raw, reason string) {
	r.errs = append(r.errs, envError(r.label(name), raw, reason))
}

func (r *reader) warn(format string, args ...any) {
	r.warnings = append(r.warnings, fmt.Sprintf(format, args...))
}

func (r *reader) float(name, raw string, check func(float64) string) (float64, bool) {
	v, err := strconv.ParseFloat(strings.TrimSpace(raw), 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		r.fail(name, raw, "not a number")
		return 0, false
	}
	if reason := check(v); err != nil || reason != "" {
		if reason == "" {
			reason = "out of range"
		}
		r.fail(name, raw, reason)
		return 0, false
	}
	return v, true
}

func isFalsey(raw string) bool {
	switch strings.ToLower(strings.TrimSpace(raw)) {
	case "0", "false", "no", "off":
		return true
	}
	return false
}

func (r *reader) boolean(name, raw string) (bool, bool) {
	switch strings.ToLower(strings.TrimSpace(raw)) {
	case "1", "true", "yes", "on":
		return true, true
	case "0", "false", "no", "off":
		return false, true
	}
	r.fail(name, raw, "not a boolean (want 1/0, true/false, yes/no or on/off)")
	return false, false
}

func (r *reader) integer(name, raw string, lo, hi int64) (int64, bool) {
	v, err := strconv.ParseInt(strings.TrimSpace(raw), 10, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		r.fail(name, raw, "not a whole number")
		return 0, false
	}
	switch {
	case v < lo:
		r.fail(name, raw, fmt.Sprintf("must be >= %d", lo))
		return 0, false
	case err != nil || v > hi:
		r.fail(name, raw, fmt.Sprintf("must be <= %d", hi))
		return 0, false
	}
	return v, true
}

// maxSeconds is the longest time.Duration, in seconds.
const maxSeconds = float64(math.MaxInt64) / float64(time.Second)

func (r *reader) seconds(name, raw string) (time.Duration, bool) {
	v, ok := r.float(name, raw, checkNonNegative)
	if !ok {
		return 0, false
	}
	if v > maxSeconds {
		r.fail(name, raw, "too large for a duration")
		return 0, false
	}
	return time.Duration(v * float64(time.Second)), true
}

func floatKnob(check func(float64) string, set func(*Config, float64)) func(*reader, *Config, string, string) {
	return func(r *reader, c *Config, name, raw string) {
		if v, ok := r.float(name, raw, check); ok {
			set(c, v)
		}
	}
}

// nullableFloatKnob also accepts "None" as unset: Dynamo's frontend documents
// passing 'None' to turn a busy-rejection check off.
func nullableFloatKnob(check func(float64) string, set func(*Config, float64)) func(*reader, *Config, string, string) {
	inner := floatKnob(check, set)
	return func(r *reader, c *Config, name, raw string) {
		if !isNone(raw) {
			inner(r, c, name, raw)
		}
	}
}

func nullableIntKnob(set func(*Config, int)) func(*reader, *Config, string, string) {
	inner := intKnob(0, math.MaxInt, set)
	return func(r *reader, c *Config, name, raw string) {
		if !isNone(raw) {
			inner(r, c, name, raw)
		}
	}
}

func isNone(raw string) bool { return strings.EqualFold(strings.TrimSpace(raw), "none") }

func boolKnob(set func(*Config, bool)) func(*reader, *Config, string, string) {
	return func(r *reader, c *Config, name, raw string) {
		if v, ok := r.boolean(name, raw); ok {
			set(c, v)
		}
	}
}

func intKnob(lo, hi int64, set func(*Config, int)) func(*reader, *Config, string, string) {
	return func(r *reader, c *Config, name, raw string) {
		if v, ok := r.integer(name, raw, lo, hi); ok {
			set(c, int(v))
		}
	}
}

func secondsKnob(set func(*Config, time.Duration)) func(*reader, *Config, string, string) {
	return func(r *reader, c *Config, name, raw string) {
		if v, ok := r.seconds(name, raw); ok {
			set(c, v)
		}
	}
}

// wholeSecondsKnob reads integer seconds, as Dynamo does for the request
// expiry (u64) and the session-affinity TTL (Python int).
func wholeSecondsKnob(lo, hi int64, set func(*Config, time.Duration)) func(*reader, *Config, string, string) {
	return func(r *reader, c *Config, name, raw string) {
		if v, ok := r.integer(name, raw, lo, hi); ok {
			set(c, time.Duration(v)*time.Second)
		}
	}
}

// choiceKnob matches exactly (Dynamo's FromStr and argparse choices are
// case-sensitive), after trimming surrounding space.
func choiceKnob(choices []string, set func(*Config, string)) func(*reader, *Config, string, string) {
	return func(r *reader, c *Config, name, raw string) {
		v := strings.TrimSpace(raw)
		for _, ch := range choices {
			if v == ch {
				set(c, v)
				return
			}
		}
		r.fail(name, raw, "want "+strings.Join(choices, ", "))
	}
}

// stringKnob keeps free text (paths, key ids, policy names) as given.
func stringKnob(set func(*Config, string)) func(*reader, *Config, string, string) {
	return func(_ *reader, c *Config, _, raw string) { set(c, raw) }
}

// aliases applies the deprecated names in Dynamo's order (config.rs
// kv_router_config_from_lookup). The first overlap-weight alias that is set
// wins; Dynamo would skip an unparsable one and try the next, kvselect
// reports it.
func (r *reader) aliases(c *Config) {
	for i, name := range []string{envOverlapWeight, envOverlapWeightOld} {
		raw, ok := r.get(name)
		if !ok {
			continue
		}
		if i == 0 {
			if _, shadowed := r.get(envOverlapWeightOld); shadowed {
				r.warn("%s is ignored: %s is also set and takes precedence", envOverlapWeightOld, envOverlapWeight)
			}
		}
		r.warn("%s is deprecated; use %s (a weight of 0 also sets the overlap credit to 0)", name, envPrefillLoadScale)
		if r.seen[envPrefillLoadScale] {
			r.warn("%s is ignored: the deprecated %s is also set and takes precedence, as in Dynamo", envPrefillLoadScale, name)
		}
		if v, ok := r.float(name, raw, checkNonNegative); ok {
			c.PrefillLoadScale = v
			if v == 0 {
				c.OverlapScoreCredit = 0
			}
		}
		break
	}

	raw, canonical := r.get(envUseKVEvents)
	if canonical {
		if v, ok := r.boolean(envUseKVEvents, raw); ok {
			c.UseKVEvents = v
		}
	}
	if raw, ok := r.get(envUseKVEventsAlias); ok {
		if canonical {
			r.warn("%s is ignored: %s is also set and takes precedence", envUseKVEventsAlias, envUseKVEvents)
		} else {
			r.warn("%s is an alias; use %s", envUseKVEventsAlias, envUseKVEvents)
			if v, ok := r.boolean(envUseKVEventsAlias, raw); ok {
				c.UseKVEvents = v
			}
		}
	}
}

// notSupported is the reason of every refused setting; tests and operators
// grep for it.
const notSupported = "not supported by kvselect"

// refuse fails a setting kvselect does not implement: taking it and doing
// nothing would route differently from what the operator asked for.
func (r *reader) refuse(name, raw, what, instead string) {
	r.fail(name, raw, notSupported+" ("+what+"); "+instead)
}

// ignoredOrUnsupported refuses the settings Load parsed that kvselect does not
// implement, and warns about the ones Dynamo itself documents as ignored.
// Load starts from Default, so anything non-default here came from the
// environment or the file. The server checks what flags can change after
// Load: DYN_ROUTER_REPLICA_SYNC=true needs --replica-sync-port, and
// DYN_ROUTER_SESSION_AFFINITY_MODE matters only once a session TTL (possibly
// --session-affinity-ttl-secs) turns affinity on.
func (r *reader) ignoredOrUnsupported(c Config) {
	if raw, ok := r.get("DYN_ROUTER_POLICY_CONFIG"); ok {
		r.refuse("DYN_ROUTER_POLICY_CONFIG", raw, "policy classes, their queues, 429/529 shedding and Retry-After, and custom worker selection",
			"for one queue set DYN_ROUTER_QUEUE_THRESHOLD and DYN_ROUTER_QUEUE_POLICY, for busy rejection the DYN_ACTIVE_* thresholds, and choose the policy with --policy or KVSELECT_POLICY")
	}
	for _, name := range []string{"DYN_ROUTER_WORKER_SELECTION_POLICY", "DYN_ROUTER_PREFILL_POLICY", "DYN_ROUTER_DECODE_POLICY"} {
		if raw, ok := r.get(name); ok && strings.TrimSpace(raw) != "default" {
			r.refuse(name, raw, "Dynamo's custom worker-selection instances", `leave it unset or "default", and choose a kvselect policy with --policy or KVSELECT_POLICY`)
		}
	}
	if c.PrefillLoadModel == PrefillLoadAIC {
		raw, _ := r.get("DYN_ROUTER_PREFILL_LOAD_MODEL")
		r.refuse("DYN_ROUTER_PREFILL_LOAD_MODEL", raw, "the AIC prefill load model", "use none: in-flight prefill counts in full until the first token")
	}
	if c.SharedCacheType == SharedCacheHiCache {
		raw, _ := r.get("DYN_SHARED_CACHE_TYPE")
		r.refuse("DYN_SHARED_CACHE_TYPE", raw, "a shared cache tier", "use none")
	}
	// Without a shared tier no block is ever shared-only, so a multiplier
	// other than 0 would be a weight that never weighs anything.
	if raw, ok := r.get(envSharedMultiplier); ok && c.SharedCacheMultiplier != 0 {
		r.refuse(envSharedMultiplier, raw, "a shared cache tier, the only place this credit applies", "leave it unset or 0")
	}
	if c.UseRemoteIndexer {
		raw, _ := r.get("DYN_USE_REMOTE_INDEXER")
		r.refuse("DYN_USE_REMOTE_INDEXER", raw, "a remote indexer", "kvselect keeps its own index; seed it from a peer's GET /dump with --indexer-peers")
	}
	if raw, ok := r.get("DYN_ROUTER_MODE"); ok && strings.TrimSpace(raw) != "kv" {
		// Not mapped onto kvselect's round-robin or random policies: Dynamo's
		// other modes pick a worker instance without the KV router (no KV
		// cost, bookings or router queue), kvselect's policies rank (worker,
		// dp rank) pairs inside it, and --policy / KVSELECT_POLICY already
		// choose the policy with their own precedence.
		r.refuse("DYN_ROUTER_MODE", raw, "routing modes other than kv: the selection service always runs a KV-aware router",
			"unset it or set kv, and choose a kvselect policy with --policy or KVSELECT_POLICY (round-robin, random, least-loaded, kv-cost, ...)")
	}
	if raw, ok := r.get("DYN_KV_CACHE_BLOCK_SIZE"); ok {
		r.refuse("DYN_KV_CACHE_BLOCK_SIZE", raw, "a process-wide block size", "each worker carries its own: block_size in POST /register or --workers-file, or the kvselect.io/block-size pod annotation")
	}
	if raw, ok := r.get("DYN_SERVE_INDEXER"); ok && !isFalsey(raw) {
		r.refuse("DYN_SERVE_INDEXER", raw, "serving the index over Dynamo's request plane", "kvselect's index is readable at GET /dump (other kvselect replicas read it with --indexer-peers); unset it")
	}

	// Dynamo's router_args.py (components/src/dynamo/common/configuration/
	// groups) accepts both so older launch commands start, warns, and sets
	// nothing; kvselect does the same.
	if _, ok := r.get("DYN_ADMISSION_CONTROL"); ok {
		r.warn("DYN_ADMISSION_CONTROL is ignored, as Dynamo ignores it (removed there); set DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD, DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD or DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC")
	}
	if _, ok := r.get("DYN_ENFORCE_DISAGG"); ok {
		r.warn("DYN_ENFORCE_DISAGG is ignored, as Dynamo ignores it (deprecated there: registered worker types decide the topology)")
	}
}
