package selection

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/kvselect/kvselect/selection/catalog"
)

func TestConditionsHoldReadinessBack(t *testing.T) {
	s, _ := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	if !s.Ready().Ready {
		t.Fatal("a schedulable worker and no conditions: want ready")
	}
	s.SetCondition(Condition{Name: "discovery", Ready: false, Reason: "InferencePoolNotFound", Message: "InferencePool default/pool not found"})
	st := s.Ready()
	if st.Ready {
		t.Fatal("a condition that is not ready must hold readiness back")
	}
	body, _ := json.Marshal(st)
	if !strings.Contains(string(body), `"conditions":[{"name":"discovery","ready":false,"reason":"InferencePoolNotFound"`) {
		t.Fatalf("/ready body does not say why: %s", body)
	}
	s.SetCondition(Condition{Name: "discovery", Ready: true, Reason: "Synced"})
	s.SetCondition(Condition{Name: "another", Ready: true})
	if st := s.Ready(); !st.Ready || len(st.Conditions) != 2 || st.Conditions[0].Name != "another" {
		t.Fatalf("ready conditions: got %+v", st)
	}
	s.gate.RemoveCondition("discovery")
	s.gate.RemoveCondition("absent")
	if got := s.gate.Conditions(); len(got) != 1 || got[0].Name != "another" {
		t.Fatalf("after remove: %+v", got)
	}
}

func TestConditionsOmittedWhenNone(t *testing.T) {
	s, _ := newService(t, nil)
	body, _ := json.Marshal(s.Ready())
	if strings.Contains(string(body), "conditions") {
		t.Fatalf("no conditions set, yet the body names them: %s", body)
	}
}

func TestSourceReasonsKeepWorkerIncomplete(t *testing.T) {
	s, _ := newService(t, nil)
	r := workerRec(7)
	r.SourceReasons = []string{`annotation kvselect.io/block-size "x": not a positive integer`}
	got := mustUpsert(t, s, r)
	if got.Lifecycle != catalog.Incomplete || len(got.NotSchedulableReasons) != 1 || !strings.HasPrefix(got.NotSchedulableReasons[0], "annotation") {
		t.Fatalf("got %s %q, want incomplete with the source reason first", got.Lifecycle, got.NotSchedulableReasons)
	}
	ws := s.Workers(nil, nil)
	if len(ws) != 1 || !slices.Equal(ws[0].SourceReasons, r.SourceReasons) {
		t.Fatalf("Workers lost the source reasons: %+v", ws)
	}
	body, _ := json.Marshal(ws[0])
	if strings.Contains(string(body), "source_reasons") || !strings.Contains(string(body), "kvselect.io/block-size") {
		t.Fatalf("want the reason only inside not_schedulable_reasons: %s", body)
	}
	r.SourceReasons = nil
	if got := mustUpsert(t, s, r); got.Lifecycle != catalog.Schedulable {
		t.Fatalf("fixed record: got %s %q", got.Lifecycle, got.NotSchedulableReasons)
	}
}
