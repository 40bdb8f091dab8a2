// Package inferencepool is the Kubernetes discovery source: it watches one
// Gateway API Inference Extension InferencePool (inference.networking.k8s.io/v1)
// and the pods its selector matches with controller-runtime, and turns every
// change into a discovery.Snapshot with one worker per ready pod × target port
// (Workers; annotations in mapping.go). A pool that does not exist, a missing
// CRD or an unreachable API server keep the picker not ready with a condition
// that says which.
package inferencepool

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	giev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/kvselect/kvselect/discovery"
	"github.com/kvselect/kvselect/selection/catalog"
)

// Condition reasons.
const (
	ReasonPending        = "InferencePoolPending"    // before the first sync
	ReasonSynced         = "InferencePoolSynced"     // the pool exists; workers follow its pods
	ReasonNotFound       = "InferencePoolNotFound"   // no such pool: no workers, not ready
	ReasonInvalid        = "InferencePoolInvalid"    // a pool kvselect cannot serve (no ports, empty selector)
	ReasonCRDMissing     = "InferencePoolCRDMissing" // the API server does not know inference.networking.k8s.io/v1
	ReasonAPIUnavailable = "KubernetesUnavailable"   // the watch could not start or failed
)

// DefaultRestartDelay is how long a failed watch waits before starting over:
// Dynamo's discovery retry interval (discovery.DefaultRetryInterval).
const DefaultRestartDelay = discovery.DefaultRetryInterval

// Options configures the source.
type Options struct {
	// Config reaches the API server (RESTConfig builds it).
	Config *rest.Config
	// Namespace and Name identify the InferencePool (--pool-namespace,
	// --pool-name). Pods are watched in the same namespace.
	Namespace, Name string
	// Logger receives sync results; slog.Default() when nil. controller-runtime
	// and client-go log through it too.
	Logger *slog.Logger
	// RestartDelay is the wait after the watch fails; 0 means DefaultRestartDelay.
	RestartDelay time.Duration
	// CacheSyncTimeout bounds the first list of pods and pools; 0 means
	// controller-runtime's default (2 minutes).
	CacheSyncTimeout time.Duration
	// Collector: kvselect binds a KV events collector (Mapping.Collector).
	Collector bool
}

// RESTConfig loads the API server configuration: the kubeconfig file at path
// when set (--kubeconfig), otherwise the in-cluster service account, otherwise
// $KUBECONFIG.
func RESTConfig(path string) (*rest.Config, error) {
	var (
		cfg *rest.Config
		err error
	)
	switch {
	case path != "":
		cfg, err = clientcmd.BuildConfigFromFlags("", path)
	default:
		cfg, err = rest.InClusterConfig()
		if errors.Is(err, rest.ErrNotInCluster) {
			env := os.Getenv("KUBECONFIG")
			if env == "" {
				return nil, errors.New("not running in a Kubernetes pod and no --kubeconfig given")
			}
			cfg, err = clientcmd.BuildConfigFromFlags("", env)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	cfg.UserAgent = "kvselect"
	return cfg, nil
}

// Source watches one InferencePool.
type Source struct {
	opts Options
	log  *slog.Logger
	key  types.NamespacedName
	sink func(discovery.Snapshot)

	mu         sync.Mutex // serializes sync passes
	last       []catalog.Record
	lastReason string
}

// New validates opts.
func New(opts Options) (*Source, error) {
	if opts.Config == nil {
		return nil, errors.New("inferencepool: no API server config")
	}
	if opts.Name == "" || opts.Namespace == "" {
		return nil, errors.New("inferencepool: pool name and namespace are required")
	}
	log := cmp.Or(opts.Logger, slog.Default()).With("inferencepool", opts.Namespace+"/"+opts.Name)
	return &Source{opts: opts, log: log, key: types.NamespacedName{Namespace: opts.Namespace, Name: opts.Name}}, nil
}

// Run watches until ctx ends, handing every snapshot to sink (a
// discovery.Reconciler's Update). The first snapshot, sent at once, holds
// readiness back until the pool has synced. A watch that fails (API server
// unreachable, CRD missing) is reported and started again after RestartDelay;
// the catalog keeps the last workers meanwhile.
func (s *Source) Run(ctx context.Context, sink func(discovery.Snapshot)) {
	s.sink = sink
	sink(discovery.Snapshot{State: discovery.State{Ready: false, Reason: ReasonPending,
		Message: fmt.Sprintf("waiting for the first sync of InferencePool %s", s.key)}})
	delay := cmp.Or(s.opts.RestartDelay, DefaultRestartDelay)
	for {
		err := s.watch(ctx)
		if ctx.Err() != nil {
			return
		}
		reason := ReasonAPIUnavailable
		if meta.IsNoMatchError(err) {
			reason = ReasonCRDMissing
		}
		s.log.Error("InferencePool watch failed; starting over", "err", err, "in", delay.String())
		s.mu.Lock()
		s.lastReason = reason
		s.sink(discovery.Snapshot{Workers: s.last, State: discovery.State{Ready: false, Reason: reason,
			Message: fmt.Sprintf("watching InferencePool %s: %v (retrying every %s)", s.key, err, delay)}})
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

// watch runs one controller-runtime manager: a cache of pools and pods in the
// namespace, a controller whose every event recomputes the whole snapshot.
func (s *Source) watch(ctx context.Context) error {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return err
	}
	if err := giev1.Install(scheme); err != nil {
		return err
	}
	mgr, err := namespaceManager(s.opts.Config, scheme, s.log, s.key.Namespace, s.opts.CacheSyncTimeout)
	if err != nil {
		return err
	}
	// Without the CRD the pool's informer would only time out; ask the API
	// server's discovery first so the condition can name the cause.
	if _, err := mgr.GetRESTMapper().RESTMapping(schema.GroupKind{Group: giev1.GroupName, Kind: "InferencePool"}, giev1.GroupVersion.Version); err != nil {
		return fmt.Errorf("InferencePool API (%s): %w", giev1.GroupVersion.String(), err)
	}
	c := mgr.GetClient()
	one := func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: s.key}}
	}
	err = builder.ControllerManagedBy(mgr).
		Named("kvselect-inferencepool").
		For(&giev1.InferencePool{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			return o.GetName() == s.key.Name
		}))).
		// Any pod change may add or remove a worker: the pool's selector can
		// change too, so pods are not pre-filtered by it.
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(one)).
		Complete(reconcile.Func(func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
			return reconcile.Result{}, s.sync(ctx, c)
		}))
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	// A pool that does not exist sends no event and may select no pods: one
	// pass after the caches have synced reports it.
	err = mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		if !mgr.GetCache().WaitForCacheSync(ctx) {
			return nil
		}
		if err := s.sync(ctx, c); err != nil {
			s.log.Error("first InferencePool sync failed", "err", err)
		}
		return nil
	}))
	if err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// namespaceManager is a controller-runtime manager that caches one
// namespace, serves no endpoints and logs to log.
func namespaceManager(cfg *rest.Config, scheme *runtime.Scheme, log *slog.Logger, namespace string, syncTimeout time.Duration) (manager.Manager, error) {
	skip := true
	mgr, err := ctrl.NewManager(cfg, manager.Options{
		Scheme: scheme,
		Logger: logr.FromSlogHandler(log.Handler()),
		// Only the pool's namespace: the Role grants no more.
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{namespace: {}}},
		Metrics:                metricsserver.Options{BindAddress: "0"}, // kvselect serves its own /metrics
		HealthProbeBindAddress: "0",
		Controller: config.Controller{
			// Several sources may run in one process (tests); names need not be unique.
			SkipNameValidation: &skip,
			CacheSyncTimeout:   syncTimeout,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("controller manager: %w", err)
	}
	return mgr, nil
}

// sync reads the pool and its pods from the cache and hands over the snapshot.
func (s *Source) sync(ctx context.Context, c client.Client) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var pool giev1.InferencePool
	if err := c.Get(ctx, s.key, &pool); err != nil {
		if apierrors.IsNotFound(err) {
			s.publish(nil, discovery.State{Ready: false, Reason: ReasonNotFound,
				Message: fmt.Sprintf("InferencePool %s (inference.networking.k8s.io/v1) not found; no workers until it exists", s.key)})
			return nil
		}
		return fmt.Errorf("get InferencePool %s: %w", s.key, err)
	}
	if len(pool.Spec.Selector.MatchLabels) == 0 || len(pool.Spec.TargetPorts) == 0 {
		s.publish(nil, discovery.State{Ready: false, Reason: ReasonInvalid,
			Message: fmt.Sprintf("InferencePool %s has no selector labels or no target ports", s.key)})
		return nil
	}
	sel := make(labels.Set, len(pool.Spec.Selector.MatchLabels))
	for k, v := range pool.Spec.Selector.MatchLabels {
		sel[string(k)] = string(v)
	}
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(s.key.Namespace), client.MatchingLabelsSelector{Selector: sel.AsSelector()}); err != nil {
		return fmt.Errorf("list pods of InferencePool %s: %w", s.key, err)
	}
	ws := WorkersFor(&pool, pods.Items, Mapping{Collector: s.opts.Collector})
	incomplete := 0
	for _, w := range ws {
		if len(w.SourceReasons) > 0 {
			incomplete++
		}
	}
	s.publish(ws, discovery.State{Ready: true, Reason: ReasonSynced,
		Message: fmt.Sprintf("%d workers from %d selected pods × %d target ports (%d with annotation problems)", len(ws), len(pods.Items), len(pool.Spec.TargetPorts), incomplete)})
	return nil
}

func (s *Source) publish(ws []catalog.Record, st discovery.State) {
	s.last = ws
	// Say it once per change of state: a missing pool is logged when it goes
	// missing, not on every pod event.
	if st.Reason != s.lastReason {
		s.lastReason = st.Reason
		if st.Ready {
			s.log.Info("InferencePool synced", "reason", st.Reason, "detail", st.Message)
		} else {
			s.log.Warn("InferencePool not usable: not ready", "reason", st.Reason, "detail", st.Message)
		}
	}
	s.log.Debug("InferencePool snapshot", "workers", len(ws), "reason", st.Reason)
	s.sink(discovery.Snapshot{Workers: ws, State: st})
}
