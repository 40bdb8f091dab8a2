package httpadmin

import (
	"net/http"
	"strings"
	"testing"
)

// The REST API's disaggregated flow over real HTTP: workers registered with
// role prefill join the prefill group; "disaggregated": true answers the
// decode selection plus the prefill worker; the decode booking's
// prefill_complete frees the prefill booking and DELETE the rest. Without the
// flag the answer has no prefill fields at all.
func TestDisaggregatedSelectAndReserve(t *testing.T) {
	a := newAPI(t, nil, Options{})
	a.addWorker(1)
	r := a.addWorker(11, "role", "prefill")
	if got := r.at("routing_group"); got != "prefill" {
		t.Fatalf("prefill worker's routing_group = %v: %s", got, r.raw)
	}
	a.do("POST", "/workers", worker(12, "role", "decode", "routing_group", "prefill")).
		want(t, http.StatusCreated, `role decode conflicts with routing_group \"prefill\"`)

	plain := a.do("POST", "/select_and_reserve", map[string]any{"model_name": "model", "selection_id": "plain", "token_ids": []int{1, 2, 3, 4}}).
		want(t, http.StatusOK, "")
	if strings.Contains(string(plain.raw), "prefill\"") {
		t.Fatalf("plain answer mentions prefill: %s", plain.raw)
	}

	body := map[string]any{"model_name": "model", "selection_id": "pd", "token_ids": []int{1, 2, 3, 4, 5, 6, 7, 8}, "disaggregated": true}
	got := a.do("POST", "/select_and_reserve", body).want(t, http.StatusOK, "")
	if got.num("worker_id") != 1 || got.num("prefill", "worker_id") != 11 || got.at("prefill", "selection_id") != "pd.prefill" ||
		got.at("prefill", "endpoint") != "http://worker-11:8000" || got.num("prefill", "effective_prefill_tokens") != 8 {
		t.Fatalf("answer = %s", got.raw)
	}
	if rawField(t, got.raw, "prefill_decision") != `{"remote":true,"reason":"conditional_disagg_disabled"}` {
		t.Fatalf("decision = %s", got.raw)
	}
	prefillLoad := func() float64 {
		l := a.do("GET", "/loads?routing_group=prefill", nil).want(t, http.StatusOK, "")
		return l.num(0, "loads", 0, "active_requests")
	}
	if prefillLoad() != 1 {
		t.Fatal("no prefill booking")
	}
	a.do("POST", "/reservations/pd/prefill_complete", map[string]any{}).want(t, http.StatusOK, "")
	if prefillLoad() != 0 {
		t.Fatal("prefill_complete of the decode booking left the prefill booking")
	}
	a.do("DELETE", "/reservations/pd", nil).want(t, http.StatusOK, "")
	a.do("DELETE", "/reservations/pd.prefill", nil).want(t, http.StatusNotFound, "")

	// Aimed at the prefill group itself: a 400 with the reason.
	body["routing_group"] = "prefill"
	a.do("POST", "/select", body).want(t, http.StatusBadRequest, "names the decode routing group")
}
