package inferencepool

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	giev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/kvselect/kvselect/selection/flow"
)

// ObjectiveGroupKind is the InferenceObjective API: GIE's
// inference.networking.x-k8s.io/v1alpha2 InferenceObjective (GIE v1.5.0,
// apix/v1alpha2; since GIE v1.6.0 it lives on in llm-d/llm-d-router). A
// request names one in the x-gateway-inference-objective header, and its
// spec.priority (unset means 0) orders the request in flow control.
// kvselect reads the objects unstructured — spec.priority and spec.poolRef —
// so whichever version the cluster serves works.
var ObjectiveGroupKind = schema.GroupKind{Group: "inference.networking.x-k8s.io", Kind: "InferenceObjective"}

// DefaultObjectiveRecheck is how often the watch looks again for an
// InferenceObjective API that is not installed, so a CRD installed after
// kvselect started is picked up without a restart.
const DefaultObjectiveRecheck = time.Minute

// ObjectiveOptions configures an ObjectiveWatch.
type ObjectiveOptions struct {
	// Config reaches the API server (RESTConfig builds it).
	Config *rest.Config
	// Namespace and Pool: the InferenceObjectives of this namespace whose
	// spec.poolRef names this InferencePool, as in GIE's endpoint picker.
	Namespace, Pool string
	// Logger; slog.Default() when nil.
	Logger *slog.Logger
	// RestartDelay is the wait after the watch fails; 0 means
	// DefaultRestartDelay. Recheck is the wait while the API is not
	// installed; 0 means DefaultObjectiveRecheck.
	RestartDelay, Recheck time.Duration
	// CacheSyncTimeout bounds the first list; 0 means controller-runtime's
	// default (2 minutes).
	CacheSyncTimeout time.Duration
}

// ObjectiveWatch keeps the priorities of one pool's InferenceObjectives. It
// runs apart from the pool's Source: objectives are optional, so a cluster
// without their CRD, or a Role that does not grant them, costs the priorities
// (every objective counts as unknown: priority 0) and never the workers.
type ObjectiveWatch struct {
	opts ObjectiveOptions
	log  *slog.Logger

	mu      sync.Mutex
	last    map[string]int
	invalid map[string]string // name → why, logged when it first appears
	state   string            // the last state logged: logs say each change once
}

// NewObjectiveWatch validates opts.
func NewObjectiveWatch(opts ObjectiveOptions) (*ObjectiveWatch, error) {
	if opts.Config == nil {
		return nil, errors.New("inferencepool: no API server config")
	}
	if opts.Pool == "" || opts.Namespace == "" {
		return nil, errors.New("inferencepool: pool name and namespace are required")
	}
	log := cmp.Or(opts.Logger, slog.Default()).With("inferencepool", opts.Namespace+"/"+opts.Pool)
	return &ObjectiveWatch{opts: opts, log: log}, nil
}

// Run watches until ctx ends and hands sink every new table: objective name
// → priority. A watch that fails keeps the last table (the objectives did not
// change because the API server is unreachable); an API that is not installed
// empties it.
func (w *ObjectiveWatch) Run(ctx context.Context, sink func(map[string]int)) {
	restart := cmp.Or(w.opts.RestartDelay, DefaultRestartDelay)
	recheck := cmp.Or(w.opts.Recheck, DefaultObjectiveRecheck)
	for {
		err := w.watch(ctx, sink)
		if ctx.Err() != nil {
			return
		}
		delay := restart
		if meta.IsNoMatchError(err) {
			delay = recheck
			w.publish(sink, nil)
			w.logState("missing", slog.LevelInfo, "InferenceObjective API not installed: objective priorities come from the config file only",
				"api", ObjectiveGroupKind.String(), "recheck_every", delay.String())
		} else {
			w.logState("failed: "+err.Error(), slog.LevelWarn, "InferenceObjective watch failed; objective priorities stay as they were",
				"err", err, "retry_in", delay.String())
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

// watch runs one controller-runtime manager whose every InferenceObjective
// event recomputes the whole table.
func (w *ObjectiveWatch) watch(ctx context.Context, sink func(map[string]int)) error {
	// Unstructured objects only: an empty scheme.
	mgr, err := namespaceManager(w.opts.Config, runtime.NewScheme(), w.log, w.opts.Namespace, w.opts.CacheSyncTimeout)
	if err != nil {
		return err
	}
	mapping, err := mgr.GetRESTMapper().RESTMapping(ObjectiveGroupKind)
	if err != nil {
		return fmt.Errorf("InferenceObjective API (%s): %w", ObjectiveGroupKind, err)
	}
	gvk := mapping.GroupVersionKind
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(gvk)
	resync := func(ctx context.Context) error {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		if err := mgr.GetCache().List(ctx, list, client.InNamespace(w.opts.Namespace)); err != nil {
			return fmt.Errorf("list InferenceObjectives: %w", err)
		}
		w.publish(sink, w.table(list.Items))
		return nil
	}
	err = builder.ControllerManagedBy(mgr).
		Named("kvselect-inferenceobjectives").
		For(obj).
		Complete(reconcile.Func(func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
			return reconcile.Result{}, resync(ctx)
		}))
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	// No objects send no event: one pass after the cache has synced
	// publishes the (maybe empty) table.
	err = mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		if !mgr.GetCache().WaitForCacheSync(ctx) {
			return nil
		}
		if err := resync(ctx); err != nil {
			return err
		}
		w.logState("synced", slog.LevelInfo, "watching InferenceObjectives", "api", gvk.String())
		return nil
	}))
	if err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// table is name → priority of the objectives that reference the pool, as
// GIE's picker matches them: spec.poolRef.name is the pool and
// spec.poolRef.group is the InferencePool's group (empty is that group, the
// CRD's default). A priority outside flow control's bounds leaves the
// objective out (requests naming it count as unknown), logged once.
func (w *ObjectiveWatch) table(items []unstructured.Unstructured) map[string]int {
	out := make(map[string]int)
	invalid := make(map[string]string)
	for i := range items {
		u := &items[i]
		if u.GetDeletionTimestamp() != nil {
			continue
		}
		pool, _, _ := unstructured.NestedString(u.Object, "spec", "poolRef", "name")
		group, _, _ := unstructured.NestedString(u.Object, "spec", "poolRef", "group")
		if pool != w.opts.Pool || cmp.Or(group, giev1.GroupName) != giev1.GroupName {
			continue
		}
		p, found, err := unstructured.NestedInt64(u.Object, "spec", "priority")
		switch {
		case err != nil:
			invalid[u.GetName()] = err.Error()
			continue
		case !found:
			p = 0 // GIE: an unset priority is 0
		case p < flow.MinPriority || p > flow.MaxPriority:
			invalid[u.GetName()] = fmt.Sprintf("spec.priority %d is outside [%d, %d]", p, flow.MinPriority, flow.MaxPriority)
			continue
		}
		out[u.GetName()] = int(p)
	}
	w.mu.Lock()
	for name, why := range invalid {
		if w.invalid[name] != why {
			w.log.Warn("InferenceObjective ignored: requests naming it get priority 0", "objective", types.NamespacedName{Namespace: w.opts.Namespace, Name: name}.String(), "reason", why)
		}
	}
	w.invalid = invalid
	w.mu.Unlock()
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

func (w *ObjectiveWatch) logState(state string, level slog.Level, msg string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if state == w.state {
		return
	}
	w.state = state
	w.log.Log(context.Background(), level, msg, args...)
}
