//go:build unix

// Package replicas holds the Kubernetes example of a kvselect replica set
// (README.md). Its test decodes the manifests strictly into the Kubernetes API
// types, checks the wiring the replica planes rely on, and starts the real
// kvselect binary with the Deployment's arguments and environment, so a flag
// kvselect would refuse fails here rather than in a cluster.
package replicas

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

// decode reads a multi-document YAML file into out, one value per document;
// unknown fields are errors.
func decode[T any](t *testing.T, file string) []T {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []T
	for doc := range strings.SplitSeq(string(raw), "\n---\n") {
		var v T
		if err := yaml.UnmarshalStrict([]byte(doc), &v); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		out = append(out, v)
	}
	return out
}

func TestManifestsWireTheReplicaPlanes(t *testing.T) {
	var kust struct {
		Resources []string `json:"resources"`
	}
	raw, err := os.ReadFile("kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &kust); err != nil {
		t.Fatal(err)
	}
	yamls, _ := filepath.Glob("*.yaml")
	for _, f := range yamls {
		if f != "kustomization.yaml" && !slices.Contains(kust.Resources, f) {
			t.Errorf("kustomization.yaml does not list %s", f)
		}
	}

	dep := decode[appsv1.Deployment](t, "deployment.yaml")[0]
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 3 {
		t.Errorf("replicas = %v, want 3", dep.Spec.Replicas)
	}
	pod := dep.Spec.Template
	for k, v := range dep.Spec.Selector.MatchLabels {
		if pod.Labels[k] != v {
			t.Errorf("selector %s=%s does not match the pod labels %v", k, v, pod.Labels)
		}
	}
	c := pod.Spec.Containers[0]
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["http"] != 8092 || ports["replica-sync"] != 9092 {
		t.Errorf("container ports %v", ports)
	}
	if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/ready" {
		t.Errorf("readiness probe %+v, want GET /ready (it waits for index recovery)", p)
	}
	if p := c.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/health" {
		t.Errorf("liveness probe %+v, want GET /health", p)
	}
	args := strings.Join(c.Args, " ")
	for _, want := range []string{"--replica-sync-port=9092", "--replica-sync-peers=tcp://kvselect-mesh:9092",
		"--replica-sync-resolve-peers", "--indexer-peers=http://kvselect:8092"} {
		if !strings.Contains(args, want) {
			t.Errorf("args lack %s: %s", want, args)
		}
	}

	svcs := map[string]corev1.Service{}
	for _, s := range decode[corev1.Service](t, "service.yaml") {
		svcs[s.Name] = s
		for k, v := range s.Spec.Selector {
			if pod.Labels[k] != v {
				t.Errorf("service %s selects %s=%s, pods are %v", s.Name, k, v, pod.Labels)
			}
		}
	}
	mesh, client := svcs["kvselect-mesh"], svcs["kvselect"]
	if mesh.Spec.ClusterIP != corev1.ClusterIPNone || !mesh.Spec.PublishNotReadyAddresses {
		t.Errorf("mesh service must be headless and list not-ready pods: %+v", mesh.Spec)
	}
	if len(mesh.Spec.Ports) != 1 || mesh.Spec.Ports[0].Port != 9092 {
		t.Errorf("mesh ports %+v", mesh.Spec.Ports)
	}
	if client.Spec.ClusterIP == corev1.ClusterIPNone || client.Spec.PublishNotReadyAddresses || client.Spec.Ports[0].Port != 8092 {
		t.Errorf("client service must route to ready pods only, on 8092: %+v", client.Spec)
	}
	pdb := decode[policyv1.PodDisruptionBudget](t, "pdb.yaml")[0]
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 2 {
		t.Errorf("pdb %+v", pdb.Spec)
	}
}

// The Deployment's arguments and environment start a real kvselect (with the
// ports moved to free loopback ones): the flags parse, the mesh binds, the
// HTTP API answers, and /ready reports the index recovery.
func TestKvselectAcceptsTheDeploymentArgs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvselect; skipped with -short")
	}
	c := decode[appsv1.Deployment](t, "deployment.yaml")[0].Spec.Template.Spec.Containers[0]
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "kvselect")
	if out, err := exec.Command(goTool, "build", "-o", bin, "../../cmd/kvselect").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	replicaPort := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	// Later flags win: only the listening addresses change.
	args := append(slices.Clone(c.Args), "--host", "127.0.0.1", "--port", "0", "--replica-sync-port", fmt.Sprint(replicaPort))
	cmd := exec.Command(bin, args...)
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "DYN_") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	for _, e := range c.Env {
		cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
	}
	var logs bytes.Buffer
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addrc := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logs.WriteString(sc.Text() + "\n")
			var rec struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "kvselect listening" {
				addrc <- rec.Addr
			}
		}
		done <- cmd.Wait()
	}()
	var addr string
	select {
	case addr = <-addrc:
	case err := <-done:
		t.Fatalf("kvselect refused the Deployment's arguments: %v\n%s", err, logs.String())
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		<-done // logs is the reader's until it is done
		t.Fatalf("kvselect did not start:\n%s", logs.String())
	}
	resp, err := httpGet("http://" + addr + "/ready")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(resp, `"ready":false`) || !strings.Contains(resp, `"index_recovery":`) {
		t.Errorf("/ready of a fresh replica: %s", resp)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("kvselect did not stop:\n%s", logs.String())
	}
}

func httpGet(url string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
