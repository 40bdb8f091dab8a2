package inferencepool

import (
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	giev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/go-logr/logr"

	"github.com/kvselect/kvselect/discovery"
	"github.com/kvselect/kvselect/discovery/kubetest"
	"github.com/kvselect/kvselect/httpadmin"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

// quiet drops logs; KVSELECT_TEST_LOG=1 shows them.
var quiet = func() *slog.Logger {
	if os.Getenv("KVSELECT_TEST_LOG") == "1" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}()

// picker is kvselect as --pool-name wires it: a selection service behind the
// REST API on loopback, fed by this package's source through a reconciler.
type picker struct {
	url string
}

func startPicker(t *testing.T, cfg *rest.Config, ns, name string) *picker {
	t.Helper()
	rc := routerconfig.Default()
	rc.UseKVEvents = false // no engines publish here; the endpoints are still built and shown
	svc, err := selection.New(selection.Config{Router: rc})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: httpadmin.New(svc, httpadmin.Options{Logger: quiet})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	src, err := New(Options{Config: cfg, Namespace: ns, Name: name, Logger: quiet, RestartDelay: 200 * time.Millisecond, CacheSyncTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	rec := discovery.NewReconciler(svc, discovery.Options{Source: "test", Logger: quiet, RetryInterval: 100 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { rec.Run(ctx) })
	wg.Go(func() { src.Run(ctx, rec.Update) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return &picker{url: "http://" + ln.Addr().String()}
}

type readyBody struct {
	Ready      bool                  `json:"ready"`
	Conditions []selection.Condition `json:"conditions"`
}

func (p *picker) get(t *testing.T, path string, v any) int {
	t.Helper()
	resp, err := http.Get(p.url + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode
}

// workers is GET /workers keyed by the pod:port kvselect records as the
// stable routing id.
func (p *picker) workers(t *testing.T) map[string]catalog.Record {
	var ws []catalog.Record
	p.get(t, "/workers", &ws)
	out := map[string]catalog.Record{}
	for _, w := range ws {
		out[d(w.StableRoutingID)] = w
	}
	return out
}

func (p *picker) condition(t *testing.T) (int, selection.Condition) {
	var b readyBody
	code := p.get(t, "/ready", &b)
	for _, c := range b.Conditions {
		if c.Name == discovery.ConditionName {
			return code, c
		}
	}
	return code, selection.Condition{}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func newClient(t *testing.T, cfg *rest.Config) client.Client {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := giev1.Install(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// createPod creates a pod as a scheduler and kubelet would leave it: labels,
// annotations, then a status with an IP and the Ready condition.
func createPod(t *testing.T, c client.Client, ns, name, ip string, ready bool, ann map[string]string) {
	t.Helper()
	ctx := context.Background()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": "vllm"}, Annotations: ann},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
	}
	if err := c.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	setReady(t, c, ns, name, ip, ready)
}

func setReady(t *testing.T, c client.Client, ns, name, ip string, ready bool) {
	t.Helper()
	ctx := context.Background()
	var p corev1.Pod
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &p); err != nil {
		t.Fatal(err)
	}
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p.Status.Phase = corev1.PodRunning
	p.Status.PodIP = ip
	p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st, LastTransitionTime: metav1.Now()}}
	if err := c.Status().Update(ctx, &p); err != nil {
		t.Fatal(err)
	}
}

func annotate(t *testing.T, c client.Client, ns, name, key, value string) {
	t.Helper()
	patchPod(t, c, ns, name, func(p *corev1.Pod) {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations[key] = value
	})
}

func label(t *testing.T, c client.Client, ns, name, key, value string) {
	t.Helper()
	patchPod(t, c, ns, name, func(p *corev1.Pod) { p.Labels[key] = value })
}

// patchPod applies edit to the pod's metadata as a merge patch.
func patchPod(t *testing.T, c client.Client, ns, name string, edit func(*corev1.Pod)) {
	t.Helper()
	ctx := context.Background()
	var p corev1.Pod
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &p); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(p.DeepCopy())
	edit(&p)
	if err := c.Patch(ctx, &p, patch); err != nil {
		t.Fatal(err)
	}
}

func TestMain(m *testing.M) {
	// controller-runtime warns on stderr when its process-wide logger is
	// never set; kvselect sets it in main.
	ctrllog.SetLogger(logr.Discard())
	m.Run()
}

// TestPoolDiscoveryAgainstARealAPIServer drives the source end to end: a
// real kube-apiserver and etcd, the GIE CRD from go.mod, pods whose status
// the test patches as a kubelet would, and the workers as GET /workers shows
// them.
func TestPoolDiscoveryAgainstARealAPIServer(t *testing.T) {
	env := kubetest.Start(t, kubetest.GIECRDs(t))
	c := newClient(t, env.Config)
	ctx := context.Background()
	const ns = "llm"
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	p := startPicker(t, env.Config, ns, "vllm-pool")

	// No pool yet: not ready, and /ready says which pool is missing.
	eventually(t, "the pool-not-found condition", func() bool {
		_, c := p.condition(t)
		return c.Reason == ReasonNotFound
	})
	if code, c := p.condition(t); code != http.StatusServiceUnavailable || c.Ready || !strings.Contains(c.Message, "InferencePool llm/vllm-pool (inference.networking.k8s.io/v1) not found") {
		t.Fatalf("/ready %d %+v", code, c)
	}

	createPod(t, c, ns, "vllm-0", "10.9.0.10", true, map[string]string{AnnotationModel: "llama", AnnotationBlockSize: "16"})
	createPod(t, c, ns, "vllm-1", "10.9.0.11", true, map[string]string{AnnotationModel: "llama"})
	createPod(t, c, ns, "vllm-2", "10.9.0.12", false, map[string]string{AnnotationModel: "llama"})
	pool := &giev1.InferencePool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vllm-pool"}}
	pool.Spec.Selector.MatchLabels = map[giev1.LabelKey]giev1.LabelValue{"app": "vllm"}
	pool.Spec.TargetPorts = []giev1.Port{{Number: 8000}}
	pool.Spec.EndpointPickerRef = &giev1.EndpointPickerRef{Name: "kvselect", Port: &giev1.Port{Number: 9002}}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}

	// The pool appears: one worker per ready pod, schedulable, ready.
	eventually(t, "two workers from the ready pods", func() bool {
		ws := p.workers(t)
		return len(ws) == 2 && ws["llm/vllm-0:8000"].Lifecycle == catalog.Schedulable && ws["llm/vllm-1:8000"].Lifecycle == catalog.Schedulable
	})
	w0 := p.workers(t)["llm/vllm-0:8000"]
	if w0.WorkerID != WorkerID(ns, "vllm-0", 8000) || d(w0.Endpoint) != "http://10.9.0.10:8000" || *w0.BlockSize != 16 ||
		w0.KVEventsEndpoints[0] != "tcp://10.9.0.10:5557" || w0.ModelName != "llama" {
		t.Fatalf("worker of vllm-0: %+v", w0)
	}
	eventually(t, "ready", func() bool { code, c := p.condition(t); return code == http.StatusOK && c.Reason == ReasonSynced })

	// A pod turns ready: it joins; one turns not ready: it leaves.
	setReady(t, c, ns, "vllm-2", "10.9.0.12", true)
	setReady(t, c, ns, "vllm-1", "10.9.0.11", false)
	eventually(t, "vllm-2 in, vllm-1 out", func() bool {
		ws := p.workers(t)
		_, one := ws["llm/vllm-1:8000"]
		_, two := ws["llm/vllm-2:8000"]
		return len(ws) == 2 && !one && two
	})

	// An annotation changes the worker in place (same id).
	annotate(t, c, ns, "vllm-0", AnnotationTotalKVBlocks, "40000")
	eventually(t, "the new capacity", func() bool {
		w, ok := p.workers(t)["llm/vllm-0:8000"]
		return ok && w.TotalKVBlocks != nil && *w.TotalKVBlocks == 40000 && w.WorkerID == w0.WorkerID && w.Lifecycle == catalog.Schedulable
	})

	// llm-d's role label moves a worker into the prefill group and back.
	label(t, c, ns, "vllm-0", LabelRole, "prefill")
	eventually(t, "vllm-0 in the prefill group", func() bool {
		w, ok := p.workers(t)["llm/vllm-0:8000"]
		return ok && w.RoutingGroup == "prefill" && w.Role != nil && *w.Role == "prefill" && w.Lifecycle == catalog.Schedulable
	})
	label(t, c, ns, "vllm-0", LabelRole, "prefill-decode")
	eventually(t, "vllm-0 aggregated again", func() bool {
		w, ok := p.workers(t)["llm/vllm-0:8000"]
		return ok && w.RoutingGroup == "default" && w.Role != nil && *w.Role == "both" && w.Lifecycle == catalog.Schedulable
	})

	// A malformed annotation: the worker stays, incomplete, with the reason.
	annotate(t, c, ns, "vllm-2", AnnotationKVEventsPort, "five-five-five-seven")
	eventually(t, "vllm-2 incomplete with its reason", func() bool {
		w := p.workers(t)["llm/vllm-2:8000"]
		return w.Lifecycle == catalog.Incomplete && len(w.NotSchedulableReasons) > 0 &&
			strings.Contains(w.NotSchedulableReasons[0], `annotation kvselect.io/kv-events-port "five-five-five-seven"`)
	})

	// A second target port: two workers per ready pod, rank 1 on PUB 5558.
	var cur giev1.InferencePool
	if err := c.Get(ctx, client.ObjectKeyFromObject(pool), &cur); err != nil {
		t.Fatal(err)
	}
	cur.Spec.TargetPorts = []giev1.Port{{Number: 8000}, {Number: 8001}}
	if err := c.Update(ctx, &cur); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a worker per pod and port", func() bool {
		ws := p.workers(t)
		w := ws["llm/vllm-0:8001"]
		return len(ws) == 4 && w.KVEventsEndpoints[1] == "tcp://10.9.0.10:5558" && *w.DataParallelStartRank == 1
	})

	// A deleted pod leaves (no kubelet here: an unscheduled pod goes at once).
	if err := c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vllm-0"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "vllm-0's workers to leave", func() bool {
		ws := p.workers(t)
		_, a := ws["llm/vllm-0:8000"]
		_, b := ws["llm/vllm-0:8001"]
		return len(ws) == 2 && !a && !b
	})

	// The pool is deleted: every worker leaves and the picker is not ready.
	if err := c.Delete(ctx, &cur); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	eventually(t, "an empty catalog and the not-found condition", func() bool {
		code, cond := p.condition(t)
		return len(p.workers(t)) == 0 && code == http.StatusServiceUnavailable && cond.Reason == ReasonNotFound
	})
}

// TestPoolCRDMissing: an API server without the InferencePool CRD leaves the
// picker not ready with a condition that names the CRD.
func TestPoolCRDMissing(t *testing.T) {
	env := kubetest.Start(t) // no CRDs
	p := startPicker(t, env.Config, "default", "vllm-pool")
	eventually(t, "the CRD-missing condition", func() bool {
		_, c := p.condition(t)
		return c.Reason == ReasonCRDMissing
	})
	code, c := p.condition(t)
	if code != http.StatusServiceUnavailable || c.Ready || !strings.Contains(c.Message, "InferencePool") {
		t.Fatalf("/ready %d %+v", code, c)
	}
}

// objective is a GIE v1.5.0 (inference.networking.x-k8s.io) InferenceObjective
// as a user writes it: priority nil is unset.
func objective(ns, name, pool string, priority *int64) *unstructured.Unstructured {
	return objectiveIn(LegacyObjectiveGroupKind, ns, name, pool, priority)
}

// objectiveIn is an InferenceObjective of the API group of gk.
func objectiveIn(gk schema.GroupKind, ns, name, pool string, priority *int64) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gk.WithVersion("v1alpha2"))
	u.SetNamespace(ns)
	u.SetName(name)
	spec := map[string]any{"poolRef": map[string]any{"name": pool}}
	if priority != nil {
		spec["priority"] = *priority
	}
	u.Object["spec"] = spec
	return u
}

// objectiveTables collects what an ObjectiveWatch publishes.
type objectiveTables struct {
	mu   sync.Mutex
	last map[string]int
	n    int
}

func (o *objectiveTables) sink(t map[string]int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.last, o.n = t, o.n+1
}

func (o *objectiveTables) is(want map[string]int) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return maps.Equal(o.last, want)
}

func startObjectiveWatch(t *testing.T, cfg *rest.Config, ns, pool string) *objectiveTables {
	t.Helper()
	w, err := NewObjectiveWatch(ObjectiveOptions{Config: cfg, Namespace: ns, Pool: pool, Logger: quiet,
		RestartDelay: 200 * time.Millisecond, Recheck: 200 * time.Millisecond, CacheSyncTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	tables := &objectiveTables{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx, tables.sink) }()
	t.Cleanup(func() { cancel(); <-done })
	return tables
}

// TestObjectivesAgainstARealAPIServer: the priorities of the pool's
// InferenceObjectives follow creates, updates and deletes; objectives of
// another pool or another InferencePool group, and priorities out of bounds,
// are left out.
func TestObjectivesAgainstARealAPIServer(t *testing.T) {
	env := kubetest.Start(t, kubetest.GIECRDs(t), kubetest.ObjectiveCRD(t))
	c := newClient(t, env.Config)
	ctx := context.Background()
	const ns = "llm"
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	tables := startObjectiveWatch(t, env.Config, ns, "vllm-pool")
	i64 := func(v int64) *int64 { return &v }
	other := objective(ns, "foreign-group", "vllm-pool", i64(7))
	_ = unstructured.SetNestedField(other.Object, "example.com", "spec", "poolRef", "group")
	for _, o := range []*unstructured.Unstructured{
		objective(ns, "premium", "vllm-pool", i64(10)),
		objective(ns, "batch", "vllm-pool", i64(-1)),
		objective(ns, "plain", "vllm-pool", nil),
		objective(ns, "elsewhere", "other-pool", i64(5)),
		objective(ns, "absurd", "vllm-pool", i64(5_000_000)),
		other,
	} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatalf("create %s: %v", o.GetName(), err)
		}
	}
	eventually(t, "the pool's objectives", func() bool {
		return tables.is(map[string]int{"premium": 10, "batch": -1, "plain": 0})
	})

	// An update and a delete.
	p := objective(ns, "premium", "vllm-pool", nil)
	if err := c.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedField(p.Object, int64(3), "spec", "priority")
	if err := c.Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, objective(ns, "batch", "", nil)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "premium at 3 and batch gone", func() bool {
		return tables.is(map[string]int{"premium": 3, "plain": 0})
	})
}

// TestObjectivesCRDMissing: without the InferenceObjective API the watch
// publishes nothing and keeps looking, the pool's discovery is not touched
// (it runs apart); a CRD installed later is picked up without a restart.
func TestObjectivesCRDMissing(t *testing.T) {
	env := kubetest.Start(t, kubetest.GIECRDs(t))
	tables := startObjectiveWatch(t, env.Config, "default", "vllm-pool")
	p := startPicker(t, env.Config, "default", "vllm-pool")
	eventually(t, "the pool-not-found condition", func() bool {
		_, c := p.condition(t)
		return c.Reason == ReasonNotFound
	})
	time.Sleep(time.Second) // several rechecks
	tables.mu.Lock()
	n := tables.n
	tables.mu.Unlock()
	if n != 0 {
		t.Fatalf("published %d tables without the API", n)
	}

	if _, err := envtest.InstallCRDs(env.Config, envtest.CRDInstallOptions{Paths: []string{kubetest.ObjectiveCRD(t)}}); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, env.Config)
	one := int64(1)
	// The API server may need a moment before it serves a new CRD.
	eventually(t, "an InferenceObjective created", func() bool {
		return c.Create(context.Background(), objective("default", "late", "vllm-pool", &one)) == nil
	})
	eventually(t, "the late objective", func() bool { return tables.is(map[string]int{"late": 1}) })
}
