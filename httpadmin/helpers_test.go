package httpadmin

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

// fakeClock is the injected time source, as in selection's tests.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

// testAPI is a real selection.Service behind the real handler on a loopback
// httptest server.
type testAPI struct {
	t      testing.TB
	svc    *selection.Service
	srv    *httptest.Server
	client *http.Client
}

// newService mirrors the setup of Dynamo's HTTP tests
// (services/selection/tests.rs): approximate index (use_kv_events=false), no
// queue threshold, fake clock, seeded rand.
func newService(t testing.TB, edit func(*routerconfig.Config)) *selection.Service {
	t.Helper()
	rc := routerconfig.Default()
	rc.UseKVEvents = false
	if edit != nil {
		edit(&rc)
	}
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	svc, err := selection.New(selection.Config{Router: rc, Clock: clock.Now, Rand: rand.New(rand.NewPCG(1, 2))})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

func newAPI(t testing.TB, edit func(*routerconfig.Config), opts Options) *testAPI {
	t.Helper()
	svc := newService(t, edit)
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	srv := httptest.NewServer(New(svc, opts))
	t.Cleanup(srv.Close)
	return &testAPI{t: t, svc: svc, srv: srv, client: srv.Client()}
}

// resp is a decoded answer.
type resp struct {
	status int
	header http.Header
	raw    []byte
	body   any // decoded JSON (map[string]any, []any, ...); nil if not JSON
}

// obj returns the body as a JSON object.
func (r resp) obj() map[string]any {
	m, _ := r.body.(map[string]any)
	return m
}

func (r resp) errText() string {
	s, _ := r.obj()["error"].(string)
	return s
}

// num reads a number at a path of object keys and array indexes.
func (r resp) at(path ...any) any {
	var v any = r.body
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			a, _ := v.([]any)
			if k >= len(a) {
				return nil
			}
			v = a[k]
		}
	}
	return v
}

func (r resp) num(path ...any) float64 {
	f, _ := r.at(path...).(float64)
	return f
}

// do sends body (a string, []byte, io.Reader, or any value marshalled to
// JSON) with Content-Type application/json unless headers say otherwise.
func (a *testAPI) do(method, path string, body any, headers ...string) resp {
	a.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	case io.Reader:
		rd = b
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			a.t.Fatal(err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, a.srv.URL+path, rd)
	if err != nil {
		a.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i+1] == "" {
			req.Header.Del(headers[i])
		} else {
			req.Header.Set(headers[i], headers[i+1])
		}
	}
	res, err := a.client.Do(req)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		a.t.Fatal(err)
	}
	out := resp{status: res.StatusCode, header: res.Header, raw: raw}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &out.body); err != nil {
			a.t.Fatalf("%s %s: %d body is not JSON: %q", method, path, res.StatusCode, raw)
		}
		if ct := res.Header.Get("Content-Type"); ct != "application/json" {
			a.t.Fatalf("%s %s: Content-Type %q", method, path, ct)
		}
	}
	return out
}

// want asserts the status, and that an error body contains frag.
func (r resp) want(t testing.TB, status int, frag string) resp {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d; body %s", r.status, status, r.raw)
	}
	if frag != "" && !strings.Contains(string(r.raw), frag) {
		t.Fatalf("body %s does not contain %q", r.raw, frag)
	}
	return r
}

// worker is the helper worker of Dynamo's HTTP tests: model "model", endpoint
// http://worker-N:8000, block size 4.
func worker(id uint64, extra ...any) map[string]any {
	w := map[string]any{"worker_id": id, "model_name": "model", "endpoint": "http://worker-" + itoa(id) + ":8000", "block_size": 4}
	for i := 0; i+1 < len(extra); i += 2 {
		w[extra[i].(string)] = extra[i+1]
	}
	return w
}

func itoa(v uint64) string { b, _ := json.Marshal(v); return string(b) }

func (a *testAPI) addWorker(id uint64, extra ...any) resp {
	a.t.Helper()
	return a.do("POST", "/workers", worker(id, extra...)).want(a.t, http.StatusCreated, "")
}

// load0 is /loads[0].loads[0].
func (a *testAPI) load0() map[string]any {
	a.t.Helper()
	r := a.do("GET", "/loads", nil).want(a.t, http.StatusOK, "")
	m, _ := r.at(0, "loads", 0).(map[string]any)
	if m == nil {
		a.t.Fatalf("no load row: %s", r.raw)
	}
	return m
}

// state is what a rejected request must leave untouched.
func (a *testAPI) state() string {
	a.t.Helper()
	w := a.do("GET", "/workers", nil).want(a.t, http.StatusOK, "")
	l := a.do("GET", "/loads", nil).want(a.t, http.StatusOK, "")
	return string(w.raw) + "\n" + string(l.raw)
}

func newDiscardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// rawField returns a top-level field of a JSON object exactly as sent.
func rawField(t testing.TB, raw []byte, name string) string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m[name] == nil {
		t.Fatalf("no %q in %s", name, raw)
	}
	return string(m[name])
}
