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

	"github.com/kvselect/kvselect/discovery/kubetest"
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

func sets() []manifestSet {
	helm := func(vals map[string]any) func() ([]*unstructured.Unstructured, error) {
		return func() ([]*unstructured.Unstructured, error) { return RenderChart(chartDir, "kvselect", "llm", vals) }
	}
	kust := func(dir string) func() ([]*unstructured.Unstructured, error) {
		return func() ([]*unstructured.Unstructured, error) { return Kustomize(filepath.Join(root, dir)) }
	}
	return []manifestSet{
		{"helm-defaults", "llm", helm(nil)},
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
		{"kustomize-example", "llm", kust("deploy/kustomize/overlays/example")},
		{"kustomize-examples-only", "llm", kust("deploy/examples")},
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
				roles = append(roles, into[rbacv1.Role](t, r).Rules)
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
				}) && s.name != "kustomize-examples-only" {
					t.Errorf("InferencePool %s: endpointPickerRef %s:%d names no http2 port of a Service in the set", u.GetName(), ref, port)
				}
			}
		})
	}
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"inference.networking.k8s.io"}, Resources: []string{"inferencepools"}, Verbs: []string{"get", "list", "watch"}},
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
	if s.name == "replicas" {
		return // deploy/replicas registers workers over REST: no pool, checked by its own test
	}
	d := into[appsv1.Deployment](t, u)
	pod := d.Spec.Template.Spec
	c := pod.Containers[0]
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
	if c.LivenessProbe == nil || c.LivenessProbe.GRPC == nil || c.LivenessProbe.GRPC.Port != 9002 {
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
	ensureNamespace(t, c, "llm")
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
