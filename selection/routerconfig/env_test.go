package routerconfig

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

func env(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func mustFromEnv(t *testing.T, kv ...string) (Config, []string) {
	t.Helper()
	c, warnings, err := FromEnv(env(kv...))
	if err != nil {
		t.Fatalf("FromEnv(%q): %v", kv, err)
	}
	return c, warnings
}

func TestDefaultsMatchDynamo(t *testing.T) {
	// Values from config.rs KvRouterConfig::default (newest), conditional_disagg.rs,
	// multi_worker.rs and overlap_refresh.rs; see the package doc.
	c := Default()
	for _, tc := range []struct {
		name      string
		got, want any
	}{
		{"overlap_score_credit", c.OverlapScoreCredit, 1.0},
		{"overlap_score_credit_decay", c.OverlapScoreCreditDecay, 0.0},
		{"prefill_load_scale", c.PrefillLoadScale, 1.0},
		{"decode_active_request_weight", c.DecodeActiveRequestWeight, 0.0},
		{"host_cache_hit_weight", c.HostCacheHitWeight, 0.75},
		{"disk_cache_hit_weight", c.DiskCacheHitWeight, 0.25},
		{"router_temperature", c.RouterTemperature, 0.0},
		{"use_kv_events", c.UseKVEvents, true},
		{"router_replica_sync", c.ReplicaSync, false},
		{"router_track_active_blocks", c.TrackActiveBlocks, true},
		{"router_track_output_blocks", c.TrackOutputBlocks, false},
		{"router_assume_kv_reuse", c.AssumeKVReuse, true},
		{"router_track_prefill_tokens", c.TrackPrefillTokens, true},
		{"router_tracking_hash", c.TrackingHash, TrackingPublic},
		{"router_prefill_load_model", c.PrefillLoadModel, PrefillLoadNone},
		{"router_ttl_secs", c.RouterTTL, 120 * time.Second},
		{"router_approximate_cache_policy", c.ApproximateCachePolicy, ApproximateTTL},
		{"router_predicted_ttl_secs", c.PredictedTTL.IsSet(), false},
		{"router_event_threads", c.EventThreads, 4},
		{"shared_cache_multiplier", c.SharedCacheMultiplier, 0.0},
		{"shared_cache_type", c.SharedCacheType, SharedCacheNone},
		{"router_queue_threshold", c.QueueThreshold.IsSet(), false},
		{"router_queue_policy", c.QueuePolicy, QueueFCFS},
		{"overlap refresh", c.OverlapRefreshAfter, 10 * time.Second},
		{"conditional_disagg_enabled", c.ConditionalDisagg, false},
		{"conditional_disagg_policy", c.ConditionalDisaggPolicy, DisaggISLBounding},
		{"conditional_disagg_eff_isl_threshold", c.ConditionalDisaggEffISLThreshold, 2048},
		{"conditional_disagg_eff_isl_ratio_threshold", c.ConditionalDisaggEffISLRatioThreshold, 0.7},
		{"conditional_disagg_prefill_busy_threshold", c.ConditionalDisaggPrefillBusyThreshold.IsSet(), false},
		{"conditional_disagg_decode_busy_threshold", c.ConditionalDisaggDecodeBusyThreshold.IsSet(), false},
		{"active request expiry", c.ActiveRequestExpiry, 300 * time.Second},
		{"session affinity ttl", c.SessionAffinityTTL.IsSet(), false},
		{"session affinity mode", c.SessionAffinityMode, AffinityHard},
		{"busy decode blocks", c.ActiveDecodeBlocksThreshold.IsSet(), false},
		{"busy prefill tokens", c.ActivePrefillTokensThreshold.IsSet(), false},
		{"busy prefill frac", c.ActivePrefillTokensThresholdFrac.IsSet(), false},
		{"min initial workers", c.MinInitialWorkers, 0},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("Default().Validate() = %v", err)
	}
}

func TestFromEnvWithEmptyEnvironmentIsDefault(t *testing.T) {
	c, warnings := mustFromEnv(t)
	if c != Default() {
		t.Fatalf("FromEnv(empty) = %+v, want Default()", c)
	}
	if len(warnings) != 0 {
		t.Fatalf("warnings = %q, want none", warnings)
	}
}

func TestFromEnvReadsEveryKnob(t *testing.T) {
	c, _ := mustFromEnv(t,
		"DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT", "0.25",
		"DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT_DECAY", "0.75",
		"DYN_ROUTER_PREFILL_LOAD_SCALE", "2.5",
		"DYN_ROUTER_DECODE_ACTIVE_REQUEST_WEIGHT", "32",
		"DYN_ROUTER_TEMPERATURE", "0.7",
		"DYN_ROUTER_USE_KV_EVENTS", "false",
		"DYN_ROUTER_REPLICA_SYNC", "yes",
		"DYN_ROUTER_TRACK_ACTIVE_BLOCKS", "0",
		"DYN_ROUTER_TRACK_OUTPUT_BLOCKS", "on",
		"DYN_ROUTER_ASSUME_KV_REUSE", "false",
		"DYN_ROUTER_TRACK_PREFILL_TOKENS", "false",
		"DYN_ROUTER_TRACKING_HASH", "keyed-xxh3-v1",
		"DYN_ROUTER_TRACKING_KEY_FILE", "/run/secrets/dynamo/tracking-key",
		"DYN_ROUTER_TRACKING_KEY_ID", "2026-01",
		"DYN_ROUTER_QUEUE_THRESHOLD", "4.5",
		// The values kvselect implements; TestLoadRefusesWhatKvselectDoesNotImplement has the others.
		"DYN_ROUTER_WORKER_SELECTION_POLICY", "default",
		"DYN_ROUTER_PREFILL_POLICY", "default",
		"DYN_ROUTER_DECODE_POLICY", "default",
		"DYN_ROUTER_CONDITIONAL_DISAGG", "true",
		"DYN_ROUTER_CONDITIONAL_DISAGG_POLICY", "isl_or_load",
		"DYN_ROUTER_CONDITIONAL_DISAGG_EFF_ISL_THRESHOLD", "4096",
		"DYN_ROUTER_CONDITIONAL_DISAGG_EFF_ISL_RATIO_THRESHOLD", "0.5",
		"DYN_ROUTER_CONDITIONAL_DISAGG_PREFILL_BUSY_THRESHOLD", "0.9",
		"DYN_ROUTER_CONDITIONAL_DISAGG_DECODE_BUSY_THRESHOLD", "0.8",
		"DYN_ROUTER_PREDICTED_TTL_SECS", "60",
		"DYN_ROUTER_APPROXIMATE_CACHE_POLICY", "lru",
		"DYN_ROUTER_TTL_SECS", "300",
		"DYN_ROUTER_EVENT_THREADS", "8",
		"DYN_ROUTER_QUEUE_POLICY", "wspt",
		"DYN_USE_REMOTE_INDEXER", "false",
		"DYN_SHARED_CACHE_MULTIPLIER", "0",
		"DYN_SHARED_CACHE_TYPE", "none",
		"DYN_ROUTER_HOST_CACHE_HIT_WEIGHT", "0.6",
		"DYN_ROUTER_DISK_CACHE_HIT_WEIGHT", "0.3",
		"DYN_ROUTER_PREFILL_LOAD_MODEL", "none",
		"DYN_ROUTER_ACTIVE_REQUEST_EXPIRY_SECS", "600",
		"DYN_ROUTER_OVERLAP_REFRESH_AFTER_SECS", "2.5",
		"DYN_ROUTER_SESSION_AFFINITY_TTL_SECS", "3600",
		"DYN_ROUTER_SESSION_AFFINITY_MODE", "soft",
		"DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD", "0.95",
		"DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD", "10000",
		"DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC", "1.5",
		"DYN_ROUTER_MIN_INITIAL_WORKERS", "3",
	)
	want := Config{
		OverlapScoreCredit:                    0.25,
		OverlapScoreCreditDecay:               0.75,
		PrefillLoadScale:                      2.5,
		DecodeActiveRequestWeight:             32,
		HostCacheHitWeight:                    0.6,
		DiskCacheHitWeight:                    0.3,
		RouterTemperature:                     0.7,
		UseKVEvents:                           false,
		ReplicaSync:                           true,
		TrackActiveBlocks:                     false,
		TrackOutputBlocks:                     true,
		AssumeKVReuse:                         false,
		TrackPrefillTokens:                    false,
		TrackingHash:                          TrackingKeyed,
		TrackingKeyFile:                       Some("/run/secrets/dynamo/tracking-key"),
		TrackingKeyID:                         Some("2026-01"),
		PrefillLoadModel:                      PrefillLoadNone,
		RouterTTL:                             300 * time.Second,
		ApproximateCachePolicy:                ApproximateLRU,
		PredictedTTL:                          Some(60 * time.Second),
		EventThreads:                          8,
		SharedCacheType:                       SharedCacheNone,
		QueueThreshold:                        Some(4.5),
		QueuePolicy:                           QueueWSPT,
		OverlapRefreshAfter:                   2500 * time.Millisecond,
		WorkerSelectionPolicy:                 Some("default"),
		PrefillPolicy:                         Some("default"),
		DecodePolicy:                          Some("default"),
		ConditionalDisagg:                     true,
		ConditionalDisaggPolicy:               DisaggISLOrLoad,
		ConditionalDisaggEffISLThreshold:      4096,
		ConditionalDisaggEffISLRatioThreshold: 0.5,
		ConditionalDisaggPrefillBusyThreshold: Some(0.9),
		ConditionalDisaggDecodeBusyThreshold:  Some(0.8),
		ActiveRequestExpiry:                   600 * time.Second,
		SessionAffinityTTL:                    Some(time.Hour),
		SessionAffinityMode:                   AffinitySoft,
		ActiveDecodeBlocksThreshold:           Some(0.95),
		ActivePrefillTokensThreshold:          Some(10000),
		ActivePrefillTokensThresholdFrac:      Some(1.5),
		MinInitialWorkers:                     3,
	}
	if c != want {
		t.Fatalf("FromEnv:\n got %+v\nwant %+v", c, want)
	}
}

func TestFromEnvAcceptsDynamoBooleanVocabulary(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want bool
	}{
		{"1", true}, {"true", true}, {"TRUE", true}, {"Yes", true}, {"on", true}, {" true ", true}, {"\tyes\n", true},
		{"0", false}, {"false", false}, {"False", false}, {"NO", false}, {"off", false}, {" off ", false},
	} {
		t.Run(tc.raw, func(t *testing.T) {
			// Flip the default so both directions are observable.
			name, def := "DYN_ROUTER_TRACK_OUTPUT_BLOCKS", false
			if !tc.want {
				name, def = "DYN_ROUTER_TRACK_PREFILL_TOKENS", true
			}
			c, _ := mustFromEnv(t, name, tc.raw)
			got := c.TrackOutputBlocks
			if name == "DYN_ROUTER_TRACK_PREFILL_TOKENS" {
				got = c.TrackPrefillTokens
			}
			if got != tc.want || got == def {
				t.Fatalf("%s=%q gave %v, want %v", name, tc.raw, got, tc.want)
			}
		})
	}
}

func TestFromEnvRejectsUnparsableAndOutOfRangeValues(t *testing.T) {
	// Dynamo ignores most of these and keeps the default; kvselect refuses
	// them (package doc).
	for _, tc := range []struct{ name, raw, want string }{
		{"DYN_ROUTER_TEMPERATURE", "abc", `DYN_ROUTER_TEMPERATURE="abc": not a number`},
		{"DYN_ROUTER_TEMPERATURE", "warm", `DYN_ROUTER_TEMPERATURE="warm": not a number`},
		{"DYN_ROUTER_TEMPERATURE", "-1", `DYN_ROUTER_TEMPERATURE="-1": must be a finite number >= 0`},
		{"DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT", "NaN", `DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT="NaN": must be a finite number >= 0`},
		{"DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT", "inf", `must be a finite number >= 0`},
		{"DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT", "1e400", `must be a finite number >= 0`},
		{"DYN_ROUTER_DECODE_ACTIVE_REQUEST_WEIGHT", "-0.5", `must be a finite number >= 0`},
		{"DYN_ROUTER_HOST_CACHE_HIT_WEIGHT", "1.5", `DYN_ROUTER_HOST_CACHE_HIT_WEIGHT="1.5": must be a finite number between 0 and 1`},
		{"DYN_SHARED_CACHE_MULTIPLIER", "-0.1", `between 0 and 1`},
		{"DYN_ROUTER_CONDITIONAL_DISAGG_EFF_ISL_RATIO_THRESHOLD", "1.1", `between 0 and 1`},
		{"DYN_ROUTER_TRACK_ACTIVE_BLOCKS", "sometimes", `DYN_ROUTER_TRACK_ACTIVE_BLOCKS="sometimes": not a boolean`},
		{"DYN_ROUTER_USE_KV_EVENTS", "y", `DYN_ROUTER_USE_KV_EVENTS="y": not a boolean`},
		{"DYN_USE_KV_EVENTS", "2", `DYN_USE_KV_EVENTS="2": not a boolean`},
		{"DYN_ROUTER_TRACKING_HASH", "mystery", `DYN_ROUTER_TRACKING_HASH="mystery": want public-xxh3-v1, keyed-xxh3-v1`},
		{"DYN_ROUTER_APPROXIMATE_CACHE_POLICY", "clock", `want ttl, lru`},
		{"DYN_ROUTER_QUEUE_POLICY", "random", `want fcfs, wspt, lcfs`},
		{"DYN_ROUTER_QUEUE_POLICY", "FCFS", `want fcfs, wspt, lcfs`},
		{"DYN_SHARED_CACHE_TYPE", "rdma", `want none, hicache`},
		{"DYN_ROUTER_PREFILL_LOAD_MODEL", "fast", `want none, aic`},
		{"DYN_ROUTER_CONDITIONAL_DISAGG_POLICY", "always", `DYN_ROUTER_CONDITIONAL_DISAGG_POLICY="always": want isl_bounding`},
		{"DYN_ROUTER_SESSION_AFFINITY_MODE", "sticky", `want hard, soft`},
		{"DYN_ROUTER_EVENT_THREADS", "0", `DYN_ROUTER_EVENT_THREADS="0": must be >= 1`},
		{"DYN_ROUTER_EVENT_THREADS", "2.5", `not a whole number`},
		{"DYN_ROUTER_QUEUE_THRESHOLD", "-1", `DYN_ROUTER_QUEUE_THRESHOLD="-1": must be a finite number >= 0`},
		{"DYN_ROUTER_TTL_SECS", "-5", `must be a finite number >= 0`},
		{"DYN_ROUTER_TTL_SECS", "1e300", `too large for a duration`},
		{"DYN_ROUTER_PREDICTED_TTL_SECS", "soon", `not a number`},
		{"DYN_ROUTER_ACTIVE_REQUEST_EXPIRY_SECS", "0", `DYN_ROUTER_ACTIVE_REQUEST_EXPIRY_SECS="0": must be >= 1`},
		{"DYN_ROUTER_ACTIVE_REQUEST_EXPIRY_SECS", "300.5", `not a whole number`},
		{"DYN_ROUTER_OVERLAP_REFRESH_AFTER_SECS", "-1", `must be a finite number >= 0`},
		{"DYN_ROUTER_OVERLAP_REFRESH_AFTER_SECS", "inf", `must be a finite number >= 0`},
		{"DYN_ROUTER_SESSION_AFFINITY_TTL_SECS", "0", `must be >= 1`},
		{"DYN_ROUTER_SESSION_AFFINITY_TTL_SECS", "31536001", `DYN_ROUTER_SESSION_AFFINITY_TTL_SECS="31536001": must be <= 31536000`},
		{"DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD", "1.2", `between 0 and 1`},
		{"DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD", "-3", `must be >= 0`},
		{"DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC", "NaN", `must be a finite number >= 0`},
		{"DYN_ROUTER_MIN_INITIAL_WORKERS", "-1", `must be >= 0`},
		{"DYN_ROUTER_MIN_INITIAL_WORKERS", "two", `DYN_ROUTER_MIN_INITIAL_WORKERS="two": not a whole number`},
		{"DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT", "heavy", `DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT="heavy": not a number`},
		{"DYN_OVERLAP_SCORE_WEIGHT", "-2", `must be a finite number >= 0`},
	} {
		t.Run(tc.name+"="+tc.raw, func(t *testing.T) {
			c, _, err := FromEnv(env(tc.name, tc.raw))
			if err == nil {
				t.Fatalf("no error; config %+v", c)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			var e *Error
			if !errors.As(err, &e) || e.Name != tc.name {
				t.Fatalf("error %v does not name %s", err, tc.name)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
			if c != (Config{}) {
				t.Fatalf("config on error = %+v, want zero", c)
			}
		})
	}
}

func TestFromEnvReportsEveryBadVariableAtOnce(t *testing.T) {
	_, _, err := FromEnv(env(
		"DYN_ROUTER_TEMPERATURE", "abc",
		"DYN_ROUTER_QUEUE_POLICY", "lifo",
		"DYN_ROUTER_TRACK_ACTIVE_BLOCKS", "maybe",
	))
	for _, name := range []string{"DYN_ROUTER_TEMPERATURE", "DYN_ROUTER_QUEUE_POLICY", "DYN_ROUTER_TRACK_ACTIVE_BLOCKS"} {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("error %v does not mention %s", err, name)
		}
	}
}

func TestFromEnvTreatsBlankValuesAsUnset(t *testing.T) {
	var kv []string
	for _, v := range EnvTable() {
		kv = append(kv, v.Name, "  ")
	}
	c, warnings := mustFromEnv(t, kv...)
	if c != Default() || len(warnings) != 0 {
		t.Fatalf("blank variables gave %+v, warnings %q; want Default() and none", c, warnings)
	}
}

func TestFromEnvDeprecatedOverlapWeightPrecedence(t *testing.T) {
	// Cases of config.rs dynamo_env_config_preserves_deprecated_alias_precedence,
	// plus the warnings kvselect adds.
	for _, tc := range []struct {
		name         string
		kv           []string
		credit       float64
		scale        float64
		warningsHave []string
	}{
		{"canonical only", []string{"DYN_ROUTER_PREFILL_LOAD_SCALE", "2"}, 1, 2, nil},
		{"new alias wins over canonical and old alias", []string{
			"DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT", "0.25",
			"DYN_ROUTER_PREFILL_LOAD_SCALE", "2",
			"DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT", "3",
			"DYN_OVERLAP_SCORE_WEIGHT", "4",
		}, 0.25, 3, []string{
			"DYN_OVERLAP_SCORE_WEIGHT is ignored",
			"DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT is deprecated",
			"DYN_ROUTER_PREFILL_LOAD_SCALE is ignored",
		}},
		{"old alias read when new one unset", []string{"DYN_OVERLAP_SCORE_WEIGHT", "4"}, 1, 4, []string{"DYN_OVERLAP_SCORE_WEIGHT is deprecated"}},
		{"weight zero also zeroes the credit", []string{
			"DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT", "0.75",
			"DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT", "0",
		}, 0, 0, []string{"DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT is deprecated"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, warnings := mustFromEnv(t, tc.kv...)
			if c.OverlapScoreCredit != tc.credit || c.PrefillLoadScale != tc.scale {
				t.Fatalf("credit, scale = %v, %v; want %v, %v", c.OverlapScoreCredit, c.PrefillLoadScale, tc.credit, tc.scale)
			}
			assertWarnings(t, warnings, tc.warningsHave)
			if len(warnings) != len(tc.warningsHave) {
				t.Fatalf("warnings = %q, want exactly %d", warnings, len(tc.warningsHave))
			}
		})
	}
}

func TestFromEnvUseKVEventsCanonicalNameWins(t *testing.T) {
	for _, tc := range []struct {
		name         string
		kv           []string
		want         bool
		warningsHave []string
	}{
		{"canonical", []string{"DYN_ROUTER_USE_KV_EVENTS", "false"}, false, nil},
		{"alias alone", []string{"DYN_USE_KV_EVENTS", "false"}, false, []string{"DYN_USE_KV_EVENTS is an alias"}},
		{"both: canonical wins", []string{"DYN_ROUTER_USE_KV_EVENTS", "false", "DYN_USE_KV_EVENTS", "true"}, false, []string{"DYN_USE_KV_EVENTS is ignored"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, warnings := mustFromEnv(t, tc.kv...)
			if c.UseKVEvents != tc.want {
				t.Fatalf("UseKVEvents = %v, want %v", c.UseKVEvents, tc.want)
			}
			assertWarnings(t, warnings, tc.warningsHave)
		})
	}
}

func TestFromEnvBusyThresholdsTakeNoneAsUnset(t *testing.T) {
	c, _ := mustFromEnv(t,
		"DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD", "None",
		"DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD", "none",
		"DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC", "NONE",
	)
	if c != Default() {
		t.Fatalf("None thresholds gave %+v, want Default()", c)
	}
}

// TestLoadRefusesWhatKvselectDoesNotImplement: every setting kvselect would
// otherwise take and not act on stops Load with an error naming the variable
// or file key, its value, "not supported by kvselect" and what to use instead.
func TestLoadRefusesWhatKvselectDoesNotImplement(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  []string
		file map[string]string
		want []string // in the error, beside "not supported by kvselect"
	}{
		{"policy config", []string{"DYN_ROUTER_POLICY_CONFIG", "/p.yaml"}, nil,
			[]string{`DYN_ROUTER_POLICY_CONFIG="/p.yaml"`, "policy classes", "429/529", "DYN_ROUTER_QUEUE_THRESHOLD", "--policy"}},
		{"policy config in the file", nil, map[string]string{"router_policy_config": "/p.yaml"},
			[]string{`kvselect.yaml: router.router_policy_config="/p.yaml"`, "policy classes"}},
		{"custom worker selection", []string{"DYN_ROUTER_WORKER_SELECTION_POLICY", "acme"}, nil,
			[]string{`DYN_ROUTER_WORKER_SELECTION_POLICY="acme"`, "custom worker-selection instances", "KVSELECT_POLICY"}},
		{"custom prefill policy", []string{"DYN_ROUTER_PREFILL_POLICY", "p"}, nil, []string{`DYN_ROUTER_PREFILL_POLICY="p"`, "--policy"}},
		{"custom decode policy", []string{"DYN_ROUTER_DECODE_POLICY", "d"}, nil, []string{`DYN_ROUTER_DECODE_POLICY="d"`, "--policy"}},
		{"aic", []string{"DYN_ROUTER_PREFILL_LOAD_MODEL", "aic"}, nil, []string{`DYN_ROUTER_PREFILL_LOAD_MODEL="aic"`, "AIC prefill load model", "use none"}},
		{"aic in the file", nil, map[string]string{"router_prefill_load_model": "aic"},
			[]string{`kvselect.yaml: router.router_prefill_load_model="aic"`, "AIC prefill load model"}},
		{"hicache", []string{"DYN_SHARED_CACHE_TYPE", "hicache"}, nil, []string{`DYN_SHARED_CACHE_TYPE="hicache"`, "shared cache tier", "use none"}},
		{"hicache in the file", nil, map[string]string{"shared_cache_type": "hicache"}, []string{`kvselect.yaml: router.shared_cache_type="hicache"`}},
		{"shared multiplier", []string{"DYN_SHARED_CACHE_MULTIPLIER", "0.5"}, nil, []string{`DYN_SHARED_CACHE_MULTIPLIER="0.5"`, "unset or 0"}},
		{"shared multiplier in the file", nil, map[string]string{"shared_cache_multiplier": "0.5"}, []string{`kvselect.yaml: router.shared_cache_multiplier="0.5"`}},
		{"remote indexer", []string{"DYN_USE_REMOTE_INDEXER", "1"}, nil, []string{`DYN_USE_REMOTE_INDEXER="1"`, "remote indexer", "--indexer-peers"}},
		{"remote indexer in the file", nil, map[string]string{"use_remote_indexer": "true"}, []string{`kvselect.yaml: router.use_remote_indexer="true"`}},
		{"router mode", []string{"DYN_ROUTER_MODE", "round-robin"}, nil, []string{`DYN_ROUTER_MODE="round-robin"`, "--policy"}},
		{"router mode random", []string{"DYN_ROUTER_MODE", "random"}, nil, []string{`DYN_ROUTER_MODE="random"`}},
		{"block size", []string{"DYN_KV_CACHE_BLOCK_SIZE", "16"}, nil, []string{`DYN_KV_CACHE_BLOCK_SIZE="16"`, "block_size in POST /register"}},
		{"serve indexer", []string{"DYN_SERVE_INDEXER", "true"}, nil, []string{`DYN_SERVE_INDEXER="true"`, "GET /dump"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Load(fileOf(tc.file), env(tc.env...))
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			for _, want := range append(tc.want, notSupported) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
			}
		})
	}
}

// TestLoadWarnsAboutWhatDynamoIgnoresToo: settings Dynamo documents as
// ignored are warned about, not refused; the values kvselect implements load
// without a word.
func TestLoadWarnsAboutWhatDynamoIgnoresToo(t *testing.T) {
	for _, tc := range []struct {
		name string
		kv   []string
		want string // "" = no warning
	}{
		{"admission control", []string{"DYN_ADMISSION_CONTROL", "token-capacity"}, "DYN_ADMISSION_CONTROL is ignored, as Dynamo ignores it"},
		{"enforce disagg", []string{"DYN_ENFORCE_DISAGG", "true"}, "DYN_ENFORCE_DISAGG is ignored, as Dynamo ignores it"},
		{"affinity mode is left to the server, which knows the flags", []string{"DYN_ROUTER_SESSION_AFFINITY_MODE", "soft"}, ""},
		{"default worker selection is fine", []string{"DYN_ROUTER_WORKER_SELECTION_POLICY", "default", "DYN_ROUTER_PREFILL_POLICY", " default ", "DYN_ROUTER_DECODE_POLICY", "default"}, ""},
		{"prefill load model none is fine", []string{"DYN_ROUTER_PREFILL_LOAD_MODEL", "none"}, ""},
		{"shared cache none and 0 are fine", []string{"DYN_SHARED_CACHE_TYPE", "none", "DYN_SHARED_CACHE_MULTIPLIER", "0"}, ""},
		{"remote indexer off is fine", []string{"DYN_USE_REMOTE_INDEXER", "false"}, ""},
		{"conditional disagg is honoured", []string{"DYN_ROUTER_CONDITIONAL_DISAGG", "on"}, ""},
		{"replica sync is left to the server", []string{"DYN_ROUTER_REPLICA_SYNC", "true"}, ""},
		{"router mode kv is fine", []string{"DYN_ROUTER_MODE", "kv"}, ""},
		{"serve indexer off is fine", []string{"DYN_SERVE_INDEXER", "false"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, warnings := mustFromEnv(t, tc.kv...)
			if tc.want == "" {
				if len(warnings) != 0 {
					t.Fatalf("warnings = %q, want none", warnings)
				}
				return
			}
			assertWarnings(t, warnings, []string{tc.want})
		})
	}
}

// TestEnvTableStatesEveryStatus: each row says whether kvselect acts on it,
// in the words docs/configuration.md uses.
func TestEnvTableStatesEveryStatus(t *testing.T) {
	for _, v := range EnvTable() {
		if !strings.HasPrefix(v.Status, "works") && !strings.HasPrefix(v.Status, "refused") && !strings.HasPrefix(v.Status, "warned") {
			t.Errorf("%s: status %q", v.Name, v.Status)
		}
	}
}

func TestFromEnvLeavesCrossFieldRulesToValidate(t *testing.T) {
	// The selection service's --router-tracking-key-file may still complete
	// a keyed setup, so FromEnv must not reject it.
	c, _ := mustFromEnv(t, "DYN_ROUTER_TRACKING_HASH", "keyed-xxh3-v1")
	if err := c.Validate(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Validate() = %v, want the missing key file and id", err)
	}
	c.TrackingKeyFile, c.TrackingKeyID = Some("/key"), Some("epoch-1")
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate() after flags = %v", err)
	}
}

func TestEnvTableCoversEveryConfigField(t *testing.T) {
	rows := map[string]bool{}
	for _, v := range EnvTable() {
		if v.Field == "" {
			continue
		}
		if _, ok := reflect.TypeOf(Config{}).FieldByName(v.Field); !ok {
			t.Errorf("%s documents unknown field %q", v.Name, v.Field)
		}
		rows[v.Field] = true
	}
	for _, f := range reflect.VisibleFields(reflect.TypeOf(Config{})) {
		if !rows[f.Name] {
			t.Errorf("Config.%s has no EnvTable row", f.Name)
		}
	}
}

func TestEnvTableRowsAreCompleteAndUnique(t *testing.T) {
	seen := map[string]bool{}
	for _, v := range EnvTable() {
		if v.Name == "" || v.Default == "" || v.Meaning == "" {
			t.Errorf("incomplete row %+v", v)
		}
		if seen[v.Name] {
			t.Errorf("%s listed twice", v.Name)
		}
		seen[v.Name] = true
	}
}

func TestEnvTableDefaultsAreTheDefaults(t *testing.T) {
	// Writing each documented default into the environment must change
	// nothing, so the table cannot drift from Default().
	for _, v := range EnvTable() {
		if v.Field == "" || v.Default == "unset" {
			continue
		}
		t.Run(v.Name, func(t *testing.T) {
			c, _ := mustFromEnv(t, v.Name, v.Default)
			if c != Default() {
				t.Fatalf("%s=%s changed the config to %+v", v.Name, v.Default, c)
			}
		})
	}
	for _, v := range EnvTable() {
		if v.Field == "" || v.Default != "unset" {
			continue
		}
		f := reflect.ValueOf(Default()).FieldByName(v.Field)
		if m := f.MethodByName("IsSet"); m.IsValid() && !m.Call(nil)[0].Bool() {
			continue
		}
		if v.Name == envOverlapWeight || v.Name == envOverlapWeightOld || v.Name == envUseKVEventsAlias {
			continue // aliases of a field documented under its canonical name
		}
		t.Errorf("%s is documented as unset by default but Config.%s is set", v.Name, v.Field)
	}
}

func TestFromEnvLooksUpEveryDocumentedVariable(t *testing.T) {
	asked := map[string]bool{}
	_, _, err := FromEnv(func(name string) (string, bool) { asked[name] = true; return "", false })
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range EnvTable() {
		if !asked[v.Name] {
			t.Errorf("FromEnv never reads %s", v.Name)
		}
		delete(asked, v.Name)
	}
	for name := range asked {
		t.Errorf("FromEnv reads undocumented %s", name)
	}
}

func TestEnvMarkdownListsEveryVariable(t *testing.T) {
	md := EnvMarkdown()
	if !strings.HasPrefix(md, "| Variable | Config file key | Default | Meaning | Status |\n|---|---|---|---|---|\n") {
		t.Fatalf("unexpected header:\n%s", md)
	}
	if got, want := strings.Count(md, "\n"), len(EnvTable())+2; got != want {
		t.Fatalf("%d lines, want %d", got, want)
	}
	for _, v := range EnvTable() {
		key := "—"
		if v.Key != "" {
			key = "`" + v.Key + "`"
		}
		if !strings.Contains(md, "| `"+v.Name+"` | "+key+" | "+v.Default+" | ") {
			t.Errorf("markdown lacks a row for %s", v.Name)
		}
	}
}

func assertWarnings(t *testing.T, got, want []string) {
	t.Helper()
	for _, w := range want {
		found := false
		for _, g := range got {
			found = found || strings.Contains(g, w)
		}
		if !found {
			t.Errorf("warnings %q lack %q", got, w)
		}
	}
}
