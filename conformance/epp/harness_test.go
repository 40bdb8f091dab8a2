package epp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvselect/kvselect/envoysim"
)

// Environment of the suite.
const (
	envURL       = "KVSELECT_URL"                      // REST base URL
	envExtProc   = "KVSELECT_EXTPROC"                  // ext_proc host:port
	envFallbacks = "KVSELECT_EXTPROC_FALLBACKS"        // the server's --extproc-fallbacks (0 when unset)
	envTestPick  = "KVSELECT_EXTPROC_TEST_PICK"        // "1": the server runs with --extproc-test-pick-header
	envBusy      = "KVSELECT_ACTIVE_PREFILL_THRESHOLD" // the server's DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD, if set
)

// Protocol names, spelled out: the suite imports nothing from the server.
const (
	hdrDest        = "x-gateway-destination-endpoint"
	hdrTestPick    = "test-epp-endpoint-selection"
	hdrTestServed  = "x-conformance-test-served-endpoint"
	hdrSelectionID = "x-kvselect-selection-id"
	hdrWorkerID    = "x-kvselect-worker-id"
	hdrDPRank      = "x-kvselect-dp-rank"
	hdrModel       = "x-kvselect-model-name"
	bodyChunkLimit = 62000
)

type suite struct {
	base   string
	client *envoysim.Client
	conn   *grpc.ClientConn
	run    string
}

var (
	the    *suite
	models atomic.Uint64
)

func TestMain(m *testing.M) {
	if os.Getenv(envURL) == "" || os.Getenv(envExtProc) == "" {
		fmt.Fprintf(os.Stderr, "conformance/epp: skipping every test: set %s and %s (conformance/run-epp.sh does)\n", envURL, envExtProc)
		os.Exit(m.Run())
	}
	conn, err := grpc.NewClient(os.Getenv(envExtProc), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	the = &suite{base: strings.TrimSuffix(os.Getenv(envURL), "/"), client: envoysim.New(conn), conn: conn,
		run: strconv.FormatInt(time.Now().UnixNano()%1e9, 36)}
	code := m.Run()
	conn.Close()
	os.Exit(code)
}

func need(t *testing.T) *suite {
	t.Helper()
	if the == nil {
		t.Skipf("%s and %s are not set", envURL, envExtProc)
	}
	return the
}

// pool is a model with its own workers, so tests never see each other.
type pool struct {
	s     *suite
	model string
	addrs []string // ip:port per worker, worker ids 1..n within the model's id range
	ids   []uint64
}

// newPool registers n workers for a fresh model; worker i listens at
// 10.<run>.<model>.<i>:8000 (addresses are never dialled).
func (s *suite) newPool(t *testing.T, n int, addrs ...string) *pool {
	t.Helper()
	m := models.Add(1)
	p := &pool{s: s, model: fmt.Sprintf("epp-%s-%d", s.run, m)}
	for i := range n {
		addr := fmt.Sprintf("10.%d.%d.%d:8000", 100+m/250, m%250, i+1)
		if i < len(addrs) {
			addr = addrs[i]
		}
		id := (uint64(time.Now().UnixNano())&0xffffff)<<16 | m<<6 | uint64(i)
		s.rest(t, "POST", "/workers", map[string]any{"worker_id": id, "model_name": p.model, "endpoint": "http://" + addr, "block_size": 4}, 0)
		p.addrs, p.ids = append(p.addrs, addr), append(p.ids, id)
	}
	t.Cleanup(func() {
		for _, id := range p.ids {
			s.restRaw("DELETE", "/workers/"+strconv.FormatUint(id, 10), nil)
		}
	})
	return p
}

func (p *pool) has(addr string) bool {
	for _, a := range p.addrs {
		if a == addr {
			return true
		}
	}
	return false
}

// rest sends a REST call and fails unless the status is 2xx (or want).
func (s *suite) rest(t *testing.T, method, path string, body any, want int) []byte {
	t.Helper()
	st, raw, err := s.restRaw(method, path, body)
	if err != nil {
		t.Fatal(err)
	}
	if (want == 0 && st/100 != 2) || (want != 0 && st != want) {
		t.Fatalf("%s %s: %d %s", method, path, st, raw)
	}
	return raw
}

func (s *suite) restRaw(method, path string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, s.base+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	return res.StatusCode, raw, err
}

// load is one rank's /loads row.
type load struct {
	WorkerID       uint64 `json:"worker_id"`
	Prefill        uint64 `json:"potential_prefill_tokens"`
	Decode         uint64 `json:"potential_decode_blocks"`
	ActiveRequests uint64 `json:"active_requests"`
}

// loads reads the model's /loads rows keyed by worker address.
func (p *pool) loads(t *testing.T) map[string]load {
	t.Helper()
	var rows []struct {
		Loads []load `json:"loads"`
	}
	if err := json.Unmarshal(p.s.rest(t, "GET", "/loads?model_name="+p.model, nil, 0), &rows); err != nil {
		t.Fatal(err)
	}
	out := map[string]load{}
	for _, m := range rows {
		for _, l := range m.Loads {
			for i, id := range p.ids {
				if id == l.WorkerID {
					out[p.addrs[i]] = l
				}
			}
		}
	}
	return out
}

func (p *pool) active(t *testing.T) int {
	n := 0
	for _, l := range p.loads(t) {
		n += int(l.ActiveRequests)
	}
	return n
}

// idle waits until the model carries no load at all.
func (p *pool) idle(t *testing.T) {
	t.Helper()
	eventually(t, "the model's load to drain to zero", func() bool {
		for _, l := range p.loads(t) {
			if l != (load{WorkerID: l.WorkerID}) {
				return false
			}
		}
		return true
	})
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

func (p *pool) chat(text string) []byte {
	return fmt.Appendf(nil, `{"model":%q,"stream":true,"messages":[{"role":"user","content":%q}]}`, p.model, text)
}

func (s *suite) start(t *testing.T, req *envoysim.Request) (*envoysim.Exchange, *envoysim.Decision) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	x, d, err := s.client.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	return x, d
}

// routed starts a request that must be routed (no immediate response).
func (s *suite) routed(t *testing.T, req *envoysim.Request) (*envoysim.Exchange, *envoysim.Decision) {
	t.Helper()
	x, d := s.start(t, req)
	if d.Immediate != nil {
		t.Fatalf("immediate response %d %s", d.Immediate.Status, d.Immediate.Body)
	}
	return x, d
}

func sse(n int) [][]byte {
	out := make([][]byte, 0, n+1)
	for i := range n {
		out = append(out, fmt.Appendf(nil, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}]}\n\n", i))
	}
	return append(out, []byte("data: [DONE]\n\n"))
}

var sseHeaders = []envoysim.Header{{Key: "content-type", Value: "text/event-stream"}}

// respond plays a streamed response and closes the exchange as Envoy does.
func respond(t *testing.T, x *envoysim.Exchange, served string, chunks [][]byte) []byte {
	t.Helper()
	if _, err := x.ResponseHeaders(envoysim.Response{Served: served, Headers: sseHeaders}, false); err != nil {
		t.Fatal(err)
	}
	var out []byte
	for i, c := range chunks {
		b, err := x.ResponseBody(c, i == len(chunks)-1)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b...)
	}
	x.Close()
	return out
}

func fallbacksConfigured() int {
	n, _ := strconv.Atoi(os.Getenv(envFallbacks))
	return n
}
