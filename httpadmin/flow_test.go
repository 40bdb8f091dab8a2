package httpadmin

import (
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/flow"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

// Flow control over real HTTP: priority and tenant place a waiting
// select_and_reserve in GET /flow; a sheddable request is a 429 while the
// worker is busy; out-of-range fields are 400s; the waiter gets the worker
// once the blocker is freed.
func TestFlowControlOverREST(t *testing.T) {
	rc := routerconfig.Default()
	rc.UseKVEvents = false
	rc.QueueThreshold = routerconfig.Some(0.5)
	svc, err := selection.New(selection.Config{Router: rc, Rand: rand.New(rand.NewPCG(1, 2)), Flow: &flow.Config{Fairness: flow.FairnessCount}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(New(svc, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	t.Cleanup(srv.Close)
	a := &testAPI{t: t, svc: svc, srv: srv, client: srv.Client()}
	a.addWorker(1, "max_num_batched_tokens", 8)
	sel := func(id string, base int, extra ...any) map[string]any {
		toks := make([]int, 8)
		for i := range toks {
			toks[i] = base + i
		}
		b := map[string]any{"model_name": "model", "selection_id": id, "token_ids": toks}
		for i := 0; i+1 < len(extra); i += 2 {
			b[extra[i].(string)] = extra[i+1]
		}
		return b
	}
	a.do("POST", "/select_and_reserve", sel("blocker", 100)).want(t, http.StatusOK, "")

	done := make(chan resp, 1)
	go func() {
		done <- a.do("POST", "/select_and_reserve", sel("waiter", 200, "tenant", "acme", "priority", 3))
	}()
	deadline := time.Now().Add(10 * time.Second)
	var st resp
	for {
		st = a.do("GET", "/flow", nil).want(t, http.StatusOK, "")
		if st.num("partitions", 0, "queued") == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the waiter never showed in GET /flow: %s", st.raw)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st.at("enabled") != true || st.at("fairness") != "count" || st.num("queue_ttl_seconds") != 30 ||
		st.num("partitions", 0, "bands", 0, "priority") != 3 || st.at("partitions", 0, "bands", 0, "tenants", 0, "tenant") != "acme" ||
		st.num("partitions", 0, "queued_bytes") == 0 {
		t.Fatalf("GET /flow = %s", st.raw)
	}

	a.do("POST", "/select_and_reserve", sel("shed", 300, "priority", -1)).want(t, http.StatusTooManyRequests, "sheddable request (priority -1) rejected")
	a.do("POST", "/select", sel("", 300, "priority", 1_000_001)).want(t, http.StatusBadRequest, "out of range")
	a.do("POST", "/select_and_reserve", sel("", 300, "tenant", strings.Repeat("t", 300))).want(t, http.StatusBadRequest, "300 bytes long")
	// A type error is a 422, as axum answers it in Dynamo's service.
	a.do("POST", "/select_and_reserve", sel("", 300, "priority", "high")).want(t, http.StatusUnprocessableEntity, "priority: invalid type")

	a.do("DELETE", "/reservations/blocker", nil).want(t, http.StatusOK, "")
	if r := <-done; r.status != http.StatusOK || r.at("selection_id") != "waiter" {
		t.Fatalf("the waiter: %d %s", r.status, r.raw)
	}
	if st := a.do("GET", "/flow", nil).want(t, http.StatusOK, ""); st.num("partitions", 0, "queued") != 0 {
		t.Fatalf("after the waiter left: %s", st.raw)
	}
}

func TestFlowStatusWhenOff(t *testing.T) {
	a := newAPI(t, nil, Options{})
	a.addWorker(1)
	if st := a.do("GET", "/flow", nil).want(t, http.StatusOK, ""); string(st.raw) != `{"enabled":false,"partitions":[]}` {
		t.Fatalf("GET /flow = %s", st.raw)
	}
}
