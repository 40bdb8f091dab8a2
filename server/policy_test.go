package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/internal/proctest"
	"github.com/kvselect/kvselect/selection/scheduler"
)

// writeConfig writes a config file into a fresh directory and returns its path.
func writeConfig(t *testing.T, name, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// resolveWith resolves args, env and an optional config file as Run does.
func resolveWith(t *testing.T, env map[string]string, file string, embedded *scheduler.Policy, args ...string) (resolved, error) {
	t.Helper()
	if file != "" {
		args = append(args, "--config", file)
	}
	o, err := parseFlags(args)
	if err != nil {
		return resolved{}, err
	}
	var cf *configFile
	if o.configFile != "" {
		if cf, err = readConfigFile(o.configFile); err != nil {
			return resolved{}, &UsageError{err}
		}
	}
	return resolveConfig(o, envOf(env), cf, embedded, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

func TestPolicyNamePrecedenceIsFlagEnvironmentFileDefault(t *testing.T) {
	file := "policy:\n  name: least-loaded\n"
	for _, tc := range []struct {
		name       string
		env        map[string]string
		file       string
		args       []string
		want, from string
	}{
		{"default", nil, "", nil, "kv-cost", "default"},
		{"file", nil, file, nil, "least-loaded", "FILE"},
		{"environment over file", map[string]string{"KVSELECT_POLICY": "random"}, file, nil, "random", "KVSELECT_POLICY"},
		{"flag over environment", map[string]string{"KVSELECT_POLICY": "random"}, file, []string{"--policy", "round-robin"}, "round-robin", "--policy"},
		{"a blank environment value is unset", map[string]string{"KVSELECT_POLICY": " "}, file, nil, "least-loaded", "FILE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := ""
			if tc.file != "" {
				path = writeConfig(t, "kvselect.yaml", tc.file)
			}
			r, err := resolveWith(t, tc.env, path, nil, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			from := strings.ReplaceAll(tc.from, "FILE", path)
			if r.policy.name != tc.want || r.policy.source != from {
				t.Errorf("policy %q from %q, want %q from %q", r.policy.name, r.policy.source, tc.want, from)
			}
			if r.cfg.Policy == nil || r.cfg.Policy.Scorer == nil {
				t.Errorf("no policy built")
			}
		})
	}
}

// TestKVCostParametersLayerUnderTheEnvironment: the file's kv-cost
// parameters are router knobs at the file's level of precedence.
func TestKVCostParametersLayerUnderTheEnvironment(t *testing.T) {
	path := writeConfig(t, "kvselect.json", `{"policy":{"name":"kv-cost","parameters":{"router_temperature":0.3,"overlap_score_credit":0.5}},
		"router":{"router_ttl_secs":30}}`)
	r, err := resolveWith(t, nil, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := r.cfg.Policy.Costs
	if c == nil || c.Temperature != 0.3 || c.OverlapScoreCredit != 0.5 || c.PrefillLoadScale != 1 {
		t.Fatalf("costs %+v", c)
	}
	if r.cfg.Router.RouterTemperature != 0.3 || r.cfg.Router.RouterTTL != 30*time.Second {
		t.Errorf("router %+v", r.cfg.Router)
	}
	r, err = resolveWith(t, map[string]string{"DYN_ROUTER_TEMPERATURE": "0.7"}, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c := r.cfg.Policy.Costs; c.Temperature != 0.7 || c.OverlapScoreCredit != 0.5 {
		t.Errorf("with DYN_ROUTER_TEMPERATURE=0.7: costs %+v", c)
	}
}

func TestConfigFileMistakesAreUsageErrorsNamingTheKey(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		args       []string
		want       string
	}{
		{"unknown section", "polcy:\n  name: kv-cost\n", nil, `unknown field "polcy"`},
		{"unknown policy field", "policy:\n  nam: kv-cost\n", nil, `unknown field "nam"`},
		{"not YAML", "policy: [\n", nil, "kvselect.yaml"},
		{"unknown router knob", "router:\n  router_tll_secs: 3\n", nil, `router.router_tll_secs="3": unknown router knob`},
		{"bad router value", "router:\n  router_ttl_secs: soon\n", nil, `router.router_ttl_secs="soon": not a number`},
		{"a router value that is a list", "router:\n  router_ttl_secs: [1]\n", nil, "router.router_ttl_secs must be a number, string or boolean"},
		{"cost weight in the router section", "router:\n  router_temperature: 0.1\n", nil, "router.router_temperature is a parameter of the kv-cost policy"},
		{"parameters without a name", "policy:\n  parameters:\n    router_temperature: 0.1\n", nil, "policy.parameters needs policy.name"},
		{"unknown policy", "policy:\n  name: fastest\n", nil, `unknown policy "fastest"`},
		{"unknown kv-cost parameter", "policy:\n  name: kv-cost\n  parameters:\n    temperature: 0.1\n", nil, "policy.parameters.temperature is not a parameter of policy kv-cost"},
		{"out-of-range kv-cost parameter", "policy:\n  name: kv-cost\n  parameters:\n    host_cache_hit_weight: 2\n", nil, `policy.parameters.host_cache_hit_weight="2": must be a finite number between 0 and 1`},
		{"parameter of a policy that takes none", "policy:\n  name: round-robin\n  parameters:\n    step: 2\n", nil, `unknown parameter "step"`},
		{"parameter of a policy the flag names", "policy:\n  name: round-robin\n  parameters:\n    step: 2\n", []string{"--policy", "round-robin"}, `policy.parameters: policy round-robin: unknown parameter "step"`},
		{"unknown policy flag", "", []string{"--policy", "fastest"}, `--policy: unknown policy "fastest"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := ""
			if tc.body != "" {
				path = writeConfig(t, "kvselect.yaml", tc.body)
			}
			_, err := resolveWith(t, nil, path, nil, tc.args...)
			var ue *UsageError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want a usage error containing %q", err, tc.want)
			}
			if path != "" && !strings.Contains(err.Error(), path) {
				t.Errorf("err = %v does not name the file", err)
			}
		})
	}
}

// TestConfigFileParametersOfAnotherPolicyAreRefused: parameters the running
// policy would never read stop the server instead of being dropped; a file
// naming only the policy is still overridden quietly.
func TestConfigFileParametersOfAnotherPolicyAreRefused(t *testing.T) {
	path := writeConfig(t, "kvselect.yaml", "policy:\n  name: kv-cost\n  parameters:\n    router_temperature: 0.4\n")
	_, err := resolveWith(t, map[string]string{"KVSELECT_POLICY": "least-loaded"}, path, nil)
	var ue *UsageError
	want := path + ": policy.parameters of policy kv-cost have no effect: KVSELECT_POLICY chose policy least-loaded"
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v, want a usage error containing %q", err, want)
	}
	nameOnly := writeConfig(t, "kvselect.yaml", "policy:\n  name: kv-cost\n")
	if r, err := resolveWith(t, nil, nameOnly, nil, "--policy", "least-loaded"); err != nil || r.policy.name != "least-loaded" {
		t.Fatalf("policy %q, err %v", r.policy.name, err)
	}
}

func TestWithPolicyRefusesANamedPolicy(t *testing.T) {
	own := scheduler.DefaultPolicy()
	r, err := resolveWith(t, nil, "", &own)
	if err != nil || r.policy.source != "server.WithPolicy" {
		t.Fatalf("policy %+v, err %v", r.policy, err)
	}
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{nil, []string{"--policy", "random"}, "--policy names policy"},
		{map[string]string{"KVSELECT_POLICY": "random"}, nil, "KVSELECT_POLICY names policy"},
	} {
		if _, err := resolveWith(t, tc.env, "", &own, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("env %v args %v: err = %v, want %q", tc.env, tc.args, err, tc.want)
		}
	}
}

// restClient talks JSON to a running server.
type restClient struct {
	t    *testing.T
	base string
}

func (c restClient) call(method, path, body string, want int) map[string]any {
	c.t.Helper()
	req, err := http.NewRequest(method, c.base+path, strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != want {
		c.t.Fatalf("%s %s: %d %s, want %d", method, path, res.StatusCode, b, want)
	}
	var out map[string]any
	_ = json.Unmarshal(b, &out)
	return out
}

// TestReloadAppliesPolicyParametersAndKeepsTheLastGoodFile drives a running
// server through reloads: new kv-cost parameters show in /overlap_scores'
// router credit at once; a broken file changes nothing; router knobs are
// reported as needing a restart.
func TestReloadAppliesPolicyParametersAndKeepsTheLastGoodFile(t *testing.T) {
	path := writeConfig(t, "kvselect.yaml", "policy:\n  name: kv-cost\n  parameters:\n    overlap_score_credit: 1\n")
	reload := make(chan struct{})
	// Approximate mode: the index learns the booked prompt, so the same
	// prompt then overlaps on the booked worker without an engine.
	srv := runInBackground(t, withoutKVEvents, []string{"--config", path}, WithReload(reload))
	c, logs := restClient{t: t, base: srv.rest()}, srv.logs
	c.call("POST", "/workers", `{"worker_id":1,"model_name":"m","endpoint":"http://127.0.0.1:9","block_size":4}`, 201)
	prompt := `"model_name":"m","token_ids":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]`
	c.call("POST", "/select_and_reserve", `{"selection_id":"a",`+prompt+`}`, 200)
	credit := func() float64 {
		t.Helper()
		out := c.call("POST", "/overlap_scores", "{"+prompt+"}", 200)
		rows, _ := out["workers"].([]any)
		if len(rows) != 1 {
			t.Fatalf("overlap_scores %v", out)
		}
		row := rows[0].(map[string]any)
		if row["device_blocks"] != 4.0 {
			t.Fatalf("device_blocks %v, want 4 (the booked prompt)", row["device_blocks"])
		}
		return row["router_credit_blocks"].(float64)
	}
	if got := credit(); got != 4 {
		t.Fatalf("router credit %v with overlap_score_credit 1, want 4", got)
	}
	reloaded := func(msg string, n int) {
		t.Helper()
		reload <- struct{}{}
		proctest.Eventually(t, fmt.Sprintf("%d %q log lines", n, msg), 30*time.Second, func() bool {
			return strings.Count(logs.String(), `"msg":"`+msg) >= n
		})
	}

	if err := os.WriteFile(path, []byte("policy:\n  name: kv-cost\n  parameters:\n    overlap_score_credit: 0.25\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	reloaded("config reloaded", 1)
	if got := credit(); got != 1 {
		t.Fatalf("router credit %v after reloading overlap_score_credit 0.25, want 1", got)
	}

	if err := os.WriteFile(path, []byte("policy:\n  name: kv-cost\n  parameters:\n    overlap_score_credit: -1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	reloaded("config reload failed; the running configuration stays", 1)
	if got := credit(); got != 1 {
		t.Fatalf("router credit %v after a rejected reload, want the last good 1", got)
	}

	if err := os.WriteFile(path, []byte("policy:\n  name: kv-cost\n  parameters:\n    overlap_score_credit: 0.5\nrouter:\n  router_ttl_secs: 30\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	reloaded("config reloaded", 2)
	if got := credit(); got != 2 {
		t.Fatalf("router credit %v after reloading overlap_score_credit 0.5, want 2", got)
	}
	if !strings.Contains(logs.String(), `"changed":["router_ttl_secs"]`) {
		t.Errorf("no restart warning for router_ttl_secs in:\n%s", logs.String())
	}
}

// With no policy named the fronts get a default each: Dynamo's kv-cost on
// the REST API, predicted-latency on the ext_proc picker. Naming any policy
// (even kv-cost) puts both fronts on it.
func TestDefaultPolicyPerFront(t *testing.T) {
	for _, tc := range []struct {
		name       string
		env        map[string]string
		args       []string
		wantPicker bool
	}{
		{"nothing named", nil, nil, true},
		{"--policy kv-cost", nil, []string{"--policy", "kv-cost"}, false},
		{"environment", map[string]string{"KVSELECT_POLICY": "predicted-latency"}, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := resolveWith(t, tc.env, "", nil, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			if got := r.cfg.PickerPolicy != nil; got != tc.wantPicker {
				t.Fatalf("picker has its own policy: %v, want %v", got, tc.wantPicker)
			}
			if tc.wantPicker && (!r.cfg.PickerPolicy.PredictsLatency || r.cfg.Policy.PredictsLatency) {
				t.Errorf("picker policy %+v, REST policy %+v: want predicted-latency and kv-cost", r.cfg.PickerPolicy, r.cfg.Policy)
			}
		})
	}
}
