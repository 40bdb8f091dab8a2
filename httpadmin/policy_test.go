package httpadmin

import (
	"net/http"
	"strings"
	"testing"

	"github.com/kvselect/kvselect/selection/scheduler"
)

// Latency objectives and the latency model over real HTTP: slo_ttft_ms and
// slo_tpot_ms are validated, a sheddable request no worker is predicted to
// serve in time is a 429 with Retry-After, and GET /policy shows the model
// the lifecycle fitted.
func TestLatencyObjectivesAndPolicyOverREST(t *testing.T) {
	a := newAPI(t, nil, Options{})
	pol, err := scheduler.New(scheduler.PredictedLatencyPolicyName, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.svc.SetPolicy(pol); err != nil {
		t.Fatal(err)
	}
	a.addWorker(1)
	body := func(id string, n int, extra ...any) map[string]any {
		toks := make([]int, n)
		for i := range toks {
			toks[i] = i + 1
		}
		b := map[string]any{"model_name": "model", "selection_id": id, "token_ids": toks}
		for i := 0; i+1 < len(extra); i += 2 {
			b[extra[i].(string)] = extra[i+1]
		}
		return b
	}
	for _, bad := range []struct {
		v      any
		status int
	}{{0, http.StatusBadRequest}, {-3, http.StatusBadRequest}, {"fast", http.StatusUnprocessableEntity}} {
		a.do("POST", "/select_and_reserve", body("bad", 8, "slo_ttft_ms", bad.v)).want(t, bad.status, "slo_ttft_ms")
	}
	r := a.do("POST", "/select_and_reserve", body("shed", 4000, "slo_ttft_ms", 0.5, "priority", -1)).want(t, http.StatusTooManyRequests, "predicted to meet")
	if got := r.header.Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After = %q, want 1", got)
	}
	if got := r.num("details", "retry_after_seconds"); got != 1 {
		t.Errorf("details.retry_after_seconds = %v, want 1", got)
	}
	a.do("POST", "/select_and_reserve", body("ok", 8, "slo_ttft_ms", 5000, "slo_tpot_ms", 100)).want(t, http.StatusOK, "")
	a.do("POST", "/reservations/ok/prefill_complete", nil).want(t, http.StatusOK, "")

	p := a.do("GET", "/policy", nil).want(t, http.StatusOK, "")
	if got := p.num("latency_model", "prediction_error", "observed"); got != 1 {
		t.Errorf("prediction_error.observed = %v, want 1 (%s)", got, p.raw)
	}
	if got := p.at("latency_model", "workers", 0, "worker_id"); got != float64(1) {
		t.Errorf("workers[0].worker_id = %v (%s)", got, p.raw)
	}
	if got := p.num("latency_model", "prior", "ttft", "per_uncached_ktokens_seconds"); got != 0.025 {
		t.Errorf("prior per_uncached_ktokens_seconds = %v, want 0.025", got)
	}
	if !strings.Contains(string(p.raw), `"source":"pooled"`) {
		t.Errorf("no pooled model in %s", p.raw)
	}
}
