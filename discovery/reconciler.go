// Package discovery keeps the selection service's worker catalog equal to what
// a discovery source says: a workers file (discovery/workersfile) or a
// Kubernetes InferencePool and its pods (discovery/inferencepool). A source
// produces complete snapshots of the workers it wants; one Reconciler turns
// each snapshot into the same UpsertWorker / DeleteWorker calls that POST and
// DELETE /workers make, so a discovered worker is indistinguishable from one
// registered over REST.
//
// The rules are Dynamo's ("Worker Registration" in
// https://docs.nvidia.com/dynamo/dev/components/router/standalone-selection-service,
// and lib/kv-router/src/services/selection/membership.rs at commit 29a05b48):
// a snapshot with a duplicate worker id is rejected before anything changes;
// records that are already schedulable and identical are left alone; a
// snapshot whose apply fails is retried after 5 seconds unless a newer
// snapshot arrives first.
package discovery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
)

// DefaultRetryInterval is Dynamo's retry delay for a snapshot whose apply
// failed; a newer snapshot arriving first replaces the retry.
const DefaultRetryInterval = 5 * time.Second

// ConditionName is the readiness condition a Reconciler maintains on the
// service unless Options.ConditionName says otherwise.
const ConditionName = "discovery"

// Catalog is what a Reconciler drives: the REST API's worker calls plus the
// readiness conditions. *selection.Service implements it.
type Catalog interface {
	UpsertWorker(ctx context.Context, rec catalog.Record) (*catalog.Record, error)
	DeleteWorker(ctx context.Context, workerID uint64) (*catalog.Record, error)
	Workers(model, group *string) []*catalog.Record
	SetCondition(c selection.Condition)
	// PrefillRoutingGroup is where prefill workers without a routing
	// group go (catalog.Record.ResolveRole).
	PrefillRoutingGroup() string
}

var _ Catalog = (*selection.Service)(nil)

// Snapshot is a source's complete view: every worker it wants in the catalog
// (workers it sent before and omits now are deleted), and whether the view is
// trustworthy enough to serve from.
type Snapshot struct {
	Workers []catalog.Record
	State   State
}

// State is a source's health as the readiness condition shows it.
type State struct {
	// Ready is false while the source has no trustworthy view (the
	// InferencePool does not exist, the workers file never parsed).
	Ready bool
	// Reason is a CamelCase word ("InferencePoolNotFound", "Synced").
	Reason string
	// Message says what is wrong or what the source serves from.
	Message string
}

// Options configures a Reconciler.
type Options struct {
	// Source names the source in logs, e.g. "workers file /etc/kvselect/workers.yaml".
	Source string
	// Logger receives what changed and why a worker is incomplete; slog.Default() when nil.
	Logger *slog.Logger
	// RetryInterval is how long a failed snapshot waits before it is applied
	// again; 0 means DefaultRetryInterval.
	RetryInterval time.Duration
	// ConditionName is the readiness condition this reconciler owns; "" means
	// ConditionName.
	ConditionName string
}

// ErrDuplicateWorkerID rejects a snapshot that names one worker id twice.
// Nothing is changed and the snapshot is not retried: the same input would
// fail again.
var ErrDuplicateWorkerID = errors.New("duplicate worker_id in snapshot")

// Result counts what one apply did.
type Result struct {
	Upserted  int // new or changed records, and incomplete ones tried again
	Unchanged int // schedulable and identical: skipped
	Deleted   int // sent before, absent now
}

// Reconciler applies snapshots from one source to a Catalog. Update is safe
// from any goroutine; Run applies them one at a time.
type Reconciler struct {
	cat   Catalog
	log   *slog.Logger
	retry time.Duration
	cond  string
	src   string

	mu     sync.Mutex
	latest *Snapshot
	wake   chan struct{}

	// owned is the set of worker ids this reconciler has put in the catalog;
	// only Run (or Apply) touches it, one call at a time.
	applyMu sync.Mutex
	owned   map[uint64]bool
	// lastReasons remembers what was logged for each incomplete worker, so an
	// unchanged problem is logged once, not on every snapshot.
	lastReasons map[uint64]string
}

// NewReconciler returns a reconciler over cat.
func NewReconciler(cat Catalog, opts Options) *Reconciler {
	r := &Reconciler{
		cat:         cat,
		log:         cmp.Or(opts.Logger, slog.Default()),
		retry:       cmp.Or(opts.RetryInterval, DefaultRetryInterval),
		cond:        cmp.Or(opts.ConditionName, ConditionName),
		src:         cmp.Or(opts.Source, "discovery"),
		wake:        make(chan struct{}, 1),
		owned:       make(map[uint64]bool),
		lastReasons: make(map[uint64]string),
	}
	r.log = r.log.With("source", r.src)
	return r
}

// Update hands over a new snapshot; it never blocks. Snapshots that Run has
// not started yet are replaced: only the newest matters.
func (r *Reconciler) Update(s Snapshot) {
	r.mu.Lock()
	r.latest = &s
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run applies snapshots as they arrive until ctx ends. A failed apply is
// retried after the retry interval unless a newer snapshot arrives first.
func (r *Reconciler) Run(ctx context.Context) {
	var (
		cur   Snapshot
		retry *time.Timer
		fire  <-chan time.Time
	)
	stop := func() {
		if retry != nil {
			retry.Stop()
			retry, fire = nil, nil
		}
	}
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
			r.mu.Lock()
			cur = *r.latest
			r.mu.Unlock()
			stop() // a newer snapshot supersedes the failed one
		case <-fire:
			retry, fire = nil, nil
			r.log.Info("retrying the snapshot whose apply failed")
		}
		if _, err := r.Apply(ctx, cur); err != nil && !errors.Is(err, ErrDuplicateWorkerID) && ctx.Err() == nil {
			retry = time.NewTimer(r.retry)
			fire = retry.C
		}
	}
}

// Apply applies one snapshot now and sets the readiness condition. It returns
// the first error of the pass joined with the others; records that could be
// applied were applied.
func (r *Reconciler) Apply(ctx context.Context, s Snapshot) (Result, error) {
	r.applyMu.Lock()
	defer r.applyMu.Unlock()
	res, err := r.apply(ctx, s)
	c := selection.Condition{Name: r.cond, Ready: s.State.Ready, Reason: s.State.Reason, Message: s.State.Message}
	if err != nil {
		c.Ready = false
		c.Reason = "ApplyFailed"
		c.Message = err.Error()
		if !errors.Is(err, ErrDuplicateWorkerID) {
			c.Message += fmt.Sprintf(" (retrying in %s unless the source changes first)", r.retry)
		}
		r.log.Error("snapshot not applied", "err", err)
	}
	r.cat.SetCondition(c)
	return res, err
}

func (r *Reconciler) apply(ctx context.Context, s Snapshot) (Result, error) {
	var res Result
	want := make(map[uint64]catalog.Record, len(s.Workers))
	for _, w := range s.Workers {
		if _, dup := want[w.WorkerID]; dup {
			return res, fmt.Errorf("%w: %d", ErrDuplicateWorkerID, w.WorkerID)
		}
		want[w.WorkerID] = w
	}
	have := make(map[uint64]*catalog.Record)
	for _, w := range r.cat.Workers(nil, nil) {
		have[w.WorkerID] = w
	}
	var errs []error
	for _, id := range slices.Sorted(maps.Keys(want)) {
		w := want[id]
		rec := w.Clone()
		rec.ResolveRole(r.cat.PrefillRoutingGroup())
		if err := rec.Normalize(); err != nil {
			errs = append(errs, fmt.Errorf("worker %d: %w", id, err))
			continue
		}
		if cur, ok := have[id]; ok && cur.Lifecycle == catalog.Schedulable && sameInput(cur, rec) {
			r.owned[id] = true
			res.Unchanged++
			continue
		}
		out, err := r.cat.UpsertWorker(ctx, *rec)
		if err != nil {
			errs = append(errs, fmt.Errorf("upsert worker %d: %w", id, err))
			continue
		}
		r.owned[id] = true
		res.Upserted++
		r.logUpsert(out)
	}
	for _, id := range slices.Sorted(maps.Keys(r.owned)) {
		if _, keep := want[id]; keep {
			continue
		}
		_, err := r.cat.DeleteWorker(ctx, id)
		if err != nil && selection.KindOf(err) != selection.KindNotFound {
			errs = append(errs, fmt.Errorf("delete worker %d: %w", id, err))
			continue
		}
		delete(r.owned, id)
		delete(r.lastReasons, id)
		res.Deleted++
		r.log.Info("worker removed", "worker_id", id)
	}
	return res, errors.Join(errs...)
}

// logUpsert logs a changed worker; an incomplete worker's reasons are logged
// at warning level, once per distinct set of reasons.
func (r *Reconciler) logUpsert(out *catalog.Record) {
	attrs := []any{"worker_id", out.WorkerID, "model_name", out.ModelName, "routing_group", out.RoutingGroup,
		"endpoint", out.EndpointOrEmpty(), "lifecycle", string(out.Lifecycle)}
	if out.Lifecycle == catalog.Schedulable {
		delete(r.lastReasons, out.WorkerID)
		r.log.Info("worker upserted", attrs...)
		return
	}
	key := fmt.Sprint(out.NotSchedulableReasons)
	if r.lastReasons[out.WorkerID] == key {
		return
	}
	r.lastReasons[out.WorkerID] = key
	r.log.Warn("worker is incomplete", append(attrs, "reasons", out.NotSchedulableReasons)...)
}

// sameInput reports whether the stored record cur came from the same input as
// want, ignoring what the service computes (lifecycle, reasons, listener
// status).
func sameInput(cur, want *catalog.Record) bool {
	a, b := cur.Clone(), want.Clone()
	for _, r := range []*catalog.Record{a, b} {
		r.Lifecycle = ""
		r.NotSchedulableReasons = nil
		r.KVEventsStatus = nil
		if len(r.SourceReasons) == 0 {
			r.SourceReasons = nil
		}
		if len(r.KVEventsEndpoints) == 0 {
			r.KVEventsEndpoints = nil
		}
		if len(r.RouterHintSourceControlEndpoints) == 0 {
			r.RouterHintSourceControlEndpoints = nil
		}
	}
	return reflect.DeepEqual(a, b)
}
