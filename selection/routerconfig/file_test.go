package routerconfig

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func noFileEnv(string) (string, bool) { return "", false }

func fileOf(values map[string]string) File {
	return File{Values: values, Label: func(key string) string { return "kvselect.yaml: router." + key }}
}

func TestLoadLayersFileUnderEnvironment(t *testing.T) {
	for _, tc := range []struct {
		name  string
		file  map[string]string
		env   map[string]string
		check func(Config) bool
	}{
		{"file sets a knob", map[string]string{"router_ttl_secs": "30"}, nil,
			func(c Config) bool { return c.RouterTTL == 30*time.Second }},
		{"environment wins over the file", map[string]string{"router_ttl_secs": "30"}, map[string]string{"DYN_ROUTER_TTL_SECS": "45"},
			func(c Config) bool { return c.RouterTTL == 45*time.Second }},
		{"a blank variable leaves the file's value", map[string]string{"router_ttl_secs": "30"}, map[string]string{"DYN_ROUTER_TTL_SECS": " "},
			func(c Config) bool { return c.RouterTTL == 30*time.Second }},
		{"file reaches the canonical name behind an alias", map[string]string{"use_kv_events": "false"}, nil,
			func(c Config) bool { return !c.UseKVEvents }},
		{"the environment's alias still loses to the file's canonical knob", map[string]string{"use_kv_events": "false"}, map[string]string{"DYN_USE_KV_EVENTS": "true"},
			func(c Config) bool { return !c.UseKVEvents }},
		{"optional knobs", map[string]string{"router_queue_threshold": "2", "session_affinity_ttl_secs": "60"}, nil,
			func(c Config) bool {
				return c.QueueThreshold == Some(2.0) && c.SessionAffinityTTL == Some(60*time.Second)
			}},
		{"the values kvselect implements of the refused knobs", map[string]string{"shared_cache_type": "none", "shared_cache_multiplier": "0",
			"router_prefill_load_model": "none", "use_remote_indexer": "false", "router_replica_sync": "true"}, nil,
			func(c Config) bool { return c.SharedCacheType == SharedCacheNone && c.ReplicaSync }},
		{"cost weights by Dynamo's names", map[string]string{"overlap_score_credit": "0.5", "router_temperature": "0.1"}, nil,
			func(c Config) bool { return c.OverlapScoreCredit == 0.5 && c.RouterTemperature == 0.1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, err := Load(fileOf(tc.file), func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(c) {
				t.Errorf("file %v, env %v: %+v", tc.file, tc.env, c)
			}
		})
	}
}

func TestLoadNamesTheFileKeyOfABadValue(t *testing.T) {
	_, _, err := Load(fileOf(map[string]string{"router_ttl_secs": "soon", "no_such_knob": "1", "router_queue_policy": "lifo"}), noFileEnv)
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("err = %v, want ErrInvalid", err)
	}
	for _, want := range []string{
		`kvselect.yaml: router.router_ttl_secs="soon": not a number`,
		`kvselect.yaml: router.no_such_knob="1": unknown router knob`,
		`kvselect.yaml: router.router_queue_policy="lifo": want fcfs, wspt, lcfs`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

func TestFileKeysAreUniqueAndSkipAliases(t *testing.T) {
	keys := FileKeys()
	sorted := slices.Clone(keys)
	slices.Sort(sorted)
	if len(slices.Compact(sorted)) != len(keys) {
		t.Fatalf("duplicate keys in %v", keys)
	}
	// Aliases, Dynamo's per-process worker-selection overrides (not
	// serialized in KvRouterConfig) and the variables Dynamo reads outside it.
	envOnly := []string{envOverlapWeight, envOverlapWeightOld, envUseKVEventsAlias,
		"DYN_ROUTER_WORKER_SELECTION_POLICY", "DYN_ROUTER_PREFILL_POLICY", "DYN_ROUTER_DECODE_POLICY",
		"DYN_ROUTER_MODE", "DYN_KV_CACHE_BLOCK_SIZE", "DYN_SERVE_INDEXER", "DYN_ADMISSION_CONTROL", "DYN_ENFORCE_DISAGG"}
	for _, v := range EnvTable() {
		if slices.Contains(envOnly, v.Name) != (v.Key == "") {
			t.Errorf("%s has file key %q", v.Name, v.Key)
		}
	}
}
