package kube

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	giev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/kvselect/kvselect/discovery/inferencepool"
	"github.com/kvselect/kvselect/discovery/kubetest"
	"github.com/kvselect/kvselect/selection/catalog"
)

const (
	root     = "../.."
	chartDir = root + "/deploy/helm/kvselect"
)

// manifestSet is one way of deploying kvselect: a chart rendering or a
// kustomization, in the namespace it is meant for.
type manifestSet struct {
	name      string
	namespace string
	objects   func() ([]*unstructured.Unstructured, error)
}

// workloadsOnly reports whether the set is one of deploy/examples' sets of
// workloads and routes, which are applied beside a kvselect install rather
// than carrying one.
func (s manifestSet) workloadsOnly() bool {
	return strings.HasPrefix(s.name, "kustomize-examples-")
}

func sets() []manifestSet {
	helm := func(vals map[string]any) func() ([]*unstructured.Unstructured, error) {
		return func() ([]*unstructured.Unstructured, error) { return RenderChart(chartDir, "kvselect", "llm", vals) }
	}
	kust := func(dir string) func() ([]*unstructured.Unstructured, error) {
		return func() ([]*unstructured.Unstructured, error) { return Kustomize(filepath.Join(root, dir)) }
	}
	return []manifestSet{
		{"helm-defaults", "llm", helm(nil)},
		// The opt-out for a trusted network still renders, and says so.
		{"helm-auth-disabled", "llm", helm(map[string]any{"auth": map[string]any{"enabled": false}})},
		// Static tokens only, in HA mode: index recovery sends the generated token.
		{"helm-ha-tokens-only", "llm", helm(map[string]any{
			"ha":   map[string]any{"enabled": true},
			"auth": map[string]any{"kubernetes": false},
		})},
		// Every TLS and credential Secret brought by the user, grants, a config file.
		{"helm-bring-your-own-secrets", "llm", helm(map[string]any{
			"ha": map[string]any{"enabled": true, "meshKey": map[string]any{"existingSecret": "my-mesh-key"}},
			"auth": map[string]any{
				"tokens": map[string]any{"existingSecret": "my-tokens"},
				"grants": []any{
					map[string]any{"name": "prometheus", "scopes": []any{"read"},
						"subjects": []any{map[string]any{"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}}},
					map[string]any{"name": "ray", "scopes": []any{"read", "select"},
						"subjects": []any{map[string]any{"kind": "ServiceAccount", "name": "ray-head", "namespace": "ray"}}},
				},
			},
			"extproc": map[string]any{"certSecretName": "picker-tls", "certReload": true, "clientCASecretName": "gateway-ca"},
			"rest":    map[string]any{"tls": map[string]any{"certSecretName": "rest-tls", "certReload": true, "clientCASecretName": "operators-ca"}},
			"config": map[string]any{"auth": map[string]any{"client_certificates": []any{
				map[string]any{"ou": "kvselect-operators", "scopes": []any{"read", "admin"}}}}},
		})},
		// GIE's plaintext-picker setups (a gateway configured for plaintext).
		{"helm-picker-plaintext", "llm", helm(map[string]any{"extproc": map[string]any{"secureServing": false}})},
		{"helm-ha-route-vllm", "llm", helm(map[string]any{
			"ha":          map[string]any{"enabled": true},
			"httpRoute":   map[string]any{"enabled": true},
			"vllmExample": map[string]any{"enabled": true},
			"extraArgs":   []any{"--session-affinity-ttl-secs=600"},
			"env":         []any{map[string]any{"name": "DYN_ROUTER_ACTIVE_REQUEST_EXPIRY_SECS", "value": "300"}},
		})},
		{"helm-bring-your-own", "llm", helm(map[string]any{
			"inferencePool":       map[string]any{"create": false, "name": "existing-pool"},
			"rbac":                map[string]any{"create": false},
			"serviceAccount":      map[string]any{"create": false, "name": "custom"},
			"podDisruptionBudget": map[string]any{"enabled": false},
		})},
		{"kustomize-base", "llm", kust("deploy/kustomize/base")},
		{"kustomize-ha", "llm", kust("deploy/kustomize/overlays/ha")},
		// The ha overlay with the token-file component, in another
		// namespace: the way deploy/README.md composes them.
		{"kustomize-ha-token-file", "inference", func() ([]*unstructured.Unstructured, error) {
			return KustomizeOverlay(root, map[string]string{"kustomization.yaml": `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: inference
resources:
  - $REPO/deploy/kustomize/overlays/ha
components:
  - $REPO/deploy/kustomize/components/auth-token-file
patches:
  - target:
      kind: ClusterRoleBinding
      name: kvselect-auth-delegator
    patch: |-
      - op: replace
        path: /metadata/name
        value: kvselect-auth-delegator-inference
`})
		}},
		{"kustomize-example", "llm", kust("deploy/kustomize/overlays/example")},
		{"kustomize-examples-only", "llm", kust("deploy/examples")},
		{"kustomize-examples-pd", "llm", kust("deploy/examples/pd")},
		// kvselect behind an NGINX Gateway Fabric Gateway: carries the
		// picker, so it is not one of the workloads-only example sets.
		{"kustomize-ngf", "llm", kust("deploy/examples/ngf")},
		{"replicas", "llm", kust("deploy/replicas")},
	}
}

func render(t *testing.T, s manifestSet) []*unstructured.Unstructured {
	t.Helper()
	objs, err := s.objects()
	if err != nil {
		t.Fatalf("%s: %v", s.name, err)
	}
	if len(objs) == 0 {
		t.Fatalf("%s: no objects", s.name)
	}
	return objs
}

func find(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

func into[T any](t *testing.T, u *unstructured.Unstructured) *T {
	t.Helper()
	var v T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, &v, true); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
	return &v
}

func TestHelmChartLints(t *testing.T) {
	l := lint.All(chartDir, nil, "llm", false)
	for _, m := range l.Messages {
		t.Logf("helm lint: %s", m)
	}
	if l.HighestSeverity >= support.WarningSev {
		t.Fatalf("helm lint found problems (severity %d)", l.HighestSeverity)
	}
}

// TestManifestsWireThePicker checks, without a cluster, what the deployment
// depends on: the pool names the picker's Service and port, the picker
// watches that pool, every Role grants the same read-only rules, the picker
// runs locked down, and the real kvselect flag parser accepts its arguments.
func TestManifestsWireThePicker(t *testing.T) {
	bin := buildKVSelect(t)
	var roles [][]rbacv1.PolicyRule
	for _, s := range sets() {
		t.Run(s.name, func(t *testing.T) {
			objs := render(t, s)
			for _, r := range find(objs, "Role") {
				role := into[rbacv1.Role](t, r)
				if scopeRole(role.Rules) {
					checkScopeRole(t, role)
					continue
				}
				roles = append(roles, role.Rules)
			}
			for _, u := range find(objs, "ClusterRoleBinding") {
				b := into[rbacv1.ClusterRoleBinding](t, u)
				// The only cluster-wide grant: the two reviews of
				// --auth-kubernetes, to kvselect's ServiceAccount alone.
				if b.RoleRef.Kind != "ClusterRole" || b.RoleRef.Name != "system:auth-delegator" || len(b.Subjects) != 1 ||
					b.Subjects[0].Kind != "ServiceAccount" || b.Subjects[0].Namespace != s.namespace {
					t.Errorf("ClusterRoleBinding %s: %+v %+v, want system:auth-delegator for one ServiceAccount of %s", b.Name, b.RoleRef, b.Subjects, s.namespace)
				}
			}
			if len(find(objs, "ClusterRole")) > 0 {
				t.Error("a ClusterRole: kvselect needs none of its own")
			}
			for _, u := range find(objs, "Deployment") {
				if !strings.HasPrefix(u.GetName(), "kvselect") || strings.HasSuffix(u.GetName(), "vllm") {
					continue
				}
				checkPicker(t, s, objs, u, bin)
			}
			for _, u := range find(objs, "HTTPRoute") {
				rt := into[gatewayv1.HTTPRoute](t, u)
				for _, rule := range rt.Spec.Rules {
					for _, b := range rule.BackendRefs {
						if b.Kind == nil || *b.Kind != "InferencePool" || b.Group == nil || *b.Group != gatewayv1.Group(giev1.GroupName) {
							t.Errorf("HTTPRoute %s: backend %+v is not an InferencePool", rt.Name, b.BackendObjectReference)
						}
						if !slices.ContainsFunc(find(objs, "InferencePool"), func(p *unstructured.Unstructured) bool { return p.GetName() == string(b.Name) }) {
							t.Errorf("HTTPRoute %s: InferencePool %s is not in the set", rt.Name, b.Name)
						}
					}
				}
			}
			for _, u := range find(objs, "InferencePool") {
				ref, _, _ := unstructured.NestedString(u.Object, "spec", "endpointPickerRef", "name")
				ip := into[giev1.InferencePool](t, u)
				port := int64(ip.Spec.EndpointPickerRef.Port.Number)
				if !slices.ContainsFunc(find(objs, "Service"), func(svc *unstructured.Unstructured) bool {
					return svc.GetName() == ref && slices.ContainsFunc(into[corev1.Service](t, svc).Spec.Ports, func(p corev1.ServicePort) bool {
						return int64(p.Port) == port && p.AppProtocol != nil && *p.AppProtocol == "http2"
					})
				}) && !s.workloadsOnly() {
					t.Errorf("InferencePool %s: endpointPickerRef %s:%d names no http2 port of a Service in the set", u.GetName(), ref, port)
				}
			}
		})
	}
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"inference.networking.k8s.io"}, Resources: []string{"inferencepools"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"llm-d.ai"}, Resources: []string{"inferenceobjectives", "inferencemodelrewrites"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"inference.networking.x-k8s.io"}, Resources: []string{"inferenceobjectives", "inferencemodelrewrites"}, Verbs: []string{"get", "list", "watch"}},
	}
	if len(roles) == 0 {
		t.Fatal("no Role rendered anywhere")
	}
	for _, r := range roles {
		if !reflect.DeepEqual(r, want) {
			t.Errorf("Role rules %+v, want exactly %+v", r, want)
		}
	}
}

func checkPicker(t *testing.T, s manifestSet, objs []*unstructured.Unstructured, u *unstructured.Unstructured, bin string) {
	t.Helper()
	d := into[appsv1.Deployment](t, u)
	pod := d.Spec.Template.Spec
	c := pod.Containers[0]
	checkReachable(t, c)
	checkMounts(t, objs, pod, c)
	// Replica planes: the mesh is keyed, and recovery from a peer that
	// authenticates sends a token.
	if hasFlag(c.Args, "--replica-sync-port") && !hasFlag(c.Args, "--replica-sync-key-file") {
		t.Errorf("args %q: replica sync without --replica-sync-key-file", c.Args)
	}
	if hasFlag(c.Args, "--indexer-peers") && !hasFlag(c.Args, "--auth-allow-unauthenticated") && !hasFlag(c.Args, "--indexer-peers-token-file") {
		t.Errorf("args %q: the peers authenticate, but recovery sends no token", c.Args)
	}
	if s.name == "replicas" {
		return // deploy/replicas registers workers over REST: no pool, checked by its own test
	}
	pool := ""
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--pool-name="); ok {
			pool = v
		}
	}
	if pool == "" {
		t.Fatalf("picker args %q: no --pool-name", c.Args)
	}
	if pools := find(objs, "InferencePool"); len(pools) > 0 && pools[0].GetName() != pool {
		t.Errorf("--pool-name=%s but the set's InferencePool is %s", pool, pools[0].GetName())
	}
	// kubelet's gRPC probes speak no TLS: a TLS picker is probed over REST.
	if slices.Contains(c.Args, "--extproc-secure-serving") {
		if p := c.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/health" || p.HTTPGet.Port.String() != "http" {
			t.Errorf("liveness probe of a TLS picker: want GET /health on the REST port, got %+v", p)
		}
	} else if c.LivenessProbe == nil || c.LivenessProbe.GRPC == nil || c.LivenessProbe.GRPC.Port != 9002 {
		t.Errorf("liveness probe: want gRPC health on 9002, got %+v", c.LivenessProbe)
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/ready" {
		t.Errorf("readiness probe: want GET /ready, got %+v", c.ReadinessProbe)
	}
	sc := c.SecurityContext
	if pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot ||
		sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("picker not locked down: pod %+v container %+v", pod.SecurityContext, sc)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources: %+v", c.Resources)
	}
	ha := slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--replica-sync-port=") })
	if ha {
		if d.Spec.Replicas == nil || *d.Spec.Replicas != 3 {
			t.Errorf("replica sync with %v replicas", d.Spec.Replicas)
		}
		if !slices.ContainsFunc(find(objs, "Service"), func(svc *unstructured.Unstructured) bool {
			sp := into[corev1.Service](t, svc).Spec
			return sp.ClusterIP == corev1.ClusterIPNone && sp.PublishNotReadyAddresses
		}) {
			t.Error("replica sync without a headless Service publishing not-ready addresses")
		}
	}
	if len(find(objs, "PodDisruptionBudget")) == 0 && s.name != "helm-bring-your-own" {
		t.Error("no PodDisruptionBudget")
	}
	// The real flag parser: an unknown or misspelt flag exits 2. --version
	// stops before the sources start, so no API server is needed.
	args := make([]string, 0, len(c.Args)+1)
	for _, a := range c.Args {
		args = append(args, strings.ReplaceAll(a, "$(NAMESPACE)", s.namespace))
	}
	out, err := exec.Command(bin, append(args, "--version")...).CombinedOutput()
	if err != nil {
		t.Errorf("kvselect %s --version: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// authFlags are the flags that make kvselect's REST API authenticate, and
// with it bind all addresses by default.
var authFlags = []string{"--auth-kubernetes", "--auth-token-file", "--tls-client-ca"}

func hasFlag(args []string, name string) bool {
	return slices.ContainsFunc(args, func(a string) bool { return a == name || strings.HasPrefix(a, name+"=") })
}

func flagValue(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	return ""
}

// checkReachable: without authentication and without --host, kvselect's REST
// API binds 127.0.0.1, where the kubelet's HTTP probes, Prometheus and peers
// never reach it. Every manifest turns authentication on, or opts out
// explicitly with --host and --auth-allow-unauthenticated together.
func checkReachable(t *testing.T, c corev1.Container) {
	t.Helper()
	auth := slices.ContainsFunc(authFlags, func(f string) bool { return hasFlag(c.Args, f) })
	open := hasFlag(c.Args, "--auth-allow-unauthenticated")
	switch {
	case auth && (open || hasFlag(c.Args, "--host")):
		t.Errorf("args %q: authentication on, yet --host or --auth-allow-unauthenticated", c.Args)
	case !auth && !(open && hasFlag(c.Args, "--host")):
		t.Errorf("args %q: the REST API authenticates nobody and binds 127.0.0.1: probes and peers cannot reach it", c.Args)
	}
	if open {
		t.Logf("REST API unauthenticated by choice: %q", c.Args)
	}
}

// fileFlags are the flags naming files that must come from a volume.
var fileFlags = []string{"--auth-token-file", "--replica-sync-key-file", "--indexer-peers-token-file", "--extproc-cert-path",
	"--extproc-client-ca", "--tls-cert-path", "--tls-client-ca", "--config"}

// saToken is where the kubelet mounts the pod's ServiceAccount token.
const saToken = "/var/run/secrets/kubernetes.io/serviceaccount/token"

// checkMounts: every file a flag names is under a volume mount (never
// subPath: a Secret's update must reach the file), whose Secret or ConfigMap
// is either in the set or one the user is told to create.
func checkMounts(t *testing.T, objs []*unstructured.Unstructured, pod corev1.PodSpec, c corev1.Container) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.SubPath != "" {
			t.Errorf("volume mount %s uses subPath: Secret updates never reach it", m.Name)
		}
	}
	for _, f := range fileFlags {
		path := flagValue(c.Args, f)
		if path == "" {
			continue
		}
		if path == saToken {
			if pod.AutomountServiceAccountToken != nil && !*pod.AutomountServiceAccountToken {
				t.Errorf("%s=%s but the ServiceAccount token is not mounted", f, path)
			}
			continue
		}
		i := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return path == m.MountPath || strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/")
		})
		if i < 0 {
			t.Errorf("%s=%s is under no volume mount", f, path)
			continue
		}
		j := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == c.VolumeMounts[i].Name })
		if j < 0 {
			t.Errorf("%s: volume %s missing", f, c.VolumeMounts[i].Name)
			continue
		}
		v := pod.Volumes[j]
		switch {
		case v.Secret != nil:
			if v.Secret.Optional != nil && *v.Secret.Optional {
				t.Errorf("%s: Secret %s is optional", f, v.Secret.SecretName)
			}
			if m := v.Secret.DefaultMode; m != nil && *m&0o007 != 0 {
				t.Errorf("%s: Secret %s mounted world-readable (mode %o)", f, v.Secret.SecretName, *m)
			}
		case v.ConfigMap != nil:
			if !slices.ContainsFunc(find(objs, "ConfigMap"), func(o *unstructured.Unstructured) bool { return o.GetName() == v.ConfigMap.Name }) {
				t.Errorf("%s: ConfigMap %s is not in the set", f, v.ConfigMap.Name)
			}
		default:
			t.Errorf("%s: volume %s is neither a Secret nor a ConfigMap", f, v.Name)
		}
	}
}

// scopeRole reports whether rules are about kvselect's scopes.
func scopeRole(rules []rbacv1.PolicyRule) bool {
	return slices.ContainsFunc(rules, func(r rbacv1.PolicyRule) bool { return slices.Contains(r.APIGroups, "kvselect.io") })
}

// checkScopeRole: a scope Role grants "use" on named kvselect.io scopes and
// nothing else (an empty resourceNames list would grant every scope).
func checkScopeRole(t *testing.T, role *rbacv1.Role) {
	t.Helper()
	for _, r := range role.Rules {
		if !slices.Equal(r.APIGroups, []string{"kvselect.io"}) || !slices.Equal(r.Resources, []string{"scopes"}) || !slices.Equal(r.Verbs, []string{"use"}) ||
			len(r.ResourceNames) == 0 || slices.ContainsFunc(r.ResourceNames, func(n string) bool { return !slices.Contains([]string{"read", "select", "admin"}, n) }) {
			t.Errorf("Role %s: rule %+v, want use on named kvselect.io scopes only", role.Name, r)
		}
	}
}

func buildKVSelect(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kvselect")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/kvselect")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build kvselect: %v\n%s", err, out)
	}
	return bin
}

// crdDirs are the CRDs a cluster running kvselect has: GIE's InferencePool
// and the Gateway API's standard channel, at the versions in go.mod.
func crdDirs(t *testing.T) []string {
	gw := filepath.Join(kubetest.ModuleDir(t, kubetest.GatewayAPIModule), "config", "crd", "standard")
	files, err := filepath.Glob(filepath.Join(gw, "gateway.networking.k8s.io_*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("Gateway API CRDs under %s: %v", gw, err)
	}
	// Only CRDs: the directory also holds a ValidatingAdmissionPolicy.
	files = slices.DeleteFunc(files, func(f string) bool { return strings.Contains(f, "_vap_") })
	return append(files, kubetest.GIECRDs(t))
}

// TestManifestsServerSideDryRun applies every object of every set with
// server-side apply and dry-run to a real kube-apiserver: schema, defaulting
// and validation (CRD OpenAPI and CEL rules included) of the API server
// itself, without a kubelet or controllers.
func TestManifestsServerSideDryRun(t *testing.T) {
	env := kubetest.Start(t, crdDirs(t)...)
	c, err := client.New(env.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, s := range sets() {
		ensureNamespace(t, c, s.namespace)
	}
	for _, s := range sets() {
		t.Run(s.name, func(t *testing.T) {
			for _, o := range render(t, s) {
				namespaced, err := isNamespaced(c.RESTMapper(), o)
				if err != nil {
					t.Errorf("%s %s: %v", o.GetKind(), o.GetName(), err)
					continue
				}
				if namespaced && o.GetNamespace() == "" {
					o.SetNamespace(s.namespace)
				}
				if err := c.Patch(ctx, o, client.Apply, client.DryRunAll, client.FieldOwner("kvselect-conformance"), client.ForceOwnership); err != nil {
					t.Errorf("%s %s/%s rejected: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
				}
			}
		})
	}
}

func isNamespaced(m meta.RESTMapper, o *unstructured.Unstructured) (bool, error) {
	gvk := o.GroupVersionKind()
	mapping, err := m.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return false, fmt.Errorf("the API server does not serve %s: %w", gvk, err)
	}
	return mapping.Scope.Name() == meta.RESTScopeNameNamespace, nil
}

func ensureNamespace(t *testing.T, c client.Client, name string) {
	t.Helper()
	err := c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

func TestMain(m *testing.M) {
	// The tests shell out to `go`; keep them in this module.
	if _, err := exec.LookPath("go"); err != nil {
		fmt.Fprintln(os.Stderr, "kube conformance tests need the go command on PATH")
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// TestPDExampleRoles: kvselect's own pod mapping reads the P/D example's pod
// templates as one prefill and one decode worker per pod, with no incomplete
// reason, and the decode pods' target port is the routing sidecar's.
func TestPDExampleRoles(t *testing.T) {
	i := slices.IndexFunc(sets(), func(s manifestSet) bool { return s.name == "kustomize-examples-pd" })
	objs := render(t, sets()[i])
	pool := &giev1.InferencePool{}
	pool.Spec.TargetPorts = []giev1.Port{{Number: 8000}}
	roles := map[string]string{}
	for _, u := range find(objs, "Deployment") {
		d := into[appsv1.Deployment](t, u)
		pod := corev1.Pod{ObjectMeta: d.Spec.Template.ObjectMeta, Spec: d.Spec.Template.Spec}
		pod.Namespace, pod.Name = "llm", d.Name+"-0"
		pod.Status.PodIP = "10.0.0.1"
		pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		ws := inferencepool.Workers(pool, []corev1.Pod{pod})
		if len(ws) != 1 || ws[0].Role == nil {
			t.Fatalf("%s: workers %+v", d.Name, ws)
		}
		ws[0].ResolveRole("prefill") // what the service does at registration
		if r := ws[0].Reasons(catalog.Checks{ConsumesEvents: true, PrefillGroup: "prefill"}); len(r) > 0 {
			t.Errorf("%s: incomplete: %v", d.Name, r)
		}
		roles[d.Name] = *ws[0].Role
		serves := slices.ContainsFunc(append(pod.Spec.InitContainers, pod.Spec.Containers...), func(c corev1.Container) bool {
			return slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.ContainerPort == 8000 })
		})
		if !serves {
			t.Errorf("%s: nothing listens on the pool's target port 8000", d.Name)
		}
	}
	if roles["vllm-prefill"] != "prefill" || roles["vllm-decode"] != "decode" {
		t.Fatalf("roles = %v", roles)
	}
}
