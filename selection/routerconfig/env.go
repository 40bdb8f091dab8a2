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
	// the policy plug-in knobs and the variables kvselect ignores, which a
	// file does not take.
	Key string
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
	b.WriteString("| Variable | Config file key | Default | Meaning |\n|---|---|---|---|\n")
	for _, k := range knobs {
		key := "—"
		if k.Key != "" {
			key = "`" + k.Key + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", k.Name, key, k.Default, strings.ReplaceAll(k.Meaning, "|", `\|`))
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
	{EnvVar{"DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT", "OverlapScoreCredit", "1", "Credit per device-cached prefix block against the request's prefill (finite, >= 0; above 1 over-credits). 0 ignores prefix overlap and turns the KV-event index off.", "overlap_score_credit"},
		floatKnob(checkNonNegative, func(c *Config, v float64) { c.OverlapScoreCredit = v })},
	{EnvVar{"DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT_DECAY", "OverlapScoreCreditDecay", "0", "Shrinks the device credit of a worker by 1 / (1 + decay × its active prefill blocks above the least-loaded candidate's, per request block). 0 = off.", "overlap_score_credit_decay"},
		floatKnob(checkNonNegative, func(c *Config, v float64) { c.OverlapScoreCreditDecay = v })},
	{EnvVar{envPrefillLoadScale, "PrefillLoadScale", "1", "Weight of the adjusted prefill blocks in the cost.", "prefill_load_scale"},
		floatKnob(checkNonNegative, func(c *Config, v float64) { c.PrefillLoadScale = v })},
	{EnvVar{"DYN_ROUTER_DECODE_ACTIVE_REQUEST_WEIGHT", "DecodeActiveRequestWeight", "0", "Block-equivalents added per active request (experimental).", "decode_active_request_weight"},
		floatKnob(checkNonNegative, func(c *Config, v float64) { c.DecodeActiveRequestWeight = v })},
	{EnvVar{envOverlapWeight, "PrefillLoadScale", "unset", "Deprecated alias of DYN_ROUTER_PREFILL_LOAD_SCALE and wins over it; 0 also sets the overlap credit to 0.", ""}, nil},
	{EnvVar{envOverlapWeightOld, "PrefillLoadScale", "unset", "Older deprecated alias, read only when DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT is unset.", ""}, nil},
	{EnvVar{"DYN_ROUTER_TEMPERATURE", "RouterTemperature", "0", "0 picks the cheapest worker (random among ties); > 0 samples a softmax over normalised costs.", "router_temperature"},
		floatKnob(checkNonNegative, func(c *Config, v float64) { c.RouterTemperature = v })},
	{EnvVar{envUseKVEvents, "UseKVEvents", "true", "Index worker KV events; false keeps an approximate index learned from routing decisions.", "use_kv_events"}, nil},
	{EnvVar{envUseKVEventsAlias, "UseKVEvents", "unset", "Alias of DYN_ROUTER_USE_KV_EVENTS, read only when that is unset.", ""}, nil},
	{EnvVar{"DYN_ROUTER_REPLICA_SYNC", "ReplicaSync", "false", "Dynamo frontend setting: share active-request load across router replicas. The selection service turns replica sync on with --replica-sync-port / --replica-sync-peers.", "router_replica_sync"},
		boolKnob(func(c *Config, v bool) { c.ReplicaSync = v })},
	{EnvVar{"DYN_ROUTER_TRACK_ACTIVE_BLOCKS", "TrackActiveBlocks", "true", "Count in-flight KV blocks (decode load) in the cost.", "router_track_active_blocks"},
		boolKnob(func(c *Config, v bool) { c.TrackActiveBlocks = v })},
	{EnvVar{"DYN_ROUTER_TRACK_OUTPUT_BLOCKS", "TrackOutputBlocks", "false", "Add a placeholder block per block_size generated tokens, with decay toward the expected output length. Requires active-block tracking.", "router_track_output_blocks"},
		boolKnob(func(c *Config, v bool) { c.TrackOutputBlocks = v })},
	{EnvVar{"DYN_ROUTER_ASSUME_KV_REUSE", "AssumeKVReuse", "true", "Derive tracking hashes from content so identical prefixes share active blocks; false gives random hashes.", "router_assume_kv_reuse"},
		boolKnob(func(c *Config, v bool) { c.AssumeKVReuse = v })},
	{EnvVar{"DYN_ROUTER_TRACK_PREFILL_TOKENS", "TrackPrefillTokens", "true", "Count in-flight prompt tokens (prefill load) in the cost and the queue.", "router_track_prefill_tokens"},
		boolKnob(func(c *Config, v bool) { c.TrackPrefillTokens = v })},
	{EnvVar{"DYN_ROUTER_TRACKING_HASH", "TrackingHash", "public-xxh3-v1", "Tracking-hash algorithm: public-xxh3-v1 or keyed-xxh3-v1 (needs a key file and key id).", "router_tracking_hash"},
		choiceKnob([]string{string(TrackingPublic), string(TrackingKeyed)}, func(c *Config, v string) { c.TrackingHash = TrackingHash(v) })},
	{EnvVar{"DYN_ROUTER_TRACKING_KEY_FILE", "TrackingKeyFile", "unset", "Path of the 32-byte key for keyed-xxh3-v1.", "router_tracking_key_file"},
		stringKnob(func(c *Config, v string) { c.TrackingKeyFile = Some(v) })},
	{EnvVar{"DYN_ROUTER_TRACKING_KEY_ID", "TrackingKeyID", "unset", "Key epoch mixed into keyed-xxh3-v1 derivations.", "router_tracking_key_id"},
		stringKnob(func(c *Config, v string) { c.TrackingKeyID = Some(v) })},
	{EnvVar{"DYN_ROUTER_QUEUE_THRESHOLD", "QueueThreshold", "unset", "Queue requests while every worker's active prefill exceeds this fraction of its max_num_batched_tokens (>= 0). Unset = no queue.", "router_queue_threshold"},
		floatKnob(checkNonNegative, func(c *Config, v float64) { c.QueueThreshold = Some(v) })},
	{EnvVar{"DYN_ROUTER_POLICY_CONFIG", "PolicyConfig", "unset", "Path of Dynamo's policy-class / custom worker-selection YAML. Accepted but ignored: kvselect does not implement policy classes yet.", ""},
		stringKnob(func(c *Config, v string) { c.PolicyConfig = Some(v) })},
	{EnvVar{"DYN_ROUTER_WORKER_SELECTION_POLICY", "WorkerSelectionPolicy", "unset", "Custom worker-selection instance (\"default\" = built-in). Accepted but ignored unless \"default\": kvselect's policies are chosen with --policy (KVSELECT_POLICY).", ""},
		stringKnob(func(c *Config, v string) { c.WorkerSelectionPolicy = Some(v) })},
	{EnvVar{"DYN_ROUTER_PREFILL_POLICY", "PrefillPolicy", "unset", "Custom worker-selection instance for prefill workers. Accepted but ignored unless \"default\".", ""},
		stringKnob(func(c *Config, v string) { c.PrefillPolicy = Some(v) })},
	{EnvVar{"DYN_ROUTER_DECODE_POLICY", "DecodePolicy", "unset", "Custom worker-selection instance for decode workers. Accepted but ignored unless \"default\".", ""},
		stringKnob(func(c *Config, v string) { c.DecodePolicy = Some(v) })},
	{EnvVar{"DYN_ROUTER_CONDITIONAL_DISAGG", "ConditionalDisagg", "false", "For disaggregated requests (docs/disaggregation.md): let the decode worker prefill locally when the policy allows; false prefills every request of a model with a prefill pool remotely.", "conditional_disagg_enabled"},
		boolKnob(func(c *Config, v bool) { c.ConditionalDisagg = v })},
	{EnvVar{"DYN_ROUTER_CONDITIONAL_DISAGG_POLICY", "ConditionalDisaggPolicy", "isl_bounding", "isl_bounding, prefill_load (needs a prefill busy threshold or the queue threshold) or isl_or_load.", "conditional_disagg_policy"},
		choiceKnob([]string{string(DisaggISLBounding), string(DisaggPrefillLoad), string(DisaggISLOrLoad)}, func(c *Config, v string) { c.ConditionalDisaggPolicy = ConditionalDisaggPolicy(v) })},
	{EnvVar{"DYN_ROUTER_CONDITIONAL_DISAGG_EFF_ISL_THRESHOLD", "ConditionalDisaggEffISLThreshold", "2048", "isl_bounding: prefill locally only if the uncached prompt is below this many tokens.", "conditional_disagg_eff_isl_threshold"},
		intKnob(0, math.MaxInt, func(c *Config, v int) { c.ConditionalDisaggEffISLThreshold = v })},
	{EnvVar{"DYN_ROUTER_CONDITIONAL_DISAGG_EFF_ISL_RATIO_THRESHOLD", "ConditionalDisaggEffISLRatioThreshold", "0.7", "isl_bounding: ... and the uncached share of the prompt is below this fraction (0-1).", "conditional_disagg_eff_isl_ratio_threshold"},
		floatKnob(checkUnit, func(c *Config, v float64) { c.ConditionalDisaggEffISLRatioThreshold = v })},
	{EnvVar{"DYN_ROUTER_CONDITIONAL_DISAGG_PREFILL_BUSY_THRESHOLD", "ConditionalDisaggPrefillBusyThreshold", "unset", "prefill_load: busy line of the chosen prefill worker, as a fraction of max_num_batched_tokens; unset falls back to the queue threshold.", "conditional_disagg_prefill_busy_threshold"},
		floatKnob(checkNonNegative, func(c *Config, v float64) { c.ConditionalDisaggPrefillBusyThreshold = Some(v) })},
	{EnvVar{"DYN_ROUTER_CONDITIONAL_DISAGG_DECODE_BUSY_THRESHOLD", "ConditionalDisaggDecodeBusyThreshold", "unset", "Veto local prefill when the decode worker's load exceeds this fraction of its KV blocks; unset = no veto.", "conditional_disagg_decode_busy_threshold"},
		floatKnob(checkNonNegative, func(c *Config, v float64) { c.ConditionalDisaggDecodeBusyThreshold = Some(v) })},
	{EnvVar{"DYN_ROUTER_PREDICTED_TTL_SECS", "PredictedTTL", "unset", "Seconds a routing decision stays in the predict-on-route side index; unset = no side index. Requires KV events.", "router_predicted_ttl_secs"},
		secondsKnob(func(c *Config, v time.Duration) { c.PredictedTTL = Some(v) })},
	{EnvVar{"DYN_ROUTER_APPROXIMATE_CACHE_POLICY", "ApproximateCachePolicy", "ttl", "Approximate index retention: ttl, or lru (requires DYN_ROUTER_USE_KV_EVENTS=false).", "router_approximate_cache_policy"},
		choiceKnob([]string{string(ApproximateTTL), string(ApproximateLRU)}, func(c *Config, v string) { c.ApproximateCachePolicy = ApproximateCachePolicy(v) })},
	{EnvVar{"DYN_ROUTER_TTL_SECS", "RouterTTL", "120", "Seconds an approximate-index entry lives (ttl policy).", "router_ttl_secs"},
		secondsKnob(func(c *Config, v time.Duration) { c.RouterTTL = v })},
	{EnvVar{"DYN_ROUTER_EVENT_THREADS", "EventThreads", "4", "KV event writer lanes (>= 1; at most 256 are started): events of one worker rank stay in order; the selection service's --threads.", "router_event_threads"},
		intKnob(1, maxEventThreads, func(c *Config, v int) { c.EventThreads = v })},
	{EnvVar{"DYN_ROUTER_QUEUE_POLICY", "QueuePolicy", "fcfs", "Queue order: fcfs (priority boost in seconds), wspt (shortest uncached prefill first) or lcfs (testing).", "router_queue_policy"},
		choiceKnob([]string{string(QueueFCFS), string(QueueWSPT), string(QueueLCFS)}, func(c *Config, v string) { c.QueuePolicy = QueuePolicy(v) })},
	{EnvVar{"DYN_USE_REMOTE_INDEXER", "UseRemoteIndexer", "false", "Query a remote indexer instead of a local one. Accepted but ignored: kvselect always keeps its own index.", "use_remote_indexer"},
		boolKnob(func(c *Config, v bool) { c.UseRemoteIndexer = v })},
	{EnvVar{envSharedMultiplier, "SharedCacheMultiplier", "0", "Credit per block found only in the shared cache tier (0-1); 0.5 when DYN_SHARED_CACHE_TYPE is set and this is not.", "shared_cache_multiplier"},
		floatKnob(checkUnit, func(c *Config, v float64) { c.SharedCacheMultiplier = v })},
	{EnvVar{"DYN_SHARED_CACHE_TYPE", "SharedCacheType", "none", "Shared cache tier: none or hicache. Accepted but hicache is ignored: kvselect does not query a shared tier yet.", "shared_cache_type"},
		choiceKnob([]string{string(SharedCacheNone), string(SharedCacheHiCache)}, func(c *Config, v string) { c.SharedCacheType = SharedCacheType(v) })},
	{EnvVar{"DYN_ROUTER_HOST_CACHE_HIT_WEIGHT", "HostCacheHitWeight", "0.75", "Credit per host-memory continuation block (0-1).", "host_cache_hit_weight"},
		floatKnob(checkUnit, func(c *Config, v float64) { c.HostCacheHitWeight = v })},
	{EnvVar{"DYN_ROUTER_DISK_CACHE_HIT_WEIGHT", "DiskCacheHitWeight", "0.25", "Credit per disk or external continuation block (0-1).", "disk_cache_hit_weight"},
		floatKnob(checkUnit, func(c *Config, v float64) { c.DiskCacheHitWeight = v })},
	{EnvVar{"DYN_ROUTER_PREFILL_LOAD_MODEL", "PrefillLoadModel", "none", "none, or aic (decay the oldest prefill over its predicted duration; requires prefill-token tracking). aic is accepted but ignored: kvselect has no AIC model yet.", "router_prefill_load_model"},
		choiceKnob([]string{string(PrefillLoadNone), string(PrefillLoadAIC)}, func(c *Config, v string) { c.PrefillLoadModel = PrefillLoadModel(v) })},

	// Read outside KvRouterConfig in Dynamo (sequences, queue, frontend args).
	{EnvVar{"DYN_ROUTER_ACTIVE_REQUEST_EXPIRY_SECS", "ActiveRequestExpiry", "300", "Whole seconds after admission at which a booking whose free never arrived is reclaimed (> 0).", "active_request_expiry_secs"},
		wholeSecondsKnob(1, math.MaxInt64/int64(time.Second), func(c *Config, v time.Duration) { c.ActiveRequestExpiry = v })},
	{EnvVar{"DYN_ROUTER_OVERLAP_REFRESH_AFTER_SECS", "OverlapRefreshAfter", "10", "Re-query a queued request's overlaps if it waited at least this long (seconds); 0 = never.", "overlap_refresh_after_secs"},
		secondsKnob(func(c *Config, v time.Duration) { c.OverlapRefreshAfter = v })},
	{EnvVar{envSessionAffinityTTL, "SessionAffinityTTL", "unset", "Enable session affinity: idle seconds a session stays bound to its worker (1-31536000). Unset = off.", "session_affinity_ttl_secs"},
		wholeSecondsKnob(1, int64(MaxSessionAffinityTTL/time.Second), func(c *Config, v time.Duration) { c.SessionAffinityTTL = Some(v) })},
	{EnvVar{envSessionAffinityMod, "SessionAffinityMode", "hard", "hard: a bound session goes to its worker; soft: the binding is only a preference.", "session_affinity_mode"},
		choiceKnob([]string{string(AffinityHard), string(AffinitySoft)}, func(c *Config, v string) { c.SessionAffinityMode = SessionAffinityMode(v) })},
	{EnvVar{"DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD", "ActiveDecodeBlocksThreshold", "unset", "Busy when active decode blocks exceed this fraction (0-1) of the worker's KV blocks; busy workers are not selected. Unset or None = check off.", "active_decode_blocks_threshold"},
		nullableFloatKnob(checkUnit, func(c *Config, v float64) { c.ActiveDecodeBlocksThreshold = Some(v) })},
	{EnvVar{"DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD", "ActivePrefillTokensThreshold", "unset", "Busy when active prefill tokens exceed this count (>= 0). Unset or None = check off.", "active_prefill_tokens_threshold"},
		nullableIntKnob(func(c *Config, v int) { c.ActivePrefillTokensThreshold = Some(v) })},
	{EnvVar{"DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC", "ActivePrefillTokensThresholdFrac", "unset", "Busy when active prefill tokens exceed this fraction of max_num_batched_tokens (>= 0). Unset or None = check off.", "active_prefill_tokens_threshold_frac"},
		nullableFloatKnob(checkNonNegative, func(c *Config, v float64) { c.ActivePrefillTokensThresholdFrac = Some(v) })},
	{EnvVar{"DYN_ROUTER_MIN_INITIAL_WORKERS", "MinInitialWorkers", "0", "Workers required before the service reports ready (>= 0).", "min_initial_workers"},
		intKnob(0, math.MaxInt, func(c *Config, v int) { c.MinInitialWorkers = v })},

	// Accepted so existing deployments start, but they do not apply here.
	{EnvVar{"DYN_ROUTER_MODE", "", "unset", "Frontend routing mode. Ignored: the selection service always selects by KV cost (kv).", ""}, nil},
	{EnvVar{"DYN_KV_CACHE_BLOCK_SIZE", "", "unset", "Block-size override. Ignored: each worker registers its own block size.", ""}, nil},
	{EnvVar{"DYN_SERVE_INDEXER", "", "unset", "Frontend setting (serve the index over Dynamo's request plane). Ignored: kvselect serves its index at GET /dump.", ""}, nil},
	{EnvVar{"DYN_ADMISSION_CONTROL", "", "unset", "Removed from Dynamo. Ignored: use the DYN_ACTIVE_* thresholds.", ""}, nil},
	{EnvVar{"DYN_ENFORCE_DISAGG", "", "unset", "Deprecated and ignored by Dynamo. Ignored.", ""}, nil},
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
// It returns warnings for deprecated names, shadowed aliases and knobs kvselect
// accepts but does not act on. Every unparsable or out-of-range value is an
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
	r.derived(&c)
	r.ignored(c)
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

// derived applies defaults that depend on other variables.
func (r *reader) derived(c *Config) {
	// Dynamo's Python CLI defaults the shared-cache multiplier to 0.5 once a
	// shared cache type is chosen; config.rs reproduces that for the
	// environment path.
	if c.SharedCacheType != SharedCacheNone && !r.seen[envSharedMultiplier] {
		c.SharedCacheMultiplier = 0.5
	}
}

// ignored warns about settings Load accepted that do not change what kvselect
// does. Load starts from Default, so anything non-default here came from the
// environment or the file.
func (r *reader) ignored(c Config) {
	const notYet = "is accepted but ignored: kvselect does not implement"
	if v, ok := c.PolicyConfig.Get(); ok {
		r.warn("DYN_ROUTER_POLICY_CONFIG=%q %s policy classes or custom worker selection yet", v, notYet)
	}
	for _, p := range []struct {
		name string
		v    Optional[string]
	}{
		{"DYN_ROUTER_WORKER_SELECTION_POLICY", c.WorkerSelectionPolicy},
		{"DYN_ROUTER_PREFILL_POLICY", c.PrefillPolicy},
		{"DYN_ROUTER_DECODE_POLICY", c.DecodePolicy},
	} {
		if v, ok := p.v.Get(); ok && strings.TrimSpace(v) != "default" {
			r.warn("%s=%q %s Dynamo's custom worker-selection instances; choose a kvselect policy with --policy or KVSELECT_POLICY", p.name, v, notYet)
		}
	}
	if c.PrefillLoadModel == PrefillLoadAIC {
		r.warn("%s=aic %s the AIC prefill load model; prefill load counts in full until the first token", r.label("DYN_ROUTER_PREFILL_LOAD_MODEL"), notYet)
	}
	if c.SharedCacheType == SharedCacheHiCache {
		r.warn("%s=hicache %s shared-cache queries; no block is credited as shared", r.label("DYN_SHARED_CACHE_TYPE"), notYet)
	}
	if c.UseRemoteIndexer {
		r.warn("%s=true %s a remote indexer; the local index is used", r.label("DYN_USE_REMOTE_INDEXER"), notYet)
	}
	if c.ReplicaSync {
		r.warn("%s=true is a Dynamo frontend setting; the selection service enables replica sync with --replica-sync-port and --replica-sync-peers", r.label("DYN_ROUTER_REPLICA_SYNC"))
	}
	if r.seen[envSessionAffinityMod] && !c.SessionAffinityTTL.IsSet() {
		r.warn("%s has no effect: session affinity is off until %s is set", r.label(envSessionAffinityMod), envSessionAffinityTTL)
	}
	if raw, ok := r.get("DYN_ROUTER_MODE"); ok && strings.TrimSpace(raw) != "kv" {
		r.warn("DYN_ROUTER_MODE=%q is ignored: the selection service always selects by KV cost", raw)
	}
	if raw, ok := r.get("DYN_KV_CACHE_BLOCK_SIZE"); ok {
		r.warn("DYN_KV_CACHE_BLOCK_SIZE=%q is ignored: each worker registers its own block size", raw)
	}
	if raw, ok := r.get("DYN_SERVE_INDEXER"); ok && !isFalsey(raw) {
		r.warn("DYN_SERVE_INDEXER=%q is ignored: kvselect serves its index to peers at GET /dump", raw)
	}
	if _, ok := r.get("DYN_ADMISSION_CONTROL"); ok {
		r.warn("DYN_ADMISSION_CONTROL is ignored (removed from Dynamo); set DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD, DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD or DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC")
	}
	if _, ok := r.get("DYN_ENFORCE_DISAGG"); ok {
		r.warn("DYN_ENFORCE_DISAGG is ignored (deprecated in Dynamo)")
	}
}
