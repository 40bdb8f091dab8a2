package kube

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	authv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	giev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/go-logr/logr"

	"github.com/kvselect/kvselect/discovery"
	"github.com/kvselect/kvselect/discovery/inferencepool"
	"github.com/kvselect/kvselect/discovery/kubetest"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

func init() { ctrllog.SetLogger(logr.Discard()) }

// TestRoleIsEnoughAndNoMore creates the base kustomization's ServiceAccount,
// Role and RoleBinding for real, then acts as that service account: pool
// discovery works end to end with its permissions, and everything outside
// them is denied.
func TestRoleIsEnoughAndNoMore(t *testing.T) {
	env := kubetest.Start(t, kubetest.GIECRDs(t))
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, rbacv1.AddToScheme, giev1.Install} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	admin, err := client.New(env.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const ns = "llm"
	ensureNamespace(t, admin, ns)
	ensureNamespace(t, admin, "other")

	objs, err := Kustomize(root + "/deploy/kustomize/base")
	if err != nil {
		t.Fatal(err)
	}
	sa := ""
	for _, o := range objs {
		switch o.GetKind() {
		case "ServiceAccount", "Role", "RoleBinding":
			o.SetNamespace(ns)
			if err := admin.Create(ctx, o); err != nil {
				t.Fatalf("create %s: %v", o.GetKind(), err)
			}
			if o.GetKind() == "ServiceAccount" {
				sa = o.GetName()
			}
		}
	}
	asSA := kubetest.Impersonate(env.Config, ns, sa)

	// Enough: discovery as the service account sees the pool and its pod.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vllm-0", Labels: map[string]string{"app": "vllm"},
			Annotations: map[string]string{inferencepool.AnnotationModel: "llama"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
	}
	if err := admin.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.2.0.7", PodIPs: []corev1.PodIP{{IP: "10.2.0.7"}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}}
	if err := admin.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	pool := &giev1.InferencePool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vllm-pool"}}
	pool.Spec.Selector.MatchLabels = map[giev1.LabelKey]giev1.LabelValue{"app": "vllm"}
	pool.Spec.TargetPorts = []giev1.Port{{Number: 8000}}
	pool.Spec.EndpointPickerRef = &giev1.EndpointPickerRef{Name: "kvselect", Port: &giev1.Port{Number: 9002}}
	if err := admin.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}

	rc := routerconfig.Default()
	rc.UseKVEvents = false
	svc, err := selection.New(selection.Config{Router: rc})
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	if os.Getenv("KVSELECT_TEST_LOG") == "1" {
		quiet = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	src, err := inferencepool.New(inferencepool.Options{Config: asSA, Namespace: ns, Name: "vllm-pool", Logger: quiet, RestartDelay: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rec := discovery.NewReconciler(svc, discovery.Options{Logger: quiet})
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { rec.Run(runCtx) })
	wg.Go(func() { src.Run(runCtx, rec.Update) })
	defer func() { cancel(); wg.Wait() }()
	deadline := time.Now().Add(90 * time.Second)
	for {
		ws := svc.Workers(nil, nil)
		if len(ws) == 1 && ws[0].Lifecycle == catalog.Schedulable && svc.Ready().Ready {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("discovery as %s never synced: workers %+v, conditions %+v", sa, ws, svc.Conditions())
		}
		time.Sleep(50 * time.Millisecond)
	}

	// No more: the account's rules in its namespace are exactly the Role's
	// plus what every authenticated user gets, and everything else is denied.
	cs, err := kubernetes.NewForConfig(asSA)
	if err != nil {
		t.Fatal(err)
	}
	review, err := cs.AuthorizationV1().SelfSubjectRulesReviews().Create(ctx, &authv1.SelfSubjectRulesReview{Spec: authv1.SelfSubjectRulesReviewSpec{Namespace: ns}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range review.Status.ResourceRules {
		if slices.Contains(r.APIGroups, "authorization.k8s.io") || slices.Contains(r.APIGroups, "authentication.k8s.io") {
			continue // self reviews: granted to every authenticated user by system:basic-user
		}
		readOnly := slices.Equal(r.Verbs, []string{"get", "list", "watch"})
		pods := slices.Equal(r.APIGroups, []string{""}) && slices.Equal(r.Resources, []string{"pods"})
		pools := slices.Equal(r.APIGroups, []string{"inference.networking.k8s.io"}) && slices.Equal(r.Resources, []string{"inferencepools"})
		if !readOnly || !(pods || pools) {
			t.Errorf("the service account may %v %v in %v: more than the Role should grant", r.Verbs, r.Resources, r.APIGroups)
		}
	}
	denied := []struct {
		what string
		call func() error
	}{
		{"get secrets", func() error { _, err := cs.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); return err }},
		{"create pods", func() error {
			_, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "x"}, Spec: pod.Spec}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}},
		{"delete pods", func() error {
			return cs.CoreV1().Pods(ns).Delete(ctx, "vllm-0", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		}},
		{"list pods in another namespace", func() error { _, err := cs.CoreV1().Pods("other").List(ctx, metav1.ListOptions{}); return err }},
		{"list pods cluster-wide", func() error { _, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); return err }},
		{"list configmaps", func() error { _, err := cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{}); return err }},
		{"list leases", func() error {
			_, err := cs.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{})
			return err
		}},
		{"update the InferencePool", func() error {
			c, err := client.New(asSA, client.Options{Scheme: scheme})
			if err != nil {
				return err
			}
			p := pool.DeepCopy()
			if err := admin.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
				return err
			}
			p.Labels = map[string]string{"touched": "yes"}
			return c.Update(ctx, p, client.DryRunAll)
		}},
	}
	for _, d := range denied {
		if err := d.call(); !apierrors.IsForbidden(err) {
			t.Errorf("%s: err = %v, want Forbidden", d.what, err)
		}
	}
}
