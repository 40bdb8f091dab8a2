package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	giev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/kvselect/kvselect/discovery/kubetest"
	"github.com/kvselect/kvselect/internal/proctest"
)

// TestPoolFlagsAgainstARealAPIServer runs the whole program as a cluster
// would: --pool-name, --pool-namespace and --kubeconfig against a real
// kube-apiserver (make test-kube; skipped without one). /ready is 503 with
// the pool-not-found condition, then 200 with the pod's worker.
func TestPoolFlagsAgainstARealAPIServer(t *testing.T) {
	env := kubetest.Start(t, kubetest.GIECRDs(t))
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	srv := runInBackground(t, withoutKVEvents, []string{"--extproc-port", "0",
		"--pool-name", "vllm-pool", "--pool-namespace", "default", "--kubeconfig", kubeconfig})
	addr, logs := srv.addrs.REST.String(), srv.logs
	ready := func() (int, string) {
		resp, err := http.Get("http://" + addr + "/ready")
		if err != nil {
			return 0, ""
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String()
	}
	proctest.Eventually(t, "the pool-not-found condition", 60*time.Second, func() bool {
		code, body := ready()
		return code == http.StatusServiceUnavailable && strings.Contains(body, `"reason":"InferencePoolNotFound"`)
	})

	scheme := runtime.NewScheme()
	_ = corev1.AddToScheme(scheme)
	_ = giev1.Install(scheme)
	c, err := client.New(env.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vllm-0", Labels: map[string]string{"app": "vllm"},
			Annotations: map[string]string{"kvselect.io/model": "llama"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
	}
	if err := c.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{PodIP: "10.3.0.4", Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if err := c.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	pool := &giev1.InferencePool{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vllm-pool"}}
	pool.Spec.Selector.MatchLabels = map[giev1.LabelKey]giev1.LabelValue{"app": "vllm"}
	pool.Spec.TargetPorts = []giev1.Port{{Number: 8000}}
	pool.Spec.EndpointPickerRef = &giev1.EndpointPickerRef{Name: "kvselect", Port: &giev1.Port{Number: 9002}}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	proctest.Eventually(t, "the pod's worker and readiness", 60*time.Second, func() bool {
		code, body := ready()
		var b struct {
			Workers []struct {
				Endpoint string `json:"endpoint"`
			} `json:"workers"`
		}
		_ = json.Unmarshal([]byte(body), &b)
		return code == http.StatusOK && len(b.Workers) == 1 && b.Workers[0].Endpoint == "http://10.3.0.4:8000"
	})
	if err := srv.stop(20 * time.Second); err != nil {
		t.Fatalf("run = %v", err)
	}
	if !strings.Contains(logs.String(), `"msg":"InferencePool not usable: not ready"`) {
		t.Errorf("the missing pool was not logged:\n%s", logs.String())
	}
}
