package gateways

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvselect/kvselect/bench/ngf"
	"github.com/kvselect/kvselect/internal/peerproc"
	"github.com/kvselect/kvselect/internal/proctest"
)

const (
	// Environment: the binaries under test (built when unset).
	envKvselectBin    = "KVSELECT_BIN"
	envMockWorkerBin  = "KVSELECT_MOCKWORKER_BIN"
	model             = "fake-model"
	blockSize         = 16
	requestTimeout    = 30 * time.Second
	processStartLimit = 30 * time.Second
)

// bins are the kvselect and mock worker binaries the tests run.
type bins struct {
	kvselect, mockWorker string
}

// lazyBins builds the binaries on the first test that needs them: `make test`'s
// parallel package run compiles this package but skips its tests, and should
// not pay for two builds it never uses.
type lazyBins struct {
	once sync.Once
	dir  string // where they were built; removed by TestMain
	b    bins
	err  error
}

// binaries is filled once, by the first test that runs, and only read after.
var binaries lazyBins

func TestMain(m *testing.M) {
	code := m.Run()
	if binaries.dir != "" {
		_ = os.RemoveAll(binaries.dir)
	}
	os.Exit(code)
}

// built returns kvselect and the mock worker from KVSELECT_BIN and
// KVSELECT_MOCKWORKER_BIN, or built from this module.
func built(t *testing.T) bins {
	t.Helper()
	binaries.once.Do(func() { binaries.b, binaries.err = binaries.build() })
	if binaries.err != nil {
		t.Fatal(binaries.err)
	}
	return binaries.b
}

func (l *lazyBins) build() (bins, error) {
	b := bins{kvselect: os.Getenv(envKvselectBin), mockWorker: os.Getenv(envMockWorkerBin)}
	for _, p := range []struct {
		path *string
		pkg  string
	}{
		{&b.kvselect, "github.com/kvselect/kvselect/cmd/kvselect"},
		{&b.mockWorker, "github.com/kvselect/kvselect/cmd/kvselect-mockworker"},
	} {
		if *p.path != "" {
			continue
		}
		if l.dir == "" {
			dir, err := os.MkdirTemp("", "kvselect-gateways-")
			if err != nil {
				return b, err
			}
			l.dir = dir
		}
		*p.path = filepath.Join(l.dir, filepath.Base(p.pkg))
		out, err := exec.Command("go", "build", "-o", *p.path, p.pkg).CombinedOutput()
		if err != nil {
			return b, fmt.Errorf("build %s: %w\n%s", p.pkg, err, out)
		}
	}
	return b, nil
}

// ngfDir returns the shim's folder, or why the gateway cannot run here.
func ngfDir() (dir, problem string) {
	dir = os.Getenv(ngf.EnvShimDir)
	if err := ngf.Check(dir); err != nil {
		return "", err.Error()
	}
	return dir, ""
}

// needNGF skips the test when NGF cannot run here, or fails it when the
// gateway is required.
func needNGF(t *testing.T) string {
	t.Helper()
	dir, problem := ngfDir()
	if problem == "" {
		return dir
	}
	if ngf.Required() {
		t.Fatalf("%s (required: %s or %s is set)", problem, ngf.EnvRequire, peerproc.EnvRequireAll)
	}
	t.Skipf("%s (%s=1 makes this a failure)", problem, ngf.EnvRequire)
	return ""
}

// ---- the gateway: NGF's shim and NGINX running epp.js ----

type gateway struct {
	url string // http://127.0.0.1:port, NGINX's listener
	ngf *ngf.Gateway
}

// startGateway starts NGF's shim and an NGINX whose configuration is NGF's
// example with this test's ports, asking the picker at extproc (bench/ngf,
// which kvbench demo -gateway nginx starts the same way).
func startGateway(t *testing.T, shimDir string, extproc string) *gateway {
	t.Helper()
	return startGatewayWith(t, ngf.Config{ShimDir: shimDir, ExtProc: extproc})
}

// startGatewayWith is startGateway with the rest of c (TLS to the picker).
func startGatewayWith(t *testing.T, c ngf.Config) *gateway {
	t.Helper()
	c.Dir = t.TempDir()
	ng, err := ngf.Start(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	g := &gateway{url: ng.URL, ngf: ng}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("nginx error.log:\n%s", proctest.Tail(g.errorLog(t), 4000))
		}
		ng.Stop()
	})
	return g
}

func (g *gateway) errorLog(t *testing.T) string {
	t.Helper()
	log, err := g.ngf.ErrorLog()
	if err != nil {
		t.Fatal(err)
	}
	return log
}

// ---- kvselect ----

type kvselect struct {
	t                      *testing.T
	restPort, extprocPort  int
	collector, workersFile string
	extra                  []string
	env                    []string
	cmd                    *exec.Cmd
	done                   chan struct{}
	logs                   *peerproc.LogBuffer
}

// newKvselect picks kvselect's ports and its workers file; start runs it.
// The ports and the file stay the same across restarts, as a Deployment's
// would.
func newKvselect(t *testing.T, extra []string, env ...string) *kvselect {
	t.Helper()
	k := &kvselect{t: t, restPort: proctest.FreePort(t), extprocPort: proctest.FreePort(t),
		collector:   "tcp://127.0.0.1:" + strconv.Itoa(proctest.FreePort(t)),
		workersFile: filepath.Join(t.TempDir(), "workers.json"), extra: extra, env: env}
	k.writeWorkers(nil)
	return k
}

func (k *kvselect) rest() string    { return "http://127.0.0.1:" + strconv.Itoa(k.restPort) }
func (k *kvselect) extproc() string { return "127.0.0.1:" + strconv.Itoa(k.extprocPort) }

// writeWorkers replaces the workers file kvselect discovers its workers in.
func (k *kvselect) writeWorkers(workers []map[string]any) {
	k.t.Helper()
	if workers == nil {
		workers = []map[string]any{}
	}
	raw, err := json.Marshal(map[string]any{"workers": workers})
	if err != nil {
		k.t.Fatal(err)
	}
	if err := os.WriteFile(k.workersFile, raw, 0o600); err != nil {
		k.t.Fatal(err)
	}
}

func (k *kvselect) start() {
	t := k.t
	t.Helper()
	args := []string{"--host", "127.0.0.1", "--port", strconv.Itoa(k.restPort),
		"--extproc-port", strconv.Itoa(k.extprocPort), "--kv-events-bind", k.collector,
		"--workers-file", k.workersFile, "--log-level", "debug", "--log-format", "json"}
	k.logs = &peerproc.LogBuffer{}
	k.cmd = exec.Command(built(t).kvselect, append(args, k.extra...)...)
	k.cmd.Env = append(os.Environ(), k.env...)
	k.cmd.Stdout, k.cmd.Stderr = k.logs, k.logs
	k.done = startProcess(t, "kvselect", k.cmd, k.logs)
	proctest.Eventually(t, "kvselect healthy", processStartLimit, func() bool {
		select {
		case <-k.done:
			t.Fatalf("kvselect exited:\n%s", proctest.Tail(k.logs.String(), 4000))
		default:
		}
		resp, err := http.Get(k.rest() + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// kill ends kvselect as a crash would.
func (k *kvselect) kill() {
	_ = k.cmd.Process.Kill()
	<-k.done
}

// decisions returns the workers kvselect's ext_proc front routed to, in
// order, from its "extproc: routed" log records.
func (k *kvselect) decisions() []decision {
	var out []decision
	for line := range strings.SplitSeq(k.logs.String(), "\n") {
		var rec struct {
			Msg         string `json:"msg"`
			WorkerID    uint64 `json:"worker_id"`
			Destination string `json:"destination"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "extproc: routed" {
			out = append(out, decision{rec.WorkerID, rec.Destination})
		}
	}
	return out
}

type decision struct {
	workerID    uint64
	destination string // host:port
}

// decisionAfter waits for the routing record after the first n and wants
// exactly one.
func (k *kvselect) decisionAfter(n int) decision {
	k.t.Helper()
	var d []decision
	proctest.Eventually(k.t, "kvselect's routing record", 5*time.Second, func() bool { d = k.decisions(); return len(d) > n })
	if len(d) != n+1 {
		k.t.Fatalf("%d routing decisions for one request: %v", len(d)-n, d[n:])
	}
	return d[n]
}

// do sends a JSON request to the REST API and decodes the answer into out.
func (k *kvselect) do(method, path string, in, out any) int {
	k.t.Helper()
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			k.t.Fatal(err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, k.rest()+path, body)
	if err != nil {
		k.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		k.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			k.t.Fatalf("%s %s: %d %s: %v", method, path, resp.StatusCode, raw, err)
		}
	}
	return resp.StatusCode
}

// overlaps returns the device blocks every worker holds of tokens.
func (k *kvselect) overlaps(tokens []int) map[uint64]int {
	k.t.Helper()
	var out struct {
		Workers []struct {
			WorkerID     uint64 `json:"worker_id"`
			DeviceBlocks int    `json:"device_blocks"`
		} `json:"workers"`
	}
	m := map[uint64]int{}
	if code := k.do(http.MethodPost, "/overlap_scores", map[string]any{"model_name": model, "token_ids": tokens}, &out); code != http.StatusOK {
		return m // not ready yet: nothing indexed for anyone
	}
	for _, w := range out.Workers {
		m[w.WorkerID] = w.DeviceBlocks
	}
	return m
}

// activeRequests is the sum of active_requests over GET /loads.
func (k *kvselect) activeRequests() uint64 {
	k.t.Helper()
	var loads []struct {
		Loads []struct {
			ActiveRequests uint64 `json:"active_requests"`
		} `json:"loads"`
	}
	if code := k.do(http.MethodGet, "/loads", nil, &loads); code != http.StatusOK {
		k.t.Fatalf("GET /loads: %d", code)
	}
	var n uint64
	for _, m := range loads {
		for _, l := range m.Loads {
			n += l.ActiveRequests
		}
	}
	return n
}

// schedulable waits until kvselect lists n schedulable workers.
func (k *kvselect) schedulable(n int) {
	k.t.Helper()
	proctest.Eventually(k.t, fmt.Sprintf("%d schedulable workers", n), processStartLimit, func() bool {
		var ws []struct {
			Lifecycle string `json:"lifecycle"`
		}
		if k.do(http.MethodGet, "/workers", nil, &ws) != http.StatusOK {
			return false
		}
		got := 0
		for _, w := range ws {
			if w.Lifecycle == "schedulable" {
				got++
			}
		}
		return got == n
	})
}

// ---- engines ----

// engine is one inference engine behind the gateway.
type engine struct {
	id       uint64
	hostPort string
	replay   string
}

func (e engine) record() map[string]any {
	return map[string]any{"worker_id": e.id, "model_name": model, "endpoint": "http://" + e.hostPort,
		"block_size": blockSize, "replay_endpoint": e.replay}
}

// startMockWorkers starts n mock workers with ids 1..n whose KV events dial
// kvselect's collector (so kvselect runs first: a mock worker exits when its
// first dial is refused), and lists them in kvselect's workers file. Every
// output token takes decode, so that a stream is a stream.
func startMockWorkers(t *testing.T, k *kvselect, n int, decode time.Duration) []engine {
	t.Helper()
	var out []engine
	var records []map[string]any
	for i := range n {
		logs := &peerproc.LogBuffer{}
		cfg := peerproc.MockWorker{Binary: built(t).mockWorker, Model: model, Port: proctest.FreePort(t),
			Collector: k.collector, ReplayPort: proctest.FreePort(t), BlockSize: blockSize, DecodePerToken: decode,
			// The worker names itself in every response
			// (x-kvselect-worker-id): the evidence of who served.
			Extra: []string{"--worker-id", strconv.Itoa(i + 1)}, Log: logs}
		w, err := peerproc.StartMockWorker(context.Background(), cfg)
		if err != nil {
			t.Fatalf("%v\n%s", err, proctest.Tail(logs.String(), 3000))
		}
		t.Cleanup(func() {
			w.Stop()
			if t.Failed() {
				t.Logf("mock worker %d log:\n%s", i+1, proctest.Tail(logs.String(), 2000))
			}
		})
		e := engine{id: uint64(i + 1), hostPort: w.HostPort(), replay: w.ReplayEndpoint()}
		out = append(out, e)
		records = append(records, e.record())
	}
	k.writeWorkers(records)
	return out
}

// ---- clients ----

type answer struct {
	status int
	header http.Header
	body   string
}

// post sends body to the gateway at /v1/completions.
func post(t *testing.T, url string, body []byte) answer {
	t.Helper()
	a, err := tryPost(url, body)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func tryPost(url string, body []byte) (answer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{}, fmt.Errorf("POST %s/v1/completions: %w", url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, fmt.Errorf("read the answer: %w", err)
	}
	return answer{resp.StatusCode, resp.Header, string(raw)}, nil
}

func completion(tokens []int, maxTokens int, stream bool) []byte {
	b, _ := json.Marshal(map[string]any{"model": model, "prompt": tokens, "max_tokens": maxTokens, "stream": stream})
	return b
}

// prompt is n (< 256) token ids derived from seed (< 120): distinct seeds
// share nothing, and every id is inside the engines' 32,000-token vocabulary.
func prompt(seed, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = 100 + seed*256 + i
	}
	return out
}

// ---- processes and small helpers ----

// startProcess starts cmd, stops it when the test ends (SIGTERM, then
// SIGKILL) and returns a channel closed when it has exited.
func startProcess(t *testing.T, name string, cmd *exec.Cmd, logs *peerproc.LogBuffer) chan struct{} {
	t.Helper()
	peerproc.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, proctest.Tail(logs.String(), 4000))
		}
	})
	return done
}
