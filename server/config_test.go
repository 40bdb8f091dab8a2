package server

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/kvhash"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func resolve(t *testing.T, env map[string]string, args ...string) (selection.Config, error) {
	t.Helper()
	o, err := parseFlags(args)
	if err != nil {
		t.Fatalf("parseFlags(%q): %v", args, err)
	}
	r, err := resolveConfig(o, envOf(env), nil, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	return r.cfg, err
}

func TestFlagsOverrideEnvironment(t *testing.T) {
	keyed := map[string]string{
		"DYN_ROUTER_TRACKING_HASH":     "keyed-xxh3-v1",
		"DYN_ROUTER_TRACKING_KEY_FILE": "/env.key",
		"DYN_ROUTER_TRACKING_KEY_ID":   "env-epoch",
	}
	for _, tc := range []struct {
		name  string
		env   map[string]string
		args  []string
		check func(routerconfig.Config, selection.Config) bool
	}{
		{"defaults without either", nil, nil, func(c routerconfig.Config, s selection.Config) bool {
			return c.EventThreads == 4 && !c.SessionAffinityTTL.IsSet() && c.AssumeKVReuse &&
				c.TrackingHash == routerconfig.TrackingPublic && s.Tracking.Algorithm == kvhash.AlgorithmPublic && s.Tracking.Key == nil &&
				s.SelectionCache.TTL == 120*time.Second && s.SelectionCache.MaxEntries == 4096 && s.SelectionCache.MaxBytes == 268435456
		}},
		{"threads from environment", map[string]string{"DYN_ROUTER_EVENT_THREADS": "8"}, nil,
			func(c routerconfig.Config, _ selection.Config) bool { return c.EventThreads == 8 }},
		{"--threads wins", map[string]string{"DYN_ROUTER_EVENT_THREADS": "8"}, []string{"--threads", "2"},
			func(c routerconfig.Config, _ selection.Config) bool { return c.EventThreads == 2 }},
		{"--threads equal to its default still wins", map[string]string{"DYN_ROUTER_EVENT_THREADS": "8"}, []string{"--threads", "4"},
			func(c routerconfig.Config, _ selection.Config) bool { return c.EventThreads == 4 }},
		{"session ttl from environment", map[string]string{"DYN_ROUTER_SESSION_AFFINITY_TTL_SECS": "30"}, nil,
			func(c routerconfig.Config, _ selection.Config) bool {
				return c.SessionAffinityTTL == routerconfig.Some(30*time.Second)
			}},
		{"--session-affinity-ttl-secs wins", map[string]string{"DYN_ROUTER_SESSION_AFFINITY_TTL_SECS": "30"}, []string{"--session-affinity-ttl-secs", "60"},
			func(c routerconfig.Config, _ selection.Config) bool {
				return c.SessionAffinityTTL == routerconfig.Some(60*time.Second)
			}},
		{"assume kv reuse off from environment", map[string]string{"DYN_ROUTER_ASSUME_KV_REUSE": "false"}, nil,
			func(c routerconfig.Config, _ selection.Config) bool { return !c.AssumeKVReuse }},
		{"--router-assume-kv-reuse wins", map[string]string{"DYN_ROUTER_ASSUME_KV_REUSE": "false"}, []string{"--router-assume-kv-reuse"},
			func(c routerconfig.Config, _ selection.Config) bool { return c.AssumeKVReuse }},
		{"--no-router-assume-kv-reuse wins", map[string]string{"DYN_ROUTER_ASSUME_KV_REUSE": "true"}, []string{"--no-router-assume-kv-reuse"},
			func(c routerconfig.Config, _ selection.Config) bool { return !c.AssumeKVReuse }},
		{"--router-assume-kv-reuse=false", nil, []string{"--router-assume-kv-reuse=false"},
			func(c routerconfig.Config, _ selection.Config) bool { return !c.AssumeKVReuse }},
		{"keyed tracking from environment", keyed, nil, func(c routerconfig.Config, s selection.Config) bool {
			return c.TrackingKeyFile == routerconfig.Some("/env.key") && s.Tracking.Algorithm == kvhash.AlgorithmKeyed && s.Tracking.KeyID == "env-epoch"
		}},
		{"tracking key flags win", keyed, []string{"--router-tracking-key-file", "/flag.key", "--router-tracking-key-id", "flag-epoch"},
			func(c routerconfig.Config, s selection.Config) bool {
				return c.TrackingKeyFile == routerconfig.Some("/flag.key") && s.Tracking.Algorithm == kvhash.AlgorithmKeyed && s.Tracking.KeyID == "flag-epoch"
			}},
		{"flags switch back to public and clear the key", keyed, []string{"--router-tracking-hash", "public-xxh3-v1", "--router-tracking-key-file", "", "--router-tracking-key-id", ""},
			func(c routerconfig.Config, s selection.Config) bool {
				return !c.TrackingKeyFile.IsSet() && !c.TrackingKeyID.IsSet() && s.Tracking.Algorithm == kvhash.AlgorithmPublic && s.Tracking.KeyID == ""
			}},
		{"other environment knobs pass through", map[string]string{"DYN_ROUTER_TEMPERATURE": "0.5", "DYN_ROUTER_QUEUE_THRESHOLD": "2"}, []string{"--threads", "3"},
			func(c routerconfig.Config, _ selection.Config) bool {
				return c.RouterTemperature == 0.5 && c.QueueThreshold == routerconfig.Some(2.0) && c.EventThreads == 3
			}},
		{"selection cache flags", nil, []string{"--selection-cache-ttl-secs", "1.5", "--selection-cache-max-entries", "7", "--selection-cache-max-bytes", "1024"},
			func(_ routerconfig.Config, s selection.Config) bool {
				return s.SelectionCache.TTL == 1500*time.Millisecond && s.SelectionCache.MaxEntries == 7 && s.SelectionCache.MaxBytes == 1024
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := resolve(t, tc.env, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(cfg.Router, cfg) {
				t.Errorf("env %v, args %q: router %+v, tracking %+v, cache %+v", tc.env, tc.args, cfg.Router, cfg.Tracking, cfg.SelectionCache)
			}
		})
	}
}

// TestInvalidConfigurationIsAUsageError: bad environment values, and flags
// that make the merged configuration invalid, fail with status 2.
func TestInvalidConfigurationIsAUsageError(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"unparsable environment", map[string]string{"DYN_ROUTER_TEMPERATURE": "warm"}, nil, "DYN_ROUTER_TEMPERATURE"},
		{"out-of-range environment", map[string]string{"DYN_ROUTER_TEMPERATURE": "-1"}, nil, "DYN_ROUTER_TEMPERATURE"},
		{"cross-field environment", map[string]string{"DYN_ROUTER_TRACK_OUTPUT_BLOCKS": "true", "DYN_ROUTER_TRACK_ACTIVE_BLOCKS": "false"}, nil, "router_track_output_blocks"},
		{"keyed flag without key", nil, []string{"--router-tracking-hash", "keyed-xxh3-v1"}, "needs router_tracking_key_file"},
		{"keyed flag without key id", nil, []string{"--router-tracking-hash", "keyed-xxh3-v1", "--router-tracking-key-file", "/k"}, "needs a non-blank router_tracking_key_id"},
		{"key file flag in public mode", nil, []string{"--router-tracking-key-file", "/k"}, "public-xxh3-v1 takes no key file"},
		{"environment session ttl out of range", map[string]string{"DYN_ROUTER_SESSION_AFFINITY_TTL_SECS": "0"}, nil, "DYN_ROUTER_SESSION_AFFINITY_TTL_SECS"},
		// Settings kvselect does not implement stop it instead of being ignored.
		{"policy classes", map[string]string{"DYN_ROUTER_POLICY_CONFIG": "/etc/policy.yaml"}, nil, `DYN_ROUTER_POLICY_CONFIG="/etc/policy.yaml": not supported by kvselect`},
		{"routing mode", map[string]string{"DYN_ROUTER_MODE": "round-robin"}, nil, `DYN_ROUTER_MODE="round-robin": not supported by kvselect`},
		{"replica sync without its port", map[string]string{"DYN_ROUTER_REPLICA_SYNC": "true"}, nil, `DYN_ROUTER_REPLICA_SYNC="true": not supported by kvselect without --replica-sync-port`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := resolve(t, tc.env, tc.args...)
			var ue *UsageError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want a usage error mentioning %q", err, tc.want)
			}
			var out, errb bytes.Buffer
			if got := ExitStatus(runWith(t.Context(), tc.args, envOf(tc.env), &out, &errb), &errb); got != 2 || !strings.Contains(errb.String(), tc.want) {
				t.Errorf("run: status %d, stderr %q", got, errb.String())
			}
		})
	}
}

func TestEnvironmentWarningsAreLogged(t *testing.T) {
	o, err := parseFlags([]string{"--log-format", "json"})
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	env := envOf(map[string]string{"DYN_ADMISSION_CONTROL": "token-capacity", "DYN_ENFORCE_DISAGG": "true"})
	if _, err := resolveConfig(o, env, nil, nil, newLogger(o, &logs)); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"level":"WARN","msg":"DYN_ADMISSION_CONTROL is ignored, as Dynamo ignores it`, `"msg":"DYN_ENFORCE_DISAGG is ignored, as Dynamo ignores it`, `"source":"environment"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs %s lack %s", logs.String(), want)
		}
	}
}

// TestSessionAffinityModeWarnsOnlyWhenAffinityIsOff: the mode has no effect
// without a session TTL, which the flag can give as well as the environment.
func TestSessionAffinityModeWarnsOnlyWhenAffinityIsOff(t *testing.T) {
	env := envOf(map[string]string{"DYN_ROUTER_SESSION_AFFINITY_MODE": "soft"})
	for _, tc := range []struct {
		args []string
		warn bool
	}{
		{nil, true},
		{[]string{"--session-affinity-ttl-secs", "60"}, false},
	} {
		o, err := parseFlags(append([]string{"--log-format", "json"}, tc.args...))
		if err != nil {
			t.Fatal(err)
		}
		var logs bytes.Buffer
		if _, err := resolveConfig(o, env, nil, nil, newLogger(o, &logs)); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(logs.String(), `"msg":"DYN_ROUTER_SESSION_AFFINITY_MODE has no effect`); got != tc.warn {
			t.Errorf("args %q: warned %v, want %v; logs %s", tc.args, got, tc.warn, logs.String())
		}
	}
}

// TestReplicaSyncVariableNeedsItsPort: DYN_ROUTER_REPLICA_SYNC=true means
// replica sync, which kvselect runs on --replica-sync-port; with the port it
// starts, without it the variable or file key is refused by name.
func TestReplicaSyncVariableNeedsItsPort(t *testing.T) {
	if _, err := resolve(t, map[string]string{"DYN_ROUTER_REPLICA_SYNC": "true"}, "--replica-sync-port", "5599"); err != nil {
		t.Fatalf("with --replica-sync-port: %v", err)
	}
	if _, err := resolve(t, map[string]string{"DYN_ROUTER_REPLICA_SYNC": "false"}); err != nil {
		t.Fatalf("false: %v", err)
	}
	path := writeConfig(t, "kvselect.yaml", "router:\n  router_replica_sync: true\n")
	var out, errb bytes.Buffer
	err := runWith(t.Context(), []string{"--config", path}, envOf(nil), &out, &errb)
	if got := ExitStatus(err, &errb); got != 2 || !strings.Contains(errb.String(), path+`: router.router_replica_sync="true": not supported by kvselect without --replica-sync-port`) {
		t.Errorf("status %d, stderr %q", got, errb.String())
	}
}

// TestUnsupportedFileKeyStopsTheServer: a config-file knob kvselect does not
// implement ends Run with status 2 and a message naming the file key, its
// value and what to use instead.
func TestUnsupportedFileKeyStopsTheServer(t *testing.T) {
	for key, value := range map[string]string{
		"router_prefill_load_model": "aic",
		"router_policy_config":      "/etc/policy.yaml",
		"shared_cache_type":         "hicache",
		"use_remote_indexer":        "true",
	} {
		t.Run(key, func(t *testing.T) {
			path := writeConfig(t, "kvselect.yaml", "router:\n  "+key+": "+value+"\n")
			var out, errb bytes.Buffer
			err := runWith(t.Context(), []string{"--config", path}, envOf(nil), &out, &errb)
			want := path + ": router." + key + `="` + value + `": not supported by kvselect (`
			if got := ExitStatus(err, &errb); got != 2 || !strings.Contains(errb.String(), want) {
				t.Errorf("status %d, stderr %q, want %q", got, errb.String(), want)
			}
		})
	}
}

// TestKeyFileIsReadAtStartup: a keyed configuration builds with a 32-byte key
// and fails with status 2 when the file is wrong.
func TestKeyFileIsReadAtStartup(t *testing.T) {
	dir := t.TempDir()
	good, short := filepath.Join(dir, "good.key"), filepath.Join(dir, "short.key")
	if err := os.WriteFile(good, bytes.Repeat([]byte{7}, kvhash.KeySize), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(short, []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	keyed := []string{"--router-tracking-hash", "keyed-xxh3-v1", "--router-tracking-key-id", "e1", "--router-tracking-key-file"}
	cfg, err := resolve(t, nil, append(keyed, good)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := loadTrackingKey(&cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := selection.New(cfg); err != nil {
		t.Fatalf("Build with a 32-byte key: %v", err)
	}
	status, _, stderr := runArgs(t, append(keyed, short)...)
	if status != 2 || !strings.Contains(stderr, "holds 5 bytes, want exactly 32") || !strings.Contains(stderr, short) {
		t.Errorf("short key: status %d, stderr %q", status, stderr)
	}
	missing := filepath.Join(dir, "missing.key")
	status, _, stderr = runArgs(t, append(keyed, missing)...)
	if status != 2 || !strings.Contains(stderr, missing) {
		t.Errorf("missing key file: status %d, stderr %q", status, stderr)
	}
}

func TestStartupLogShowsNonDefaultRouterKnobs(t *testing.T) {
	cfg, err := resolve(t, map[string]string{"DYN_ROUTER_TEMPERATURE": "0.5"}, "--session-affinity-ttl-secs", "60")
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	slog.New(slog.NewTextHandler(&logs, nil)).Info("x", configAttrs(cfg)...)
	for _, want := range []string{"router_non_default.RouterTemperature=0.5", "router_non_default.SessionAffinityTTL=1m0s", "session_affinity_ttl=1m0s", "selection_cache.max_entries=4096"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("startup attrs %q lack %q", logs.String(), want)
		}
	}
	if strings.Contains(logs.String(), "router_non_default.EventThreads") {
		t.Errorf("default knob logged as changed: %s", logs.String())
	}
}
