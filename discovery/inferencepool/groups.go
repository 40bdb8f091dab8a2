package inferencepool

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	giev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
)

// The API groups of InferenceObjective and InferenceModelRewrite. GIE v1.6.0
// removed both from inference.networking.x-k8s.io (GIE PR #2973); they live on
// in llm-d/llm-d-router as llm-d.ai/v1alpha2 (config/crd/bases at v0.10.0),
// whose picker still reads the old group when the new one is not installed.
const (
	// LLMDGroup is llm-d-router's group, preferred.
	LLMDGroup = "llm-d.ai"
	// LegacyGroup is GIE v1.5.0's group, read as a fallback.
	LegacyGroup = "inference.networking.x-k8s.io"
)

// DefaultObjectiveRecheck is how often a watch looks again for an API group
// that is not installed, so a CRD installed after kvselect started is picked
// up without a restart.
const DefaultObjectiveRecheck = time.Minute

// ObjectiveOptions configures an ObjectiveWatch or a RewriteWatch.
type ObjectiveOptions struct {
	// Config reaches the API server (RESTConfig builds it).
	Config *rest.Config
	// Namespace and Pool: the objects of this namespace whose spec.poolRef
	// names this InferencePool, as in GIE's and llm-d's endpoint pickers.
	Namespace, Pool string
	// Logger; slog.Default() when nil.
	Logger *slog.Logger
	// RestartDelay is the wait after the watch fails; 0 means
	// DefaultRestartDelay. Recheck is the wait before looking again for an
	// API group that is not installed; 0 means DefaultObjectiveRecheck.
	RestartDelay, Recheck time.Duration
	// CacheSyncTimeout bounds the first list; 0 means controller-runtime's
	// default (2 minutes).
	CacheSyncTimeout time.Duration
}

func (o *ObjectiveOptions) validate() error {
	if o.Config == nil {
		return errors.New("inferencepool: no API server config")
	}
	if o.Pool == "" || o.Namespace == "" {
		return errors.New("inferencepool: pool name and namespace are required")
	}
	return nil
}

// errAPIAppeared restarts a watch whose missing API group got installed.
var errAPIAppeared = errors.New("an API group that was missing is installed now")

// groupWatch watches one kind in several API groups at once, the preferred
// group first: every event lists the objects of every installed group again
// and hands them over, index-aligned with the groups (nil for a group that
// is not installed). A group installed later restarts the watch within
// Recheck; with none installed, the watch reports so and looks again.
type groupWatch struct {
	kind   string
	groups []string
	opts   ObjectiveOptions
	log    *slog.Logger

	mu    sync.Mutex
	state string // the last state logged: logs say each change once
}

func newGroupWatch(kind string, opts ObjectiveOptions, groups ...string) *groupWatch {
	log := cmp.Or(opts.Logger, slog.Default()).With("inferencepool", opts.Namespace+"/"+opts.Pool)
	return &groupWatch{kind: kind, groups: groups, opts: opts, log: log}
}

// run watches until ctx ends. none is called when no group is installed;
// a watch that fails keeps what was last handed over.
func (w *groupWatch) run(ctx context.Context, sink func([][]unstructured.Unstructured), none func()) {
	restart := cmp.Or(w.opts.RestartDelay, DefaultRestartDelay)
	recheck := cmp.Or(w.opts.Recheck, DefaultObjectiveRecheck)
	for {
		err := w.watch(ctx, sink, recheck)
		if ctx.Err() != nil {
			return
		}
		delay := restart
		switch {
		case errors.Is(err, errAPIAppeared):
			delay = 0
		case meta.IsNoMatchError(err):
			delay = recheck
			none()
			w.logState("missing", slog.LevelInfo, w.kind+" API not installed in any of its groups",
				"groups", strings.Join(w.groups, ","), "recheck_every", delay.String())
		default:
			w.logState("failed: "+err.Error(), slog.LevelWarn, w.kind+" watch failed; what it last read stays",
				"err", err, "retry_in", delay.String())
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

// watch runs one controller-runtime manager with a controller per installed
// group; its every event lists them all again.
func (w *groupWatch) watch(ctx context.Context, sink func([][]unstructured.Unstructured), recheck time.Duration) error {
	// Unstructured objects only: an empty scheme.
	mgr, err := namespaceManager(w.opts.Config, runtime.NewScheme(), w.log, w.opts.Namespace, w.opts.CacheSyncTimeout)
	if err != nil {
		return err
	}
	gvks := make([]schema.GroupVersionKind, len(w.groups)) // zero where not installed
	var installed, missing []string
	var noMatch error
	for i, g := range w.groups {
		gk := schema.GroupKind{Group: g, Kind: w.kind}
		m, err := mgr.GetRESTMapper().RESTMapping(gk)
		switch {
		case meta.IsNoMatchError(err):
			missing = append(missing, g)
			noMatch = cmp.Or(noMatch, err)
			continue
		case err != nil:
			return fmt.Errorf("%s API (%s): %w", w.kind, gk, err)
		}
		gvks[i] = m.GroupVersionKind
		installed = append(installed, m.GroupVersionKind.String())
	}
	if len(installed) == 0 {
		return fmt.Errorf("%s API: %w", w.kind, noMatch)
	}
	resync := func(ctx context.Context) error {
		lists := make([][]unstructured.Unstructured, len(gvks))
		for i, gvk := range gvks {
			if gvk.Empty() {
				continue
			}
			list := &unstructured.UnstructuredList{}
			list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
			if err := mgr.GetCache().List(ctx, list, client.InNamespace(w.opts.Namespace)); err != nil {
				return fmt.Errorf("list %s: %w", gvk.GroupKind(), err)
			}
			lists[i] = list.Items
			if lists[i] == nil {
				lists[i] = []unstructured.Unstructured{}
			}
		}
		sink(lists)
		return nil
	}
	for _, gvk := range gvks {
		if gvk.Empty() {
			continue
		}
		obj := &unstructured.Unstructured{}
		obj.SetGroupVersionKind(gvk)
		err = builder.ControllerManagedBy(mgr).
			Named("kvselect-" + strings.ToLower(w.kind) + "-" + gvk.Group).
			For(obj).
			Complete(reconcile.Func(func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
				return reconcile.Result{}, resync(ctx)
			}))
		if err != nil {
			return fmt.Errorf("controller: %w", err)
		}
	}
	// No objects send no event: one pass after the cache has synced
	// hands over the (maybe empty) lists.
	err = mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		if !mgr.GetCache().WaitForCacheSync(ctx) {
			return nil
		}
		if err := resync(ctx); err != nil {
			return err
		}
		state := "synced " + strings.Join(installed, ",")
		if len(installed) > 1 {
			w.logState(state, slog.LevelInfo, "watching "+w.kind+"s in both groups: for the same name, the "+w.groups[0]+" object wins",
				"apis", strings.Join(installed, ","))
		} else {
			w.logState(state, slog.LevelInfo, "watching "+w.kind+"s", "api", installed[0], "not_installed", strings.Join(missing, ","))
		}
		return nil
	}))
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
			return w.awaitGroups(ctx, missing, recheck)
		})); err != nil {
			return err
		}
	}
	return mgr.Start(ctx)
}

// awaitGroups looks for the missing groups' kind every recheck, with a fresh
// discovery mapper (the manager's remembers what it did not find), and
// returns errAPIAppeared when one is served.
func (w *groupWatch) awaitGroups(ctx context.Context, missing []string, recheck time.Duration) error {
	hc, err := rest.HTTPClientFor(w.opts.Config)
	if err != nil {
		return fmt.Errorf("http client: %w", err)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(recheck):
		}
		if w.anyServed(hc, missing) {
			w.log.Info(w.kind+" API installed in another group: watching it too", "groups", strings.Join(missing, ","))
			return errAPIAppeared
		}
	}
}

func (w *groupWatch) anyServed(hc *http.Client, groups []string) bool {
	mapper, err := apiutil.NewDynamicRESTMapper(w.opts.Config, hc)
	if err != nil {
		return false
	}
	for _, g := range groups {
		if _, err := mapper.RESTMapping(schema.GroupKind{Group: g, Kind: w.kind}); err == nil {
			return true
		}
	}
	return false
}

func (w *groupWatch) logState(state string, level slog.Level, msg string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if state == w.state {
		return
	}
	w.state = state
	w.log.Log(context.Background(), level, msg, args...)
}

// forPool reports whether u references the pool: spec.poolRef.name is the
// pool and spec.poolRef.group is the InferencePool's group (empty is that
// group, the CRDs' default), as GIE's and llm-d's pickers match them.
func forPool(u *unstructured.Unstructured, pool string) bool {
	if u.GetDeletionTimestamp() != nil {
		return false
	}
	name, _, _ := unstructured.NestedString(u.Object, "spec", "poolRef", "name")
	group, _, _ := unstructured.NestedString(u.Object, "spec", "poolRef", "group")
	return name == pool && cmp.Or(group, giev1.GroupName) == giev1.GroupName
}

// shadowed logs, once per name, the objects of the fallback group that an
// object of the same name in the preferred group hides.
type shadowed struct {
	log    *slog.Logger
	kind   string
	logged map[string]bool
}

// note records the names hidden now and logs the new ones.
func (s *shadowed) note(names []string) {
	now := make(map[string]bool, len(names))
	for _, n := range names {
		now[n] = true
		if !s.logged[n] {
			s.log.Warn(s.kind+" exists in both API groups: the "+LLMDGroup+" object is used, the "+LegacyGroup+" one ignored (logged once)",
				"name", n)
		}
	}
	s.logged = now
}
