package routerconfig

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// TrackingHash selects how router-side tracking hashes are derived
// (router_tracking_hash). The names match selection/kvhash.
type TrackingHash string

const (
	TrackingPublic TrackingHash = "public-xxh3-v1"
	TrackingKeyed  TrackingHash = "keyed-xxh3-v1"
)

// PrefillLoadModel selects how in-flight prefill load decays: not at all until
// the first token (none), or over the prefill's predicted duration (aic).
type PrefillLoadModel string

const (
	PrefillLoadNone PrefillLoadModel = "none"
	PrefillLoadAIC  PrefillLoadModel = "aic"
)

// QueuePolicy orders the router queue: first come first served with a
// priority boost (fcfs), shortest uncached prefill first (wspt), or last come
// first served (lcfs, Dynamo's internal testing order).
type QueuePolicy string

const (
	QueueFCFS QueuePolicy = "fcfs"
	QueueWSPT QueuePolicy = "wspt"
	QueueLCFS QueuePolicy = "lcfs" // Dynamo: internal/testing only
)

// SharedCacheType names a cluster-shared cache tier queried during scoring.
type SharedCacheType string

const (
	SharedCacheNone    SharedCacheType = "none"
	SharedCacheHiCache SharedCacheType = "hicache"
)

// ApproximateCachePolicy is the retention policy of an approximate primary
// index, the one learned from routing decisions when KV events are off:
// entries expire after RouterTTL, or are evicted LRU.
type ApproximateCachePolicy string

const (
	ApproximateTTL ApproximateCachePolicy = "ttl"
	ApproximateLRU ApproximateCachePolicy = "lru"
)

// ConditionalDisaggPolicy decides when a decode worker may prefill locally
// instead of remotely (lib/kv-router/src/conditional_disagg.rs in Dynamo).
type ConditionalDisaggPolicy string

const (
	DisaggISLBounding ConditionalDisaggPolicy = "isl_bounding"
	DisaggPrefillLoad ConditionalDisaggPolicy = "prefill_load"
	DisaggISLOrLoad   ConditionalDisaggPolicy = "isl_or_load"
)

// SessionAffinityMode is how a session binding steers selection: hard (the
// bound worker, while it is schedulable) or soft (a preference).
type SessionAffinityMode string

const (
	AffinityHard SessionAffinityMode = "hard"
	AffinitySoft SessionAffinityMode = "soft"
)

// Limits from the sources named in the package doc.
const (
	// MaxSessionAffinityTTL is the upper bound of DYN_ROUTER_SESSION_AFFINITY_TTL_SECS
	// (31,536,000 s, one year, as Dynamo's Python frontend bounds it).
	MaxSessionAffinityTTL = 31_536_000 * time.Second
	// maxEventThreads: Dynamo's router_event_threads is a u32.
	maxEventThreads = math.MaxUint32
)

// Config is the router configuration: Dynamo's KvRouterConfig plus the
// selection-service settings Dynamo reads from the environment elsewhere.
// Field comments give Dynamo's key; EnvTable gives each field's variable,
// default and meaning. Knobs Dynamo models as Option are Optional here.
//
// Left out on purpose: skip_initial_worker_wait and serve_indexer (no
// environment variable; frontend-only), the SITA knobs (model-card only, no
// environment variable in the newest config.rs), and the legacy JetStream and
// tree-size knobs Dynamo keeps only for compatibility.
type Config struct {
	// Cost function (lib/kv-router/src/scheduling/selector/mod.rs in Dynamo).
	OverlapScoreCredit        float64 // overlap_score_credit
	OverlapScoreCreditDecay   float64 // overlap_score_credit_decay
	PrefillLoadScale          float64 // prefill_load_scale
	DecodeActiveRequestWeight float64 // decode_active_request_weight
	HostCacheHitWeight        float64 // host_cache_hit_weight
	DiskCacheHitWeight        float64 // disk_cache_hit_weight
	RouterTemperature         float64 // router_temperature

	// Index and load tracking.
	UseKVEvents            bool                    // use_kv_events
	ReplicaSync            bool                    // router_replica_sync
	TrackActiveBlocks      bool                    // router_track_active_blocks
	TrackOutputBlocks      bool                    // router_track_output_blocks
	AssumeKVReuse          bool                    // router_assume_kv_reuse
	TrackPrefillTokens     bool                    // router_track_prefill_tokens
	TrackingHash           TrackingHash            // router_tracking_hash
	TrackingKeyFile        Optional[string]        // router_tracking_key_file
	TrackingKeyID          Optional[string]        // router_tracking_key_id
	PrefillLoadModel       PrefillLoadModel        // router_prefill_load_model
	RouterTTL              time.Duration           // router_ttl_secs
	ApproximateCachePolicy ApproximateCachePolicy  // router_approximate_cache_policy
	PredictedTTL           Optional[time.Duration] // router_predicted_ttl_secs
	EventThreads           int                     // router_event_threads
	UseRemoteIndexer       bool                    // use_remote_indexer
	SharedCacheMultiplier  float64                 // shared_cache_multiplier
	SharedCacheType        SharedCacheType         // shared_cache_type

	// Queueing.
	QueueThreshold      Optional[float64] // router_queue_threshold; unset = no queue
	QueuePolicy         QueuePolicy       // router_queue_policy
	OverlapRefreshAfter time.Duration     // DYN_ROUTER_OVERLAP_REFRESH_AFTER_SECS; 0 = off

	// Policy plug-ins. kvselect implements none: Load refuses any value but
	// "default" (the worker-selection instances) and any policy config.
	PolicyConfig          Optional[string] // router_policy_config (a YAML path)
	WorkerSelectionPolicy Optional[string] // DYN_ROUTER_WORKER_SELECTION_POLICY
	PrefillPolicy         Optional[string] // router_prefill_policy
	DecodePolicy          Optional[string] // router_decode_policy

	// Conditional disaggregation.
	ConditionalDisagg                     bool                    // conditional_disagg_enabled
	ConditionalDisaggPolicy               ConditionalDisaggPolicy // conditional_disagg_policy
	ConditionalDisaggEffISLThreshold      int                     // conditional_disagg_eff_isl_threshold (tokens)
	ConditionalDisaggEffISLRatioThreshold float64                 // conditional_disagg_eff_isl_ratio_threshold
	ConditionalDisaggPrefillBusyThreshold Optional[float64]       // conditional_disagg_prefill_busy_threshold
	ConditionalDisaggDecodeBusyThreshold  Optional[float64]       // conditional_disagg_decode_busy_threshold

	// Lifecycle, affinity, busy rejection, startup.
	ActiveRequestExpiry              time.Duration           // DYN_ROUTER_ACTIVE_REQUEST_EXPIRY_SECS
	SessionAffinityTTL               Optional[time.Duration] // unset = affinity off
	SessionAffinityMode              SessionAffinityMode
	ActiveDecodeBlocksThreshold      Optional[float64] // fraction of total KV blocks
	ActivePrefillTokensThreshold     Optional[int]     // absolute tokens
	ActivePrefillTokensThresholdFrac Optional[float64] // fraction of max_num_batched_tokens
	MinInitialWorkers                int
}

// Default returns Dynamo's defaults (newest config.rs; see the package doc).
func Default() Config {
	return Config{
		OverlapScoreCredit:        1.0,
		OverlapScoreCreditDecay:   0,
		PrefillLoadScale:          1.0,
		DecodeActiveRequestWeight: 0,
		HostCacheHitWeight:        0.75,
		DiskCacheHitWeight:        0.25,
		RouterTemperature:         0,

		UseKVEvents:            true,
		TrackActiveBlocks:      true,
		AssumeKVReuse:          true,
		TrackPrefillTokens:     true,
		TrackingHash:           TrackingPublic,
		PrefillLoadModel:       PrefillLoadNone,
		RouterTTL:              120 * time.Second,
		ApproximateCachePolicy: ApproximateTTL,
		EventThreads:           4,
		SharedCacheType:        SharedCacheNone,

		// router_queue_threshold: None in the newest config.rs (16.0 in one
		// intermediate release, commit 0243c51b).
		QueuePolicy:         QueueFCFS,
		OverlapRefreshAfter: 10 * time.Second,

		ConditionalDisaggPolicy:               DisaggISLBounding,
		ConditionalDisaggEffISLThreshold:      2048,
		ConditionalDisaggEffISLRatioThreshold: 0.7,

		ActiveRequestExpiry: 300 * time.Second,
		// Hard is the standalone service's mode and the Python
		// frontend's default.
		SessionAffinityMode: AffinityHard,
	}
}

// QueueingEnabled reports whether the router queue is on: only when
// router_queue_threshold is set. Dynamo can also enable it
// through policy classes in router_policy_config, which kvselect does not
// implement and Load refuses.
func (c Config) QueueingEnabled() bool { return c.QueueThreshold.IsSet() }

// LoadAware returns c with Dynamo's --load-aware preset applied: no prefix
// credit and no events, random tracking hashes, active-block
// tracking on, no shared cache.
func (c Config) LoadAware() Config {
	c.OverlapScoreCredit = 0
	c.UseKVEvents = false
	c.AssumeKVReuse = false
	c.TrackActiveBlocks = true
	c.SharedCacheType = SharedCacheNone
	c.SharedCacheMultiplier = 0
	return c
}

// Validate checks every value and every cross-field rule of Dynamo's
// KvRouterConfig and selection service settings, and reports all violations at once (errors.Join); each
// wraps ErrInvalid. It does not read the tracking key file: the server does,
// and selection/kvhash checks the key when it builds the tracker.
func (c Config) Validate() error {
	var errs []error
	errs = append(errs, c.validateWeights()...)
	errs = append(errs, c.validateCounts()...)
	errs = append(errs, c.validateChoices()...)
	errs = append(errs, c.validateCombinations()...)
	errs = append(errs, c.validateTracking()...)
	return errors.Join(errs...)
}

// validateWeights checks the weights, fractions and thresholds
// (config.rs KvRouterConfig::validate).
func (c Config) validateWeights() []error {
	var errs []error
	nonNeg := func(name string, v float64) {
		if r := checkNonNegative(v); r != "" {
			errs = append(errs, floatError(name, v, r))
		}
	}
	unit := func(name string, v float64) {
		if r := checkUnit(v); r != "" {
			errs = append(errs, floatError(name, v, r))
		}
	}
	optNonNeg := func(name string, o Optional[float64]) {
		if v, ok := o.Get(); ok {
			nonNeg(name, v)
		}
	}
	nonNeg("overlap_score_credit", c.OverlapScoreCredit)
	nonNeg("overlap_score_credit_decay", c.OverlapScoreCreditDecay)
	nonNeg("prefill_load_scale", c.PrefillLoadScale)
	nonNeg("decode_active_request_weight", c.DecodeActiveRequestWeight)
	unit("host_cache_hit_weight", c.HostCacheHitWeight)
	unit("disk_cache_hit_weight", c.DiskCacheHitWeight)
	nonNeg("router_temperature", c.RouterTemperature)
	unit("shared_cache_multiplier", c.SharedCacheMultiplier)
	optNonNeg("router_queue_threshold", c.QueueThreshold)
	unit("conditional_disagg_eff_isl_ratio_threshold", c.ConditionalDisaggEffISLRatioThreshold)
	optNonNeg("conditional_disagg_prefill_busy_threshold", c.ConditionalDisaggPrefillBusyThreshold)
	optNonNeg("conditional_disagg_decode_busy_threshold", c.ConditionalDisaggDecodeBusyThreshold)
	if v, ok := c.ActiveDecodeBlocksThreshold.Get(); ok {
		unit("active_decode_blocks_threshold", v)
	}
	optNonNeg("active_prefill_tokens_threshold_frac", c.ActivePrefillTokensThresholdFrac)
	return errs
}

// validateCounts checks the token counts, thread and worker counts and
// durations.
func (c Config) validateCounts() []error {
	var errs []error
	add := func(err error) { errs = append(errs, err) }
	if v, ok := c.ActivePrefillTokensThreshold.Get(); ok && v < 0 {
		add(&Error{Name: "active_prefill_tokens_threshold", Value: fmt.Sprint(v), Reason: "must be >= 0"})
	}
	if c.ConditionalDisaggEffISLThreshold < 0 {
		add(&Error{Name: "conditional_disagg_eff_isl_threshold", Value: fmt.Sprint(c.ConditionalDisaggEffISLThreshold), Reason: "must be >= 0"})
	}
	if c.EventThreads < 1 || int64(c.EventThreads) > maxEventThreads {
		add(&Error{Name: "router_event_threads", Value: fmt.Sprint(c.EventThreads), Reason: "must be between 1 and 4294967295"})
	}
	if c.MinInitialWorkers < 0 {
		add(&Error{Name: "min_initial_workers", Value: fmt.Sprint(c.MinInitialWorkers), Reason: "must be >= 0"})
	}
	if c.RouterTTL < 0 {
		add(secondsError("router_ttl_secs", c.RouterTTL, "must be >= 0"))
	}
	if d, ok := c.PredictedTTL.Get(); ok && d < 0 {
		add(secondsError("router_predicted_ttl_secs", d, "must be >= 0"))
	}
	if c.ActiveRequestExpiry <= 0 {
		add(secondsError("active_request_expiry_secs", c.ActiveRequestExpiry, "must be > 0"))
	}
	if c.OverlapRefreshAfter < 0 {
		add(secondsError("overlap_refresh_after_secs", c.OverlapRefreshAfter, "must be >= 0 (0 disables refresh)"))
	}
	if d, ok := c.SessionAffinityTTL.Get(); ok && (d < time.Second || d > MaxSessionAffinityTTL) {
		add(secondsError("session_affinity_ttl_secs", d, "must be between 1 and 31536000 seconds"))
	}
	return errs
}

// validateChoices checks that every enumerated setting names a known value.
func (c Config) validateChoices() []error {
	var errs []error
	for _, e := range []struct {
		name, value string
		ok          bool
		want        string
	}{
		{"router_tracking_hash", string(c.TrackingHash), c.TrackingHash == TrackingPublic || c.TrackingHash == TrackingKeyed, "public-xxh3-v1 or keyed-xxh3-v1"},
		{"router_prefill_load_model", string(c.PrefillLoadModel), c.PrefillLoadModel == PrefillLoadNone || c.PrefillLoadModel == PrefillLoadAIC, "none or aic"},
		{"router_approximate_cache_policy", string(c.ApproximateCachePolicy), c.ApproximateCachePolicy == ApproximateTTL || c.ApproximateCachePolicy == ApproximateLRU, "ttl or lru"},
		{"router_queue_policy", string(c.QueuePolicy), c.QueuePolicy == QueueFCFS || c.QueuePolicy == QueueWSPT || c.QueuePolicy == QueueLCFS, "fcfs, wspt or lcfs"},
		{"shared_cache_type", string(c.SharedCacheType), c.SharedCacheType == SharedCacheNone || c.SharedCacheType == SharedCacheHiCache, "none or hicache"},
		{"conditional_disagg_policy", string(c.ConditionalDisaggPolicy), c.ConditionalDisaggPolicy == DisaggISLBounding || c.ConditionalDisaggPolicy == DisaggPrefillLoad || c.ConditionalDisaggPolicy == DisaggISLOrLoad, "isl_bounding, prefill_load or isl_or_load"},
		{"session_affinity_mode", string(c.SessionAffinityMode), c.SessionAffinityMode == AffinityHard || c.SessionAffinityMode == AffinitySoft, "hard or soft"},
	} {
		if !e.ok {
			errs = append(errs, stringError(e.name, e.value, "want "+e.want))
		}
	}
	return errs
}

// validateCombinations checks the cross-field rules (config.rs
// validate_kv_router_config).
func (c Config) validateCombinations() []error {
	var errs []error
	add := func(err error) { errs = append(errs, err) }
	if c.TrackOutputBlocks && !c.TrackActiveBlocks {
		add(boolError("router_track_output_blocks", true, "requires router_track_active_blocks=true"))
	}
	if c.PrefillLoadModel == PrefillLoadAIC && !c.TrackPrefillTokens {
		add(stringError("router_prefill_load_model", string(c.PrefillLoadModel), "requires router_track_prefill_tokens=true"))
	}
	if d, ok := c.PredictedTTL.Get(); ok && !c.UseKVEvents {
		add(secondsError("router_predicted_ttl_secs", d, "requires use_kv_events=true (the predict-on-route side index sits beside an event-driven primary)"))
	}
	if c.ApproximateCachePolicy == ApproximateLRU && c.UseKVEvents {
		add(stringError("router_approximate_cache_policy", string(c.ApproximateCachePolicy), "requires use_kv_events=false; the side index beside an event-driven primary is TTL-only"))
	}
	if c.ConditionalDisagg && (c.ConditionalDisaggPolicy == DisaggPrefillLoad || c.ConditionalDisaggPolicy == DisaggISLOrLoad) &&
		!c.ConditionalDisaggPrefillBusyThreshold.IsSet() && !c.QueueThreshold.IsSet() {
		add(stringError("conditional_disagg_policy", string(c.ConditionalDisaggPolicy), "needs conditional_disagg_prefill_busy_threshold or router_queue_threshold"))
	}
	return errs
}

// validateTracking mirrors Dynamo's validate_tracking_hash_options and
// selection/kvhash.NewTracker: public mode takes no key material, keyed mode
// needs a key file and a non-blank key id.
func (c Config) validateTracking() []error {
	file, hasFile := c.TrackingKeyFile.Get()
	id, hasID := c.TrackingKeyID.Get()
	var errs []error
	switch c.TrackingHash {
	case TrackingPublic:
		if hasFile {
			errs = append(errs, stringError("router_tracking_key_file", file, "public-xxh3-v1 takes no key file"))
		}
		if hasID {
			errs = append(errs, stringError("router_tracking_key_id", id, "public-xxh3-v1 takes no key id"))
		}
	case TrackingKeyed:
		if !hasFile || strings.TrimSpace(file) == "" {
			errs = append(errs, stringError("router_tracking_hash", string(c.TrackingHash), "needs router_tracking_key_file (a 32-byte key)"))
		}
		if !hasID || strings.TrimSpace(id) == "" {
			errs = append(errs, stringError("router_tracking_hash", string(c.TrackingHash), "needs a non-blank router_tracking_key_id"))
		}
	}
	return errs
}
