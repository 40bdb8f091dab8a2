package mockworker

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/engines/kvlisten"
	"github.com/kvselect/kvselect/httpadmin"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

// kvselectREST starts kvselect's REST API on loopback: the real
// selection.Service with real KV event listeners behind httpadmin.
func kvselectREST(t *testing.T) string {
	t.Helper()
	l := kvlisten.New(context.Background(), kvlisten.Options{Logger: quiet(),
		ReconnectMin: 20 * time.Millisecond, ReconnectMax: 200 * time.Millisecond})
	t.Cleanup(l.Close)
	svc, err := selection.New(selection.Config{Router: routerconfig.Default(), Listeners: l})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(httpadmin.New(svc, httpadmin.Options{Logger: quiet()}))
	t.Cleanup(srv.Close)
	return srv.URL
}

type selectResult struct {
	WorkerID uint64 `json:"worker_id"`
	DPRank   uint32 `json:"dp_rank"`
	Endpoint string `json:"endpoint"`
	Overlap  struct {
		GPU uint64 `json:"gpu"`
	} `json:"overlap"`
}

func selectTokens(t *testing.T, base string, tokens []uint32) selectResult {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model_name": DefaultModel, "token_ids": tokens})
	resp, err := http.Post(base+"/select", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/select: status %d", resp.StatusCode)
	}
	var out selectResult
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// lastSequence is the KV event sequence kvselect last applied for a worker
// rank, from GET /workers.
func lastSequence(t *testing.T, base string, workerID uint64, rank int) (uint64, bool) {
	t.Helper()
	resp, err := http.Get(base + "/workers")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ws []struct {
		WorkerID uint64 `json:"worker_id"`
		Status   map[string]struct {
			LastSequence *uint64 `json:"last_sequence"`
		} `json:"kv_events_status"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&ws); err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		if st, ok := w.Status[fmt.Sprint(rank)]; ok && w.WorkerID == workerID && st.LastSequence != nil {
			return *st.LastSequence, true
		}
	}
	return 0, false
}

// TestRegisterThenSelectFindsThePrefix registers two mock workers (one with
// two data-parallel ranks) with a real kvselect REST API, runs a prompt on
// each, and checks that /select sends each prompt to the worker and rank
// whose cache holds it: the events travelled from the mock's pools through
// ZMQ into kvselect's index.
func TestRegisterThenSelectFindsThePrefix(t *testing.T) {
	const bs = 4
	base := kvselectREST(t)
	ctx := context.Background()
	events := Config{BlockSize: bs, KVEventsEndpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"}
	a := events
	a.WorkerID = 1
	b := events
	b.WorkerID, b.DPSize = 2, 2
	wa, wb := newWorker(t, a), newWorker(t, b)
	for _, w := range []*Worker{wa, wb} {
		reg := w.Registration(fmt.Sprintf("http://worker-%d:8000", w.Config().WorkerID), "", "")
		if err := Register(ctx, nil, base, reg); err != nil {
			t.Fatal(err)
		}
	}
	if reg := wb.Registration("x", "", ""); reg.ReplayEndpoint != "" || len(reg.KVEventsEndpoints) != 2 {
		t.Fatalf("two-rank registration %+v: replay is only allowed with one rank", reg)
	}
	var workers []struct {
		WorkerID  uint64 `json:"worker_id"`
		Lifecycle string `json:"lifecycle"`
	}
	resp, err := http.Get(base + "/workers")
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&workers)
	resp.Body.Close()
	if len(workers) != 2 || workers[0].Lifecycle != "schedulable" || workers[1].Lifecycle != "schedulable" {
		t.Fatalf("workers %+v", workers)
	}

	p := toks(1000, 10*bs)
	q := toks(5000, 12*bs)
	if _, err := wa.Generate(ctx, Request{Tokens: p, MaxTokens: 1}); err != nil {
		t.Fatal(err)
	}
	rank1 := 1
	// A subscriber that connected after a worker's last batch hears of it only
	// with the next one (then replays from 0), so keep each worker busy with
	// unrelated one-block prompts while waiting, as real traffic would.
	nudges := 0
	nudge := func(w *Worker, rank *int) {
		nudges++
		prompt := []uint32{7, uint32(300 + nudges%30000), uint32(300 + nudges/30000), 8, 9}
		if _, err := w.Generate(ctx, Request{Tokens: prompt, MaxTokens: 1, DPRank: rank}); err != nil {
			t.Fatal(err)
		}
	}
	var got selectResult
	routed := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(waitFor)
		for !cond() {
			if time.Now().After(deadline) {
				resp, err := http.Get(base + "/workers")
				var body []byte
				if err == nil {
					body, _ = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				t.Fatalf("timed out waiting for %s; last /select %+v; /workers %s", what, got, body)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	routed("prompt p routed to worker 1", func() bool {
		nudge(wa, nil)
		got = selectTokens(t, base, p)
		return got.WorkerID == 1 && got.Overlap.GPU == 10*bs
	})
	if got.Endpoint != "http://worker-1:8000" {
		t.Fatalf("endpoint %q", got.Endpoint)
	}
	// Worker 2 has two ranks, so it registered no replay endpoint (the API
	// allows one only with a single rank): a batch published before kvselect
	// subscribed would be lost for good. Wait until rank 1's listener has
	// caught up with the publisher before running q.
	routed("worker 2 rank 1 listener caught up", func() bool {
		if seq, ok := lastSequence(t, base, 2, 1); ok && seq == wb.Loads()[1].NextEventSeq-1 {
			return true
		}
		nudge(wb, &rank1)
		return false
	})
	if _, err := wb.Generate(ctx, Request{Tokens: q, MaxTokens: 1, DPRank: &rank1}); err != nil {
		t.Fatal(err)
	}
	routed("prompt q routed to worker 2 rank 1", func() bool {
		got = selectTokens(t, base, q)
		return got.WorkerID == 2 && got.DPRank == 1 && got.Overlap.GPU == 12*bs
	})

	if err := Deregister(ctx, nil, base, 1); err != nil {
		t.Fatal(err)
	}
	if err := Deregister(ctx, nil, base, 1); err != nil {
		t.Fatalf("second deregister: %v", err)
	}
	if got := selectTokens(t, base, p); got.WorkerID != 2 {
		t.Fatalf("after deregistering worker 1, /select chose %d", got.WorkerID)
	}
}

// A worker dialing a collector registers no KV events endpoint (the
// collector's owner feeds it by topic), keeps its bound replay endpoint, and
// sends kv_events_topic only when its topic is not llm-d's
// kv@<host>:<port>@<model> for the endpoint it registers.
func TestCollectorRegistrationNamesNoEventsEndpoint(t *testing.T) {
	l := kvlisten.New(context.Background(), kvlisten.Options{Logger: quiet()})
	t.Cleanup(l.Close)
	collector, err := l.Bind("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const endpoint = "http://10.0.0.7:8000"
	for _, tc := range []struct {
		name, topic, wantTopic string
		dp                     int
		wantReplay             bool
	}{
		{"llm-d topic", "kv@10.0.0.7:8000@" + DefaultModel, "", 1, true},
		{"own topic", "engine-7", "engine-7", 1, true},
		{"two ranks", "kv@10.0.0.7:8000@" + DefaultModel, "", 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorker(t, Config{KVEventsCollector: collector, ReplayEndpoint: "tcp://127.0.0.1:0", EventsTopic: tc.topic, DPSize: tc.dp})
			reg := w.Registration(endpoint, "", "10.0.0.7")
			if len(reg.KVEventsEndpoints) != 0 || reg.KVEventsTopic != tc.wantTopic || (reg.ReplayEndpoint != "") != tc.wantReplay {
				t.Fatalf("registration %+v: want no kv_events_endpoints, kv_events_topic %q, replay %v", reg, tc.wantTopic, tc.wantReplay)
			}
			if eps := w.Endpoints(); len(eps) != tc.dp || eps[0].KVEvents != collector {
				t.Fatalf("endpoints %+v: want %d ranks dialing %s", eps, tc.dp, collector)
			}
		})
	}
}

func TestRegisterReportsRejection(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		http.Error(rw, `{"error":"nope"}`, http.StatusUnprocessableEntity)
	}))
	defer srv.Close()
	err := Register(context.Background(), nil, srv.URL, Registration{WorkerID: 1})
	if err == nil || !strings.Contains(err.Error(), "422") || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("err %v", err)
	}
}

func TestWithHost(t *testing.T) {
	for _, c := range []struct{ ep, host, want string }{
		{"tcp://127.0.0.1:5557", "", "tcp://127.0.0.1:5557"},
		{"tcp://127.0.0.1:5557", "10.0.0.7", "tcp://10.0.0.7:5557"},
		{"tcp://127.0.0.1:5557", "::1", "tcp://[::1]:5557"},
		{"ipc:///tmp/x", "h", "ipc:///tmp/x"},
	} {
		if got := withHost(c.ep, c.host); got != c.want {
			t.Errorf("withHost(%q, %q) = %q, want %q", c.ep, c.host, got, c.want)
		}
	}
}

// A prefill-role and a decode-role worker registered with a real kvselect:
// the prefill worker lands in kvselect's prefill routing group (its
// registration names no group, only its role), and a disaggregated selection
// names it as the prefill worker of the decode worker.
func TestRolesRegisterIntoThePrefillGroup(t *testing.T) {
	base := kvselectREST(t)
	ctx := context.Background()
	for _, c := range []Config{{Role: RolePrefill, WorkerID: 11}, {Role: RoleDecode, WorkerID: 12}, {WorkerID: 13}} {
		c.KVEventsEndpoint = "tcp://127.0.0.1:0"
		w := newWorker(t, c)
		reg := w.Registration(fmt.Sprintf("http://127.0.0.1:%d", 9000+c.WorkerID), "", "127.0.0.1")
		if want := map[string]string{RolePrefill: "prefill", RoleDecode: "decode"}[c.Role]; reg.Role != want {
			t.Fatalf("worker %d registers role %q, want %q", c.WorkerID, reg.Role, want)
		}
		if err := Register(ctx, nil, base, reg); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := http.Get(base + "/workers?routing_group=prefill")
	if err != nil {
		t.Fatal(err)
	}
	var ws []struct {
		WorkerID  uint64 `json:"worker_id"`
		Role      string `json:"role"`
		Lifecycle string `json:"lifecycle"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&ws); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(ws) != 1 || ws[0].WorkerID != 11 || ws[0].Role != "prefill" || ws[0].Lifecycle != "schedulable" {
		t.Fatalf("prefill group = %+v", ws)
	}
	body := `{"model_name":"` + DefaultModel + `","token_ids":[1,2,3,4,5,6,7,8],"disaggregated":true,"allowed_worker_ids":[12]}`
	resp, err = http.Post(base+"/select", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sel struct {
		WorkerID uint64 `json:"worker_id"`
		Prefill  *struct {
			WorkerID uint64 `json:"worker_id"`
		} `json:"prefill"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&sel); err != nil {
		t.Fatal(err)
	}
	if sel.WorkerID != 12 || sel.Prefill == nil || sel.Prefill.WorkerID != 11 {
		t.Fatalf("selection = %+v", sel)
	}
}
