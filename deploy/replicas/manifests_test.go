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
		"--replica-sync-resolve-peers", "--indexer-peers=http://kvselect:8092", "--extproc-port=0"} {
		if !strings.Contains(args, want) {
			t.Errorf("args lack %s: %s", want, args)
		}
	}
	// Secure by default: the REST API authenticates (and so binds all
	// addresses by itself), the mesh is keyed, recovery sends a token, and
	// every file comes from a Secret the user creates (README.md), mounted
	// whole so that a rotated token file is picked up.
	for _, bad := range []string{"--host", "--auth-allow-unauthenticated"} {
		if strings.Contains(args, bad) {
			t.Errorf("args have %s: the REST API must authenticate, not bind all addresses open: %s", bad, args)
		}
	}
	files := map[string]string{
		"--auth-token-file":          "kvselect-auth-tokens",
		"--replica-sync-key-file":    "kvselect-mesh-key",
		"--indexer-peers-token-file": "kvselect-auth-tokens",
	}
	for flag, secret := range files {
		path := flagValue(c.Args, flag)
		if path == "" {
			t.Errorf("args lack %s: %s", flag, args)
			continue
		}
		vol, item := secretFor(t, pod.Spec, c, path)
		if vol == nil || vol.Secret == nil || vol.Secret.SecretName != secret || item == "" {
			t.Errorf("%s=%s: not a file of Secret %s mounted in the container (volume %+v)", flag, path, secret, vol)
			continue
		}
		if vol.Secret.Optional != nil && *vol.Secret.Optional {
			t.Errorf("Secret %s is optional: the pods would start without it", secret)
		}
	}
	for _, m := range c.VolumeMounts {
		if m.SubPath != "" {
			t.Errorf("volume mount %s uses subPath, which never sees a Secret's updates", m.Name)
		}
	}
	if a := pod.Spec.AutomountServiceAccountToken; a == nil || *a {
		t.Error("the pods get a ServiceAccount token they do not use (automountServiceAccountToken)")
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kubectl create secret generic kvselect-auth-tokens", "kubectl create secret generic kvselect-mesh-key", "KVSELECT_TOKEN"} {
		if !strings.Contains(string(readme), want) {
			t.Errorf("README.md does not tell %q", want)
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

// flagValue returns the value of --name=value in args, or "".
func flagValue(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	return ""
}

// secretFor finds the Secret volume and item key that path, a file in one of
// c's volume mounts, comes from.
func secretFor(t *testing.T, spec corev1.PodSpec, c corev1.Container, path string) (*corev1.Volume, string) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		rel, ok := strings.CutPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/")
		if !ok {
			continue
		}
		for i := range spec.Volumes {
			v := &spec.Volumes[i]
			if v.Name != m.Name || v.Secret == nil {
				continue
			}
			for _, it := range v.Secret.Items {
				if it.Path == rel {
					return v, it.Key
				}
			}
			return v, ""
		}
	}
	return nil, ""
}

// Tokens of the test's Secrets, in the shapes README.md has the user create.
const (
	adminToken = "0123456789abcdef0123456789abcdef-admin"
	peerToken  = "0123456789abcdef0123456789abcdef-peer"
)

// secretData is what the README's commands put in each Secret.
var secretData = map[string]map[string]string{
	"kvselect-auth-tokens": {
		"tokens":     adminToken + " admin,read name=operator\n" + peerToken + " read name=replica-peers\n",
		"peer-token": peerToken,
	},
	"kvselect-mesh-key": {"key": strings.Repeat("5a", 32) + "\n"},
}

// materialize writes the Deployment's Secret volumes into dir, as the
// kubelet would mount them, and returns the args with each mount path
// replaced by its directory.
func materialize(t *testing.T, spec corev1.PodSpec, c corev1.Container, dir string) []string {
	t.Helper()
	args := slices.Clone(c.Args)
	for _, m := range c.VolumeMounts {
		i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		if i < 0 || spec.Volumes[i].Secret == nil {
			t.Fatalf("volume mount %s: no Secret volume", m.Name)
		}
		sec := spec.Volumes[i].Secret
		data, ok := secretData[sec.SecretName]
		if !ok {
			t.Fatalf("Secret %s: the test does not know what README.md puts in it", sec.SecretName)
		}
		local := filepath.Join(dir, m.Name)
		if err := os.MkdirAll(local, 0o700); err != nil {
			t.Fatal(err)
		}
		for _, it := range sec.Items {
			v, ok := data[it.Key]
			if !ok {
				t.Fatalf("Secret %s has no key %s", sec.SecretName, it.Key)
			}
			if err := os.WriteFile(filepath.Join(local, it.Path), []byte(v), 0o400); err != nil {
				t.Fatal(err)
			}
		}
		for j, a := range args {
			if name, val, ok := strings.Cut(a, "="); ok && strings.HasPrefix(val, m.MountPath+"/") {
				args[j] = name + "=" + local + strings.TrimPrefix(val, m.MountPath)
			}
		}
	}
	return args
}

// The Deployment's arguments and environment start a real kvselect (with the
// ports moved to free loopback ones and the Secrets written as the kubelet
// mounts them): the flags parse, the mesh binds with its key, the REST API
// answers the probes without a token and everything else only with one, and
// register-workers.sh registers workers with its token.
func TestKvselectAcceptsTheDeploymentArgs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvselect; skipped with -short")
	}
	spec := decode[appsv1.Deployment](t, "deployment.yaml")[0].Spec.Template.Spec
	c := spec.Containers[0]
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
	args := append(materialize(t, spec, c, t.TempDir()), "--host", "127.0.0.1", "--port", "0", "--replica-sync-port", fmt.Sprint(replicaPort))
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
	stopped := false
	defer func() {
		if !stopped {
			_ = cmd.Process.Kill()
			<-done
		}
	}()
	base := "http://" + addr
	code, resp, err := request(http.MethodGet, base+"/ready", "", "")
	if err != nil {
		t.Fatal(err)
	}
	if code != http.StatusServiceUnavailable || !strings.Contains(resp, `"ready":false`) || !strings.Contains(resp, `"index_recovery":`) {
		t.Errorf("/ready of a fresh replica without a token: %d %s", code, resp)
	}
	for _, tc := range []struct {
		method, token string
		want          int
	}{
		{http.MethodGet, "", http.StatusUnauthorized},
		{http.MethodGet, "wrong-token-0123456789abcdef", http.StatusUnauthorized},
		{http.MethodGet, peerToken, http.StatusOK},
		{http.MethodPost, peerToken, http.StatusForbidden}, // the replicas' token reads, no more
	} {
		code, body, err := request(tc.method, base+"/workers", tc.token, `{"worker_id":7,"model_name":"m","endpoint":"http://w:8000","block_size":4}`)
		if err != nil {
			t.Fatal(err)
		}
		if code != tc.want {
			t.Errorf("%s /workers with token %q: %d %s, want %d", tc.method, tc.token, code, body, tc.want)
		}
	}

	// register-workers.sh as written, with a kubectl that lists one pod and
	// whose port-forward is kvselect already listening on the local port.
	fake := t.TempDir()
	kubectl := "#!/bin/sh\ncase \"$*\" in\n  *\" get pods \"*) echo kvselect-0 ;;\n  *port-forward*) exec sleep 300 ;;\n  *) echo \"fake kubectl: $*\" >&2; exit 1 ;;\nesac\n"
	if err := os.WriteFile(filepath.Join(fake, "kubectl"), []byte(kubectl), 0o755); err != nil {
		t.Fatal(err)
	}
	workers := filepath.Join(fake, "workers.json")
	if err := os.WriteFile(workers, []byte(`[{"worker_id":1,"model_name":"m","endpoint":"http://w1:8000","block_size":4},{"worker_id":2,"model_name":"m","endpoint":"http://w2:8000","block_size":4}]`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(addr)
	script := func(token string) (string, error) {
		sh := exec.Command("bash", "register-workers.sh", workers, "llm")
		sh.Env = append(os.Environ(), "PATH="+fake+string(os.PathListSeparator)+os.Getenv("PATH"), "KVSELECT_LOCAL_PORT="+port)
		if token != "" {
			sh.Env = append(sh.Env, "KVSELECT_TOKEN="+token)
		}
		out, err := sh.CombinedOutput()
		return string(out), err
	}
	if out, err := script(""); err == nil || !strings.Contains(out, "KVSELECT_TOKEN") {
		t.Errorf("register-workers.sh without KVSELECT_TOKEN: %v\n%s", err, out)
	}
	if out, err := script(peerToken); err == nil {
		t.Errorf("register-workers.sh with a read-only token succeeded:\n%s", out)
	}
	out, err := script(adminToken)
	if err != nil || !strings.Contains(out, "kvselect-0: 2 workers registered") {
		t.Fatalf("register-workers.sh: %v\n%s\nkvselect:\n%s", err, out, logs.String())
	}
	if strings.Contains(out, adminToken) {
		t.Errorf("register-workers.sh printed the token:\n%s", out)
	}
	_, body, err := request(http.MethodGet, base+"/workers", adminToken, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{`"worker_id":1`, `"worker_id":2`} {
		if !strings.Contains(body, id) {
			t.Errorf("GET /workers after register-workers.sh lacks %s: %s", id, body)
		}
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	stopped = true
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

// request sends method url with an optional bearer token and JSON body (for
// POST), and returns the status and body.
func request(method, url, token, body string) (int, string, error) {
	var rd io.Reader
	if method == http.MethodPost {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}
