package server

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kvselect/kvselect/discovery/kubetest"
)

// TestAuthKubernetesAgainstARealAPIServer runs the program with
// --auth-kubernetes beside a token file against a real kube-apiserver (make
// test-kube; skipped without one): a ServiceAccount token whose RoleBinding
// grants the select scope selects, and is refused the read scope; a token
// nobody issued is invalid; the file's admin token still works.
func TestAuthKubernetesAgainstARealAPIServer(t *testing.T) {
	env := kubetest.Start(t)
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	const ns = "inference"
	mustCreate := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	mustCreate(err)
	_, err = cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "ray"}}, metav1.CreateOptions{})
	mustCreate(err)
	_, err = cs.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "kvselect-select"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"kvselect.io"}, Resources: []string{"scopes"}, ResourceNames: []string{"select"}, Verbs: []string{"use"}}}},
		metav1.CreateOptions{})
	mustCreate(err)
	_, err = cs.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "ray-select"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "kvselect-select"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "ray", Namespace: ns}}}, metav1.CreateOptions{})
	mustCreate(err)
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "ray", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(600))}}, metav1.CreateOptions{})
	mustCreate(err)
	rayToken := tr.Status.Token

	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte(e2eAll+" read,select,admin name=operator\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := runInBackground(t, withoutKVEvents, []string{"--extproc-port", "0", "--engine-metrics-interval", "0",
		"--auth-token-file", tokens, "--auth-kubernetes", "--auth-kubernetes-namespace", ns, "--kubeconfig", kubeconfig})
	call := func(token, method, path, body string) int {
		t.Helper()
		req, err := http.NewRequestWithContext(context.Background(), method, srv.rest()+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if st := call(e2eAll, "POST", "/workers", `{"worker_id":1,"model_name":"m","endpoint":"http://10.0.0.1:8000","block_size":4}`); st != http.StatusCreated {
		t.Fatalf("register with the file's admin token: %d", st)
	}
	for _, tc := range []struct {
		name, token, method, path, body string
		want                            int
	}{
		{"service account selects", rayToken, "POST", "/select", `{"model_name":"m","token_ids":[1,2,3,4]}`, http.StatusOK},
		{"service account cannot read", rayToken, "GET", "/workers", "", http.StatusForbidden},
		{"service account cannot register", rayToken, "POST", "/workers", `{"worker_id":2,"model_name":"m","endpoint":"http://10.0.0.2:8000","block_size":4}`, http.StatusForbidden},
		{"forged token", "eyJhbGciOiJSUzI1NiJ9.e30.c2lnbmF0dXJl", "POST", "/select", `{"model_name":"m","token_ids":[1,2,3,4]}`, http.StatusUnauthorized},
		{"the file's token", e2eAll, "GET", "/workers", "", http.StatusOK},
	} {
		if st := call(tc.token, tc.method, tc.path, tc.body); st != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, st, tc.want)
		}
	}
}
