package inferencepool

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kvselect/kvselect/discovery/kubetest"
	"github.com/kvselect/kvselect/selection/rewrite"
)

// The tests of this file install llm-d-router v0.10.0's llm-d.ai CRDs
// (kubetest.LLMDCRDs) beside GIE v1.5.0's inference.networking.x-k8s.io
// ones, into a real kube-apiserver.

func i64(v int64) *int64 { return &v }

func createNamespace(t *testing.T, c client.Client, ns string) {
	t.Helper()
	if err := c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
}

// createAll creates the objects, waiting for an API the server may not
// serve yet (a CRD installed a moment ago).
func createAll(t *testing.T, c client.Client, objs ...*unstructured.Unstructured) {
	t.Helper()
	for _, o := range objs {
		var err error
		eventually(t, "create "+o.GetKind()+" "+o.GetName(), func() bool {
			err = c.Create(context.Background(), o)
			return err == nil
		})
	}
}

// TestObjectivesBothGroupsAgainstARealAPIServer: with both groups installed,
// an llm-d.ai InferenceObjective wins over an inference.networking.x-k8s.io
// one of the same name, objectives of other names count from either group,
// and deleting the llm-d.ai object uncovers the old one again.
func TestObjectivesBothGroupsAgainstARealAPIServer(t *testing.T) {
	env := kubetest.Start(t, kubetest.GIECRDs(t), kubetest.ObjectiveCRD(t), kubetest.LLMDCRDs(t))
	c := newClient(t, env.Config)
	const ns = "llm"
	createNamespace(t, c, ns)
	tables := startObjectiveWatch(t, env.Config, ns, "vllm-pool")
	createAll(t, c,
		objectiveIn(LegacyObjectiveGroupKind, ns, "premium", "vllm-pool", i64(10)),
		objectiveIn(LegacyObjectiveGroupKind, ns, "legacy-only", "vllm-pool", i64(3)),
		objectiveIn(ObjectiveGroupKind, ns, "premium", "vllm-pool", i64(20)),
		objectiveIn(ObjectiveGroupKind, ns, "new-only", "vllm-pool", nil),
		objectiveIn(ObjectiveGroupKind, ns, "elsewhere", "other-pool", i64(5)),
	)
	eventually(t, "both groups merged, llm-d.ai winning", func() bool {
		return tables.is(map[string]int{"premium": 20, "legacy-only": 3, "new-only": 0})
	})

	// An update of the llm-d.ai object, then its delete: the old one is back.
	p := objectiveIn(ObjectiveGroupKind, ns, "premium", "", nil)
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(p), p); err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedField(p.Object, int64(-2), "spec", "priority")
	if err := c.Update(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	eventually(t, "premium at -2", func() bool {
		return tables.is(map[string]int{"premium": -2, "legacy-only": 3, "new-only": 0})
	})
	if err := c.Delete(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the inference.networking.x-k8s.io premium uncovered", func() bool {
		return tables.is(map[string]int{"premium": 10, "legacy-only": 3, "new-only": 0})
	})
}

// TestObjectivesLLMDGroupInstalledLater: a watch that started with only the
// old group picks up llm-d.ai's CRD installed afterwards, and its objects
// then win.
func TestObjectivesLLMDGroupInstalledLater(t *testing.T) {
	env := kubetest.Start(t, kubetest.GIECRDs(t), kubetest.ObjectiveCRD(t))
	c := newClient(t, env.Config)
	createAll(t, c, objective("default", "gold", "vllm-pool", i64(4)))
	tables := startObjectiveWatch(t, env.Config, "default", "vllm-pool")
	eventually(t, "the old group's objective", func() bool { return tables.is(map[string]int{"gold": 4}) })

	if _, err := envtest.InstallCRDs(env.Config, envtest.CRDInstallOptions{Paths: []string{kubetest.LLMDCRDs(t, kubetest.LLMDObjectiveCRD)}}); err != nil {
		t.Fatal(err)
	}
	createAll(t, c, objectiveIn(ObjectiveGroupKind, "default", "gold", "vllm-pool", i64(9)))
	eventually(t, "the llm-d.ai objective", func() bool { return tables.is(map[string]int{"gold": 9}) })
}

// rewriteObject is an InferenceModelRewrite with one rule: models (none:
// every model) to targets "model:weight" or "model" without a weight.
func rewriteObject(gk schema.GroupKind, ns, name, pool string, models []string, targets ...string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gk.WithVersion("v1alpha2"))
	u.SetNamespace(ns)
	u.SetName(name)
	var matches, ts []any
	for _, m := range models {
		matches = append(matches, map[string]any{"model": map[string]any{"value": m}})
	}
	for _, tg := range targets {
		if model, ws, ok := strings.Cut(tg, ":"); ok {
			weight, _ := strconv.ParseInt(ws, 10, 64)
			ts = append(ts, map[string]any{"modelRewrite": model, "weight": weight})
		} else {
			ts = append(ts, map[string]any{"modelRewrite": tg})
		}
	}
	rule := map[string]any{"targets": ts}
	if matches != nil {
		rule["matches"] = matches
	}
	u.Object["spec"] = map[string]any{"poolRef": map[string]any{"name": pool}, "rules": []any{rule}}
	return u
}

func startRewriteWatch(t *testing.T, cfg *rest.Config, ns, pool string) *rewrite.Rules {
	t.Helper()
	w, err := NewRewriteWatch(ObjectiveOptions{Config: cfg, Namespace: ns, Pool: pool, Logger: quiet,
		RestartDelay: 200 * time.Millisecond, Recheck: 200 * time.Millisecond, CacheSyncTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	rules := &rewrite.Rules{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx, rules.Set) }()
	t.Cleanup(func() { cancel(); <-done })
	return rules
}

// target is where the rules send a request for model without a session, a
// fixed draw deciding; "" when no rule applies.
func target(r *rewrite.Rules, model string, draw uint64) string {
	c, ok := r.Table().Choose(model, "", func() uint64 { return draw })
	if !ok {
		return ""
	}
	return c.Model
}

// split draws n targets for model: sessions "" draw from a seeded source.
func split(r *rewrite.Rules, model string, n int, session func(i int) string) map[string]int {
	rnd := rand.New(rand.NewPCG(11, 12))
	out := map[string]int{}
	tab := r.Table()
	for i := range n {
		c, _ := tab.Choose(model, session(i), rnd.Uint64)
		out[c.Model]++
	}
	return out
}

// binomial fails t unless k of n lies within 5 standard deviations of n·p.
func binomial(t *testing.T, what string, k, n int, p float64) {
	t.Helper()
	mean, sd := float64(n)*p, math.Sqrt(float64(n)*p*(1-p))
	if math.Abs(float64(k)-mean) > 5*sd {
		t.Errorf("%s: %d of %d, want %.0f ± %.0f", what, k, n, mean, 5*sd)
	}
}

// TestRewritesAgainstARealAPIServer: the pool's InferenceModelRewrites of
// both groups become the picker's rules — a 90/10 LoRA canary honoured over
// 1,000 draws and sticky per session, another pool's object ignored, an old
// group's object hidden by an llm-d.ai one of the same name — and follow
// updates and deletes.
func TestRewritesAgainstARealAPIServer(t *testing.T) {
	env := kubetest.Start(t, kubetest.GIECRDs(t), kubetest.LegacyRewriteCRD(t), kubetest.LLMDCRDs(t))
	c := newClient(t, env.Config)
	const ns = "llm"
	createNamespace(t, c, ns)
	rules := startRewriteWatch(t, env.Config, ns, "vllm-pool")
	canary := rewriteObject(RewriteGroupKind, ns, "llama-canary", "vllm-pool", []string{"llama"}, "llama-base:90", "llama-lora-v2:10")
	createAll(t, c,
		canary,
		rewriteObject(RewriteGroupKind, ns, "foreign", "other-pool", []string{"llama", "qwen"}, "elsewhere"),
		rewriteObject(LegacyRewriteGroupKind, ns, "llama-canary", "vllm-pool", []string{"llama"}, "hidden"),
		rewriteObject(LegacyRewriteGroupKind, ns, "qwen-move", "vllm-pool", []string{"qwen"}, "qwen-2"),
	)
	eventually(t, "the pool's rules", func() bool {
		return rules.Table().Objects() == 2 && target(rules, "qwen", 0) == "qwen-2" && target(rules, "llama", 0) == "llama-base"
	})
	if got := target(rules, "mistral", 0); got != "" {
		t.Errorf("mistral rewritten to %q", got)
	}

	const n = 1000
	random := split(rules, "llama", n, func(int) string { return "" })
	if random["llama-base"]+random["llama-lora-v2"] != n {
		t.Fatalf("draws went elsewhere: %v", random)
	}
	binomial(t, "random draws to llama-lora-v2", random["llama-lora-v2"], n, 0.1)
	sessions := split(rules, "llama", n, func(i int) string { return fmt.Sprintf("conversation-%d", i) })
	binomial(t, "sessions on llama-lora-v2", sessions["llama-lora-v2"], n, 0.1)
	again := split(rules, "llama", n, func(i int) string { return fmt.Sprintf("conversation-%d", i) })
	if again["llama-lora-v2"] != sessions["llama-lora-v2"] {
		t.Errorf("sessions moved: %v then %v", sessions, again)
	}
	noDraw := func() uint64 { panic("a session's request drew at random") }
	for i := range 50 {
		s := fmt.Sprintf("conversation-%d", i)
		first, _ := rules.Table().Choose("llama", s, noDraw)
		for range 10 {
			if c, _ := rules.Table().Choose("llama", s, noDraw); c.Model != first.Model {
				t.Fatalf("session %s went to %s then %s", s, first.Model, c.Model)
			}
		}
	}

	// The canary is promoted: all to the adapter; then deleted, which
	// uncovers the old group's object of the same name.
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(canary), canary); err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedSlice(canary.Object, []any{map[string]any{
		"matches": []any{map[string]any{"model": map[string]any{"value": "llama"}}},
		"targets": []any{map[string]any{"modelRewrite": "llama-lora-v2"}},
	}}, "spec", "rules")
	if err := c.Update(context.Background(), canary); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the promoted canary", func() bool {
		return target(rules, "llama", 0) == "llama-lora-v2" && target(rules, "llama", math.MaxUint64) == "llama-lora-v2"
	})
	if err := c.Delete(context.Background(), canary); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the old group's llama-canary", func() bool { return target(rules, "llama", 0) == "hidden" })
}

// TestRewritesCRDMissing: without an InferenceModelRewrite API the watch
// hands over nothing and keeps looking; llm-d.ai's CRD installed later is
// picked up without a restart.
func TestRewritesCRDMissing(t *testing.T) {
	env := kubetest.Start(t, kubetest.GIECRDs(t))
	rules := startRewriteWatch(t, env.Config, "default", "vllm-pool")
	time.Sleep(time.Second) // several rechecks
	if rules.Table() != nil {
		t.Fatal("a table without the API")
	}
	if _, err := envtest.InstallCRDs(env.Config, envtest.CRDInstallOptions{Paths: []string{kubetest.LLMDCRDs(t, kubetest.LLMDRewriteCRD)}}); err != nil {
		t.Fatal(err)
	}
	createAll(t, newClient(t, env.Config), rewriteObject(RewriteGroupKind, "default", "late", "vllm-pool", nil, "everything-here"))
	eventually(t, "the late generic rule", func() bool { return target(rules, "any-model", 0) == "everything-here" })
}
