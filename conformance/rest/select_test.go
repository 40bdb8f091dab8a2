package rest

import (
	"fmt"
	"net/http"
	"regexp"
	"testing"
	"time"
)

// /select echoes the id, reports the chosen worker and books nothing; the booking-only fields
// (sequence_hashes, isl_tokens, track_prefill_tokens, kv_hint) and the removed legacy ones
// (cached_tokens, effective_overlap_blocks, reservation_id, tenant_id) are absent; unknown
// fields are ignored (Dynamo's HTTP test select_echoes_selection_id_and_does_not_book_load).
func TestSelectEchoesSelectionIDAndDoesNotBookLoad(t *testing.T) {
	s := conformance(t)
	model := s.model(t)
	id := s.addSimpleWorker(t, model)
	sid := s.selectionID("sel")
	r := s.post(t, "/select", obj{"model_name": model, "token_ids": tokens(1, 4), "selection_id": sid,
		"tenant_id": "legacy", "reservation_id": "legacy", "unknown": true}).want(t, http.StatusOK)
	var got selectResponse
	r.decode(t, &got)
	if got.SelectionID == nil || *got.SelectionID != sid || got.ModelName != model || got.RoutingGroup != "default" ||
		got.WorkerID != id || got.DPRank != 0 || got.Endpoint != fmt.Sprintf("http://conf-worker-%d:8000", id) ||
		got.BlockSize != 4 || got.EffectivePrefillTokens != 4 || got.PotentialDecodeBlocks != 1 {
		t.Fatalf("select response %s", r.body)
	}
	if got.Overlap.LongestMatched != 0 || got.Overlap.GPU != 0 || got.Overlap.CPU != 0 || got.Overlap.Disk != 0 ||
		!equal(got.Overlap.DP, map[string]uint64{"0": 0}) {
		t.Fatalf("fresh partition: overlap %+v, want zeros with dp {\"0\":0}", got.Overlap)
	}
	f := r.fields(t)
	wantKeys(t, "SelectResponse", f, "selection_id", "model_name", "routing_group", "worker_id", "dp_rank", "endpoint",
		"block_size", "overlap", "effective_prefill_tokens", "potential_decode_blocks")
	wantNoKeys(t, "SelectResponse of /select", f, "sequence_hashes", "isl_tokens", "track_prefill_tokens", "kv_hint",
		"worker_load", "cached_tokens", "effective_overlap_blocks", "reservation_id", "tenant_id")
	// Default config has no conditional-disagg busy threshold and the worker no capacity.
	wantNoKeys(t, "SelectResponse without busy threshold", f, "decode_busy")
	s.wantLoad(t, "after /select", model, id, 0, load{})

	t.Run("without selection_id", func(t *testing.T) {
		r := s.post(t, "/select", obj{"model_name": model, "token_ids": tokens(1, 4)}).want(t, http.StatusOK)
		wantNoKeys(t, "SelectResponse without selection_id", r.fields(t), "selection_id")
	})
}

// overlap.dp lists every rank of the chosen worker, zeros included, and dp_rank is one of
// them.
func TestSelectReportsEveryRankOfChosenWorker(t *testing.T) {
	s := conformance(t)
	model := s.model(t)
	id := s.workerID()
	b := workerBody(id, model)
	b["data_parallel_start_rank"] = 2
	b["data_parallel_size"] = 2
	s.addWorker(t, b)
	got := s.selectOK(t, obj{"model_name": model, "token_ids": tokens(1, 4)})
	if got.WorkerID != id || (got.DPRank != 2 && got.DPRank != 3) {
		t.Fatalf("select on ranks [2,4): worker %d rank %d", got.WorkerID, got.DPRank)
	}
	if !equal(got.Overlap.DP, map[string]uint64{"2": 0, "3": 0}) {
		t.Fatalf("overlap.dp = %v, want {\"2\":0,\"3\":0}", got.Overlap.DP)
	}
}

// allowed_worker_ids restricts the candidates, pinned_worker forces one.
func TestSelectHonoursAllowedAndPinnedWorkers(t *testing.T) {
	s := conformance(t)
	model := s.model(t)
	w1, w2 := s.addSimpleWorker(t, model), s.addSimpleWorker(t, model)
	for range 4 {
		if got := s.selectOK(t, obj{"model_name": model, "token_ids": tokens(1, 4), "allowed_worker_ids": []uint64{w2}}); got.WorkerID != w2 {
			t.Fatalf("allowed_worker_ids [%d]: chose %d", w2, got.WorkerID)
		}
		if got := s.selectOK(t, obj{"model_name": model, "token_ids": tokens(1, 4),
			"pinned_worker": obj{"worker_id": w1, "dp_rank": 0}}); got.WorkerID != w1 {
			t.Fatalf("pinned_worker %d: chose %d", w1, got.WorkerID)
		}
	}
}

// /select_and_reserve books before answering, echoes the booking inputs, and a second
// booking of a live id is 409 (Dynamo's HTTP test
// select_and_reserve_books_and_duplicate_reservation_conflicts).
func TestSelectAndReserveBooksAndDuplicateConflicts(t *testing.T) {
	s := conformance(t)
	model := s.model(t)
	id := s.addSimpleWorker(t, model)
	sid := s.selectionID("res")
	body := obj{"model_name": model, "token_ids": tokens(1, 4), "selection_id": sid}
	r := s.post(t, "/select_and_reserve", body).want(t, http.StatusOK)
	s.cleanupReservation(t, sid)
	var got selectResponse
	r.decode(t, &got)
	if got.SelectionID == nil || *got.SelectionID != sid || got.WorkerID != id || got.EffectivePrefillTokens != 4 ||
		got.ISLTokens == nil || *got.ISLTokens != 4 || got.TrackPrefillTokens == nil || !*got.TrackPrefillTokens ||
		len(got.SequenceHashes) != 1 {
		t.Fatalf("select_and_reserve response %s", r.body)
	}
	f := r.fields(t)
	wantKeys(t, "booking SelectResponse", f, "selection_id", "sequence_hashes", "isl_tokens", "track_prefill_tokens")
	wantNoKeys(t, "booking SelectResponse", f, "worker_load", "cached_tokens", "effective_overlap_blocks", "tenant_id", "reservation_id")
	s.wantLoad(t, "after select_and_reserve", model, id, 0, load{prefill: 4, decode: 1, active: 1})

	s.post(t, "/select_and_reserve", body).wantError(t, http.StatusConflict, "already reserved")
	s.wantLoad(t, "after the 409", model, id, 0, load{prefill: 4, decode: 1, active: 1})
	s.del(t, "/reservations/"+sid).wantOK(t)
	s.wantLoad(t, "after DELETE", model, id, 0, load{})

	t.Run("tracking hashes are deterministic", func(t *testing.T) {
		again := s.reserveOK(t, obj{"model_name": model, "token_ids": tokens(1, 4), "selection_id": s.selectionID("res")})
		if !equal(again.SequenceHashes, got.SequenceHashes) {
			t.Fatalf("same prompt, different sequence_hashes: %v vs %v", again.SequenceHashes, got.SequenceHashes)
		}
		two := s.reserveOK(t, obj{"model_name": model, "token_ids": tokens(1, 9), "selection_id": s.selectionID("res")})
		// 9 tokens at block size 4: two complete blocks, the partial one dropped (Dynamo never
		// hashes a partial block), chained from the same first block.
		if len(two.SequenceHashes) != 2 || two.SequenceHashes[0] != got.SequenceHashes[0] || *two.ISLTokens != 9 {
			t.Fatalf("9-token prompt: sequence_hashes %v isl %v; want 2 hashes starting with %d", two.SequenceHashes, two.ISLTokens, got.SequenceHashes[0])
		}
	})
}

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// Without a selection_id the service books under a generated UUIDv4, which the lifecycle
// routes accept.
func TestSelectAndReserveGeneratesSelectionID(t *testing.T) {
	s := conformance(t)
	model := s.model(t)
	id := s.addSimpleWorker(t, model)
	got := s.reserveOK(t, obj{"model_name": model, "token_ids": tokens(1, 4)})
	if !uuidV4.MatchString(*got.SelectionID) {
		t.Fatalf("generated selection_id %q is not a UUIDv4", *got.SelectionID)
	}
	s.wantLoad(t, "after booking", model, id, 0, load{prefill: 4, decode: 1, active: 1})
	s.post(t, "/reservations/"+*got.SelectionID+"/prefill_complete", nil).wantOK(t)
	s.del(t, "/reservations/"+*got.SelectionID).wantOK(t)
	s.wantLoad(t, "after DELETE", model, id, 0, load{})
}

// Precomputed hashes are trusted as sent (no re-hashing) and echoed as i64, negative
// included.
func TestSelectAndReserveEchoesTrustedHashes(t *testing.T) {
	s := conformance(t)
	model := s.model(t)
	id := s.addSimpleWorker(t, model)
	got := s.reserveOK(t, obj{"model_name": model, "block_hashes": []int64{11, -12}, "sequence_hashes": []int64{-1, 7},
		"isl_tokens": 8, "selection_id": s.selectionID("hash")})
	if !equal(got.SequenceHashes, []int64{-1, 7}) || *got.ISLTokens != 8 || got.WorkerID != id {
		t.Fatalf("hash path: sequence_hashes %v isl %v worker %d", got.SequenceHashes, *got.ISLTokens, got.WorkerID)
	}
	s.wantLoad(t, "after hash-path booking", model, id, 0, load{prefill: 8, decode: 2, active: 1})
}

// Without token ids the hash path needs all three inputs (block_hashes, sequence_hashes,
// isl_tokens), equal lengths and isl_tokens > 0, on every route that normalizes a prompt
// (Dynamo's HTTP test hash_path_validation_returns_bad_request).
func TestHashPathValidationReturns400(t *testing.T) {
	s := conformance(t)
	model := s.model(t)
	id := s.addSimpleWorker(t, model)
	for _, c := range []struct {
		name string
		body obj
		text string
	}{
		{"length mismatch", obj{"block_hashes": []int{1}, "sequence_hashes": []int{1, 2}, "isl_tokens": 4}, "must match sequence_hashes length"},
		{"no block_hashes", obj{"sequence_hashes": []int{1}, "isl_tokens": 4}, "block_hashes is required without token_ids"},
		{"no sequence_hashes", obj{"block_hashes": []int{1}, "isl_tokens": 4}, "sequence_hashes is required without token_ids"},
		{"no isl_tokens", obj{"block_hashes": []int{1}, "sequence_hashes": []int{1}}, "isl_tokens is required without token_ids"},
		{"zero isl_tokens", obj{"block_hashes": []int{1}, "sequence_hashes": []int{1}, "isl_tokens": 0}, "isl_tokens must be greater than 0"},
	} {
		for _, path := range []string{"/select", "/select_and_reserve", "/potential_loads", "/overlap_scores"} {
			t.Run(c.name+path, func(t *testing.T) {
				c.body["model_name"] = model
				s.post(t, path, c.body).wantError(t, http.StatusBadRequest, c.text)
			})
		}
	}
	s.wantLoad(t, "after rejected bookings", model, id, 0, load{})
}

// An advisory select (Dynamo's docs, "Advisory selection") reports the chosen worker's load
// in worker_load, books nothing, and still caches its selection for replay.
func TestAdvisorySelectReportsWorkerLoad(t *testing.T) {
	s := conformance(t)
	model := s.model(t)
	id := s.workerID()
	b := workerBody(id, model)
	b["max_num_batched_tokens"] = 1024
	b["total_kv_blocks"] = 1000
	s.addWorker(t, b)

	sid := s.selectionID("adv")
	r := s.post(t, "/select", obj{"model_name": model, "token_ids": tokens(1, 4), "advisory": true, "selection_id": sid}).want(t, http.StatusOK)
	var got selectResponse
	r.decode(t, &got)
	wl := got.WorkerLoad
	if got.WorkerID != id || wl == nil || wl.ActivePrefillTokens != 0 || wl.PrefillTokenCapacity == nil || *wl.PrefillTokenCapacity != 1024 ||
		wl.TotalKVBlocks == nil || *wl.TotalKVBlocks != 1000 {
		t.Fatalf("advisory select on an idle worker: %s", r.body)
	}
	var wlFields map[string]any
	r.decode(t, &struct {
		WorkerLoad *map[string]any `json:"worker_load"`
	}{&wlFields})
	if _, ok := wlFields["prefill_busy"]; ok {
		t.Errorf("prefill_busy present without DYN_ROUTER_CONDITIONAL_DISAGG_PREFILL_BUSY_THRESHOLD: %s", r.body)
	}
	wantNoKeys(t, "advisory SelectResponse", r.fields(t), "decode_busy", "sequence_hashes", "isl_tokens", "track_prefill_tokens")
	s.wantLoad(t, "after advisory select", model, id, 0, load{})

	// The advisory selection is cached like any other select that carries a selection_id.
	s.book(t, replay(sid, model))
	s.wantLoad(t, "after replaying the advisory selection", model, id, 0, load{prefill: 4, decode: 1, active: 1})
	var again selectResponse
	s.post(t, "/select", obj{"model_name": model, "token_ids": tokens(101, 8), "advisory": true}).want(t, http.StatusOK).decode(t, &again)
	if again.WorkerLoad == nil || again.WorkerLoad.ActivePrefillTokens != 4 {
		t.Fatalf("advisory select next to a 4-token booking: worker_load %+v", again.WorkerLoad)
	}

	t.Run("ignored by select_and_reserve", func(t *testing.T) {
		// A prompt of its own: the replayed one is now in the approximate index and its
		// blocks already active, which would change the expected load.
		r := s.post(t, "/select_and_reserve", obj{"model_name": model, "token_ids": tokens(301, 4), "advisory": true,
			"selection_id": s.selectionID("adv")}).want(t, http.StatusOK)
		var got selectResponse
		r.decode(t, &got)
		s.cleanupReservation(t, *got.SelectionID)
		wantNoKeys(t, "select_and_reserve with advisory", r.fields(t), "worker_load")
		s.wantLoad(t, "after select_and_reserve with advisory", model, id, 0, load{prefill: 8, decode: 2, active: 2})
	})
}

// With the approximate index (Dynamo's docs, "KV Indexing Modes"), bookings
// (select_and_reserve, cached replay, explicit reservation with tokens) are recorded,
// query-only selects are not.
func TestBookingsFeedTheApproximateIndex(t *testing.T) {
	s := conformance(t)
	model := s.model(t)
	id := s.addSimpleWorker(t, model)
	prompt := func(first int) obj { return obj{"model_name": model, "token_ids": tokens(first, 8)} }
	wantCached := func(t *testing.T, first int, want uint64) {
		t.Helper()
		eventually(t, 3*time.Second, func() error {
			got := s.selectOK(t, prompt(first))
			if got.Overlap.LongestMatched != want || got.Overlap.GPU != want || got.Overlap.DP["0"] != want ||
				got.EffectivePrefillTokens != 8-want {
				return fmt.Errorf("prompt %d..: overlap %+v effective_prefill_tokens %d, want %d tokens matched",
					first, got.Overlap, got.EffectivePrefillTokens, want)
			}
			return nil
		})
	}

	t.Run("query-only select records nothing", func(t *testing.T) {
		s.selectOK(t, prompt(1))
		time.Sleep(200 * time.Millisecond)
		if got := s.selectOK(t, prompt(1)); got.Overlap.LongestMatched != 0 {
			t.Fatalf("after a query-only select the prompt matches %d tokens", got.Overlap.LongestMatched)
		}
	})
	t.Run("select_and_reserve", func(t *testing.T) {
		s.reserveOK(t, obj{"model_name": model, "token_ids": tokens(1, 8), "selection_id": s.selectionID("idx")})
		wantCached(t, 1, 8)
		var scores overlapScores
		s.post(t, "/overlap_scores", prompt(1)).want(t, http.StatusOK).decode(t, &scores)
		if scores.NumBlocks != 2 || len(scores.Workers) != 1 || scores.Workers[0].WorkerID != id || scores.Workers[0].DeviceBlocks != 2 {
			t.Fatalf("overlap_scores after booking: %+v", scores)
		}
	})
	t.Run("cached replay", func(t *testing.T) {
		sid := s.selectionID("idx")
		s.selectOK(t, obj{"model_name": model, "token_ids": tokens(101, 8), "selection_id": sid})
		s.book(t, replay(sid, model))
		wantCached(t, 101, 8)
	})
	t.Run("explicit reservation with tokens", func(t *testing.T) {
		s.book(t, obj{"model_name": model, "selection_id": s.selectionID("idx"), "worker_id": id, "dp_rank": 0,
			"token_ids": tokens(201, 8)})
		wantCached(t, 201, 8)
	})
}
