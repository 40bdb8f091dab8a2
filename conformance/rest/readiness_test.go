package rest

import (
	"fmt"
	"net/http"
	"testing"
)

// readyResponse is the body of GET /ready, the same for 200 and 503.
type readyResponse struct {
	Ready              bool           `json:"ready"`
	SchedulableWorkers uint64         `json:"schedulable_workers"`
	Workers            []workerRecord `json:"workers"`
}

// ready reads GET /ready and checks what holds whatever else shares the server: 200 exactly
// when ready, ready exactly when some worker is schedulable, the count agrees with the
// listed catalog, and the catalog is sorted.
func (s *server) ready(t *testing.T) readyResponse {
	t.Helper()
	r := s.get(t, "/ready")
	var body readyResponse
	r.decode(t, &body)
	wantKeys(t, "ReadyResponse", r.fields(t), "ready", "schedulable_workers", "workers")
	if body.Ready != (body.SchedulableWorkers > 0) {
		t.Fatalf("ready=%v with schedulable_workers=%d: %v", body.Ready, body.SchedulableWorkers, r)
	}
	want := http.StatusOK
	if !body.Ready {
		want = http.StatusServiceUnavailable
	}
	r.want(t, want)
	n := uint64(0)
	for _, w := range body.Workers {
		if w.Lifecycle == "schedulable" {
			n++
		}
	}
	if n != body.SchedulableWorkers {
		t.Fatalf("schedulable_workers=%d but %d listed workers are schedulable", body.SchedulableWorkers, n)
	}
	if !sortedWorkers(body.Workers) {
		t.Fatalf("GET /ready workers not sorted by (model_name, routing_group, worker_id)")
	}
	return body
}

// A partition is ready exactly while it has a schedulable worker (/select is 503 "no
// schedulable workers for …" otherwise); GET /ready follows the whole catalog (Dynamo's HTTP
// test ready_and_select_report_not_ready_without_schedulable_workers).
func TestReadinessFollowsPartitionLifecycle(t *testing.T) {
	s := conformance(t)
	anchor := s.anchor(t)
	model := s.model(t)
	prompt := obj{"model_name": model, "token_ids": tokens(1, 4)}
	notReady := func(step string) {
		t.Helper()
		for _, path := range []string{"/select", "/select_and_reserve", "/potential_loads", "/overlap_scores"} {
			t.Run(step+path, func(t *testing.T) {
				wantPartitionNotReady(t, s.post(t, path, prompt), model)
			})
		}
	}

	notReady("unknown partition")
	if r := s.ready(t); !r.Ready || !hasWorker(r.Workers, anchor, "schedulable") {
		t.Fatalf("with anchor worker %d registered: ready=%v workers=%+v", anchor, r.Ready, r.Workers)
	}

	id := s.addSimpleWorker(t, model)
	if got := s.selectOK(t, prompt); got.WorkerID != id {
		t.Fatalf("select chose %d, want %d", got.WorkerID, id)
	}
	r := s.ready(t)
	if !r.Ready || r.SchedulableWorkers < 2 || !hasWorker(r.Workers, id, "schedulable") {
		t.Fatalf("after registering %d: %+v", id, r)
	}

	s.del(t, fmt.Sprintf("/workers/%d", id)).want(t, http.StatusOK)
	notReady("after delete")
	if r := s.ready(t); hasWorker(r.Workers, id, "schedulable") {
		t.Fatalf("deleted worker %d still schedulable in /ready", id)
	}

	// Without the anchor the whole service may be empty (unless someone else shares it).
	s.del(t, fmt.Sprintf("/workers/%d", anchor)).want(t, http.StatusOK)
	if r := s.ready(t); r.SchedulableWorkers == 0 {
		s.post(t, "/select", prompt).wantError(t, http.StatusServiceUnavailable, "no schedulable workers")
	} else {
		t.Logf("service shared with %d other schedulable workers: the empty-service 503 of /ready was not observable", r.SchedulableWorkers)
	}
}
