package kube

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// TestChartMonitoring: off by default; on, the ServiceMonitor scrapes the
// picker Service's REST port with the generated read token, and the
// PrometheusRule carries exactly the groups of deploy/observability/alerts.yaml,
// which promtool accepts when it is installed.
func TestChartMonitoring(t *testing.T) {
	objs, err := RenderChart(chartDir, "kvselect", "llm", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(find(objs, "ServiceMonitor"))+len(find(objs, "PrometheusRule")) != 0 {
		t.Fatal("monitoring objects rendered by default")
	}
	objs, err = RenderChart(chartDir, "kvselect", "llm", map[string]any{"metrics": map[string]any{
		"serviceMonitor": map[string]any{"enabled": true, "labels": map[string]any{"release": "prom"}},
		"prometheusRule": map[string]any{"enabled": true},
	}})
	if err != nil {
		t.Fatal(err)
	}
	sms := find(objs, "ServiceMonitor")
	if len(sms) != 1 {
		t.Fatalf("%d ServiceMonitors, want 1", len(sms))
	}
	sm := sms[0]
	sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	var svc *unstructured.Unstructured
	for _, s := range find(objs, "Service") {
		if labels := s.GetLabels(); labelsMatch(sel, labels) && hasPort(s, "http") {
			svc = s
		}
	}
	if svc == nil {
		t.Fatalf("ServiceMonitor selector %v matches no Service with an http port", sel)
	}
	if sm.GetLabels()["release"] != "prom" {
		t.Errorf("ServiceMonitor labels %v lack release=prom", sm.GetLabels())
	}
	eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(eps) != 1 {
		t.Fatalf("endpoints %v", eps)
	}
	ep := eps[0].(map[string]any)
	secret, _, _ := unstructured.NestedString(ep, "authorization", "credentials", "name")
	if ep["port"] != "http" || ep["path"] != "/metrics" || secret != "kvselect-auth-tokens" {
		t.Errorf("endpoint %v: want port http, path /metrics and the generated token", ep)
	}

	rules := find(objs, "PrometheusRule")
	if len(rules) != 1 {
		t.Fatalf("%d PrometheusRules, want 1", len(rules))
	}
	raw, err := os.ReadFile(filepath.Join(root, "deploy/observability/alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var want map[string]any
	if err := yaml.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	got, _, _ := unstructured.NestedMap(rules[0].Object, "spec")
	if !reflect.DeepEqual(got["groups"], want["groups"]) {
		t.Errorf("PrometheusRule groups differ from deploy/observability/alerts.yaml")
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Log("promtool not installed: the rules file is checked in the main module's observability test")
		return
	}
	spec, _ := yaml.Marshal(got)
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, spec, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", path).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules on the rendered PrometheusRule: %v\n%s", err, out)
	}
}

func labelsMatch(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return len(sel) > 0
}

func hasPort(svc *unstructured.Unstructured, name string) bool {
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	for _, p := range ports {
		if m, ok := p.(map[string]any); ok && m["name"] == name {
			return true
		}
	}
	return false
}
