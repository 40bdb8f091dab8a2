package kube

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	giev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/go-logr/logr"

	"github.com/kvselect/kvselect/discovery"
	"github.com/kvselect/kvselect/discovery/inferencepool"
	"github.com/kvselect/kvselect/discovery/kubetest"
	"github.com/kvselect/kvselect/internal/access"
	"github.com/kvselect/kvselect/internal/access/kubeauth"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/flow"
	"github.com/kvselect/kvselect/selection/rewrite"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

func init() { ctrllog.SetLogger(logr.Discard()) }

// rbacSource is a rendering whose ServiceAccount and RBAC the test creates
// for real, in its own namespace.
type rbacSource struct {
	name, namespace string
	objects         func() ([]*unstructured.Unstructured, error)
}

// TestRoleIsEnoughAndNoMore creates the ServiceAccount and RBAC of the
// kustomize base and of the Helm chart's defaults for real, then acts as that
// service account: pool discovery works end to end with its permissions, and
// so do the InferenceObjective and InferenceModelRewrite watches of both
// API groups (llm-d.ai and inference.networking.x-k8s.io),
// ServiceAccount tokens are authenticated and their scopes decided as
// --auth-kubernetes does it (TokenReview, SubjectAccessReview), and
// everything outside that is denied.
func TestRoleIsEnoughAndNoMore(t *testing.T) {
	env := kubetest.Start(t, kubetest.GIECRDs(t), kubetest.ObjectiveCRD(t), kubetest.LegacyRewriteCRD(t), kubetest.LLMDCRDs(t))
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
	ensureNamespace(t, admin, "other")
	for _, src := range []rbacSource{
		{"kustomize-base", "llm", func() ([]*unstructured.Unstructured, error) { return Kustomize(root + "/deploy/kustomize/base") }},
		{"helm-defaults", "llm-helm", func() ([]*unstructured.Unstructured, error) {
			return RenderChart(chartDir, "kvselect", "llm-helm", nil)
		}},
	} {
		t.Run(src.name, func(t *testing.T) { checkRBAC(t, env.Config, admin, scheme, src) })
	}
}

func checkRBAC(t *testing.T, cfg *rest.Config, admin client.Client, scheme *runtime.Scheme, src rbacSource) {
	ctx := context.Background()
	ns := src.namespace
	ensureNamespace(t, admin, ns)

	objs, err := src.objects()
	if err != nil {
		t.Fatal(err)
	}
	sa := ""
	for _, o := range objs {
		switch o.GetKind() {
		case "ServiceAccount", "Role", "RoleBinding":
			o.SetNamespace(ns)
		case "ClusterRoleBinding":
		default:
			continue
		}
		if err := admin.Create(ctx, o); err != nil {
			t.Fatalf("create %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		if o.GetKind() == "ServiceAccount" {
			sa = o.GetName()
		}
	}
	asSA := kubetest.Impersonate(cfg, ns, sa)

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

	// InferenceObjectives and InferenceModelRewrites of both API groups.
	newObject := func(gk schema.GroupKind, name string, spec map[string]any) {
		t.Helper()
		obj := &unstructured.Unstructured{}
		obj.SetGroupVersionKind(gk.WithVersion("v1alpha2"))
		obj.SetNamespace(ns)
		obj.SetName(name)
		spec["poolRef"] = map[string]any{"name": "vllm-pool"}
		obj.Object["spec"] = spec
		if err := admin.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	rule := func(model, target string) map[string]any {
		return map[string]any{"rules": []any{map[string]any{
			"matches": []any{map[string]any{"model": map[string]any{"value": model}}},
			"targets": []any{map[string]any{"modelRewrite": target}},
		}}}
	}
	newObject(inferencepool.LegacyObjectiveGroupKind, "premium", map[string]any{"priority": int64(4)})
	newObject(inferencepool.ObjectiveGroupKind, "gold", map[string]any{"priority": int64(7)})
	newObject(inferencepool.RewriteGroupKind, "llama-canary", rule("llama", "llama-lora"))
	newObject(inferencepool.LegacyRewriteGroupKind, "qwen-move", rule("qwen", "qwen-2"))

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
	src2, err := inferencepool.New(inferencepool.Options{Config: asSA, Namespace: ns, Name: "vllm-pool", Logger: quiet, RestartDelay: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// And the pool's InferenceObjectives (flow control's priorities).
	objWatch, err := inferencepool.NewObjectiveWatch(inferencepool.ObjectiveOptions{Config: asSA, Namespace: ns, Pool: "vllm-pool", Logger: quiet, RestartDelay: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// And the pool's InferenceModelRewrites (the picker's model rewrites).
	rwWatch, err := inferencepool.NewRewriteWatch(inferencepool.ObjectiveOptions{Config: asSA, Namespace: ns, Pool: "vllm-pool", Logger: quiet, RestartDelay: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var objectives flow.Objectives
	var rewrites rewrite.Rules
	rewritten := func(model string) string {
		c, _ := rewrites.Table().Choose(model, "", func() uint64 { return 0 })
		return c.Model
	}
	rec := discovery.NewReconciler(svc, discovery.Options{Logger: quiet})
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { rec.Run(runCtx) })
	wg.Go(func() { src2.Run(runCtx, rec.Update) })
	wg.Go(func() { objWatch.Run(runCtx, func(m map[string]int) { objectives.Set(flow.SourceKubernetes, m) }) })
	wg.Go(func() { rwWatch.Run(runCtx, rewrites.Set) })
	defer func() { cancel(); wg.Wait() }()
	deadline := time.Now().Add(90 * time.Second)
	for {
		ws := svc.Workers(nil, nil)
		p, ok := objectives.Lookup("premium")
		g, gok := objectives.Lookup("gold")
		if len(ws) == 1 && ws[0].Lifecycle == catalog.Schedulable && svc.Ready().Ready && ok && p == 4 && gok && g == 7 &&
			rewritten("llama") == "llama-lora" && rewritten("qwen") == "qwen-2" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("discovery as %s never synced: workers %+v, conditions %+v, objectives %v, rewrites of llama %q and qwen %q",
				sa, ws, svc.Ready().Conditions, objectives.All(), rewritten("llama"), rewritten("qwen"))
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Enough for --auth-kubernetes: kvselect, as its service account, has
	// ServiceAccount tokens reviewed and their scopes decided, exactly as
	// the server does it (kubeauth, caches off). Its own token has read —
	// what HA replicas send each other for /dump — and nothing more; a
	// client has what a Role of deploy/README.md's shape grants it.
	cs, err := kubernetes.NewForConfig(asSA)
	if err != nil {
		t.Fatal(err)
	}
	adminCS, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	checker, err := kubeauth.New(kubeauth.Config{Client: cs, Namespace: ns, CacheTTL: -1, NegativeCacheTTL: -1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	token := func(name string) string {
		t.Helper()
		tr, err := adminCS.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authnv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("token for %s: %v", name, err)
		}
		return tr.Status.Token
	}
	if err := admin.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "client"}}); err != nil {
		t.Fatal(err)
	}
	self, clientToken := token(sa), token("client")
	expect := func(what, tok string, need access.Scope, want error) {
		t.Helper()
		id, err := checker.CheckToken(ctx, tok, need)
		switch {
		case want == nil && err != nil:
			t.Errorf("%s, scope %s: %v (identity %s)", what, need, err, id)
		case want != nil && !errors.Is(err, want):
			t.Errorf("%s, scope %s: err = %v, want %v", what, need, err, want)
		}
	}
	expect("kvselect's own token", self, access.Read, nil)
	expect("kvselect's own token", self, access.Select, access.ErrForbidden)
	expect("kvselect's own token", self, access.Admin, access.ErrForbidden)
	expect("a client without a grant", clientToken, access.Read, access.ErrForbidden)
	expect("not a token", "not-a-kubernetes-token-0123456789", access.Read, access.ErrInvalidCredentials)
	grant := []client.Object{
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kvselect-select"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{"kvselect.io"}, Resources: []string{"scopes"}, ResourceNames: []string{"select"}, Verbs: []string{"use"}}}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "client-may-select"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "kvselect-select"},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "client", Namespace: ns}}},
	}
	for _, o := range grant {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	expect("a client granted select", clientToken, access.Select, nil)
	expect("a client granted select", clientToken, access.Read, access.ErrForbidden)

	// No more: the account's rules in its namespace are exactly the Roles'
	// and system:auth-delegator's, plus what every authenticated user gets,
	// and everything else is denied.
	review, err := cs.AuthorizationV1().SelfSubjectRulesReviews().Create(ctx, &authv1.SelfSubjectRulesReview{Spec: authv1.SelfSubjectRulesReviewSpec{Namespace: ns}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Per API group, the resources the account may create (reviews only).
	creates := map[string][]string{
		// system:auth-delegator (--auth-kubernetes).
		"authentication.k8s.io": {"tokenreviews", "selfsubjectreviews"},
		// system:auth-delegator, and the self reviews every authenticated
		// user gets from system:basic-user.
		"authorization.k8s.io": {"subjectaccessreviews", "selfsubjectaccessreviews", "selfsubjectrulesreviews"},
	}
	for _, r := range review.Status.ResourceRules {
		readOnly := slices.Equal(r.Verbs, []string{"get", "list", "watch"})
		pods := slices.Equal(r.APIGroups, []string{""}) && slices.Equal(r.Resources, []string{"pods"})
		pools := slices.Equal(r.APIGroups, []string{"inference.networking.k8s.io"}) && slices.Equal(r.Resources, []string{"inferencepools"})
		objectives := len(r.APIGroups) == 1 && (r.APIGroups[0] == inferencepool.LLMDGroup || r.APIGroups[0] == inferencepool.LegacyGroup) &&
			slices.Equal(r.Resources, []string{"inferenceobjectives", "inferencemodelrewrites"})
		readScope := slices.Equal(r.APIGroups, []string{"kvselect.io"}) && slices.Equal(r.Resources, []string{"scopes"}) &&
			slices.Equal(r.ResourceNames, []string{"read"}) && slices.Equal(r.Verbs, []string{"use"})
		review := len(r.APIGroups) == 1 && slices.Equal(r.Verbs, []string{"create"}) && len(r.ResourceNames) == 0 &&
			!slices.ContainsFunc(r.Resources, func(res string) bool { return !slices.Contains(creates[r.APIGroups[0]], res) })
		if !(readOnly && (pods || pools || objectives)) && !readScope && !review {
			t.Errorf("the service account may %v %v %v in %v: more than its Roles and system:auth-delegator should grant", r.Verbs, r.Resources, r.ResourceNames, r.APIGroups)
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
		// Minting tokens would let kvselect act as another account.
		{"create a token for another service account", func() error {
			_, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "client", &authnv1.TokenRequest{}, metav1.CreateOptions{})
			return err
		}},
		{"grant itself a scope", func() error {
			_, err := cs.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "self"},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "kvselect-select"},
				Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: ns}}}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}},
		{"list cluster role bindings", func() error {
			_, err := cs.RbacV1().ClusterRoleBindings().List(ctx, metav1.ListOptions{})
			return err
		}},
	}
	for _, d := range denied {
		if err := d.call(); !apierrors.IsForbidden(err) {
			t.Errorf("%s: err = %v, want Forbidden", d.what, err)
		}
	}
	// What the account may not do, asked of the authorizer directly: the
	// scopes beyond read, read elsewhere, impersonation.
	user := "system:serviceaccount:" + ns + ":" + sa
	for _, ra := range []authv1.ResourceAttributes{
		{Namespace: ns, Group: "kvselect.io", Resource: "scopes", Name: "select", Verb: "use"},
		{Namespace: ns, Group: "kvselect.io", Resource: "scopes", Name: "admin", Verb: "use"},
		{Namespace: "other", Group: "kvselect.io", Resource: "scopes", Name: "read", Verb: "use"},
		{Group: "", Resource: "users", Verb: "impersonate"},
		{Group: "", Resource: "serviceaccounts", Namespace: ns, Verb: "impersonate"},
		{Group: "authorization.k8s.io", Resource: "localsubjectaccessreviews", Namespace: ns, Verb: "create"},
		{Group: "certificates.k8s.io", Resource: "certificatesigningrequests", Verb: "create"},
	} {
		sar, err := adminCS.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authv1.SubjectAccessReview{Spec: authv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}, ResourceAttributes: &ra}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sar.Status.Allowed {
			t.Errorf("the service account may %s %s/%s %q in %q", ra.Verb, ra.Group, ra.Resource, ra.Name, ra.Namespace)
		}
	}
}
