package selection

import (
	"sync"
	"testing"

	"github.com/kvselect/kvselect/selection/catalog"
)

func records(lifecycles ...catalog.Lifecycle) []*catalog.Record {
	out := make([]*catalog.Record, len(lifecycles))
	for i, l := range lifecycles {
		out[i] = &catalog.Record{WorkerID: uint64(i + 1), Lifecycle: l}
	}
	return out
}

func TestReadinessGatesOnEveryInput(t *testing.T) {
	one := records(catalog.Schedulable, catalog.Incomplete)
	for _, tc := range []struct {
		name        string
		set         func(r *readiness)
		ws          []*catalog.Record
		ready       bool
		recovery    string
		mayAdmit    bool
		schedulable int
	}{
		{"running with a schedulable worker", func(*readiness) {}, one, true, "", true, 1},
		{"no schedulable worker", func(*readiness) {}, records(catalog.Incomplete, catalog.Draining), false, "", true, 0},
		{"empty catalog", func(*readiness) {}, nil, false, "", true, 0},
		{"shutting down", func(r *readiness) { r.shutDown() }, one, false, "", false, 1},
		{"recovery pending", func(r *readiness) { r.setRecovery(RecoveryPending) }, one, false, "pending", true, 1},
		{"recovery done", func(r *readiness) { r.setRecovery(RecoveryRecovered) }, one, true, "recovered", true, 1},
		{"recovery failed still serves", func(r *readiness) { r.setRecovery(RecoveryFailed) }, one, true, "failed", true, 1},
		{"a condition not ready", func(r *readiness) {
			r.setCondition(Condition{Name: "discovery", Ready: false, Reason: "InferencePoolNotFound"})
		}, one, false, "", true, 1},
		{"every condition ready", func(r *readiness) {
			r.setCondition(Condition{Name: "discovery", Ready: true})
			r.setCondition(Condition{Name: "file", Ready: true})
		}, one, true, "", true, 1},
		{"a removed condition no longer holds", func(r *readiness) {
			r.setCondition(Condition{Name: "discovery", Ready: false})
			r.removeCondition("discovery")
		}, one, true, "", true, 1},
		{"a replaced condition counts as its last value", func(r *readiness) {
			r.setCondition(Condition{Name: "discovery", Ready: false})
			r.setCondition(Condition{Name: "discovery", Ready: true})
		}, one, true, "", true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r readiness
			tc.set(&r)
			st := r.status(tc.ws)
			if st.Ready != tc.ready || st.IndexRecovery != tc.recovery || st.SchedulableWorkers != tc.schedulable || len(st.Workers) != len(tc.ws) {
				t.Errorf("status = %+v, want ready %v, recovery %q, %d schedulable", st, tc.ready, tc.recovery, tc.schedulable)
			}
			if err := r.admit(); (err == nil) != tc.mayAdmit {
				t.Errorf("admit = %v, want admitted %v", err, tc.mayAdmit)
			} else if err != nil {
				wantKind(t, err, KindNotReady, "shutting down")
			}
		})
	}
}

func TestReadinessConditionsAreSortedCopies(t *testing.T) {
	var r readiness
	if got := r.conditions(); len(got) != 0 {
		t.Fatalf("zero value has conditions: %+v", got)
	}
	r.removeCondition("absent") // no-op on the zero value
	for _, n := range []string{"zeta", "alpha", "mid"} {
		r.setCondition(Condition{Name: n, Ready: true})
	}
	got := r.conditions()
	if len(got) != 3 || got[0].Name != "alpha" || got[1].Name != "mid" || got[2].Name != "zeta" {
		t.Fatalf("conditions = %+v, want sorted by name", got)
	}
	got[0].Ready = false
	if !r.status(records(catalog.Schedulable)).Ready {
		t.Fatal("editing the returned slice changed the readiness")
	}
}

func TestReadinessIsSafeForConcurrentUse(t *testing.T) {
	var r readiness
	ws := records(catalog.Schedulable)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for j := range 200 {
				r.setCondition(Condition{Name: string(rune('a' + i)), Ready: j%2 == 0})
				r.setRecovery(IndexRecovery(j % 4))
				_ = r.status(ws)
				_ = r.admit()
			}
		})
	}
	wg.Wait()
	r.shutDown()
	if r.admit() == nil || r.status(ws).Ready {
		t.Fatal("shutdown lost")
	}
}
