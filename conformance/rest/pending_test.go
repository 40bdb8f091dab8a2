package rest

import (
	"fmt"
	"net/http"
	"testing"
	"time"
)

// Single-use, one of the rules of the replay form in Dynamo's docs ("Cached selection replay
// form"; Pure replay, Retryable on failure and Bounded window below are others): the first
// replay consumes the cached selection; a second is 404 (Dynamo's HTTP test
// cached_reservation_books_from_select).
func TestReplayIsSingleUse(t *testing.T) {
	s := conformance(t)
	model := s.model(t)
	s.addSimpleWorker(t, model)
	s.addSimpleWorker(t, model)
	sid := s.selectionID("once")
	sel := s.selectOK(t, obj{"model_name": model, "token_ids": tokens(1, 4), "selection_id": sid})
	res := s.book(t, replay(sid, model))
	if res.WorkerID != sel.WorkerID || res.DPRank != sel.DPRank {
		t.Fatalf("replay booked worker %d rank %d, select chose %d rank %d", res.WorkerID, res.DPRank, sel.WorkerID, sel.DPRank)
	}
	s.wantLoad(t, "after the replay", model, sel.WorkerID, 0, load{prefill: 4, decode: 1, active: 1})
	s.post(t, "/reservations/"+sid+"/prefill_complete", obj{}).wantOK(t)

	s.post(t, "/reservations", replay(sid, model)).
		wantError(t, http.StatusNotFound, "no pending selection "+sid)
	s.del(t, "/reservations/"+sid).wantOK(t)
	// Freeing the booking does not bring the consumed selection back.
	s.post(t, "/reservations", replay(sid, model)).wantError(t, http.StatusNotFound, "no pending selection")
}

// Any miss is 404 (never selected, other model, other routing group), and a miss does not
// consume the entry (Dynamo's HTTP test cached_reservation_needs_matching_model).
func TestReplayMissReturns404(t *testing.T) {
	s := conformance(t)
	model := s.model(t)
	id := s.addSimpleWorker(t, model)
	other := s.model(t, "other")
	s.addSimpleWorker(t, other)

	s.post(t, "/reservations", replay(s.selectionID("never"), model)).wantError(t, http.StatusNotFound, "no pending selection")
	sid := s.selectionID("miss")
	s.selectOK(t, obj{"model_name": model, "token_ids": tokens(1, 4), "selection_id": sid})
	s.post(t, "/reservations", replay(sid, other)).wantError(t, http.StatusNotFound, "no pending selection")
	s.post(t, "/reservations", obj{"selection_id": sid, "model_name": model, "routing_group": "elsewhere"}).
		wantError(t, http.StatusNotFound, "no pending selection")
	// No partition key: model_name and routing_group default to "default".
	s.post(t, "/reservations", obj{"selection_id": sid}).wantError(t, http.StatusNotFound, "no pending selection")
	if res := s.book(t, replay(sid, model)); res.WorkerID != id {
		t.Fatalf("replay after the misses booked %d, want %d", res.WorkerID, id)
	}
}

// Pure replay: the replay books exactly what select captured; prompt and accounting fields
// in the reservation are ignored (Dynamo's HTTP test
// cached_reservation_ignores_request_overrides).
func TestReplayIgnoresRequestOverrides(t *testing.T) {
	s := conformance(t)
	model := s.model(t)
	id := s.addSimpleWorker(t, model)
	sid := s.selectionID("pure")
	s.selectOK(t, obj{"model_name": model, "token_ids": tokens(1, 4), "selection_id": sid})
	body := replay(sid, model)
	body["effective_prefill_tokens"] = 3
	body["track_prefill_tokens"] = false
	body["token_ids"] = tokens(1, 16)
	body["isl_tokens"] = 99
	body["dp_rank"] = 7
	if res := s.book(t, body); res.WorkerID != id || res.DPRank != 0 {
		t.Fatalf("replay with overrides booked %+v", res)
	}
	s.wantLoad(t, "after a replay with overrides", model, id, 0, load{prefill: 4, decode: 1, active: 1})
}

// A second /select with the same id replaces the cached selection (latest wins).
func TestSelectLatestWins(t *testing.T) {
	s := conformance(t)
	model := s.model(t)
	w1, w2 := s.addSimpleWorker(t, model), s.addSimpleWorker(t, model)
	sid := s.selectionID("latest")
	if got := s.selectOK(t, obj{"model_name": model, "token_ids": tokens(1, 4), "selection_id": sid,
		"allowed_worker_ids": []uint64{w1}}); got.WorkerID != w1 {
		t.Fatalf("first select chose %d, want %d", got.WorkerID, w1)
	}
	if got := s.selectOK(t, obj{"model_name": model, "token_ids": tokens(1, 8), "selection_id": sid,
		"allowed_worker_ids": []uint64{w2}}); got.WorkerID != w2 {
		t.Fatalf("second select chose %d, want %d", got.WorkerID, w2)
	}
	if res := s.book(t, replay(sid, model)); res.WorkerID != w2 {
		t.Fatalf("replay booked worker %d, want the latest selection's %d", res.WorkerID, w2)
	}
	s.wantLoad(t, "latest selection's worker", model, w2, 0, load{prefill: 8, decode: 2, active: 1})
	s.wantLoad(t, "first selection's worker", model, w1, 0, load{})
	s.post(t, "/reservations", replay(sid, model)).wantError(t, http.StatusNotFound, "no pending selection")
}

// Retryable on failure: a replay that fails because the worker left (503: its partition is
// not ready) keeps the entry, and succeeds once the worker is back (Dynamo's HTTP test
// failed_cached_booking_is_retryable).
func TestReplayRetryableAfterWorkerFailure(t *testing.T) {
	s := conformance(t)
	model := s.model(t)
	id := s.workerID()
	body := workerBody(id, model)
	s.addWorker(t, body)
	sid := s.selectionID("retry")
	s.selectOK(t, obj{"model_name": model, "token_ids": tokens(1, 4), "selection_id": sid})

	s.del(t, fmt.Sprintf("/workers/%d", id)).want(t, http.StatusOK)
	s.post(t, "/reservations", replay(sid, model)).wantError(t, http.StatusServiceUnavailable, "no schedulable workers")
	s.post(t, "/reservations", replay(sid, model)).wantError(t, http.StatusServiceUnavailable, "no schedulable workers")

	s.addWorker(t, body)
	if res := s.book(t, replay(sid, model)); res.WorkerID != id {
		t.Fatalf("retried replay booked %d, want %d", res.WorkerID, id)
	}
	s.wantLoad(t, "after the retried replay", model, id, 0, load{prefill: 4, decode: 1, active: 1})
}

// A replay that collides with a live booking of the same id is 409 and keeps the entry for a
// retry after the booking is freed (Dynamo's HTTP test
// cached_booking_retryable_after_scheduler_conflict).
func TestReplayRetryableAfterConflict(t *testing.T) {
	s := conformance(t)
	model := s.model(t)
	id := s.addSimpleWorker(t, model)
	sid := s.selectionID("conflict")
	s.selectOK(t, obj{"model_name": model, "token_ids": tokens(1, 8), "selection_id": sid})
	s.reserveOK(t, obj{"model_name": model, "token_ids": tokens(101, 4), "selection_id": sid})
	s.post(t, "/reservations", replay(sid, model)).wantError(t, http.StatusConflict, "already reserved")
	s.del(t, "/reservations/"+sid).wantOK(t)
	s.book(t, replay(sid, model))
	// The cached 8-token selection was booked, not the 4-token select_and_reserve.
	s.wantLoad(t, "after the retried replay", model, id, 0, load{prefill: 8, decode: 2, active: 1})
}

// A replay whose cached rank left the worker's range (PATCH of data_parallel_start_rank) is
// 404 with the entry kept; moving the range back makes it bookable again (Dynamo's HTTP test
// cached_reservation_rejects_stale_dp_rank).
func TestReplayRejectsStaleDPRank(t *testing.T) {
	s := conformance(t)
	model := s.model(t)
	id := s.addSimpleWorker(t, model)
	sid := s.selectionID("rank")
	if got := s.selectOK(t, obj{"model_name": model, "token_ids": tokens(1, 4), "selection_id": sid}); got.DPRank != 0 {
		t.Fatalf("select chose rank %d, want 0", got.DPRank)
	}
	path := fmt.Sprintf("/workers/%d", id)
	s.patch(t, path, obj{"data_parallel_start_rank": 1, "data_parallel_size": 1}).want(t, http.StatusOK)
	s.post(t, "/reservations", replay(sid, model)).
		wantError(t, http.StatusNotFound, fmt.Sprintf("schedulable worker %d (dp_rank 0) not found", id))
	s.patch(t, path, obj{"data_parallel_start_rank": 0, "data_parallel_size": 1}).want(t, http.StatusOK)
	if res := s.book(t, replay(sid, model)); res.WorkerID != id || res.DPRank != 0 {
		t.Fatalf("replay after moving the range back booked %+v", res)
	}
	s.wantLoad(t, "after the replay", model, id, 0, load{prefill: 4, decode: 1, active: 1})
}

// An explicit booking discards the cached selection of its id, so a later replay cannot book
// stale state (Dynamo's HTTP test explicit_reservation_discards_cached_selection).
func TestExplicitReservationDiscardsCachedSelection(t *testing.T) {
	s := conformance(t)
	model := s.model(t)
	id := s.addSimpleWorker(t, model)
	sid := s.selectionID("discard")
	s.selectOK(t, obj{"model_name": model, "token_ids": tokens(1, 8), "selection_id": sid})
	s.book(t, obj{"model_name": model, "selection_id": sid, "worker_id": id, "sequence_hashes": []int{1}, "isl_tokens": 4,
		"effective_prefill_tokens": 4})
	s.post(t, "/reservations", replay(sid, model)).wantError(t, http.StatusNotFound, "no pending selection")
	s.del(t, "/reservations/"+sid).wantOK(t)
	s.post(t, "/reservations", replay(sid, model)).wantError(t, http.StatusNotFound, "no pending selection")

	t.Run("even when the explicit booking fails", func(t *testing.T) {
		sid := s.selectionID("discard")
		s.selectOK(t, obj{"model_name": model, "token_ids": tokens(1, 8), "selection_id": sid})
		s.post(t, "/reservations", obj{"model_name": model, "selection_id": sid, "worker_id": s.workerID(),
			"sequence_hashes": []int{1}, "isl_tokens": 4}).want(t, http.StatusNotFound)
		s.post(t, "/reservations", replay(sid, model)).wantError(t, http.StatusNotFound, "no pending selection")
	})
}

// Bounded window: a cached selection expires --selection-cache-ttl-secs after its (latest)
// /select.
func TestPendingSelectionExpiresAfterTTL(t *testing.T) {
	s := conformance(t)
	ttl, fromEnv := cacheTTL(t)
	if ttl > 10*time.Second {
		t.Skipf("precondition: selection cache TTL %v (%s) is too long for this test; start the server with "+
			"--selection-cache-ttl-secs 2 and set %s=2", ttl, envCacheTTL, envCacheTTL)
	}
	hint := ""
	if !fromEnv {
		hint = fmt.Sprintf(" (assumed --selection-cache-ttl-secs %v; set %s if the server uses another)", ttl.Seconds(), envCacheTTL)
	}
	model := s.model(t)
	s.addSimpleWorker(t, model)
	sel := func(sid string) {
		s.selectOK(t, obj{"model_name": model, "token_ids": tokens(1, 4), "selection_id": sid})
	}
	expired, refreshed, fresh := s.selectionID("ttl"), s.selectionID("ttl"), s.selectionID("ttl")

	start := time.Now()
	sel(expired)
	sel(refreshed)
	time.Sleep(ttl * 6 / 10)
	sel(refreshed) // latest wins with a new insertion time
	sel(fresh)
	time.Sleep(ttl*6/10 + 100*time.Millisecond)
	if time.Since(start) < ttl {
		t.Fatalf("internal: slept less than the TTL")
	}
	if r := s.post(t, "/reservations", replay(expired, model)); r.status != http.StatusNotFound {
		t.Fatalf("a selection cached %v ago must have expired%s: %v", time.Since(start).Round(time.Millisecond), hint, r)
	} else {
		r.wantError(t, http.StatusNotFound, "no pending selection")
	}
	for _, sid := range []string{refreshed, fresh} {
		if r := s.post(t, "/reservations", replay(sid, model)); r.status != http.StatusCreated {
			t.Fatalf("a selection cached about %v ago must still be replayable%s: %v", ttl*6/10, hint, r)
		}
		s.cleanupReservation(t, sid)
	}
}
