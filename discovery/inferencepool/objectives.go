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
	"k8s.io/apimachinery/pkg/types"

	"github.com/kvselect/kvselect/selection/flow"
)

// ObjectiveGroupKind is the InferenceObjective API: llm-d-router's
// llm-d.ai/v1alpha2 InferenceObjective (v0.10.0, config/crd/bases), and
// LegacyObjectiveGroupKind GIE v1.5.0's inference.networking.x-k8s.io one,
// read as a fallback. A request names one in the x-llm-d-inference-objective
// header (or its deprecated alias x-gateway-inference-objective), and its
// spec.priority (unset means 0) orders the request in flow control. kvselect reads the objects unstructured — spec.priority and
// spec.poolRef — so whichever version the cluster serves works.
var (
	ObjectiveGroupKind       = schema.GroupKind{Group: LLMDGroup, Kind: "InferenceObjective"}
	LegacyObjectiveGroupKind = schema.GroupKind{Group: LegacyGroup, Kind: "InferenceObjective"}
)

// ObjectiveWatch keeps the priorities of one pool's InferenceObjectives, of
// both API groups: an object of llm-d.ai wins over one of the same name in
// inference.networking.x-k8s.io (logged once per name), and objects of
// either group with other names all count. (llm-d-router v0.10.0 instead
// ignores the old group altogether once the new one is installed,
// pkg/epp/server/controller_config.go; merging by name keeps a half-migrated
// namespace working.) It runs apart from the pool's Source: objectives are
// optional, so a cluster without their CRDs, or a Role that does not grant
// them, costs the priorities (every objective counts as unknown: priority 0)
// and never the workers.
type ObjectiveWatch struct {
	opts  ObjectiveOptions
	log   *slog.Logger
	watch *groupWatch

	mu      sync.Mutex
	last    map[string]int
	invalid map[string]string // name → why, logged when it first appears
	shadow  shadowed
}

// NewObjectiveWatch validates opts.
func NewObjectiveWatch(opts ObjectiveOptions) (*ObjectiveWatch, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	gw := newGroupWatch(ObjectiveGroupKind.Kind, opts, LLMDGroup, LegacyGroup)
	return &ObjectiveWatch{opts: opts, log: gw.log, watch: gw, shadow: shadowed{log: gw.log, kind: ObjectiveGroupKind.Kind}}, nil
}

// Run watches until ctx ends and hands sink every new table: objective name
// → priority. A watch that fails keeps the last table (the objectives did not
// change because the API server is unreachable); an API installed in neither
// group empties it.
func (w *ObjectiveWatch) Run(ctx context.Context, sink func(map[string]int)) {
	w.watch.run(ctx, func(lists [][]unstructured.Unstructured) {
		w.publish(sink, w.merge(lists))
	}, func() { w.publish(sink, nil) })
}

// merge is the table of the preferred group's objectives over the fallback
// group's.
func (w *ObjectiveWatch) merge(lists [][]unstructured.Unstructured) map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	invalid := make(map[string]string)
	preferred, fallback := w.table(lists[0], invalid), w.table(lists[1], invalid)
	w.invalid = invalid
	var hidden []string
	for name := range fallback {
		if _, ok := preferred[name]; ok {
			hidden = append(hidden, name)
			continue
		}
		preferred[name] = fallback[name]
	}
	slices.Sort(hidden)
	w.shadow.note(hidden)
	return preferred
}

// table is name → priority of the objectives that reference the pool. A
// priority outside flow control's bounds leaves the objective out (requests
// naming it count as unknown), logged when it first appears; invalid
// collects them. Called with w.mu held, once per group.
func (w *ObjectiveWatch) table(items []unstructured.Unstructured, invalid map[string]string) map[string]int {
	out := make(map[string]int)
	for i := range items {
		u := &items[i]
		if !forPool(u, w.opts.Pool) {
			continue
		}
		p, found, err := unstructured.NestedInt64(u.Object, "spec", "priority")
		why := ""
		switch {
		case err != nil:
			why = err.Error()
		case !found:
			p = 0 // GIE: an unset priority is 0
		case p < flow.MinPriority || p > flow.MaxPriority:
			why = fmt.Sprintf("spec.priority %d is outside [%d, %d]", p, flow.MinPriority, flow.MaxPriority)
		}
		key := u.GroupVersionKind().Group + "/" + u.GetName()
		if why == "" {
			out[u.GetName()] = int(p)
			continue
		}
		invalid[key] = why
		if w.invalid[key] != why {
			w.log.Warn("InferenceObjective ignored: requests naming it get priority 0", "objective", types.NamespacedName{Namespace: w.opts.Namespace, Name: u.GetName()}.String(),
				"group", u.GroupVersionKind().Group, "reason", why)
		}
	}
	return out
}

// publish hands sink a table that differs from the last one.
func (w *ObjectiveWatch) publish(sink func(map[string]int), t map[string]int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if maps.Equal(w.last, t) { // nil and empty are equal: nothing to say before the first objective
		return
	}
	w.last = t
	names := slices.Sorted(maps.Keys(t))
	if len(names) > 20 {
		names = append(names[:20], "...")
	}
	w.log.Info("InferenceObjective priorities", "objectives", len(t), "names", strings.Join(names, ","))
	sink(maps.Clone(t))
}
