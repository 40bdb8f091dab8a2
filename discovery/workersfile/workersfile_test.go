package workersfile

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvselect/kvselect/discovery"
	"github.com/kvselect/kvselect/httpadmin"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		ids     []uint64
		wantErr string
	}{
		{"yaml workers list", `
workers:
  - worker_id: 1
    model_name: llama
    endpoint: http://10.0.0.5:8000
    block_size: 16
    kv_events_endpoint: tcp://10.0.0.5:5557
  - {worker_id: 2, endpoint: "http://10.0.0.6:8000", block_size: 16}
`, []uint64{1, 2}, ""},
		{"json object", `{"workers":[{"worker_id":7,"endpoint":"http://a:1","block_size":4,"data_parallel_size":2,"kv_events_endpoints":{"0":"tcp://a:5557","1":"tcp://a:5558"}}]}`, []uint64{7}, ""},
		{"bare yaml list", "- worker_id: 3\n  endpoint: http://a:1\n", []uint64{3}, ""},
		{"explicitly empty", "workers: []\n", []uint64{}, ""},
		{"a record pasted from GET /workers", `[{"worker_id":4,"lifecycle":"schedulable","not_schedulable_reasons":["x"],"kv_events_status":{"0":{"connected":true,"complete":true,"lost_batches":0}}}]`, []uint64{4}, ""},
		{"empty file", "  \n", nil, "file is empty"},
		{"not yaml", "workers: [\n", nil, "not valid YAML or JSON"},
		{"scalar", "42\n", nil, "want a `workers:` list"},
		{"no workers key", "worker: []\n", nil, "unknown field \"worker\""},
		{"missing workers", "{}\n", nil, "missing `workers` list"},
		{"unknown field", "workers:\n  - worker_id: 1\n    blocksize: 16\n", nil, `workers[0]: json: unknown field "blocksize"`},
		{"missing worker_id", "workers:\n  - endpoint: http://a:1\n", nil, "workers[0]: missing field `worker_id`"},
		{"negative id", "workers:\n  - worker_id: -1\n", nil, "workers[0]: json: cannot unmarshal number -1"},
		{"wrong type", "workers:\n  - worker_id: 1\n    block_size: big\n", nil, "workers[0]: json: cannot unmarshal string"},
		{"duplicate id", "workers:\n  - worker_id: 1\n  - worker_id: 2\n  - worker_id: 1\n", nil, "workers[2]: worker_id 1 already used by workers[0]"},
		{"duplicate key", "workers:\n  - worker_id: 1\n    worker_id: 2\n", nil, "not valid YAML or JSON"},
		{"bad enum", "workers:\n  - worker_id: 1\n    kv_transfer_enforcement: maybe\n", nil, "workers[0] (worker_id 1): kv_transfer_enforcement must be"},
		{"engine and metrics endpoint", "workers:\n  - worker_id: 1\n    engine: sglang\n    metrics_endpoint: http://10.0.0.5:9100/metrics\n", []uint64{1}, ""},
		{"unknown engine", "workers:\n  - worker_id: 1\n    engine: tgi\n", nil, "workers[0] (worker_id 1): engine must be one of vllm, sglang, trtllm"},
		{"bad metrics endpoint", "workers:\n  - worker_id: 1\n    metrics_endpoint: tcp://x:1\n", nil, "metrics_endpoint: invalid URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.ids) {
				t.Fatalf("got %d records, want %d", len(got), len(tt.ids))
			}
			for i, r := range got {
				if r.WorkerID != tt.ids[i] || r.Lifecycle != "" || r.NotSchedulableReasons != nil || r.KVEventsStatus != nil {
					t.Errorf("record %d: %+v", i, r)
				}
				if r.ModelName == "" || r.RoutingGroup == "" {
					t.Errorf("record %d: partition defaults not filled: %+v", i, r)
				}
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("workers:\n  - worker_id: 1\n    endpoint: http://a:1\n    block_size: 16\n"))
	f.Add([]byte(`[{"worker_id":7,"kv_events_endpoints":{"0":"tcp://a:5557"}}]`))
	f.Add([]byte("workers: [\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		recs, err := Parse(data)
		if err != nil {
			return
		}
		seen := map[uint64]bool{}
		for _, r := range recs {
			if seen[r.WorkerID] {
				t.Fatalf("duplicate id %d accepted", r.WorkerID)
			}
			seen[r.WorkerID] = true
		}
	})
}

// harness is a real selection service behind the real REST API on loopback,
// fed by a Source and a Reconciler, as kvselect --workers-file wires them.
type harness struct {
	path string
	url  string
	svc  *selection.Service
}

func start(t *testing.T) *harness {
	t.Helper()
	rc := routerconfig.Default()
	rc.UseKVEvents = false
	svc, err := selection.New(selection.Config{Router: rc})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: httpadmin.New(svc, httpadmin.Options{Logger: quiet})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	h := &harness{path: filepath.Join(t.TempDir(), "workers.yaml"), url: "http://" + ln.Addr().String(), svc: svc}
	src, err := New(Options{Path: h.path, PollInterval: 10 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	rec := discovery.NewReconciler(svc, discovery.Options{Source: "workers file", Logger: quiet, RetryInterval: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { rec.Run(ctx) })
	wg.Go(func() { src.Run(ctx, rec.Update) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return h
}

func (h *harness) write(t *testing.T, content string) {
	t.Helper()
	// Write-and-rename, as editors and ConfigMap volumes replace files.
	tmp := h.path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, h.path); err != nil {
		t.Fatal(err)
	}
}

func (h *harness) get(t *testing.T, path string, v any) int {
	t.Helper()
	resp, err := http.Get(h.url + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode
}

type readyBody struct {
	Ready      bool                  `json:"ready"`
	Conditions []selection.Condition `json:"conditions"`
}

func (h *harness) workers(t *testing.T) map[uint64]*catalog.Record {
	var ws []catalog.Record
	h.get(t, "/workers", &ws)
	out := map[uint64]*catalog.Record{}
	for _, w := range ws {
		out[w.WorkerID] = &w
	}
	return out
}

func (h *harness) ready(t *testing.T) (int, readyBody) {
	var b readyBody
	code := h.get(t, "/ready", &b)
	return code, b
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (h *harness) condition(t *testing.T) selection.Condition {
	_, b := h.ready(t)
	for _, c := range b.Conditions {
		if c.Name == discovery.ConditionName {
			return c
		}
	}
	return selection.Condition{}
}

const twoWorkers = `
workers:
  - worker_id: 1
    model_name: llama
    endpoint: http://10.0.0.5:8000
    block_size: 16
  - worker_id: 2
    model_name: llama
    endpoint: http://10.0.0.6:8000
    block_size: 16
`

func TestFileLifecycleThroughREST(t *testing.T) {
	h := start(t)

	// No file yet: not ready, and /ready says why.
	eventually(t, "the unreadable condition", func() bool { return h.condition(t).Reason == ReasonUnreadable })
	if code, b := h.ready(t); code != http.StatusServiceUnavailable || b.Ready || !strings.Contains(h.condition(t).Message, "no such file") {
		t.Fatalf("missing file: /ready %d %+v", code, b)
	}

	// Write: both workers appear and the picker is ready.
	h.write(t, twoWorkers)
	eventually(t, "two workers", func() bool { return len(h.workers(t)) == 2 })
	eventually(t, "ready", func() bool { code, _ := h.ready(t); return code == http.StatusOK })
	if w := h.workers(t)[1]; w.Lifecycle != catalog.Schedulable || w.EndpointOrEmpty() != "http://10.0.0.5:8000" {
		t.Fatalf("worker 1: %+v", w)
	}

	// Rewrite: worker 2 leaves, worker 1 moves, worker 3 arrives incomplete
	// (no block size) with the catalog's reason.
	h.write(t, `
workers:
  - {worker_id: 1, model_name: llama, endpoint: "http://10.0.0.9:8000", block_size: 16}
  - {worker_id: 3, model_name: llama, endpoint: "http://10.0.0.7:8000"}
`)
	eventually(t, "the rewrite", func() bool {
		ws := h.workers(t)
		_, two := ws[2]
		return !two && ws[1].EndpointOrEmpty() == "http://10.0.0.9:8000" && ws[3].Lifecycle == catalog.Incomplete
	})
	if r := h.workers(t)[3].NotSchedulableReasons; len(r) != 1 || r[0] != "block_size must be greater than 0" {
		t.Fatalf("worker 3 reasons: %q", r)
	}

	// Malformed: the last good catalog stays, readiness too, and the
	// condition names the problem.
	h.write(t, "workers:\n  - worker_id: 1\n    blocksize: 16\n")
	eventually(t, "the last-good condition", func() bool { return h.condition(t).Reason == ReasonLastGoodKept })
	c := h.condition(t)
	if !c.Ready || !strings.Contains(c.Message, `unknown field "blocksize"`) || !strings.Contains(c.Message, "serving the 2 workers of the last good version") {
		t.Fatalf("condition: %+v", c)
	}
	if ws := h.workers(t); len(ws) != 2 || ws[1].EndpointOrEmpty() != "http://10.0.0.9:8000" {
		t.Fatalf("malformed file changed the catalog: %+v", ws)
	}
	if code, _ := h.ready(t); code != http.StatusOK {
		t.Fatalf("a malformed rewrite must not take the picker out of service: /ready %d", code)
	}

	// Deleted: same, the last good catalog stays.
	if err := os.Remove(h.path); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the deleted-file condition", func() bool {
		c := h.condition(t)
		return c.Reason == ReasonLastGoodKept && strings.Contains(c.Message, "no such file")
	})
	if ws := h.workers(t); len(ws) != 2 {
		t.Fatalf("deleted file changed the catalog: %+v", ws)
	}

	// Back: a good file applies again and the condition clears.
	h.write(t, twoWorkers)
	eventually(t, "the restored file", func() bool {
		ws := h.workers(t)
		_, three := ws[3]
		return len(ws) == 2 && !three && ws[2].Lifecycle == catalog.Schedulable && h.condition(t).Reason == ReasonLoaded
	})

	// Empty list: every file worker leaves; no schedulable worker means not ready.
	h.write(t, "workers: []\n")
	eventually(t, "an empty catalog", func() bool { return len(h.workers(t)) == 0 })
	if code, _ := h.ready(t); code != http.StatusServiceUnavailable {
		t.Fatalf("no workers: /ready %d", code)
	}
}

func TestFileMalformedFromTheStartIsNotReady(t *testing.T) {
	h := start(t)
	h.write(t, "workers:\n  - worker_id: 1\n  - worker_id: 1\n")
	eventually(t, "the invalid condition", func() bool { return h.condition(t).Reason == ReasonInvalid })
	c := h.condition(t)
	if c.Ready || !strings.Contains(c.Message, "worker_id 1 already used by workers[0]") {
		t.Fatalf("condition: %+v", c)
	}
	if code, _ := h.ready(t); code != http.StatusServiceUnavailable {
		t.Fatalf("/ready %d", code)
	}
}

func TestCheckReportsOnlyChanges(t *testing.T) {
	path := filepath.Join(t.TempDir(), "w.json")
	s, err := New(Options{Path: path, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		write   *string
		changed bool
		reason  string
	}{
		{nil, true, ReasonUnreadable},
		{nil, false, ""},
		{ptr(`{"workers":[{"worker_id":1}]}`), true, ReasonLoaded},
		{nil, false, ""},
		{ptr(`{"workers":[{"worker_id":1}]}`), false, ""}, // same bytes rewritten
		{ptr(`{"workers":[`), true, ReasonLastGoodKept},
		{nil, false, ""},
		{ptr(`{"workers":[{"worker_id":2}]}`), true, ReasonLoaded},
	}
	for i, st := range steps {
		if st.write != nil {
			if err := os.WriteFile(path, []byte(*st.write), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		snap, changed := s.Check()
		if changed != st.changed || (changed && snap.State.Reason != st.reason) {
			t.Fatalf("step %d: changed=%v reason=%q, want %v %q", i, changed, snap.State.Reason, st.changed, st.reason)
		}
	}
	if _, err := New(Options{Path: " "}); err == nil {
		t.Fatal("empty path accepted")
	}
}

func ptr[T any](v T) *T { return &v }

func TestParseRoles(t *testing.T) {
	recs, err := Parse([]byte("workers:\n- {worker_id: 1, endpoint: 'http://a:8000', block_size: 16, role: prefill}\n- {worker_id: 2, endpoint: 'http://b:8000', block_size: 16, role: decode}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if *recs[0].Role != "prefill" || recs[0].RoutingGroup != "" || *recs[1].Role != "decode" || recs[1].RoutingGroup != "default" {
		t.Fatalf("records = %+v", recs)
	}
	_, err = Parse([]byte("workers:\n- {worker_id: 1, endpoint: 'http://a:8000', role: prefiller}\n"))
	if err == nil || !strings.Contains(err.Error(), "workers[0] (worker_id 1): role must be one of prefill, decode, both") {
		t.Fatalf("err = %v", err)
	}
}
