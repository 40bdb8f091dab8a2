package discovery

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func newService(t testing.TB) *selection.Service {
	t.Helper()
	rc := routerconfig.Default()
	rc.UseKVEvents = false // no engines here: the approximate index needs no event endpoints
	svc, err := selection.New(selection.Config{Router: rc})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

func ptr[T any](v T) *T { return &v }

func rec(id uint64, endpoint string) catalog.Record {
	return catalog.Record{WorkerID: id, ModelName: "llama", Endpoint: ptr(endpoint), BlockSize: ptr(uint32(16))}
}

func ids(svc *selection.Service) []uint64 {
	var out []uint64
	for _, w := range svc.Workers(nil, nil) {
		out = append(out, w.WorkerID)
	}
	slices.Sort(out)
	return out
}

// eventually polls cond until it holds or a generous deadline passes; the
// machine is shared, so no test asserts on how long anything takes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestApplyUpsertsSkipsConvergedAndDeletes(t *testing.T) {
	svc := newService(t)
	r := NewReconciler(svc, Options{Logger: quiet})
	ctx := context.Background()
	ready := State{Ready: true, Reason: "Synced"}

	steps := []struct {
		name    string
		workers []catalog.Record
		want    Result
		ids     []uint64
	}{
		{"first snapshot adds", []catalog.Record{rec(1, "http://a:8000"), rec(2, "http://b:8000")}, Result{Upserted: 2}, []uint64{1, 2}},
		{"same snapshot is converged", []catalog.Record{rec(2, "http://b:8000"), rec(1, "http://a:8000")}, Result{Unchanged: 2}, []uint64{1, 2}},
		{"changed endpoint is upserted", []catalog.Record{rec(1, "http://a:8001"), rec(2, "http://b:8000")}, Result{Upserted: 1, Unchanged: 1}, []uint64{1, 2}},
		{"omitted worker is deleted", []catalog.Record{rec(1, "http://a:8001")}, Result{Unchanged: 1, Deleted: 1}, []uint64{1}},
		{"empty snapshot deletes all", nil, Result{Deleted: 1}, nil},
	}
	for _, s := range steps {
		got, err := r.Apply(ctx, Snapshot{Workers: s.workers, State: ready})
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got != s.want {
			t.Errorf("%s: result %+v, want %+v", s.name, got, s.want)
		}
		if g := ids(svc); !slices.Equal(g, s.ids) {
			t.Errorf("%s: catalog %v, want %v", s.name, g, s.ids)
		}
	}
	if c := svc.Ready().Conditions; len(c) != 1 || !c[0].Ready || c[0].Reason != "Synced" {
		t.Fatalf("condition: %+v", c)
	}
}

func TestApplyRejectsDuplicateIDsBeforeAnyChange(t *testing.T) {
	svc := newService(t)
	r := NewReconciler(svc, Options{Logger: quiet})
	ctx := context.Background()
	if _, err := r.Apply(ctx, Snapshot{Workers: []catalog.Record{rec(1, "http://a:8000")}, State: State{Ready: true}}); err != nil {
		t.Fatal(err)
	}
	_, err := r.Apply(ctx, Snapshot{Workers: []catalog.Record{rec(2, "http://b:8000"), rec(3, "http://c:8000"), rec(2, "http://d:8000")}, State: State{Ready: true}})
	if !errors.Is(err, ErrDuplicateWorkerID) || !strings.Contains(err.Error(), ": 2") {
		t.Fatalf("err = %v, want ErrDuplicateWorkerID naming 2", err)
	}
	if g := ids(svc); !slices.Equal(g, []uint64{1}) {
		t.Fatalf("catalog changed by a rejected snapshot: %v", g)
	}
	c := svc.Ready().Conditions
	if len(c) != 1 || c[0].Ready || c[0].Reason != "ApplyFailed" || !strings.Contains(c[0].Message, "duplicate worker_id") {
		t.Fatalf("condition after a rejected snapshot: %+v", c)
	}
	if svc.Ready().Ready {
		t.Fatal("ready with a rejected snapshot")
	}
}

func TestApplyLeavesRESTWorkersAlone(t *testing.T) {
	svc := newService(t)
	ctx := context.Background()
	if _, err := svc.UpsertWorker(ctx, rec(9, "http://rest:8000")); err != nil {
		t.Fatal(err)
	}
	r := NewReconciler(svc, Options{Logger: quiet})
	for _, ws := range [][]catalog.Record{{rec(1, "http://a:8000")}, nil} {
		if _, err := r.Apply(ctx, Snapshot{Workers: ws, State: State{Ready: true}}); err != nil {
			t.Fatal(err)
		}
	}
	if g := ids(svc); !slices.Equal(g, []uint64{9}) {
		t.Fatalf("catalog %v: the REST worker must stay, the discovered one go", g)
	}
}

func TestApplyToleratesWorkerDeletedOverREST(t *testing.T) {
	svc := newService(t)
	ctx := context.Background()
	r := NewReconciler(svc, Options{Logger: quiet})
	if _, err := r.Apply(ctx, Snapshot{Workers: []catalog.Record{rec(1, "http://a:8000")}, State: State{Ready: true}}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.DeleteWorker(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if res, err := r.Apply(ctx, Snapshot{State: State{Ready: true}}); err != nil || res.Deleted != 1 {
		t.Fatalf("res %+v err %v", res, err)
	}
}

func TestIncompleteWorkerIsKeptWithItsReasons(t *testing.T) {
	svc := newService(t)
	ctx := context.Background()
	r := NewReconciler(svc, Options{Logger: quiet})
	bad := rec(5, "http://e:8000")
	bad.SourceReasons = []string{"annotation kvselect.io/block-size \"sixteen\": not a positive integer"}
	noBlock := rec(6, "http://f:8000")
	noBlock.BlockSize = nil
	for range 2 { // incomplete records are never "converged": each snapshot tries them again
		res, err := r.Apply(ctx, Snapshot{Workers: []catalog.Record{bad, noBlock}, State: State{Ready: true}})
		if err != nil || res.Upserted != 2 {
			t.Fatalf("res %+v err %v", res, err)
		}
	}
	ws := svc.Workers(nil, nil)
	if len(ws) != 2 || ws[0].Lifecycle != catalog.Incomplete || ws[1].Lifecycle != catalog.Incomplete {
		t.Fatalf("want two incomplete workers, got %+v", ws)
	}
	if !strings.Contains(ws[0].NotSchedulableReasons[0], "kvselect.io/block-size") || ws[1].NotSchedulableReasons[0] != "block_size must be greater than 0" {
		t.Fatalf("reasons: %q / %q", ws[0].NotSchedulableReasons, ws[1].NotSchedulableReasons)
	}
}

// flaky fails the first n upserts, as a shutting-down or briefly unavailable
// catalog would; everything else goes to the real service.
type flaky struct {
	*selection.Service
	fail  atomic.Int32
	calls atomic.Int32
}

func (f *flaky) UpsertWorker(ctx context.Context, r catalog.Record) (*catalog.Record, error) {
	f.calls.Add(1)
	if f.fail.Add(-1) >= 0 {
		return nil, errors.New("injected failure")
	}
	return f.Service.UpsertWorker(ctx, r)
}

func TestRunRetriesAFailedSnapshot(t *testing.T) {
	svc := newService(t)
	f := &flaky{Service: svc}
	f.fail.Store(2)
	r := NewReconciler(f, Options{Logger: quiet, RetryInterval: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { r.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()

	r.Update(Snapshot{Workers: []catalog.Record{rec(1, "http://a:8000")}, State: State{Ready: true, Reason: "Synced"}})
	eventually(t, "the retried snapshot to land", func() bool { return slices.Equal(ids(svc), []uint64{1}) })
	if n := f.calls.Load(); n != 3 {
		t.Fatalf("upsert calls %d, want 2 failures and 1 success", n)
	}
	eventually(t, "the condition to turn ready", func() bool { return svc.Ready().Ready })
}

func TestRunNewerSnapshotSupersedesTheRetry(t *testing.T) {
	svc := newService(t)
	f := &flaky{Service: svc}
	f.fail.Store(1)
	// A retry interval far longer than the test: only the newer snapshot can
	// make progress.
	r := NewReconciler(f, Options{Logger: quiet, RetryInterval: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { r.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()

	r.Update(Snapshot{Workers: []catalog.Record{rec(1, "http://a:8000")}, State: State{Ready: true}})
	eventually(t, "the first apply to fail", func() bool {
		c := svc.Ready().Conditions
		return len(c) == 1 && c[0].Reason == "ApplyFailed" && strings.Contains(c[0].Message, "retrying in 1h0m0s")
	})
	r.Update(Snapshot{Workers: []catalog.Record{rec(2, "http://b:8000")}, State: State{Ready: true}})
	eventually(t, "the newer snapshot to land", func() bool { return slices.Equal(ids(svc), []uint64{2}) })
}

// A prefill worker discovered without a routing group lands in the service's
// prefill group, and the next identical snapshot finds it converged rather
// than upserting it again (the group it was given is the service's doing).
func TestApplyPlacesPrefillWorkersOnce(t *testing.T) {
	svc := newService(t)
	r := NewReconciler(svc, Options{Logger: quiet})
	ctx := context.Background()
	p := rec(1, "http://a:8000")
	p.Role = ptr(catalog.RolePrefill)
	snap := Snapshot{Workers: []catalog.Record{p, rec(2, "http://b:8000")}, State: State{Ready: true}}
	for i, want := range []Result{{Upserted: 2}, {Unchanged: 2}} {
		got, err := r.Apply(ctx, snap)
		if err != nil || got != want {
			t.Fatalf("apply %d: %+v %v, want %+v", i, got, err, want)
		}
	}
	w := svc.Workers(nil, ptr(selection.DefaultPrefillRoutingGroup))
	if len(w) != 1 || w[0].WorkerID != 1 || w[0].Lifecycle != catalog.Schedulable {
		t.Fatalf("prefill group = %+v", w)
	}
}
