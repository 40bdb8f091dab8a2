package rest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// POST /workers is 201 with the catalog record: fields as sent, no defaults filled in, unset
// optional fields null, and the empty maps and unset hint fields omitted, as Dynamo's
// WorkerCatalogRecord serializes.
func TestUpsertWorkerReturnsRecord(t *testing.T) {
	s := conformance(t)
	model := s.model(t)
	id := s.workerID()
	body := workerBody(id, model)
	body["routing_group"] = "g1"
	body["max_num_batched_tokens"] = 8192
	body["total_kv_blocks"] = 1000
	body["taints"] = []string{"t1"}
	r := s.post(t, "/workers", body).want(t, http.StatusCreated)
	s.cleanupWorker(t, id)

	var rec workerRecord
	r.decode(t, &rec)
	if rec.WorkerID != id || rec.ModelName != model || rec.RoutingGroup != "g1" || rec.Lifecycle != "schedulable" {
		skipOnConfigReasons(t, rec.NotSchedulableReasons)
		t.Fatalf("record %+v: want worker %d of %s/g1, schedulable", rec, id, model)
	}
	if rec.Endpoint == nil || *rec.Endpoint != body["endpoint"] || rec.BlockSize == nil || *rec.BlockSize != 4 ||
		rec.MaxNumBatchedTokens == nil || *rec.MaxNumBatchedTokens != 8192 ||
		rec.TotalKVBlocks == nil || *rec.TotalKVBlocks != 1000 || !equal(rec.Taints, []string{"t1"}) {
		t.Fatalf("record %+v does not echo the request %v", rec, body)
	}
	f := r.fields(t)
	wantKeys(t, "WorkerCatalogRecord", f, "worker_id", "model_name", "routing_group", "lifecycle", "endpoint",
		"kv_events_endpoint", "replay_endpoint", "block_size", "data_parallel_start_rank", "data_parallel_size",
		"max_num_batched_tokens", "total_kv_blocks", "stable_routing_id", "is_eagle", "taints", "topology_domains",
		"kv_transfer_domain", "kv_transfer_enforcement", "kv_transfer_preferred_weight")
	// Omitted when empty or null (skip_serializing_if on Dynamo's record).
	wantNoKeys(t, "WorkerCatalogRecord", f, "kv_events_endpoints", "router_hint_worker_type",
		"router_hint_source_control_endpoints", "kv_event_source_mode", "not_schedulable_reasons")
	// Stored as sent: no defaults filled in.
	if v := f["data_parallel_size"]; !isNull(v) {
		t.Errorf("data_parallel_size not sent, want null, got %s", v)
	}
	if string(f["topology_domains"]) != "{}" {
		t.Errorf("topology_domains not sent, want {}, got %s", f["topology_domains"])
	}

	t.Run("model_name and routing_group default to \"default\"", func(t *testing.T) {
		id := s.workerID()
		r := s.post(t, "/workers", obj{"worker_id": id, "endpoint": "http://x:1", "block_size": 4}).want(t, http.StatusCreated)
		s.cleanupWorker(t, id)
		var rec workerRecord
		r.decode(t, &rec)
		if rec.ModelName != "default" || rec.RoutingGroup != "default" {
			t.Fatalf("record %+v: want model_name and routing_group \"default\"", rec)
		}
	})
}

// An incomplete worker is accepted (201, lifecycle "incomplete") with its
// not_schedulable_reasons, and is not schedulable: Dynamo never rejects a registration for
// what it lacks.
func TestIncompleteWorkerIsAcceptedButNotSchedulable(t *testing.T) {
	s := conformance(t)
	s.anchor(t)
	model := s.model(t)
	base := s.addSimpleWorker(t, model) // freezes the partition's block_size at 4
	for _, c := range []struct {
		name   string
		edit   func(obj)
		reason string
	}{
		{"no endpoint", func(b obj) { delete(b, "endpoint") }, "endpoint is required"},
		{"empty endpoint", func(b obj) { b["endpoint"] = "" }, "endpoint is required"},
		{"no block_size", func(b obj) { delete(b, "block_size") }, "block_size must be greater than 0"},
		{"zero block_size", func(b obj) { b["block_size"] = 0 }, "block_size must be greater than 0"},
		{"zero data_parallel_size", func(b obj) { b["data_parallel_size"] = 0 }, "data_parallel_size must be greater than 0"},
		{"block_size mismatch", func(b obj) { b["block_size"] = 8 }, "block_size mismatch"},
	} {
		t.Run(c.name, func(t *testing.T) {
			id := s.workerID()
			body := workerBody(id, model)
			c.edit(body)
			rec := s.putWorker(t, body)
			if rec.Lifecycle != "incomplete" || !anyContains(rec.NotSchedulableReasons, c.reason) {
				t.Fatalf("record %+v: want incomplete with a reason containing %q", rec, c.reason)
			}
			var listed []workerRecord
			s.get(t, "/workers?model_name="+url.QueryEscape(model)).want(t, http.StatusOK).decode(t, &listed)
			if !hasWorker(listed, id, "incomplete") {
				t.Fatalf("GET /workers does not list incomplete worker %d: %+v", id, listed)
			}
			// Only the complete worker is a candidate.
			for range 4 {
				if got := s.selectOK(t, obj{"model_name": model, "token_ids": tokens(1, 4)}); got.WorkerID != base {
					t.Fatalf("/select chose worker %d; only %d is schedulable", got.WorkerID, base)
				}
			}
		})
	}
	t.Run("partition with only incomplete workers is not ready", func(t *testing.T) {
		other := s.model(t, "incomplete-only")
		id := s.workerID()
		body := workerBody(id, other)
		delete(body, "endpoint")
		s.putWorker(t, body)
		wantPartitionNotReady(t, s.post(t, "/select", obj{"model_name": other, "token_ids": tokens(1, 4)}), other)
	})
}

// POST /workers replaces the whole record; missing optional fields are cleared.
func TestUpsertIsFullReplace(t *testing.T) {
	s := conformance(t)
	model := s.model(t)
	id := s.workerID()
	body := workerBody(id, model)
	body["total_kv_blocks"] = 1000
	body["taints"] = []string{"a"}
	s.addWorker(t, body)
	rec := s.addWorker(t, workerBody(id, model))
	if rec.TotalKVBlocks != nil || len(rec.Taints) != 0 {
		t.Fatalf("re-upsert without total_kv_blocks/taints kept them: %+v", rec)
	}
	var listed []workerRecord
	s.get(t, "/workers?model_name="+url.QueryEscape(model)).want(t, http.StatusOK).decode(t, &listed)
	if len(listed) != 1 || listed[0].TotalKVBlocks != nil {
		t.Fatalf("GET /workers after replace: %+v", listed)
	}
}

// DELETE /workers/{id} answers the record as unschedulable and removes it (newest Dynamo;
// older versions kept it in the catalog); a second DELETE is 404.
func TestDeleteWorker(t *testing.T) {
	s := conformance(t)
	model := s.model(t)
	id := s.addSimpleWorker(t, model)
	r := s.del(t, fmt.Sprintf("/workers/%d", id)).want(t, http.StatusOK)
	var rec workerRecord
	r.decode(t, &rec)
	if rec.WorkerID != id || rec.Lifecycle != "unschedulable" {
		t.Fatalf("DELETE answered %+v, want worker %d unschedulable", rec, id)
	}
	wantNoKeys(t, "DELETE /workers record", r.fields(t), "not_schedulable_reasons")
	var listed []workerRecord
	s.get(t, "/workers?model_name="+url.QueryEscape(model)).want(t, http.StatusOK).decode(t, &listed)
	if len(listed) != 0 {
		t.Fatalf("deleted worker still listed: %+v", listed)
	}
	s.del(t, fmt.Sprintf("/workers/%d", id)).wantError(t, http.StatusNotFound, fmt.Sprintf("worker %d not found", id))
}

// GET /workers filters by model_name and routing_group independently and sorts by
// (model_name, routing_group, worker_id).
func TestListWorkersFiltersAndSorts(t *testing.T) {
	s := conformance(t)
	modelA, modelB := s.model(t, "a"), s.model(t, "b")
	g1, g2 := s.model(t, "g1"), s.model(t, "g2") // group names unique to the run too
	ids := make([]uint64, 6)
	for i := range ids {
		ids[i] = s.workerID()
	}
	// Registered out of order; the listing must not depend on registration order.
	layout := []struct {
		id           uint64
		model, group string
	}{
		{ids[5], modelA, g1}, {ids[1], modelA, g2}, {ids[3], modelB, g1},
		{ids[0], modelA, g1}, {ids[4], modelB, g2}, {ids[2], modelA, g2},
	}
	for _, w := range layout {
		b := workerBody(w.id, w.model)
		b["routing_group"] = w.group
		s.addWorker(t, b)
	}
	list := func(q url.Values) []workerRecord {
		var out []workerRecord
		s.get(t, "/workers?"+q.Encode()).want(t, http.StatusOK).decode(t, &out)
		if !sortedWorkers(out) {
			t.Fatalf("GET /workers?%s not sorted by (model_name, routing_group, worker_id): %+v", q.Encode(), out)
		}
		return out
	}
	keys := func(recs []workerRecord) []string {
		var out []string
		for _, r := range recs {
			out = append(out, fmt.Sprintf("%s/%s/%d", r.ModelName, r.RoutingGroup, r.WorkerID))
		}
		return out
	}
	key := func(model, group string, id uint64) string { return fmt.Sprintf("%s/%s/%d", model, group, id) }

	for _, c := range []struct {
		name string
		q    url.Values
		want []string
	}{
		{"model", url.Values{"model_name": {modelA}}, []string{
			key(modelA, g1, ids[0]), key(modelA, g1, ids[5]), key(modelA, g2, ids[1]), key(modelA, g2, ids[2])}},
		{"group", url.Values{"routing_group": {g1}}, []string{
			key(modelA, g1, ids[0]), key(modelA, g1, ids[5]), key(modelB, g1, ids[3])}},
		{"model and group", url.Values{"model_name": {modelB}, "routing_group": {g2}}, []string{key(modelB, g2, ids[4])}},
		{"no match", url.Values{"model_name": {modelA}, "routing_group": {"conf-" + s.run + "-none"}}, nil},
		{"legacy tenant_id ignored", url.Values{"model_name": {modelB}, "tenant_id": {"x"}}, []string{
			key(modelB, g1, ids[3]), key(modelB, g2, ids[4])}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := keys(list(c.q)); !equal(got, c.want) {
				t.Fatalf("GET /workers?%s = %q, want %q", c.q.Encode(), got, c.want)
			}
		})
	}
	t.Run("empty match is an empty array", func(t *testing.T) {
		r := s.get(t, "/workers?model_name="+url.QueryEscape(s.model(t, "nothing"))).want(t, http.StatusOK)
		var raw json.RawMessage
		r.decode(t, &raw)
		if string(raw) != "[]" {
			t.Fatalf("want [], got %s", raw)
		}
	})
	t.Run("unfiltered holds every partition, sorted", func(t *testing.T) {
		all := list(url.Values{})
		for _, w := range layout {
			if !hasWorker(all, w.id, "schedulable") {
				t.Fatalf("unfiltered GET /workers misses worker %d", w.id)
			}
		}
	})
}

// Worker ids are service-wide (Dynamo's docs, "Worker Registration"): reusing one in another
// routing group moves the worker; the old partition can become not ready.
func TestUpsertMovesWorkerBetweenRoutingGroups(t *testing.T) {
	s := conformance(t)
	s.anchor(t)
	model := s.model(t)
	id := s.workerID()
	b := workerBody(id, model)
	b["routing_group"] = "g1"
	s.addWorker(t, b)
	sel := obj{"model_name": model, "routing_group": "g1", "token_ids": tokens(1, 4)}
	if got := s.selectOK(t, sel); got.WorkerID != id || got.RoutingGroup != "g1" {
		t.Fatalf("select in g1: %+v", got)
	}

	b["routing_group"] = "g2"
	if rec := s.addWorker(t, b); rec.RoutingGroup != "g2" {
		t.Fatalf("moved record %+v, want routing_group g2", rec)
	}
	wantPartitionNotReady(t, s.post(t, "/select", sel), model)
	sel["routing_group"] = "g2"
	if got := s.selectOK(t, sel); got.WorkerID != id || got.RoutingGroup != "g2" {
		t.Fatalf("select in g2 after the move: %+v", got)
	}
	var listed []workerRecord
	s.get(t, "/workers?model_name="+url.QueryEscape(model)).want(t, http.StatusOK).decode(t, &listed)
	if len(listed) != 1 || listed[0].RoutingGroup != "g2" {
		t.Fatalf("after the move GET /workers = %+v, want the worker only in g2", listed)
	}

	t.Run("to another model", func(t *testing.T) {
		other := s.model(t, "other")
		b["model_name"] = other
		s.addWorker(t, b)
		sel := obj{"model_name": model, "routing_group": "g2", "token_ids": tokens(1, 4)}
		wantPartitionNotReady(t, s.post(t, "/select", sel), model)
		if got := s.selectOK(t, obj{"model_name": other, "routing_group": "g2", "token_ids": tokens(1, 4)}); got.WorkerID != id {
			t.Fatalf("select in the new model: %+v", got)
		}
	})
}

// PATCH updates supplied fields only; null means no change; sets are replaced
// wholesale; partition keys are ignored (PATCH cannot move a worker); unknown worker is 404.
func TestPatchWorker(t *testing.T) {
	s := conformance(t)
	s.anchor(t)
	model := s.model(t)
	id := s.workerID()
	body := workerBody(id, model)
	body["total_kv_blocks"] = 100
	s.addWorker(t, body)
	path := fmt.Sprintf("/workers/%d", id)
	patch := func(t *testing.T, p obj) workerRecord {
		t.Helper()
		var rec workerRecord
		s.patch(t, path, p).want(t, http.StatusOK).decode(t, &rec)
		return rec
	}

	t.Run("unknown worker", func(t *testing.T) {
		unknown := s.workerID()
		s.patch(t, fmt.Sprintf("/workers/%d", unknown), obj{"total_kv_blocks": 1}).
			wantError(t, http.StatusNotFound, fmt.Sprintf("worker %d not found", unknown))
	})
	t.Run("supplied fields only", func(t *testing.T) {
		rec := patch(t, obj{"total_kv_blocks": 2000})
		if rec.TotalKVBlocks == nil || *rec.TotalKVBlocks != 2000 || rec.Endpoint == nil || *rec.Endpoint != body["endpoint"] ||
			rec.BlockSize == nil || *rec.BlockSize != 4 || rec.Lifecycle != "schedulable" {
			t.Fatalf("after PATCH total_kv_blocks: %+v", rec)
		}
	})
	t.Run("null is no change", func(t *testing.T) {
		rec := patch(t, obj{"endpoint": nil, "total_kv_blocks": nil})
		if rec.Endpoint == nil || *rec.Endpoint != body["endpoint"] || rec.TotalKVBlocks == nil || *rec.TotalKVBlocks != 2000 {
			t.Fatalf("null fields changed the record: %+v", rec)
		}
	})
	t.Run("partition keys ignored", func(t *testing.T) {
		rec := patch(t, obj{"model_name": s.model(t, "elsewhere"), "routing_group": "elsewhere", "worker_id": id + 1})
		if rec.WorkerID != id || rec.ModelName != model || rec.RoutingGroup != "default" {
			t.Fatalf("PATCH moved the worker: %+v", rec)
		}
		if got := s.selectOK(t, obj{"model_name": model, "token_ids": tokens(1, 4)}); got.WorkerID != id {
			t.Fatalf("select after PATCH: %+v", got)
		}
	})
	t.Run("sets replaced wholesale", func(t *testing.T) {
		patch(t, obj{"taints": []string{"a", "b"}})
		if rec := patch(t, obj{"taints": []string{"c"}}); !equal(rec.Taints, []string{"c"}) {
			t.Fatalf("taints after second PATCH = %q, want [c]", rec.Taints)
		}
		patch(t, obj{"taints": []string{}})
	})
	t.Run("empty endpoint makes it incomplete, restoring it schedulable", func(t *testing.T) {
		rec := patch(t, obj{"endpoint": ""})
		if rec.Lifecycle != "incomplete" || !anyContains(rec.NotSchedulableReasons, "endpoint is required") {
			t.Fatalf("after PATCH endpoint \"\": %+v", rec)
		}
		wantPartitionNotReady(t, s.post(t, "/select", obj{"model_name": model, "token_ids": tokens(1, 4)}), model)
		if rec := patch(t, obj{"endpoint": body["endpoint"]}); rec.Lifecycle != "schedulable" {
			t.Fatalf("after restoring the endpoint: %+v", rec)
		}
		s.selectOK(t, obj{"model_name": model, "token_ids": tokens(1, 4)})
	})
	t.Run("dp range move", func(t *testing.T) {
		rec := patch(t, obj{"data_parallel_start_rank": 1, "data_parallel_size": 1})
		if rec.DataParallelStartRank == nil || *rec.DataParallelStartRank != 1 || rec.Lifecycle != "schedulable" {
			t.Fatalf("after the dp move: %+v", rec)
		}
		if got := s.selectOK(t, obj{"model_name": model, "token_ids": tokens(1, 4)}); got.DPRank != 1 {
			t.Fatalf("select after moving the rank range to [1,2): dp_rank %d", got.DPRank)
		}
		patch(t, obj{"data_parallel_start_rank": 0, "data_parallel_size": 1})
	})
}

func anyContains(list []string, fragment string) bool {
	for _, s := range list {
		if strings.Contains(s, fragment) {
			return true
		}
	}
	return false
}

func hasWorker(recs []workerRecord, id uint64, lifecycle string) bool {
	for _, r := range recs {
		if r.WorkerID == id && r.Lifecycle == lifecycle {
			return true
		}
	}
	return false
}
