package inferencepool

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kvselect/kvselect/selection/rewrite"
)

// RewriteGroupKind is the InferenceModelRewrite API: llm-d-router's
// llm-d.ai/v1alpha2 InferenceModelRewrite (v0.10.0, config/crd/bases), and
// LegacyRewriteGroupKind GIE v1.5.0's inference.networking.x-k8s.io one,
// read as a fallback. Its spec.rules map request models to weighted target
// models (selection/rewrite says how a rule is chosen and a target drawn).
var (
	RewriteGroupKind       = schema.GroupKind{Group: LLMDGroup, Kind: "InferenceModelRewrite"}
	LegacyRewriteGroupKind = schema.GroupKind{Group: LegacyGroup, Kind: "InferenceModelRewrite"}
)

// RewriteWatch keeps the model rewrite rules of one pool's
// InferenceModelRewrites, of both API groups with the precedence of
// ObjectiveWatch: an llm-d.ai object hides an inference.networking.x-k8s.io
// one of the same name (logged once per name), objects of other names all
// count. Like the objectives, rewrites are optional: without their CRDs, or
// their Role rules, requests keep the model they name.
type RewriteWatch struct {
	opts  ObjectiveOptions
	log   *slog.Logger
	watch *groupWatch

	mu      sync.Mutex
	last    string            // the summary of the last table handed over
	invalid map[string]string // group/name/rule → why, logged when it first appears
	shadow  shadowed
}

// NewRewriteWatch validates opts.
func NewRewriteWatch(opts ObjectiveOptions) (*RewriteWatch, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	gw := newGroupWatch(RewriteGroupKind.Kind, opts, LLMDGroup, LegacyGroup)
	return &RewriteWatch{opts: opts, log: gw.log, watch: gw, shadow: shadowed{log: gw.log, kind: RewriteGroupKind.Kind}}, nil
}

// Run watches until ctx ends and hands sink every new table. A watch that
// fails keeps the last table; an API installed in neither group empties it.
func (w *RewriteWatch) Run(ctx context.Context, sink func(*rewrite.Table)) {
	w.watch.run(ctx, func(lists [][]unstructured.Unstructured) {
		w.publish(sink, w.merge(lists))
	}, func() { w.publish(sink, nil) })
}

// merge reads the pool's objects of both groups, the preferred group's
// winning by name.
func (w *RewriteWatch) merge(lists [][]unstructured.Unstructured) []rewrite.Object {
	w.mu.Lock()
	defer w.mu.Unlock()
	invalid := make(map[string]string)
	byName := make(map[string]rewrite.Object)
	var hidden []string
	for gi := len(lists) - 1; gi >= 0; gi-- { // the fallback first: the preferred group overwrites
		for i := range lists[gi] {
			u := &lists[gi][i]
			if !forPool(u, w.opts.Pool) {
				continue
			}
			if _, ok := byName[u.GetName()]; ok && gi == 0 {
				hidden = append(hidden, u.GetName())
			}
			byName[u.GetName()] = w.object(u, invalid)
		}
	}
	w.invalid = invalid
	slices.Sort(hidden)
	w.shadow.note(hidden)
	objs := make([]rewrite.Object, 0, len(byName))
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		objs = append(objs, byName[name])
	}
	return objs
}

// object reads one InferenceModelRewrite as the CRD describes it
// (spec.rules[].matches[].model.{type,value}, spec.rules[].targets[]
// .{modelRewrite,weight}). What cannot be used is left out and logged once:
// a match of a type other than Exact (the only one the CRD allows), a target
// without a model, a weight that is not a positive integer; a rule left with
// no target, or with matches that all were dropped, is dropped.
func (w *RewriteWatch) object(u *unstructured.Unstructured, invalid map[string]string) rewrite.Object {
	o := rewrite.Object{Name: u.GetName(), Created: u.GetCreationTimestamp().Time}
	key := u.GroupVersionKind().Group + "/" + u.GetName()
	bad := func(rule int, why string) {
		k := fmt.Sprintf("%s/%d/%s", key, rule, why)
		invalid[k] = why
		if _, seen := w.invalid[k]; !seen {
			w.log.Warn("InferenceModelRewrite rule partly ignored", "rewrite", w.opts.Namespace+"/"+u.GetName(),
				"group", u.GroupVersionKind().Group, "rule", rule, "reason", why)
		}
	}
	rules, _, err := unstructured.NestedSlice(u.Object, "spec", "rules")
	if err != nil {
		bad(-1, "spec.rules: "+err.Error())
		return o
	}
	for ri, rv := range rules {
		rm, ok := rv.(map[string]any)
		if !ok {
			bad(ri, "not an object")
			continue
		}
		var r rewrite.Rule
		matches, _, _ := unstructured.NestedSlice(rm, "matches")
		for _, mv := range matches {
			mm, _ := mv.(map[string]any)
			value, _, _ := unstructured.NestedString(mm, "model", "value")
			typ, _, _ := unstructured.NestedString(mm, "model", "type")
			switch {
			case value == "":
				bad(ri, "a match without model.value")
			case typ != "" && typ != "Exact":
				bad(ri, fmt.Sprintf("match type %q (only Exact is known)", typ))
			default:
				r.Models = append(r.Models, value)
			}
		}
		if len(matches) > 0 && len(r.Models) == 0 {
			bad(ri, "no usable match: the rule is dropped (it would match every model)")
			continue
		}
		targets, _, _ := unstructured.NestedSlice(rm, "targets")
		for _, tv := range targets {
			tm, _ := tv.(map[string]any)
			model, _, _ := unstructured.NestedString(tm, "modelRewrite")
			if model == "" {
				bad(ri, "a target without modelRewrite")
				continue
			}
			t := rewrite.Target{Model: model}
			if wv, found, err := unstructured.NestedInt64(tm, "weight"); found {
				if err != nil || wv < 1 || wv > 1_000_000 {
					bad(ri, fmt.Sprintf("target %q: weight must be an integer from 1 to 1000000", model))
					continue
				}
				w32 := int32(wv)
				t.Weight = &w32
			}
			r.Targets = append(r.Targets, t)
		}
		if len(r.Targets) == 0 {
			bad(ri, "no usable target: the rule is dropped")
			continue
		}
		o.Rules = append(o.Rules, r)
	}
	return o
}

// publish hands sink a table whose objects differ from the last one's.
func (w *RewriteWatch) publish(sink func(*rewrite.Table), objs []rewrite.Object) {
	sum := summary(objs)
	w.mu.Lock()
	defer w.mu.Unlock()
	if sum == w.last {
		return
	}
	w.last = sum
	names := make([]string, 0, len(objs))
	for _, o := range objs {
		names = append(names, o.Name)
	}
	if len(names) > 20 {
		names = append(names[:20], "...")
	}
	w.log.Info("InferenceModelRewrite rules", "rewrites", len(objs), "names", strings.Join(names, ","))
	sink(rewrite.NewTable(objs))
}

// summary is a canonical text of objs, to tell a change from a resync.
func summary(objs []rewrite.Object) string {
	var sb strings.Builder
	for _, o := range objs {
		fmt.Fprintf(&sb, "%s@%d{", o.Name, o.Created.UnixNano())
		for _, r := range o.Rules {
			fmt.Fprintf(&sb, "%q->", r.Models)
			for _, t := range r.Targets {
				if t.Weight != nil {
					fmt.Fprintf(&sb, "%q:%d,", t.Model, *t.Weight)
				} else {
					fmt.Fprintf(&sb, "%q,", t.Model)
				}
			}
			sb.WriteByte(';')
		}
		sb.WriteByte('}')
	}
	return sb.String()
}
