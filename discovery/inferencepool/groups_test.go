package inferencepool

import (
	"bytes"
	"log/slog"
	"maps"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
)

// These tests need no API server: they feed the watches' merge steps the
// lists a watch would hand over.

func testOptions(log *slog.Logger) ObjectiveOptions {
	return ObjectiveOptions{Config: &rest.Config{}, Namespace: "llm", Pool: "vllm-pool", Logger: log}
}

// TestObjectivePrecedenceMergesByName: the llm-d.ai object wins over the
// inference.networking.x-k8s.io one of the same name, logged once; other
// names count from both groups; other pools and bad priorities are left out.
func TestObjectivePrecedenceMergesByName(t *testing.T) {
	var logs bytes.Buffer
	w, err := NewObjectiveWatch(testOptions(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	preferred := []unstructured.Unstructured{
		*objectiveIn(ObjectiveGroupKind, "llm", "premium", "vllm-pool", i64(20)),
		*objectiveIn(ObjectiveGroupKind, "llm", "new-only", "vllm-pool", nil),
		*objectiveIn(ObjectiveGroupKind, "llm", "elsewhere", "other-pool", i64(1)),
	}
	fallback := []unstructured.Unstructured{
		*objectiveIn(LegacyObjectiveGroupKind, "llm", "premium", "vllm-pool", i64(10)),
		*objectiveIn(LegacyObjectiveGroupKind, "llm", "legacy-only", "vllm-pool", i64(3)),
		*objectiveIn(LegacyObjectiveGroupKind, "llm", "absurd", "vllm-pool", i64(5_000_000)),
	}
	want := map[string]int{"premium": 20, "new-only": 0, "legacy-only": 3}
	for range 2 {
		if got := w.merge([][]unstructured.Unstructured{preferred, fallback}); !maps.Equal(got, want) {
			t.Fatalf("merged %v, want %v", got, want)
		}
	}
	if n := strings.Count(logs.String(), "exists in both API groups"); n != 1 {
		t.Errorf("the hidden premium logged %d times:\n%s", n, logs.String())
	}
	if n := strings.Count(logs.String(), "absurd"); n != 1 {
		t.Errorf("the bad priority logged %d times", n)
	}
	// Only the old group installed (the new group's list is nil).
	if got := w.merge([][]unstructured.Unstructured{nil, fallback}); !maps.Equal(got, map[string]int{"premium": 10, "legacy-only": 3}) {
		t.Errorf("old group alone: %v", got)
	}
}

// TestRewriteObjectsFromTheCRDShape reads InferenceModelRewrites as the CRD
// describes them, merges the groups by name and leaves unusable parts out.
func TestRewriteObjectsFromTheCRDShape(t *testing.T) {
	var logs bytes.Buffer
	w, err := NewRewriteWatch(testOptions(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	canary := rewriteObject(RewriteGroupKind, "llm", "canary", "vllm-pool", []string{"llama"}, "llama-base:90", "llama-lora:10")
	canary.SetCreationTimestamp(metav1.NewTime(time.Unix(100, 0)))
	broken := rewriteObject(RewriteGroupKind, "llm", "broken", "vllm-pool", []string{"qwen"}, "qwen-2:0", "qwen-3")
	_ = unstructured.SetNestedSlice(broken.Object, []any{
		map[string]any{"matches": []any{map[string]any{"model": map[string]any{"type": "RegularExpression", "value": "q.*"}}},
			"targets": []any{map[string]any{"modelRewrite": "never"}}},
		broken.Object["spec"].(map[string]any)["rules"].([]any)[0],
	}, "spec", "rules")
	objs := w.merge([][]unstructured.Unstructured{
		{*canary, *broken, *rewriteObject(RewriteGroupKind, "llm", "foreign", "other-pool", nil, "x")},
		{*rewriteObject(LegacyRewriteGroupKind, "llm", "canary", "vllm-pool", []string{"llama"}, "hidden"),
			*rewriteObject(LegacyRewriteGroupKind, "llm", "move", "vllm-pool", []string{"mistral"}, "mistral-2")},
	})
	if len(objs) != 3 || objs[0].Name != "broken" || objs[1].Name != "canary" || objs[2].Name != "move" {
		t.Fatalf("objects %+v", objs)
	}
	c := objs[1]
	if !c.Created.Equal(time.Unix(100, 0)) || len(c.Rules) != 1 || c.Rules[0].Models[0] != "llama" ||
		c.Rules[0].Targets[0].Model != "llama-base" || *c.Rules[0].Targets[0].Weight != 90 || *c.Rules[0].Targets[1].Weight != 10 {
		t.Errorf("canary %+v", c)
	}
	// The RegularExpression rule is dropped; the weight-0 target too, and
	// qwen-3 (unweighted) stays.
	if b := objs[0]; len(b.Rules) != 1 || len(b.Rules[0].Targets) != 1 || b.Rules[0].Targets[0].Model != "qwen-3" {
		t.Errorf("broken %+v", b)
	}
	for _, want := range []string{`match type \"RegularExpression\"`, "weight must be an integer", "exists in both API groups"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no log of %s:\n%s", want, logs.String())
		}
	}
}
