package kubeauth

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kvselect/kvselect/discovery/kubetest"
	"github.com/kvselect/kvselect/internal/access"
)

// TestCheckerAgainstARealAPIServer checks real ServiceAccount tokens, issued
// by the TokenRequest API, against a real kube-apiserver's TokenReview and
// RBAC (make test-kube; skipped without one). The Checker acts as a kvselect
// ServiceAccount holding only system:auth-delegator, so this is also the
// proof that the deploy manifests need no more.
func TestCheckerAgainstARealAPIServer(t *testing.T) {
	start := time.Now()
	env := kubetest.Start(t)
	admin, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	const ns = "llm"
	user := func(sa string) string { return "system:serviceaccount:" + ns + ":" + sa }

	// The namespace, the clients' accounts and kvselect's own.
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, sa := range []string{"reader", "selector", "nobody", "kvselect"} {
		if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The scopes granted as the package documentation says: a Role per
	// scope, a RoleBinding per client.
	for sa, scope := range map[string]string{"reader": "read", "selector": "select"} {
		role := &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kvselect-" + scope},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{Group}, Resources: []string{Resource},
				ResourceNames: []string{scope}, Verbs: []string{Verb}}},
		}
		if _, err := admin.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		rb := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa + "-may-" + scope},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa}},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		}
		if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// Real tokens, signed by the API server's service-account key.
	tokenStart := time.Now()
	readerTok := requestToken(t, admin, ns, "reader", nil)
	selectorTok := requestToken(t, admin, ns, "selector", nil)
	nobodyTok := requestToken(t, admin, ns, "nobody", nil)
	readerKvselectTok := requestToken(t, admin, ns, "reader", []string{"kvselect"})
	t.Logf("4 tokens from the TokenRequest API in %s", time.Since(tokenStart).Round(time.Millisecond))

	// The Checker as kvselect's ServiceAccount, which so far may do nothing.
	asKvselect, err := kubernetes.NewForConfig(kubetest.Impersonate(env.Config, ns, "kvselect"))
	if err != nil {
		t.Fatal(err)
	}
	clock := newTestClock()
	c, err := New(Config{Client: asKvselect, Namespace: ns, Now: clock.Now, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}

	// Without system:auth-delegator the API server refuses kvselect's
	// TokenReview: the request is refused too, and nothing is cached.
	wantInvalid(t, c, readerTok, access.Read, "kubernetes token review failed: kvselect may not create tokenreviews")
	if got := metric(t, c, "kvselect_auth_kubernetes_reviews_total", "kind", "token", "result", "error"); got != 1 {
		t.Errorf("token review errors %v, want 1", got)
	}

	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kvselect-auth-delegator"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "kvselect"}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:auth-delegator"},
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The API server's RBAC authorizer sees new bindings through an
	// informer; wait until it does, so a momentary "no" is not cached.
	rbacStart := time.Now()
	waitRBAC(t, admin, user("kvselect"), authorizationv1.ResourceAttributes{Group: "authentication.k8s.io", Resource: "tokenreviews", Verb: "create"})
	waitRBAC(t, admin, user("kvselect"), authorizationv1.ResourceAttributes{Group: "authorization.k8s.io", Resource: "subjectaccessreviews", Verb: "create"})
	waitRBAC(t, admin, user("reader"), authorizationv1.ResourceAttributes{Namespace: ns, Group: Group, Resource: Resource, Name: "read", Verb: Verb})
	waitRBAC(t, admin, user("selector"), authorizationv1.ResourceAttributes{Namespace: ns, Group: Group, Resource: Resource, Name: "select", Verb: Verb})
	t.Logf("RBAC in force in %s", time.Since(rbacStart).Round(time.Millisecond))

	checkStart := time.Now()
	wantAllowed(t, c, readerTok, access.Read, user("reader"))
	wantForbidden(t, c, readerTok, access.Select, user("reader"))
	wantForbidden(t, c, readerTok, access.Admin, user("reader"))
	wantAllowed(t, c, selectorTok, access.Select, user("selector"))
	wantForbidden(t, c, selectorTok, access.Admin, user("selector"))
	wantForbidden(t, c, selectorTok, access.Read, user("selector")) // no scope implies another
	for _, need := range []access.Scope{access.Read, access.Select, access.Admin} {
		wantForbidden(t, c, nobodyTok, need, user("nobody"))
	}
	wantInvalid(t, c, "not-a-kubernetes-token", access.Read, "kubernetes rejected the token")
	// A token for another audience is not one for the API server's.
	wantInvalid(t, c, readerKvselectTok, access.Read, "kubernetes rejected the token")
	t.Logf("11 first checks (each a TokenReview and/or SubjectAccessReview) in %s", time.Since(checkStart).Round(time.Millisecond))

	// Repeats come from the cache.
	tokenReviews := metric(t, c, "kvselect_auth_kubernetes_reviews_total", "kind", "token", "result", "allowed")
	accessReviews := metric(t, c, "kvselect_auth_kubernetes_reviews_total", "kind", "access", "result", "allowed")
	hits := metric(t, c, "kvselect_auth_kubernetes_cache_hits_total")
	wantAllowed(t, c, readerTok, access.Read, user("reader"))
	wantForbidden(t, c, nobodyTok, access.Admin, user("nobody"))
	if got := metric(t, c, "kvselect_auth_kubernetes_cache_hits_total"); got != hits+2 {
		t.Errorf("cache hits %v after 2 repeats, want %v", got, hits+2)
	}
	if tr, sar := metric(t, c, "kvselect_auth_kubernetes_reviews_total", "kind", "token", "result", "allowed"),
		metric(t, c, "kvselect_auth_kubernetes_reviews_total", "kind", "access", "result", "allowed"); tr != tokenReviews || sar != accessReviews {
		t.Errorf("repeats asked the API server: token reviews %v -> %v, access reviews %v -> %v", tokenReviews, tr, accessReviews, sar)
	}
	if tr := metric(t, c, "kvselect_auth_kubernetes_reviews_total", "kind", "token", "result", "allowed"); tr != 3 {
		t.Errorf("%v TokenReviews allowed, want 3: one per token, whatever the scopes asked", tr)
	}

	// Through the REST front's chain: 401 and 403 as the route handler
	// will see them.
	chain := access.NewChain(nil, c, nil)
	for _, tc := range []struct {
		token string
		need  access.Scope
		want  error
	}{
		{readerTok, access.Read, nil},
		{readerTok, access.Select, access.ErrForbidden},
		{"not-a-kubernetes-token", access.Read, access.ErrInvalidCredentials},
	} {
		r, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://kvselect/workers", nil)
		r.Header.Set("Authorization", "Bearer "+tc.token)
		if _, err := chain.Authorize(ctx, r, tc.need); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("chain, %s: %v, want %v", tc.need, err, tc.want)
		}
	}

	// A Checker for the audience "kvselect" takes the reader's token issued
	// for it, and not the one for the API server.
	forKvselect, err := New(Config{Client: asKvselect, Namespace: ns, Audiences: []string{"kvselect"}, Now: clock.Now, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	wantAllowed(t, forKvselect, readerKvselectTok, access.Read, user("reader"))
	wantForbidden(t, forKvselect, readerKvselectTok, access.Select, user("reader"))
	wantInvalid(t, forKvselect, readerTok, access.Read, "kubernetes rejected the token")

	// The selector's ServiceAccount is deleted: its token is bound to it, so
	// the API server stops accepting it. Until the cache TTL ends the
	// Checker still answers from the cache; past it, the token is invalid.
	if err := admin.CoreV1().ServiceAccounts(ns).Delete(ctx, "selector", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wantAllowed(t, c, selectorTok, access.Select, user("selector"))
	// The API server itself caches a successful token authentication for
	// 10 s (kube-apiserver's token success cache), so its answer may lag the
	// deletion; each round jumps the Checker's clock past its TTL, so every
	// round is a fresh TokenReview, and waits a little real time.
	deleted := time.Now()
	for round := 1; ; round++ {
		clock.Advance(DefaultCacheTTL + time.Second)
		_, err := c.CheckToken(ctx, selectorTok, access.Select)
		if errors.Is(err, access.ErrInvalidCredentials) {
			if !strings.Contains(err.Error(), "kubernetes rejected the token") {
				t.Fatalf("deleted ServiceAccount: %v", err)
			}
			t.Logf("the deleted ServiceAccount's token refused after %d rounds, %s: %v", round, time.Since(deleted).Round(time.Millisecond), err)
			break
		}
		if err != nil {
			t.Fatalf("deleted ServiceAccount, round %d: %v, want allowed or invalid", round, err)
		}
		if time.Since(deleted) > 30*time.Second {
			t.Fatalf("the deleted ServiceAccount's token still allowed after %s", time.Since(deleted))
		}
		time.Sleep(250 * time.Millisecond)
	}
	// The refusal is cached for the negative TTL, then asked about again.
	wantInvalid(t, c, selectorTok, access.Select, "kubernetes rejected the token")
	before := metric(t, c, "kvselect_auth_kubernetes_reviews_total", "kind", "token", "result", "denied")
	clock.Advance(DefaultNegativeCacheTTL)
	wantInvalid(t, c, selectorTok, access.Select, "kubernetes rejected the token")
	if got := metric(t, c, "kvselect_auth_kubernetes_reviews_total", "kind", "token", "result", "denied"); got != before+1 {
		t.Errorf("token reviews denied %v -> %v past the negative TTL, want one more", before, got)
	}
	t.Logf("whole test %s", time.Since(start).Round(time.Millisecond))
}

// requestToken issues a token for the ServiceAccount ns/sa with the
// TokenRequest API, as the kubelet does for a projected volume; no
// audiences means the API server's own.
func requestToken(t *testing.T, cs kubernetes.Interface, ns, sa string, audiences []string) string {
	t.Helper()
	expiration := int64(600) // the shortest the API server issues
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(t.Context(), sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: audiences, ExpirationSeconds: &expiration},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest for %s/%s: %v", ns, sa, err)
	}
	if tr.Status.Token == "" {
		t.Fatalf("TokenRequest for %s/%s: no token", ns, sa)
	}
	return tr.Status.Token
}

// waitRBAC waits until the API server's authorizer allows user attrs.
func waitRBAC(t *testing.T, admin kubernetes.Interface, user string, attrs authorizationv1.ResourceAttributes) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for {
		sar, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{User: user, ResourceAttributes: &attrs},
		}, metav1.CreateOptions{})
		if err == nil && sar.Status.Allowed {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("RBAC never allowed %s %+v: %v %+v", user, attrs, err, sar)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// testLogger sends the Checker's log to the test's.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
