package rest

import (
	"fmt"
	"net/http"
	"testing"
)

// The Ray select-then-reserve flow of Dynamo's docs: select → replay → prefill_complete →
// output_block → DELETE, with the worker's active load checked after every step.
func TestRayFlowSelectReserveLifecycle(t *testing.T) {
	s := conformance(t)
	model := s.model(t)
	// Two candidates: the replay must book the selected one.
	s.addSimpleWorker(t, model)
	s.addSimpleWorker(t, model)
	sid := s.selectionID("ray")

	sel := s.selectOK(t, obj{"model_name": model, "token_ids": tokens(1, 8), "selection_id": sid})
	w := sel.WorkerID
	s.wantLoad(t, "after /select", model, w, 0, load{})

	r := s.post(t, "/reservations", replay(sid, model)).want(t, http.StatusCreated)
	s.cleanupReservation(t, sid)
	var res reservationResponse
	r.decode(t, &res)
	want := reservationResponse{SelectionID: sid, ModelName: model, RoutingGroup: "default", WorkerID: sel.WorkerID,
		DPRank: sel.DPRank, Endpoint: sel.Endpoint}
	if res != want {
		t.Fatalf("replay answered %+v, want %+v", res, want)
	}
	wantKeys(t, "ReservationResponse", r.fields(t), "selection_id", "model_name", "routing_group", "worker_id", "dp_rank", "endpoint")
	s.wantLoad(t, "after POST /reservations", model, w, 0, load{prefill: 8, decode: 2, active: 1})

	path := "/reservations/" + sid
	s.post(t, path+"/prefill_complete", noBody).wantOK(t)
	s.wantLoad(t, "after prefill_complete", model, w, 0, load{prefill: 0, decode: 2, active: 1})
	s.post(t, path+"/prefill_complete", obj{}).wantOK(t) // repeatable on a live booking
	s.wantLoad(t, "after a repeated prefill_complete", model, w, 0, load{prefill: 0, decode: 2, active: 1})

	s.post(t, path+"/output_block", obj{}).wantOK(t)
	s.wantLoad(t, "after output_block", model, w, 0, load{prefill: 0, decode: 3, active: 1})
	for _, bad := range []float64{1.5, -0.1} {
		s.post(t, path+"/output_block", obj{"decay_fraction": bad}).
			wantError(t, http.StatusBadRequest, "decay_fraction must be between 0.0 and 1.0")
	}
	s.wantLoad(t, "after rejected output_blocks", model, w, 0, load{prefill: 0, decode: 3, active: 1})
	for _, ok := range []float64{0, 1} {
		s.post(t, path+"/output_block", obj{"decay_fraction": ok}).wantOK(t)
	}

	s.del(t, path).wantOK(t)
	s.wantLoad(t, "after DELETE", model, w, 0, load{})

	notFound := fmt.Sprintf("reservation %s not found", sid)
	s.del(t, path).wantError(t, http.StatusNotFound, notFound)
	s.post(t, path+"/prefill_complete", obj{}).wantError(t, http.StatusNotFound, notFound)
	s.post(t, path+"/output_block", obj{}).wantError(t, http.StatusNotFound, notFound)
	s.post(t, "/reservations", replay(sid, model)).wantError(t, http.StatusNotFound, "no pending selection")
	s.wantLoad(t, "at the end", model, w, 0, load{})
}

// Lifecycle calls on an id that was never booked are 404; decay_fraction is checked before
// the lookup (400 outside [0, 1] even for an unknown id).
func TestLifecycleOfUnknownReservationIs404(t *testing.T) {
	s := conformance(t)
	sid := s.selectionID("unknown")
	path := "/reservations/" + sid
	notFound := fmt.Sprintf("reservation %s not found", sid)
	s.post(t, path+"/prefill_complete", obj{}).wantError(t, http.StatusNotFound, notFound)
	s.post(t, path+"/output_block", obj{}).wantError(t, http.StatusNotFound, notFound)
	s.del(t, path).wantError(t, http.StatusNotFound, notFound)
	s.post(t, path+"/output_block", obj{"decay_fraction": 2}).
		wantError(t, http.StatusBadRequest, "decay_fraction must be between 0.0 and 1.0")
}

// The explicit form: the self-contained booking, its validation and its prefill-tracking
// switch (Dynamo's HTTP tests explicit_reservation_books_after_select,
// explicit_reservation_rejects_effective_prefill_above_isl and
// explicit_reservation_rejects_unschedulable_worker).
func TestExplicitReservation(t *testing.T) {
	s := conformance(t)
	s.anchor(t)
	model := s.model(t)
	id := s.addSimpleWorker(t, model)
	incomplete := s.workerID()
	b := workerBody(incomplete, model)
	delete(b, "endpoint")
	s.putWorker(t, b)

	explicit := func(sid string) obj {
		return obj{"model_name": model, "selection_id": sid, "worker_id": id, "dp_rank": 0,
			"sequence_hashes": []int64{1}, "isl_tokens": 4, "effective_prefill_tokens": 4}
	}

	t.Run("books after a select without id", func(t *testing.T) {
		sel := s.selectOK(t, obj{"model_name": model, "token_ids": tokens(1, 4)})
		if sel.WorkerID != id {
			t.Fatalf("select chose %d, want %d", sel.WorkerID, id)
		}
		sid := s.selectionID("exp")
		res := s.book(t, explicit(sid))
		want := reservationResponse{SelectionID: sid, ModelName: model, RoutingGroup: "default", WorkerID: id,
			Endpoint: fmt.Sprintf("http://conf-worker-%d:8000", id)}
		if res != want {
			t.Fatalf("explicit reservation answered %+v, want %+v", res, want)
		}
		s.wantLoad(t, "after the explicit booking", model, id, 0, load{prefill: 4, decode: 1, active: 1})
		s.post(t, "/reservations/"+sid+"/prefill_complete", obj{}).wantOK(t)
		s.wantLoad(t, "after prefill_complete", model, id, 0, load{prefill: 0, decode: 1, active: 1})
		s.del(t, "/reservations/"+sid).wantOK(t)
		s.wantLoad(t, "after DELETE", model, id, 0, load{})
	})
	t.Run("live id conflicts", func(t *testing.T) {
		sid := s.selectionID("exp")
		s.book(t, explicit(sid))
		s.post(t, "/reservations", explicit(sid)).wantError(t, http.StatusConflict, "already reserved")
		s.wantLoad(t, "after the 409", model, id, 0, load{prefill: 4, decode: 1, active: 1})
		s.del(t, "/reservations/"+sid).wantOK(t)
	})
	t.Run("effective_prefill_tokens above isl", func(t *testing.T) {
		body := explicit(s.selectionID("exp"))
		body["effective_prefill_tokens"] = 5
		s.post(t, "/reservations", body).wantError(t, http.StatusBadRequest, "must not exceed isl_tokens")
	})
	t.Run("track_prefill_tokens false", func(t *testing.T) {
		body := explicit(s.selectionID("exp"))
		body["track_prefill_tokens"] = false
		s.book(t, body)
		s.wantLoad(t, "after an untracked booking", model, id, 0, load{prefill: 0, decode: 1, active: 1})
		s.del(t, "/reservations/"+body["selection_id"].(string)).wantOK(t)
	})
	t.Run("missing prompt inputs", func(t *testing.T) {
		body := explicit(s.selectionID("exp"))
		delete(body, "sequence_hashes")
		s.post(t, "/reservations", body).wantError(t, http.StatusBadRequest, "sequence_hashes is required without token_ids")
		body = explicit(s.selectionID("exp"))
		delete(body, "isl_tokens")
		delete(body, "effective_prefill_tokens")
		s.post(t, "/reservations", body).wantError(t, http.StatusBadRequest, "isl_tokens is required without token_ids")
	})
	for _, c := range []struct {
		name   string
		worker uint64
		rank   int
		text   string
	}{
		{"incomplete worker", incomplete, 0, fmt.Sprintf("schedulable worker %d not found", incomplete)},
		{"unknown worker", s.workerID(), 0, "not found"},
		{"rank outside the worker's range", id, 5, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			body := explicit(s.selectionID("exp"))
			body["worker_id"], body["dp_rank"] = c.worker, c.rank
			s.post(t, "/reservations", body).wantError(t, http.StatusNotFound, c.text)
		})
	}
	t.Run("not-ready partition", func(t *testing.T) {
		other := s.model(t, "empty")
		body := explicit(s.selectionID("exp"))
		body["model_name"] = other
		wantPartitionNotReady(t, s.post(t, "/reservations", body), other)
	})
	s.wantLoad(t, "after every rejected booking", model, id, 0, load{})
}

// Reservation ids are process-wide (Dynamo's docs, "Consistency Invariants"): a live id
// conflicts in every partition and through every booking route, and lifecycle calls resolve
// it without a partition.
func TestReservationIDsAreServiceWide(t *testing.T) {
	s := conformance(t)
	modelA, modelB := s.model(t, "a"), s.model(t, "b")
	wa, wb := s.addSimpleWorker(t, modelA), s.addSimpleWorker(t, modelB)
	sid := s.selectionID("global")
	s.reserveOK(t, obj{"model_name": modelA, "token_ids": tokens(1, 4), "selection_id": sid})

	s.post(t, "/select_and_reserve", obj{"model_name": modelB, "token_ids": tokens(1, 4), "selection_id": sid}).
		wantError(t, http.StatusConflict, "already reserved")
	s.post(t, "/reservations", obj{"model_name": modelB, "selection_id": sid, "worker_id": wb, "sequence_hashes": []int{1},
		"isl_tokens": 4}).wantError(t, http.StatusConflict, "already reserved")
	// B had no cached selection for the id yet; cache one there and replay it.
	s.selectOK(t, obj{"model_name": modelB, "token_ids": tokens(1, 8), "selection_id": sid})
	s.post(t, "/reservations", replay(sid, modelB)).wantError(t, http.StatusConflict, "already reserved")
	s.wantLoad(t, "partition B after the conflicts", modelB, wb, 0, load{})

	s.post(t, "/reservations/"+sid+"/prefill_complete", obj{}).wantOK(t)
	s.wantLoad(t, "partition A after prefill_complete", modelA, wa, 0, load{prefill: 0, decode: 1, active: 1})
	s.del(t, "/reservations/"+sid).wantOK(t)
	s.wantLoad(t, "partition A after DELETE", modelA, wa, 0, load{})

	// A conflict leaves the cached selection in place, as any failed replay does.
	s.book(t, replay(sid, modelB))
	s.wantLoad(t, "partition B after the retried replay", modelB, wb, 0, load{prefill: 8, decode: 2, active: 1})
	s.wantLoad(t, "partition A untouched", modelA, wa, 0, load{})
}
