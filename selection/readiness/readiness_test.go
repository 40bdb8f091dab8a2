package readiness

import (
	"strings"
	"sync"
	"testing"

	"github.com/kvselect/kvselect/selection/apierr"

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
		set         func(r *Gate)
		ws          []*catalog.Record
		ready       bool
		recovery    string
		mayAdmit    bool
		schedulable int
	}{
		{"running with a schedulable worker", func(*Gate) {}, one, true, "", true, 1},
		{"no schedulable worker", func(*Gate) {}, records(catalog.Incomplete, catalog.Draining), false, "", true, 0},
		{"empty catalog", func(*Gate) {}, nil, false, "", true, 0},
		{"shutting down", func(r *Gate) { r.ShutDown() }, one, false, "", false, 1},
		{"recovery pending", func(r *Gate) { r.SetRecovery(RecoveryPending) }, one, false, "pending", true, 1},
		{"recovery done", func(r *Gate) { r.SetRecovery(RecoveryRecovered) }, one, true, "recovered", true, 1},
		{"recovery failed still serves", func(r *Gate) { r.SetRecovery(RecoveryFailed) }, one, true, "failed", true, 1},
		{"a condition not ready", func(r *Gate) {
			r.SetCondition(Condition{Name: "discovery", Ready: false, Reason: "InferencePoolNotFound"})
		}, one, false, "", true, 1},
		{"every condition ready", func(r *Gate) {
			r.SetCondition(Condition{Name: "discovery", Ready: true})
			r.SetCondition(Condition{Name: "file", Ready: true})
		}, one, true, "", true, 1},
		{"a removed condition no longer holds", func(r *Gate) {
			r.SetCondition(Condition{Name: "discovery", Ready: false})
			r.RemoveCondition("discovery")
		}, one, true, "", true, 1},
		{"a replaced condition counts as its last value", func(r *Gate) {
			r.SetCondition(Condition{Name: "discovery", Ready: false})
			r.SetCondition(Condition{Name: "discovery", Ready: true})
		}, one, true, "", true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r Gate
			tc.set(&r)
			st := r.Status(tc.ws)
			if st.Ready != tc.ready || st.Recovery.String() != tc.recovery || st.Schedulable != tc.schedulable {
				t.Errorf("status = %+v, want ready %v, recovery %q, %d schedulable", st, tc.ready, tc.recovery, tc.schedulable)
			}
			if err := r.Admit(); (err == nil) != tc.mayAdmit {
				t.Errorf("admit = %v, want admitted %v", err, tc.mayAdmit)
			} else if err != nil && (apierr.KindOf(err) != apierr.NotReady || !strings.Contains(err.Error(), "shutting down")) {
				t.Errorf("admit = %v (kind %v), want not_ready, shutting down", err, apierr.KindOf(err))
			}
		})
	}
}

func TestReadinessConditionsAreSortedCopies(t *testing.T) {
	var r Gate
	if got := r.Conditions(); len(got) != 0 {
		t.Fatalf("zero value has conditions: %+v", got)
	}
	r.RemoveCondition("absent") // no-op on the zero value
	for _, n := range []string{"zeta", "alpha", "mid"} {
		r.SetCondition(Condition{Name: n, Ready: true})
	}
	got := r.Conditions()
	if len(got) != 3 || got[0].Name != "alpha" || got[1].Name != "mid" || got[2].Name != "zeta" {
		t.Fatalf("conditions = %+v, want sorted by name", got)
	}
	got[0].Ready = false
	if !r.Status(records(catalog.Schedulable)).Ready {
		t.Fatal("editing the returned slice changed the readiness")
	}
}

func TestReadinessIsSafeForConcurrentUse(t *testing.T) {
	var r Gate
	ws := records(catalog.Schedulable)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for j := range 200 {
				r.SetCondition(Condition{Name: string(rune('a' + i)), Ready: j%2 == 0})
				r.SetRecovery(IndexRecovery(j % 4))
				_ = r.Status(ws)
				_ = r.Admit()
			}
		})
	}
	wg.Wait()
	r.ShutDown()
	if r.Admit() == nil || r.Status(ws).Ready {
		t.Fatal("shutdown lost")
	}
}
