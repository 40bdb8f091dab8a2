package rewrite

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

func w(v int32) *int32 { return &v }

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// canary is the usual LoRA canary: llama split 90/10 between the base and
// an adapter.
func canary(name string, created time.Time) Object {
	return Object{Name: name, Created: created, Rules: []Rule{{
		Models:  []string{"llama"},
		Targets: []Target{{Model: "llama-base", Weight: w(90)}, {Model: "llama-lora-v2", Weight: w(10)}},
	}}}
}

// within is the binomial check: k successes of n at probability p lie within
// 5 standard deviations of n·p (a false alarm about once in 3.5 million).
func within(t *testing.T, what string, k, n int, p float64) {
	t.Helper()
	mean, sd := float64(n)*p, math.Sqrt(float64(n)*p*(1-p))
	if math.Abs(float64(k)-mean) > 5*sd {
		t.Errorf("%s: %d of %d, want %.0f ± %.0f", what, k, n, mean, 5*sd)
	}
}

func TestRewriteWeightsWithoutSession(t *testing.T) {
	tab := NewTable([]Object{canary("canary", t0)})
	rnd := rand.New(rand.NewPCG(1, 2))
	counts := map[string]int{}
	const n = 1000
	for range n {
		c, ok := tab.Choose("llama", "", rnd.Uint64)
		if !ok || c.Object != "canary" || c.Sticky {
			t.Fatalf("choice %+v %v", c, ok)
		}
		counts[c.Model]++
	}
	if counts["llama-base"]+counts["llama-lora-v2"] != n {
		t.Fatalf("counts %v", counts)
	}
	within(t, "llama-lora-v2", counts["llama-lora-v2"], n, 0.1)
}

func TestRewriteIsStickyPerSession(t *testing.T) {
	tab := NewTable([]Object{canary("canary", t0)})
	panicDraw := func() uint64 { panic("a session's request drew at random") }
	counts := map[string]int{}
	const n = 1000
	for i := range n {
		s := fmt.Sprintf("session-%d", i)
		first, _ := tab.Choose("llama", s, panicDraw)
		for range 5 {
			again, _ := tab.Choose("llama", s, panicDraw)
			if again != first || !again.Sticky {
				t.Fatalf("session %s: %+v then %+v", s, first, again)
			}
		}
		counts[first.Model]++
	}
	// Sessions, too, split by the weights.
	within(t, "sessions on llama-lora-v2", counts["llama-lora-v2"], n, 0.1)
	// The hash is stable across releases: a session stays where it was.
	if c, _ := tab.Choose("llama", "session-0", panicDraw); c.Model != "llama-base" {
		t.Errorf("session-0 went to %s", c.Model)
	}
}

func TestRewritePrecedence(t *testing.T) {
	generic := Object{Name: "catch-all", Created: t0, Rules: []Rule{{Targets: []Target{{Model: "fallback"}}}}}
	older := Object{Name: "older", Created: t0.Add(time.Minute), Rules: []Rule{{Models: []string{"llama", "qwen"}, Targets: []Target{{Model: "llama-old"}}}}}
	newer := Object{Name: "newer", Created: t0.Add(time.Hour), Rules: []Rule{
		{Models: []string{"llama"}, Targets: []Target{{Model: "llama-new"}}},
		{Models: []string{"mistral"}, Targets: []Target{{Model: "mistral-new"}}},
	}}
	sameAge := Object{Name: "a-same-age", Created: t0.Add(time.Hour), Rules: []Rule{{Models: []string{"mistral"}, Targets: []Target{{Model: "mistral-a"}}}}}
	empty := Object{Name: "no-targets", Created: t0.Add(-time.Hour), Rules: []Rule{{Models: []string{"phi"}}}}
	tab := NewTable([]Object{newer, generic, older, sameAge, empty})
	zero := func() uint64 { return 0 }
	for _, tc := range []struct{ model, want, object string }{
		{"llama", "llama-old", "older"},        // exact beats generic; the oldest exact rule wins
		{"qwen", "llama-old", "older"},         // a rule matches every model it lists
		{"mistral", "mistral-a", "a-same-age"}, // same age: the name decides
		{"phi", "fallback", "catch-all"},       // a rule without targets is left out
		{"gemma", "fallback", "catch-all"},     // no exact rule: the generic one
	} {
		c, ok := tab.Choose(tc.model, "", zero)
		if !ok || c.Model != tc.want || c.Object != tc.object {
			t.Errorf("%s: %+v %v, want %s from %s", tc.model, c, ok, tc.want, tc.object)
		}
	}
	if _, ok := NewTable([]Object{older}).Choose("gemma", "", zero); ok {
		t.Error("a model no rule names was rewritten")
	}
	var none *Table
	if _, ok := none.Choose("llama", "s", zero); ok || !none.Empty() {
		t.Error("a nil table rewrote")
	}
}

func TestRewriteWeightRules(t *testing.T) {
	// Mixed weights: the unweighted target is never chosen (llm-d-router).
	mixed := NewTable([]Object{{Name: "m", Rules: []Rule{{Models: []string{"x"},
		Targets: []Target{{Model: "a", Weight: w(1)}, {Model: "never"}, {Model: "b", Weight: w(1)}}}}}})
	// No weights: an even split.
	even := NewTable([]Object{{Name: "e", Rules: []Rule{{Models: []string{"x"},
		Targets: []Target{{Model: "a"}, {Model: "b"}, {Model: "c"}}}}}})
	rnd := rand.New(rand.NewPCG(3, 4))
	mc, ec := map[string]int{}, map[string]int{}
	const n = 3000
	for range n {
		c, _ := mixed.Choose("x", "", rnd.Uint64)
		mc[c.Model]++
		c, _ = even.Choose("x", "", rnd.Uint64)
		ec[c.Model]++
	}
	if mc["never"] != 0 {
		t.Errorf("the unweighted target of a weighted rule got %d", mc["never"])
	}
	within(t, "mixed a", mc["a"], n, 0.5)
	for _, m := range []string{"a", "b", "c"} {
		within(t, "even "+m, ec[m], n, 1.0/3)
	}
}

func TestRulesHolder(t *testing.T) {
	var r Rules
	if r.Table() != nil {
		t.Fatal("zero Rules has a table")
	}
	tab := NewTable([]Object{canary("c", t0)})
	r.Set(tab)
	if r.Table() != tab || tab.Objects() != 1 || tab.Empty() {
		t.Fatal("Set")
	}
	var nilRules *Rules
	if nilRules.Table() != nil {
		t.Fatal("nil Rules has a table")
	}
}
