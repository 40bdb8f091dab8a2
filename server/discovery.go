package server

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/go-logr/logr"

	"github.com/kvselect/kvselect/discovery"
	"github.com/kvselect/kvselect/discovery/inferencepool"
	"github.com/kvselect/kvselect/discovery/workersfile"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/flow"
	"github.com/kvselect/kvselect/selection/rewrite"
)

// discoveryFlags choose where the worker catalog comes from besides REST:
// a workers file, or a Kubernetes InferencePool (docs/kubernetes.md).
type discoveryFlags struct {
	workersFile   string
	poolName      string
	poolNamespace string
	kubeconfig    string
}

func (d *discoveryFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&d.workersFile, "workers-file", "", "YAML or JSON `file` of worker records (the POST /workers shape) to keep in the catalog; re-read when it changes, and a malformed version keeps the last good catalog")
	fs.StringVar(&d.poolName, "pool-name", "", "`name` of the InferencePool (inference.networking.k8s.io/v1) whose ready pods become workers, one per pod and target port (GIE's flag)")
	fs.StringVar(&d.poolNamespace, "pool-namespace", "default", "`namespace` of --pool-name and its pods")
	fs.StringVar(&d.kubeconfig, "kubeconfig", "", "kubeconfig `file` for --pool-name and --auth-kubernetes; default: the pod's service account, else $KUBECONFIG")
}

func (d *discoveryFlags) validate(set map[string]bool) []error {
	var errs []error
	if set["workers-file"] && strings.TrimSpace(d.workersFile) == "" {
		errs = append(errs, fmt.Errorf("--workers-file: empty path"))
	}
	if d.workersFile != "" && d.poolName != "" {
		errs = append(errs, fmt.Errorf("--workers-file and --pool-name are both discovery sources: choose one"))
	}
	if d.poolName != "" {
		for _, m := range validation.IsDNS1123Subdomain(d.poolName) {
			errs = append(errs, fmt.Errorf("--pool-name %q: %s", d.poolName, m))
		}
		for _, m := range validation.IsDNS1123Label(d.poolNamespace) {
			errs = append(errs, fmt.Errorf("--pool-namespace %q: %s", d.poolNamespace, m))
		}
	}
	if set["pool-namespace"] && d.poolName == "" {
		errs = append(errs, errors.New("--pool-namespace requires --pool-name"))
	}
	// --auth-kubernetes reaches the API server through --kubeconfig too.
	if set["kubeconfig"] && d.poolName == "" && !set["auth-kubernetes"] {
		errs = append(errs, errors.New("--kubeconfig requires --pool-name or --auth-kubernetes"))
	}
	return errs
}

// prepareDiscovery builds the configured source and its reconciler and sets
// the readiness condition, so /ready is 503 from the first request until the
// source has synced. The returned function starts them on wg; they stop with
// its ctx. Without a source it does nothing. With an InferencePool and
// objectives (flow control on), the pool's InferenceObjectives are watched
// too, into objectives' Kubernetes table; with an InferencePool, its
// InferenceModelRewrites are watched into rewrites.
func prepareDiscovery(d discoveryFlags, collector bool, svc *selection.Service, objectives *flow.Objectives, rewrites *rewrite.Rules, log *slog.Logger) (func(context.Context, *sync.WaitGroup), error) {
	type runner interface {
		Run(ctx context.Context, sink func(discovery.Snapshot))
	}
	var (
		src        runner
		name       string
		pending    selection.Condition
		objWatcher *inferencepool.ObjectiveWatch
		rwWatcher  *inferencepool.RewriteWatch
	)
	switch {
	case d.workersFile != "":
		s, err := workersfile.New(workersfile.Options{Path: d.workersFile, Logger: log})
		if err != nil {
			return nil, &UsageError{err}
		}
		src, name = s, "workers file "+d.workersFile
		pending = selection.Condition{Name: discovery.ConditionName, Reason: "WorkersFilePending", Message: "reading " + d.workersFile}
	case d.poolName != "":
		cfg, err := inferencepool.RESTConfig(d.kubeconfig)
		if err != nil {
			return nil, &UsageError{err}
		}
		// controller-runtime and client-go keep process-wide loggers; route
		// both to the server's, once, here in the program.
		ctrllog.SetLogger(logr.FromSlogHandler(log.Handler()))
		klog.SetSlogLogger(log)
		s, err := inferencepool.New(inferencepool.Options{Config: cfg, Namespace: d.poolNamespace, Name: d.poolName, Logger: log, Collector: collector})
		if err != nil {
			return nil, &UsageError{err}
		}
		src, name = s, "InferencePool "+d.poolNamespace+"/"+d.poolName
		if objectives != nil {
			objWatcher, err = inferencepool.NewObjectiveWatch(inferencepool.ObjectiveOptions{Config: cfg, Namespace: d.poolNamespace, Pool: d.poolName, Logger: log})
			if err != nil {
				return nil, &UsageError{err}
			}
		}
		rwWatcher, err = inferencepool.NewRewriteWatch(inferencepool.ObjectiveOptions{Config: cfg, Namespace: d.poolNamespace, Pool: d.poolName, Logger: log})
		if err != nil {
			return nil, &UsageError{err}
		}
		pending = selection.Condition{Name: discovery.ConditionName, Reason: inferencepool.ReasonPending, Message: "waiting for the first sync of " + name}
		log.Info("discovery: Kubernetes API server", "host", cfg.Host)
	default:
		return func(context.Context, *sync.WaitGroup) {}, nil
	}
	svc.SetCondition(pending)
	rec := discovery.NewReconciler(svc, discovery.Options{Source: name, Logger: log})
	log.Info("discovery source", "source", name)
	return func(ctx context.Context, wg *sync.WaitGroup) {
		wg.Go(func() { rec.Run(ctx) })
		wg.Go(func() { src.Run(ctx, rec.Update) })
		if objWatcher != nil {
			wg.Go(func() {
				objWatcher.Run(ctx, func(t map[string]int) { objectives.Set(flow.SourceKubernetes, t) })
			})
		}
		if rwWatcher != nil {
			wg.Go(func() { rwWatcher.Run(ctx, rewrites.Set) })
		}
	}, nil
}
