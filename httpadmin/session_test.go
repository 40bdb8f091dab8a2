package httpadmin

import (
	"net/http"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection/routerconfig"
)

// sessionAPI is the REST API with session affinity on (one minute) and
// workers 1 and 2.
func sessionAPI(t *testing.T) *testAPI {
	t.Helper()
	a := newAPI(t, func(c *routerconfig.Config) { c.SessionAffinityTTL = routerconfig.Some(time.Minute) }, Options{})
	a.addWorker(1)
	a.addWorker(2)
	return a
}

// loadREST books n long prompts pinned to worker w.
func (a *testAPI) loadREST(w uint64, n int) {
	a.t.Helper()
	tokens := make([]int, 1024)
	for i := range tokens {
		tokens[i] = 70_000 + i
	}
	for i := range n {
		a.do("POST", "/select_and_reserve", map[string]any{"selection_id": "load-" + itoa(uint64(i)), "model_name": "model",
			"token_ids": tokens, "pinned_worker": map[string]any{"worker_id": w, "dp_rank": 0}}).want(a.t, http.StatusOK, "")
	}
}

// sessionBody is a select body of session_context ctx.
func sessionBody(id string, ctx map[string]any, tokens ...int) map[string]any {
	b := map[string]any{"model_name": "model", "token_ids": tokens, "session_context": ctx}
	if id != "" {
		b["selection_id"] = id
	}
	return b
}

// TestRESTSessionContextParentAndFinal: session_context.parent_session_id
// starts a child on its parent's worker, session_final ends the binding when
// the final request's reservation is deleted, on /select_and_reserve and on
// the /select + /reservations replay; the fields are typed as Dynamo's serde
// types them (422 otherwise).
func TestRESTSessionContextParentAndFinal(t *testing.T) {
	a := sessionAPI(t)
	w := uint64(a.do("POST", "/select_and_reserve", sessionBody("root-1", map[string]any{"session_id": "root"}, 1, 2, 3, 4)).
		want(t, http.StatusOK, "").num("worker_id"))
	other := 3 - w
	a.loadREST(w, 6)

	child := a.do("POST", "/select_and_reserve", sessionBody("child-1",
		map[string]any{"session_id": "child", "parent_session_id": "root", "input_trigger": "tool_result"}, 5, 6, 7, 8)).want(t, http.StatusOK, "")
	if got := uint64(child.num("worker_id")); got != w {
		t.Fatalf("child went to %d, its parent is bound to %d", got, w)
	}
	stranger := a.do("POST", "/select_and_reserve", sessionBody("stranger-1", map[string]any{"session_id": "stranger"}, 5, 6, 7, 8)).want(t, http.StatusOK, "")
	if got := uint64(stranger.num("worker_id")); got != other {
		t.Fatalf("an unrelated session went to %d, want the unloaded %d", got, other)
	}

	// The final request routes by the binding; deleting its reservation ends it.
	fin := a.do("POST", "/select_and_reserve", sessionBody("root-final", map[string]any{"session_id": "root", "session_final": true}, 1, 2, 3, 4, 5)).
		want(t, http.StatusOK, "")
	if got := uint64(fin.num("worker_id")); got != w {
		t.Fatalf("the final request went to %d, bound to %d", got, w)
	}
	query := func(sid string) uint64 {
		return uint64(a.do("POST", "/select", sessionBody("", map[string]any{"session_id": sid}, 9, 9, 9, 9)).want(t, http.StatusOK, "").num("worker_id"))
	}
	if got := query("root"); got != w {
		t.Fatalf("before the final reservation is deleted, root selects %d, bound to %d", got, w)
	}
	a.do("DELETE", "/reservations/root-final", nil).want(t, http.StatusOK, "")
	if got := query("root"); got != other {
		t.Fatalf("after the final reservation, root selects %d (the ended binding?), want the unloaded %d", got, other)
	}

	// The child keeps its own binding; its final turn, by the replay form.
	a.do("POST", "/select", sessionBody("child-final", map[string]any{"session_id": "child", "session_final": true}, 5, 6, 7, 8, 9)).
		want(t, http.StatusOK, "")
	a.do("POST", "/reservations", map[string]any{"selection_id": "child-final", "model_name": "model"}).want(t, http.StatusCreated, "")
	a.do("DELETE", "/reservations/child-1", nil).want(t, http.StatusOK, "")
	if got := query("child"); got != w {
		t.Fatalf("before its final reservation is deleted, child selects %d, bound to %d", got, w)
	}
	a.do("DELETE", "/reservations/child-final", nil).want(t, http.StatusOK, "")
	if got := query("child"); got != other {
		t.Fatalf("after its final reservation, child selects %d, want the unloaded %d", got, other)
	}

	for _, bad := range []map[string]any{
		{"session_id": "s", "parent_session_id": 5},
		{"session_id": "s", "session_final": "true"},
	} {
		a.do("POST", "/select_and_reserve", sessionBody("", bad, 1, 2, 3, 4)).want(t, http.StatusUnprocessableEntity, "")
	}
}
