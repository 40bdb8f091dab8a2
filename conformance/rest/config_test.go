package rest

import (
	"net/http"
	"strings"
	"testing"
)

// Tests that depend on a server setting other than the assumed configuration probe for it
// and skip with the reason.

// Without --session-affinity-ttl-secs a session id is only policy input (Dynamo's docs,
// "session_id"): the built-in selector ignores it, so bookings of one session spread by load.
func TestSessionIDWithoutAffinityIsPolicyInput(t *testing.T) {
	s := conformance(t)
	if s.sessionAffinityEnabled(t) {
		t.Skip("precondition: session affinity is on (a session's second booking stayed on its worker); " +
			"this test needs a server without --session-affinity-ttl-secs")
	}
	model := s.model(t)
	s.addSimpleWorker(t, model)
	s.addSimpleWorker(t, model)
	a := s.reserveOK(t, obj{"model_name": model, "token_ids": tokens(1, 4), "session_id": "sess", "selection_id": s.selectionID("sess")})
	b := s.reserveOK(t, obj{"model_name": model, "token_ids": tokens(101, 4), "session_id": "sess", "selection_id": s.selectionID("sess")})
	if a.WorkerID == b.WorkerID {
		t.Fatalf("without affinity the second booking of a session goes to the idle worker; both went to %d", a.WorkerID)
	}
	// The 256-byte bound (400 "session affinity ID must not exceed 256 bytes") belongs to the
	// affinity table: without a table a long session id is plain policy input.
	s.selectOK(t, obj{"model_name": model, "token_ids": tokens(1, 4), "session_id": strings.Repeat("s", 300)})
	s.selectOK(t, obj{"model_name": model, "token_ids": tokens(1, 4), "session_context": obj{
		"session_id": "child", "parent_session_id": "root", "session_final": false, "input_trigger": "tool_result",
		"agent_headers": obj{"x-claude-code-request-class": []string{"subagent"}},
	}})
}

// With --session-affinity-ttl-secs (Dynamo's docs, "session_id") a booked session stays on
// its worker, /select follows the binding without creating one, session_context wins over the
// flat id, and a two-phase select → reservation binds the session.
func TestSessionAffinityPinsSessionToWorker(t *testing.T) {
	s := conformance(t)
	if !s.sessionAffinityEnabled(t) {
		t.Skip("precondition: session affinity is off (a session's second booking moved to the idle worker); " +
			"start the server with --session-affinity-ttl-secs 60 to run this test")
	}
	model := s.model(t)
	s.addSimpleWorker(t, model)
	s.addSimpleWorker(t, model)
	session := func(id string, first int) obj {
		return obj{"model_name": model, "token_ids": tokens(first, 4), "session_id": id, "selection_id": s.selectionID("aff")}
	}
	a := s.reserveOK(t, session("S", 1))
	for i := range 3 {
		if b := s.reserveOK(t, session("S", 100*(i+1))); b.WorkerID != a.WorkerID {
			t.Fatalf("booking %d of session S went to %d, bound to %d", i+2, b.WorkerID, a.WorkerID)
		}
	}
	if got := s.selectOK(t, obj{"model_name": model, "token_ids": tokens(901, 4), "session_id": "S"}); got.WorkerID != a.WorkerID {
		t.Fatalf("/select of session S went to %d, bound to %d", got.WorkerID, a.WorkerID)
	}
	other := s.reserveOK(t, session("T", 1000))
	if other.WorkerID == a.WorkerID {
		t.Fatalf("a new session T went to the loaded worker %d", a.WorkerID)
	}
	ctx := session("ignored-flat-id", 1100)
	ctx["session_context"] = obj{"session_id": "S"}
	if got := s.reserveOK(t, ctx); got.WorkerID != a.WorkerID {
		t.Fatalf("session_context S went to %d, bound to %d", got.WorkerID, a.WorkerID)
	}

	t.Run("session ids over 256 bytes", func(t *testing.T) {
		s.post(t, "/select", obj{"model_name": model, "token_ids": tokens(1, 4), "session_id": strings.Repeat("s", 257)}).
			wantError(t, http.StatusBadRequest, "must not exceed 256 bytes")
	})
	t.Run("two-phase select then reservation binds", func(t *testing.T) {
		sid := s.selectionID("aff")
		sel := s.selectOK(t, obj{"model_name": model, "token_ids": tokens(1200, 4), "session_id": "U", "selection_id": sid})
		s.book(t, replay(sid, model))
		for i := range 3 {
			if b := s.reserveOK(t, session("U", 1300+10*i)); b.WorkerID != sel.WorkerID {
				t.Fatalf("session U bound by the replay to %d, booking went to %d", sel.WorkerID, b.WorkerID)
			}
		}
	})
}

// With queueing enabled a worker needs max_num_batched_tokens to be schedulable (Dynamo's
// HTTP test incomplete_worker_is_accepted_but_not_schedulable).
func TestQueueingRequiresMaxNumBatchedTokens(t *testing.T) {
	s := conformance(t)
	anchor := workerBody(s.workerID(), s.model(t, "anchor"))
	anchor["max_num_batched_tokens"] = 8192 // schedulable whether or not queueing is on
	s.addWorker(t, anchor)
	model := s.model(t)
	rec := s.putWorker(t, workerBody(s.workerID(), model))
	if rec.Lifecycle == "schedulable" {
		t.Skip("precondition: queueing is disabled (a worker without max_num_batched_tokens is schedulable); " +
			"this test needs a server with DYN_ROUTER_QUEUE_THRESHOLD set")
	}
	for _, r := range rec.NotSchedulableReasons {
		if strings.Contains(r, "kv_events endpoint is required") {
			skipOnConfigReasons(t, rec.NotSchedulableReasons)
		}
	}
	if rec.Lifecycle != "incomplete" || len(rec.NotSchedulableReasons) == 0 ||
		!strings.Contains(rec.NotSchedulableReasons[0], "max_num_batched_tokens") {
		t.Fatalf("record %+v: want incomplete, first reason about max_num_batched_tokens", rec)
	}
	wantPartitionNotReady(t, s.post(t, "/select", obj{"model_name": model, "token_ids": tokens(1, 4)}), model)
	b := workerBody(rec.WorkerID, model)
	b["max_num_batched_tokens"] = 8192
	if rec := s.putWorker(t, b); rec.Lifecycle != "schedulable" {
		t.Fatalf("with max_num_batched_tokens: %+v", rec)
	}
	s.post(t, "/select", obj{"model_name": model, "token_ids": tokens(1, 4)}).want(t, http.StatusOK)
}
