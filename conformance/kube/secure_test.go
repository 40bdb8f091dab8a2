package kube

import (
	"context"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvselect/kvselect/discovery/kubetest"
	"github.com/kvselect/kvselect/internal/access"
)

// The deploy/ manifests are secure by default: the REST API authenticates
// (ServiceAccount tokens, plus a generated static token in the chart), the
// picker serves TLS, the replica mesh is keyed and index recovery sends a
// token. These tests pin those defaults on the rendered objects; the RBAC
// they rely on is exercised against a real API server in rbac_test.go.

// picker returns the kvselect Deployment's pod spec and container.
func picker(t *testing.T, objs []*unstructured.Unstructured) (corev1.PodSpec, corev1.Container) {
	t.Helper()
	for _, u := range find(objs, "Deployment") {
		if strings.HasPrefix(u.GetName(), "kvselect") && !strings.HasSuffix(u.GetName(), "vllm") {
			spec := into[appsv1.Deployment](t, u).Spec.Template.Spec
			return spec, spec.Containers[0]
		}
	}
	t.Fatal("no kvselect Deployment")
	return corev1.PodSpec{}, corev1.Container{}
}

// named returns the object of kind and name, or nil.
func named(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range find(objs, kind) {
		if o.GetName() == name {
			return o
		}
	}
	return nil
}

// secretOf returns the Secret volume and item key the file path comes from.
func secretOf(t *testing.T, pod corev1.PodSpec, c corev1.Container, path string) (name, key string) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		rel, ok := strings.CutPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/")
		if !ok {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name != m.Name || v.Secret == nil {
				continue
			}
			for _, it := range v.Secret.Items {
				if it.Path == rel {
					return v.Secret.SecretName, it.Key
				}
			}
			return v.Secret.SecretName, rel
		}
	}
	t.Fatalf("%s comes from no Secret volume", path)
	return "", ""
}

// secretData decodes a rendered Secret's data.
func secretData(t *testing.T, u *unstructured.Unstructured) map[string]string {
	t.Helper()
	s := into[corev1.Secret](t, u)
	out := map[string]string{}
	for k, v := range s.Data {
		out[k] = string(v)
	}
	for k, v := range s.StringData {
		out[k] = v
	}
	return out
}

func wantArgs(t *testing.T, args []string, want, unwanted []string) {
	t.Helper()
	for _, w := range want {
		if !slices.ContainsFunc(args, func(a string) bool { return a == w || strings.HasPrefix(a, w+"=") }) {
			t.Errorf("args lack %s: %q", w, args)
		}
	}
	for _, u := range unwanted {
		if hasFlag(args, u) {
			t.Errorf("args have %s: %q", u, args)
		}
	}
}

var alnum48 = regexp.MustCompile(`^[A-Za-z0-9]{48}$`)

func TestChartIsSecureByDefault(t *testing.T) {
	files, err := RenderChartFiles(chartDir, "kvselect", "llm", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := ChartObjects(files)
	if err != nil {
		t.Fatal(err)
	}
	pod, c := picker(t, objs)
	wantArgs(t, c.Args, []string{"--auth-kubernetes", "--auth-token-file", "--extproc-secure-serving"},
		[]string{"--auth-allow-unauthenticated", "--host", "--replica-sync-port"})
	if p := c.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/health" {
		t.Errorf("liveness probe %+v: a TLS picker is probed with GET /health", p)
	}

	// The generated token: a Secret holding it bare and as a token file with
	// every scope, which kvselect's own parser accepts.
	name, key := secretOf(t, pod, c, flagValue(c.Args, "--auth-token-file"))
	sec := named(objs, "Secret", name)
	if name != "kvselect-auth-tokens" || key != "tokens" || sec == nil {
		t.Fatalf("--auth-token-file from Secret %s key %s, rendered: %v", name, key, sec != nil)
	}
	data := secretData(t, sec)
	token := data["token"]
	if !alnum48.MatchString(token) {
		t.Errorf("generated token %q: want 48 random alphanumerics", token)
	}
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte(data["tokens"]), 0o600); err != nil {
		t.Fatal(err)
	}
	tf, err := access.OpenTokenFile(path, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatalf("kvselect refuses the generated token file %q: %v", data["tokens"], err)
	}
	id, scopes, found, invalid := tf.Lookup(token)
	if !found || invalid != "" || !scopes.Has(access.Read) || !scopes.Has(access.Select) || !scopes.Has(access.Admin) || id.Subject != "helm-generated" {
		t.Errorf("the generated token in its file: found %v (%s), scopes %s, identity %s; want read,select,admin as helm-generated", found, invalid, scopes, id)
	}
	if tf.Len() != 1 {
		t.Errorf("the generated token file holds %d tokens, want 1", tf.Len())
	}
	again, err := RenderChart(chartDir, "kvselect", "llm", nil)
	if err != nil {
		t.Fatal(err)
	}
	if secretData(t, named(again, "Secret", "kvselect-auth-tokens"))["token"] == token {
		t.Error("two renderings without a cluster gave the same token: it is not random")
	}
	if notes := files["kvselect/templates/NOTES.txt"]; !strings.Contains(notes, "get secret kvselect-auth-tokens -o jsonpath='{.data.token}' | base64 -d") ||
		!strings.Contains(notes, "Authorization: Bearer $TOKEN") {
		t.Errorf("NOTES.txt does not tell how to read and send the generated token:\n%s", notes)
	}

	// --auth-kubernetes: the two reviews for kvselect's ServiceAccount, and
	// the read scope for itself.
	crb := named(objs, "ClusterRoleBinding", "llm-kvselect-auth-delegator")
	if crb == nil {
		t.Fatal("no ClusterRoleBinding llm-kvselect-auth-delegator")
	}
	b := into[rbacv1.ClusterRoleBinding](t, crb)
	if b.RoleRef.Name != "system:auth-delegator" || len(b.Subjects) != 1 || b.Subjects[0].Name != pod.ServiceAccountName || b.Subjects[0].Namespace != "llm" {
		t.Errorf("ClusterRoleBinding %+v %+v", b.RoleRef, b.Subjects)
	}
	rb := named(objs, "RoleBinding", "kvselect-scope-read")
	role := named(objs, "Role", "kvselect-scope-read")
	if rb == nil || role == nil {
		t.Fatal("no read scope Role and RoleBinding for kvselect's ServiceAccount")
	}
	if r := into[rbacv1.Role](t, role).Rules; len(r) != 1 || !slices.Equal(r[0].ResourceNames, []string{"read"}) {
		t.Errorf("scope Role rules %+v, want read only", r)
	}
	if s := into[rbacv1.RoleBinding](t, rb).Subjects; len(s) != 1 || s[0].Name != pod.ServiceAccountName {
		t.Errorf("scope RoleBinding subjects %+v", s)
	}
}

func TestChartHAIsKeyed(t *testing.T) {
	for _, tc := range []struct {
		name                string
		vals                map[string]any
		peerSecret, peerKey string // "" : the ServiceAccount token
	}{
		{"service account tokens", map[string]any{"ha": map[string]any{"enabled": true}}, "", ""},
		{"static tokens only", map[string]any{"ha": map[string]any{"enabled": true}, "auth": map[string]any{"kubernetes": false}},
			"kvselect-auth-tokens", "token"},
		{"peer token Secret", map[string]any{"ha": map[string]any{"enabled": true, "peerTokenSecret": map[string]any{"name": "peer", "key": "t"}},
			"auth": map[string]any{"kubernetes": false, "tokens": map[string]any{"existingSecret": "mine"}}}, "peer", "t"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := RenderChart(chartDir, "kvselect", "llm", tc.vals)
			if err != nil {
				t.Fatal(err)
			}
			pod, c := picker(t, objs)
			wantArgs(t, c.Args, []string{"--replica-sync-port", "--replica-sync-key-file", "--indexer-peers", "--indexer-peers-token-file"}, nil)
			name, key := secretOf(t, pod, c, flagValue(c.Args, "--replica-sync-key-file"))
			sec := named(objs, "Secret", name)
			if name != "kvselect-mesh-key" || key != "key" || sec == nil {
				t.Fatalf("--replica-sync-key-file from Secret %s key %s, rendered: %v", name, key, sec != nil)
			}
			k := secretData(t, sec)["key"]
			if b, err := hex.DecodeString(k); err != nil || len(b) != 32 {
				t.Errorf("generated mesh key %q: want 64 hex digits", k)
			}
			peer := flagValue(c.Args, "--indexer-peers-token-file")
			if tc.peerSecret == "" {
				if peer != saToken {
					t.Errorf("--indexer-peers-token-file=%s, want the ServiceAccount token", peer)
				}
				return
			}
			if name, key := secretOf(t, pod, c, peer); name != tc.peerSecret || key != tc.peerKey {
				t.Errorf("--indexer-peers-token-file from Secret %s key %s, want %s %s", name, key, tc.peerSecret, tc.peerKey)
			}
		})
	}
}

func TestChartAuthOptOutIsExplicit(t *testing.T) {
	files, err := RenderChartFiles(chartDir, "kvselect", "llm", map[string]any{"auth": map[string]any{"enabled": false}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := ChartObjects(files)
	if err != nil {
		t.Fatal(err)
	}
	_, c := picker(t, objs)
	wantArgs(t, c.Args, []string{"--host=0.0.0.0", "--auth-allow-unauthenticated"}, []string{"--auth-kubernetes", "--auth-token-file"})
	for _, kind := range []string{"Secret", "ClusterRoleBinding"} {
		if len(find(objs, kind)) > 0 {
			t.Errorf("a %s without authentication", kind)
		}
	}
	if !strings.Contains(files["kvselect/templates/NOTES.txt"], "WARNING: auth.enabled is false") {
		t.Errorf("NOTES.txt does not warn:\n%s", files["kvselect/templates/NOTES.txt"])
	}
	// The user's own token Secret: nothing generated, theirs mounted.
	objs, err = RenderChart(chartDir, "kvselect", "llm", map[string]any{"auth": map[string]any{"tokens": map[string]any{"existingSecret": "mine", "key": "file"}}})
	if err != nil {
		t.Fatal(err)
	}
	pod, c := picker(t, objs)
	if len(find(objs, "Secret")) > 0 {
		t.Error("a Secret generated beside auth.tokens.existingSecret")
	}
	if name, key := secretOf(t, pod, c, flagValue(c.Args, "--auth-token-file")); name != "mine" || key != "file" {
		t.Errorf("--auth-token-file from %s key %s, want mine file", name, key)
	}
}

// Values the flags would refuse fail at render time, naming the value.
func TestChartRefusesInsecureOrBrokenValues(t *testing.T) {
	for _, tc := range []struct {
		vals map[string]any
		want string
	}{
		{map[string]any{"auth": map[string]any{"kubernetes": false, "tokens": map[string]any{"create": false}}}, "nobody could call the REST API"},
		{map[string]any{"auth": map[string]any{"grants": []any{map[string]any{"name": "x", "subjects": []any{map[string]any{"kind": "User", "name": "u"}}}}}}, "no scopes"},
		{map[string]any{"auth": map[string]any{"grants": []any{map[string]any{"name": "x", "scopes": []any{"write"}, "subjects": []any{map[string]any{"kind": "User", "name": "u"}}}}}}, `unknown scope "write"`},
		{map[string]any{"auth": map[string]any{"kubernetes": false, "grants": []any{map[string]any{"name": "x", "scopes": []any{"read"}, "subjects": []any{map[string]any{"kind": "User", "name": "u"}}}}}}, "need auth.enabled and auth.kubernetes"},
		{map[string]any{"extproc": map[string]any{"secureServing": false, "clientCASecretName": "ca"}}, "extproc.clientCASecretName needs extproc.secureServing"},
		{map[string]any{"rest": map[string]any{"tls": map[string]any{"clientCASecretName": "ca"}}}, "needs rest.tls.certSecretName"},
		{map[string]any{"rest": map[string]any{"tls": map[string]any{"clientCASecretName": "ca", "certSecretName": "t"}}}, "needs config.auth.client_certificates"},
		{map[string]any{"config": map[string]any{"auth": map[string]any{"client_certificates": []any{map[string]any{"ou": "ops", "scopes": []any{"read"}}}}}}, "config.auth.client_certificates needs rest.tls.clientCASecretName"},
		{map[string]any{"ha": map[string]any{"enabled": true, "meshKey": map[string]any{"create": false}}}, "ha.enabled needs a mesh key"},
		{map[string]any{"ha": map[string]any{"enabled": true}, "auth": map[string]any{"kubernetes": false, "tokens": map[string]any{"existingSecret": "mine"}}}, "set ha.peerTokenSecret"},
	} {
		_, err := RenderChart(chartDir, "kvselect", "llm", tc.vals)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("values %v: err = %v, want %q", tc.vals, err, tc.want)
		}
	}
}

func TestKustomizeIsSecureByDefault(t *testing.T) {
	for _, s := range sets() {
		if !strings.HasPrefix(s.name, "kustomize-") || s.workloadsOnly() {
			continue
		}
		t.Run(s.name, func(t *testing.T) {
			objs := render(t, s)
			pod, c := picker(t, objs)
			wantArgs(t, c.Args, []string{"--auth-kubernetes", "--extproc-secure-serving"}, []string{"--auth-allow-unauthenticated", "--host"})
			crbs := find(objs, "ClusterRoleBinding")
			if len(crbs) != 1 {
				t.Fatalf("%d ClusterRoleBindings, want the auth-delegator one", len(crbs))
			}
			if b := into[rbacv1.ClusterRoleBinding](t, crbs[0]); b.RoleRef.Name != "system:auth-delegator" || b.Subjects[0].Namespace != s.namespace || b.Subjects[0].Name != pod.ServiceAccountName {
				t.Errorf("ClusterRoleBinding %s: %+v %+v", b.Name, b.RoleRef, b.Subjects)
			}
			if named(objs, "RoleBinding", "kvselect-scope-read") == nil {
				t.Error("no read scope for kvselect's own ServiceAccount")
			}
			if !hasFlag(c.Args, "--replica-sync-port") {
				return
			}
			if name, _ := secretOf(t, pod, c, flagValue(c.Args, "--replica-sync-key-file")); name != "kvselect-mesh-key" {
				t.Errorf("mesh key from Secret %s, want kvselect-mesh-key (deploy/README.md)", name)
			}
			if p := flagValue(c.Args, "--indexer-peers-token-file"); p != saToken {
				t.Errorf("--indexer-peers-token-file=%s, want the ServiceAccount token", p)
			}
			if s.name == "kustomize-ha-token-file" {
				if name, key := secretOf(t, pod, c, flagValue(c.Args, "--auth-token-file")); name != "kvselect-auth-tokens" || key != "tokens" {
					t.Errorf("--auth-token-file from Secret %s key %s", name, key)
				}
			}
		})
	}
	readme, err := os.ReadFile(root + "/deploy/README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kubectl create secret generic kvselect-auth-tokens --from-file=tokens=",
		"kubectl -n llm create secret generic kvselect-mesh-key", "components/auth-token-file"} {
		if !strings.Contains(string(readme), want) {
			t.Errorf("deploy/README.md does not tell %q", want)
		}
	}
}

// TestChartKeepsGeneratedSecretsAcrossUpgrades renders the chart as `helm
// install` does against a real API server, creates its generated Secrets,
// then renders again as `helm upgrade` would: lookup returns the stored
// token and mesh key, so an upgrade neither locks out the token's users nor
// splits the replicas between two keys.
func TestChartKeepsGeneratedSecretsAcrossUpgrades(t *testing.T) {
	env := kubetest.Start(t)
	c, err := client.New(env.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const ns = "upgrade"
	ensureNamespace(t, c, ns)
	vals := map[string]any{"ha": map[string]any{"enabled": true}}
	render := func(withCluster bool) (token, key string) {
		t.Helper()
		cfg := env.Config
		if !withCluster {
			cfg = nil
		}
		files, err := RenderChartFiles(chartDir, "kvselect", ns, vals, cfg)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := ChartObjects(files)
		if err != nil {
			t.Fatal(err)
		}
		return secretData(t, named(objs, "Secret", "kvselect-auth-tokens"))["token"], secretData(t, named(objs, "Secret", "kvselect-mesh-key"))["key"]
	}
	// Install: nothing stored yet; then the Secrets as Helm would create them.
	files, err := RenderChartFiles(chartDir, "kvselect", ns, vals, env.Config)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := ChartObjects(files)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range find(objs, "Secret") {
		s.SetNamespace(ns)
		if err := c.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	installed := secretData(t, named(objs, "Secret", "kvselect-auth-tokens"))["token"]
	installedKey := secretData(t, named(objs, "Secret", "kvselect-mesh-key"))["key"]
	if token, key := render(true); token != installed || key != installedKey {
		t.Errorf("upgrade changed the generated secrets: token %q → %q, mesh key %q → %q", installed, token, installedKey, key)
	}
	if token, key := render(false); token == installed || key == installedKey {
		t.Error("a rendering without the cluster kept the values: lookup is not what keeps them")
	}
}
