package peerproc

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// eppConfigShape is the part of an EndpointPickerConfig the tests read.
type eppConfigShape struct {
	Kind    string `json:"kind"`
	Plugins []struct {
		Name       string         `json:"name"`
		Type       string         `json:"type"`
		Parameters map[string]any `json:"parameters"`
	} `json:"plugins"`
	DataLayer struct {
		Discovery struct {
			PluginRef string `json:"pluginRef"`
		} `json:"discovery"`
	} `json:"dataLayer"`
	SchedulingProfiles []struct {
		Plugins []struct {
			PluginRef string   `json:"pluginRef"`
			Weight    *float64 `json:"weight"`
		} `json:"plugins"`
	} `json:"schedulingProfiles"`
}

// Each profile's configuration is well-formed YAML naming the scorers with the
// documented weights, every plugin it refers to is declared, and the engines'
// KV events socket, block size and endpoints are the ones given.
func TestGenerateEPPConfigProfiles(t *testing.T) {
	for _, tc := range []struct {
		profile     EPPProfile
		weights     map[string]float64
		speculative bool
	}{
		{EPPDefault, map[string]float64{"prefix-cache-scorer": 3, "queue-scorer": 1, "kv-cache-utilization-scorer": 1}, false},
		{EPPTuned, map[string]float64{"active-request-scorer": 4, "kv-cache-utilization-scorer": 2, "prefix-cache-scorer": 2, "no-hit-lru-scorer": 2}, true},
	} {
		t.Run(string(tc.profile), func(t *testing.T) {
			cfg := EPP{Endpoints: []string{"127.0.0.1:8000", "127.0.0.1:8001"}, ZMQEndpoint: "tcp://127.0.0.1:5557", BlockSize: 16, Profile: tc.profile}
			text, endpoints, err := GenerateEPPConfig(cfg, "/tmp/x/endpoints.yaml")
			if err != nil {
				t.Fatal(err)
			}
			var c eppConfigShape
			if err := yaml.Unmarshal([]byte(text), &c); err != nil {
				t.Fatalf("config is not YAML: %v\n%s", err, text)
			}
			declared := map[string]map[string]any{}
			for _, p := range c.Plugins {
				name := p.Name
				if name == "" {
					name = p.Type
				}
				declared[name] = p.Parameters
			}
			if len(c.SchedulingProfiles) != 1 {
				t.Fatalf("profiles: %+v", c.SchedulingProfiles)
			}
			got := map[string]float64{}
			for _, p := range c.SchedulingProfiles[0].Plugins {
				if _, ok := declared[p.PluginRef]; !ok {
					t.Errorf("profile refers to undeclared plugin %q", p.PluginRef)
				}
				if p.Weight != nil {
					got[p.PluginRef] = *p.Weight
				}
			}
			if len(got) != len(tc.weights) {
				t.Errorf("weights %v, want %v", got, tc.weights)
			}
			for k, w := range tc.weights {
				if got[k] != w {
					t.Errorf("weight of %s = %v, want %v", k, got[k], w)
				}
			}
			if _, ok := declared[c.DataLayer.Discovery.PluginRef]; !ok || c.Kind != "EndpointPickerConfig" {
				t.Errorf("discovery %q, kind %q", c.DataLayer.Discovery.PluginRef, c.Kind)
			}
			pp := declared["precise-prefix-cache-producer"]
			kv, _ := pp["kvEventsConfig"].(map[string]any)
			tp, _ := pp["tokenProcessorConfig"].(map[string]any)
			if kv["zmqEndpoint"] != "tcp://127.0.0.1:5557" || tp["blockSize"] != float64(16) || (pp["speculativeIndexing"] == true) != tc.speculative {
				t.Errorf("precise-prefix-cache-producer parameters %v", pp)
			}
			if declared["file-disc"]["path"] != "/tmp/x/endpoints.yaml" {
				t.Errorf("file discovery parameters %v", declared["file-disc"])
			}
			var eps struct {
				Endpoints []struct{ Name, Address, Port string } `json:"endpoints"`
			}
			if err := yaml.Unmarshal([]byte(endpoints), &eps); err != nil || len(eps.Endpoints) != 2 ||
				eps.Endpoints[1].Address != "127.0.0.1" || eps.Endpoints[1].Port != "8001" {
				t.Errorf("endpoints %v: %+v\n%s", err, eps, endpoints)
			}
		})
	}
}

func TestGenerateEPPConfigRefusesBadInput(t *testing.T) {
	for name, cfg := range map[string]EPP{
		"no endpoints":     {ZMQEndpoint: "tcp://127.0.0.1:1"},
		"not host:port":    {Endpoints: []string{"127.0.0.1"}},
		"unknown profile":  {Endpoints: []string{"127.0.0.1:1"}, Profile: "fastest"},
		"empty port field": {Endpoints: []string{"127.0.0.1:"}},
	} {
		if _, _, err := GenerateEPPConfig(cfg, "e.yaml"); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// StartEPP runs llm-d's endpoint picker from its binary until its gRPC health
// answers SERVING, with its Prometheus metrics readable without credentials,
// for both profiles (the tuned one exercises plugins the sample lacks).
func TestStartEPPServes(t *testing.T) {
	bin := EPPBinary(t)
	for _, profile := range []EPPProfile{EPPDefault, EPPTuned} {
		t.Run(string(profile), func(t *testing.T) {
			var ports [5]int
			for i := range ports {
				p, err := FreePort()
				if err != nil {
					t.Fatal(err)
				}
				ports[i] = p
			}
			log := &LogBuffer{}
			p, err := StartEPP(context.Background(), EPP{
				Binary: bin, Dir: t.TempDir(), Endpoints: []string{"127.0.0.1:" + strconv.Itoa(ports[0])},
				ZMQEndpoint: "tcp://127.0.0.1:" + strconv.Itoa(ports[1]), Profile: profile,
				GRPCPort: ports[2], HealthPort: ports[3], MetricsPort: ports[4], Log: log,
			})
			if err != nil {
				t.Fatalf("%v\n%s", err, log)
			}
			defer p.Stop()
			resp, err := http.Get(p.MetricsURL())
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || p.Pid() <= 0 || !strings.HasSuffix(p.Addr(), ":"+strconv.Itoa(ports[2])) {
				t.Fatalf("metrics %s, pid %d, addr %s", resp.Status, p.Pid(), p.Addr())
			}
		})
	}
}
