package routerconfig

import (
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestValidateRejectsEachBrokenRule(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		// Values.
		{"negative credit", func(c *Config) { c.OverlapScoreCredit = -0.5 }, "overlap_score_credit=-0.5: must be a finite number >= 0"},
		{"NaN credit", func(c *Config) { c.OverlapScoreCredit = math.NaN() }, "overlap_score_credit=NaN"},
		{"infinite credit", func(c *Config) { c.OverlapScoreCredit = math.Inf(1) }, "overlap_score_credit=+Inf"},
		{"negative decay", func(c *Config) { c.OverlapScoreCreditDecay = -1 }, "overlap_score_credit_decay=-1"},
		{"negative prefill scale", func(c *Config) { c.PrefillLoadScale = -0.1 }, "prefill_load_scale=-0.1"},
		{"infinite request weight", func(c *Config) { c.DecodeActiveRequestWeight = math.Inf(1) }, "decode_active_request_weight=+Inf"},
		{"host weight above 1", func(c *Config) { c.HostCacheHitWeight = 1.1 }, "host_cache_hit_weight=1.1: must be a finite number between 0 and 1"},
		{"disk weight below 0", func(c *Config) { c.DiskCacheHitWeight = -0.1 }, "disk_cache_hit_weight=-0.1"},
		{"negative temperature", func(c *Config) { c.RouterTemperature = -1 }, "router_temperature=-1"},
		{"shared multiplier above 1", func(c *Config) { c.SharedCacheMultiplier = 1.5 }, "shared_cache_multiplier=1.5"},
		{"negative queue threshold", func(c *Config) { c.QueueThreshold = Some(-1.0) }, "router_queue_threshold=-1"},
		{"ratio above 1", func(c *Config) { c.ConditionalDisaggEffISLRatioThreshold = 2 }, "conditional_disagg_eff_isl_ratio_threshold=2"},
		{"negative eff isl", func(c *Config) { c.ConditionalDisaggEffISLThreshold = -1 }, "conditional_disagg_eff_isl_threshold=-1"},
		{"negative prefill busy", func(c *Config) { c.ConditionalDisaggPrefillBusyThreshold = Some(-1.0) }, "conditional_disagg_prefill_busy_threshold=-1"},
		{"negative decode busy", func(c *Config) { c.ConditionalDisaggDecodeBusyThreshold = Some(-1.0) }, "conditional_disagg_decode_busy_threshold=-1"},
		{"decode blocks threshold above 1", func(c *Config) { c.ActiveDecodeBlocksThreshold = Some(1.5) }, "active_decode_blocks_threshold=1.5"},
		{"negative prefill tokens threshold", func(c *Config) { c.ActivePrefillTokensThreshold = Some(-1) }, "active_prefill_tokens_threshold=-1"},
		{"negative prefill frac", func(c *Config) { c.ActivePrefillTokensThresholdFrac = Some(-0.5) }, "active_prefill_tokens_threshold_frac=-0.5"},
		{"zero event threads", func(c *Config) { c.EventThreads = 0 }, "router_event_threads=0"},
		{"negative min workers", func(c *Config) { c.MinInitialWorkers = -1 }, "min_initial_workers=-1"},
		{"negative ttl", func(c *Config) { c.RouterTTL = -time.Second }, "router_ttl_secs=-1"},
		{"negative predicted ttl", func(c *Config) { c.PredictedTTL = Some(-time.Second) }, "router_predicted_ttl_secs=-1"},
		{"zero expiry", func(c *Config) { c.ActiveRequestExpiry = 0 }, "active_request_expiry_secs=0: must be > 0"},
		{"negative refresh", func(c *Config) { c.OverlapRefreshAfter = -time.Second }, "overlap_refresh_after_secs=-1"},
		{"affinity ttl too short", func(c *Config) { c.SessionAffinityTTL = Some(500 * time.Millisecond) }, "session_affinity_ttl_secs=0.5"},
		{"affinity ttl too long", func(c *Config) { c.SessionAffinityTTL = Some(MaxSessionAffinityTTL + time.Second) }, "session_affinity_ttl_secs=31536001"},
		{"unknown tracking hash", func(c *Config) { c.TrackingHash = "md5" }, `router_tracking_hash="md5": want public-xxh3-v1 or keyed-xxh3-v1`},
		{"unknown prefill load model", func(c *Config) { c.PrefillLoadModel = "x" }, `router_prefill_load_model="x"`},
		{"unknown approximate policy", func(c *Config) { c.ApproximateCachePolicy = "" }, `router_approximate_cache_policy=""`},
		{"unknown queue policy", func(c *Config) { c.QueuePolicy = "lifo" }, `router_queue_policy="lifo"`},
		{"unknown shared cache type", func(c *Config) { c.SharedCacheType = "rdma" }, `shared_cache_type="rdma"`},
		{"unknown disagg policy", func(c *Config) { c.ConditionalDisaggPolicy = "x" }, `conditional_disagg_policy="x"`},
		{"unknown affinity mode", func(c *Config) { c.SessionAffinityMode = "" }, `session_affinity_mode=""`},

		// Cross-field rules.
		{"output blocks need active blocks", func(c *Config) { c.TrackOutputBlocks, c.TrackActiveBlocks = true, false },
			"router_track_output_blocks=true: requires router_track_active_blocks=true"},
		{"aic needs prefill tokens", func(c *Config) { c.PrefillLoadModel, c.TrackPrefillTokens = PrefillLoadAIC, false },
			`router_prefill_load_model="aic": requires router_track_prefill_tokens=true`},
		{"predicted ttl needs events", func(c *Config) { c.PredictedTTL, c.UseKVEvents = Some(5*time.Second), false },
			"router_predicted_ttl_secs=5: requires use_kv_events=true"},
		{"lru needs events off", func(c *Config) { c.ApproximateCachePolicy = ApproximateLRU },
			`router_approximate_cache_policy="lru": requires use_kv_events=false`},
		{"prefill_load needs a busy line", func(c *Config) { c.ConditionalDisagg, c.ConditionalDisaggPolicy = true, DisaggPrefillLoad },
			`conditional_disagg_policy="prefill_load": needs conditional_disagg_prefill_busy_threshold or router_queue_threshold`},
		{"isl_or_load needs a busy line", func(c *Config) { c.ConditionalDisagg, c.ConditionalDisaggPolicy = true, DisaggISLOrLoad },
			`conditional_disagg_policy="isl_or_load"`},
		{"public rejects key file", func(c *Config) { c.TrackingKeyFile = Some("/k") }, `router_tracking_key_file="/k": public-xxh3-v1 takes no key file`},
		{"public rejects key id", func(c *Config) { c.TrackingKeyID = Some("e1") }, `router_tracking_key_id="e1": public-xxh3-v1 takes no key id`},
		{"keyed needs key file", func(c *Config) { c.TrackingHash, c.TrackingKeyID = TrackingKeyed, Some("e1") }, "needs router_tracking_key_file"},
		{"keyed needs non-blank key id", func(c *Config) {
			c.TrackingHash, c.TrackingKeyFile, c.TrackingKeyID = TrackingKeyed, Some("/k"), Some("  ")
		},
			"needs a non-blank router_tracking_key_id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.mutate(&c)
			err := c.Validate()
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Validate() = %v, want ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestValidateAcceptsBoundaryAndCombinedSettings(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
	}{
		{"credit above 1 (newest Dynamo)", func(c *Config) { c.OverlapScoreCredit = 1.5 }},
		{"zero credit and scale", func(c *Config) { c.OverlapScoreCredit, c.PrefillLoadScale = 0, 0 }},
		{"unit bounds", func(c *Config) { c.HostCacheHitWeight, c.DiskCacheHitWeight, c.SharedCacheMultiplier = 1, 0, 1 }},
		{"queue threshold zero", func(c *Config) { c.QueueThreshold = Some(0.0) }},
		{"lru with events off", func(c *Config) { c.ApproximateCachePolicy, c.UseKVEvents = ApproximateLRU, false }},
		{"predicted ttl with events", func(c *Config) { c.PredictedTTL = Some(5 * time.Second) }},
		{"prefill_load with queue threshold", func(c *Config) {
			c.ConditionalDisagg, c.ConditionalDisaggPolicy, c.QueueThreshold = true, DisaggPrefillLoad, Some(1.0)
		}},
		{"prefill_load with its own threshold", func(c *Config) {
			c.ConditionalDisagg, c.ConditionalDisaggPolicy, c.ConditionalDisaggPrefillBusyThreshold = true, DisaggISLOrLoad, Some(0.8)
		}},
		{"prefill_load while disabled", func(c *Config) { c.ConditionalDisaggPolicy = DisaggPrefillLoad }},
		{"aic with wspt (newest Dynamo dropped the fcfs rule)", func(c *Config) { c.PrefillLoadModel, c.QueuePolicy = PrefillLoadAIC, QueueWSPT }},
		{"affinity bounds", func(c *Config) { c.SessionAffinityTTL = Some(time.Second) }},
		{"affinity max", func(c *Config) { c.SessionAffinityTTL = Some(MaxSessionAffinityTTL) }},
		{"refresh off", func(c *Config) { c.OverlapRefreshAfter = 0 }},
		{"keyed complete", func(c *Config) {
			c.TrackingHash, c.TrackingKeyFile, c.TrackingKeyID = TrackingKeyed, Some("/k"), Some("e1")
		}},
		{"busy thresholds", func(c *Config) {
			c.ActiveDecodeBlocksThreshold, c.ActivePrefillTokensThreshold, c.ActivePrefillTokensThresholdFrac = Some(1.0), Some(0), Some(2.0)
		}},
		{"load-aware preset", func(c *Config) { *c = c.LoadAware() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.mutate(&c)
			if err := c.Validate(); err != nil {
				t.Fatalf("Validate() = %v", err)
			}
		})
	}
}

func TestValidateReportsEveryViolationAtOnce(t *testing.T) {
	c := Default()
	c.RouterTemperature = -1
	c.TrackOutputBlocks, c.TrackActiveBlocks = true, false
	c.ApproximateCachePolicy = ApproximateLRU
	err := c.Validate()
	for _, want := range []string{"router_temperature", "router_track_output_blocks", "router_approximate_cache_policy"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to mention %s", err, want)
		}
	}
}

func TestQueueingEnabledOnlyWhenThresholdIsSet(t *testing.T) {
	c := Default()
	if c.QueueingEnabled() {
		t.Fatal("queueing on by default; Dynamo's newest default is off")
	}
	c.QueueThreshold = Some(0.0)
	if !c.QueueingEnabled() {
		t.Fatal("threshold 0 must enable queueing (maximum sensitivity), not disable it")
	}
}

func TestLoadAwarePresetMatchesDynamo(t *testing.T) {
	c := Default()
	c.TrackActiveBlocks = false
	c.SharedCacheType, c.SharedCacheMultiplier = SharedCacheHiCache, 0.5
	got := c.LoadAware()
	if got.OverlapScoreCredit != 0 || got.UseKVEvents || got.AssumeKVReuse || !got.TrackActiveBlocks ||
		got.SharedCacheType != SharedCacheNone || got.SharedCacheMultiplier != 0 {
		t.Fatalf("LoadAware() = %+v", got)
	}
	if c.OverlapScoreCredit != 1 {
		t.Fatal("LoadAware modified its receiver")
	}
}

func TestOptionalDistinguishesUnsetFromZero(t *testing.T) {
	var unset Optional[float64]
	zero := Some(0.0)
	if unset.IsSet() || !zero.IsSet() || unset == zero {
		t.Fatal("unset and Some(0) must differ")
	}
	if v, ok := zero.Get(); !ok || v != 0 {
		t.Fatalf("Some(0).Get() = %v, %v", v, ok)
	}
	if unset.Or(7) != 7 || zero.Or(7) != 0 {
		t.Fatal("Or")
	}
	if unset.String() != "unset" || Some(2.5).String() != "2.5" {
		t.Fatalf("String() = %q, %q", unset.String(), Some(2.5).String())
	}
}

func TestConfigsAreIndependentValuesAcrossGoroutines(t *testing.T) {
	// No global mutable state: concurrent FromEnv, Validate and Apply calls
	// share nothing writable (run under -race).
	base := Default()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, _, err := FromEnv(env("DYN_ROUTER_TEMPERATURE", "0.5"))
			if err != nil || c.Validate() != nil {
				t.Error(err)
			}
			v := float64(i)
			_ = base.Apply(Override{PrefillLoadScale: &v})
			_ = EnvTable()
		}()
	}
	wg.Wait()
	if base != Default() {
		t.Fatal("Apply modified the shared base config")
	}
}
