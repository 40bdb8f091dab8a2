package engines

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
	"syscall"
	"testing"
	"time"

	"github.com/kvselect/kvselect/internal/peerproc"
	"github.com/kvselect/kvselect/internal/proctest"
)

const (
	model     = "fake-model"
	blockSize = 16
	// settle bounds how long the index may take to reflect an engine's
	// cache: the simulator flushes its event batches on a one-second timer.
	settle = 15 * time.Second
)

// kvselectBin is the kvselect binary the suite runs, built once by TestMain
// (or taken from KVSELECT_BIN).
var kvselectBin string

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if bin := os.Getenv("KVSELECT_BIN"); bin != "" {
		kvselectBin = bin
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "kvselect-engines-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	kvselectBin = filepath.Join(dir, "kvselect")
	build := exec.Command("go", "build", "-o", kvselectBin, "github.com/kvselect/kvselect/cmd/kvselect")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build kvselect:", err)
		return 1
	}
	return m.Run()
}

// ---- kvselect as a process ----

type kvselect struct {
	t       *testing.T
	rest    string // http://127.0.0.1:port
	extproc string // the ext_proc picker, 127.0.0.1:port
	collect string // the collector endpoint, when bound
	cmd     *exec.Cmd
	done    chan struct{}
	logs    *peerproc.LogBuffer
}

type kvselectOptions struct {
	collector   bool // --kv-events-bind on a fresh port
	collectorEP string
	workersFile string
	extra       []string
}

func startKvselect(t *testing.T, o kvselectOptions) *kvselect {
	t.Helper()
	port := proctest.FreePort(t)
	k := &kvselect{t: t, rest: "http://127.0.0.1:" + strconv.Itoa(port), logs: &peerproc.LogBuffer{}, done: make(chan struct{})}
	args := []string{"--host", "127.0.0.1", "--port", strconv.Itoa(port), "--log-level", "debug"}
	if o.collector {
		k.collect = o.collectorEP
		if k.collect == "" {
			k.collect = "tcp://127.0.0.1:" + strconv.Itoa(proctest.FreePort(t))
		}
		args = append(args, "--kv-events-bind", k.collect)
	}
	// The picker always listens (9002 by default): give it a port of its own.
	ep := proctest.FreePort(t)
	k.extproc = "127.0.0.1:" + strconv.Itoa(ep)
	args = append(args, "--extproc-port", strconv.Itoa(ep))
	if o.workersFile != "" {
		args = append(args, "--workers-file", o.workersFile)
	}
	args = append(args, o.extra...)
	k.cmd = exec.Command(kvselectBin, args...)
	k.cmd.Stdout, k.cmd.Stderr = k.logs, k.logs
	peerproc.DieWithParent(k.cmd)
	if err := k.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = k.cmd.Wait()
		close(k.done)
	}()
	t.Cleanup(func() {
		k.stop()
		if t.Failed() {
			t.Logf("kvselect log:\n%s", proctest.Tail(k.logs.String(), 6000))
		}
	})
	proctest.Eventually(t, "kvselect healthy", 30*time.Second, func() bool {
		select {
		case <-k.done:
			t.Fatal("kvselect exited")
		default:
		}
		resp, err := http.Get(k.rest + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return k
}

func (k *kvselect) stop() {
	select {
	case <-k.done:
		return
	default:
	}
	_ = k.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-k.done:
	case <-time.After(15 * time.Second):
		_ = k.cmd.Process.Kill()
		<-k.done
	}
}

// kill ends kvselect as a crash would.
func (k *kvselect) kill() {
	_ = k.cmd.Process.Kill()
	<-k.done
}

// do sends a JSON request and decodes a JSON answer into out (when non-nil).
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
	req, err := http.NewRequest(method, k.rest+path, body)
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

// register adds a simulator as worker id over REST, fed by the collector.
func (k *kvselect) register(s *peerproc.SimProcess, id uint64) {
	k.t.Helper()
	rec := workerRecord(s, id)
	var out map[string]any
	if code := k.do(http.MethodPost, "/workers", rec, &out); (code != http.StatusOK && code != http.StatusCreated) || out["lifecycle"] != "schedulable" {
		k.t.Fatalf("register %s: %d %v", s.URL(), code, out)
	}
}

func workerRecord(s *peerproc.SimProcess, id uint64) map[string]any {
	rec := map[string]any{
		"worker_id": id, "model_name": model, "endpoint": s.URL(), "block_size": blockSize,
	}
	if ep := s.ReplayEndpoint(); ep != "" {
		rec["replay_endpoint"] = ep
	}
	return rec
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
	switch code := k.do(http.MethodPost, "/overlap_scores", map[string]any{"model_name": model, "token_ids": tokens}, &out); code {
	case http.StatusOK:
	case http.StatusServiceUnavailable:
		// Healthy is not ready: discovery may not have read the workers
		// file yet. Nothing is indexed for anyone until it has.
		return map[uint64]int{}
	default:
		k.t.Fatalf("overlap_scores: %d", code)
	}
	m := map[uint64]int{}
	for _, w := range out.Workers {
		m[w.WorkerID] = w.DeviceBlocks
	}
	return m
}

// metric sums the samples of a Prometheus counter or gauge, optionally only
// those whose labels contain match.
func (k *kvselect) metric(name, match string) float64 {
	k.t.Helper()
	resp, err := http.Get(k.rest + "/metrics")
	if err != nil {
		k.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var sum float64
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		if match != "" && !strings.Contains(line, match) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

// collector is GET /kv_events/collector.
type collectorStatus struct {
	Received  uint64            `json:"received"`
	Delivered uint64            `json:"delivered"`
	Unmatched map[string]uint64 `json:"unmatched"`
}

func (k *kvselect) collector() collectorStatus {
	k.t.Helper()
	var st collectorStatus
	if code := k.do(http.MethodGet, "/kv_events/collector", nil, &st); code != http.StatusOK {
		k.t.Fatalf("GET /kv_events/collector: %d", code)
	}
	return st
}

// ---- simulators ----

type simOptions struct {
	mapEvents   bool
	noReplay    bool
	kvCacheSize int
	port        int // 0: a free one
	extra       []string
}

func startSim(t *testing.T, collectorEP string, o simOptions) *peerproc.SimProcess {
	t.Helper()
	bin := peerproc.SimBinary(t)
	port := o.port
	if port == 0 {
		port = proctest.FreePort(t)
	}
	cfg := peerproc.Sim{Binary: bin, Model: model, Port: port, ZMQEndpoint: collectorEP,
		BlockSize: blockSize, KVCacheSize: o.kvCacheSize, MapEvents: o.mapEvents, Extra: o.extra}
	if !o.noReplay {
		cfg.ReplayPort = proctest.FreePort(t)
	}
	return startSimWith(t, cfg)
}

func startSimWith(t *testing.T, cfg peerproc.Sim) *peerproc.SimProcess {
	t.Helper()
	logs := &peerproc.LogBuffer{}
	cfg.Log = logs
	s, err := peerproc.StartSim(context.Background(), cfg)
	if err != nil {
		t.Fatalf("%v\n%s", err, proctest.Tail(logs.String(), 4000))
	}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			t.Logf("simulator %s log:\n%s", s.URL(), proctest.Tail(logs.String(), 3000))
		}
	})
	return s
}

// complete sends a token-id completion straight to a simulator and returns
// the prompt tokens it reports as served from its prefix cache.
func complete(t *testing.T, s *peerproc.SimProcess, tokens []int) int {
	t.Helper()
	cached, err := tryComplete(s, tokens)
	if err != nil {
		t.Fatal(err)
	}
	return cached
}

// tryComplete is complete for any goroutine: it returns what went wrong
// instead of failing the test.
func tryComplete(s *peerproc.SimProcess, tokens []int) (cached int, err error) {
	b, _ := json.Marshal(map[string]any{"model": model, "prompt": tokens, "max_tokens": 2})
	resp, err := http.Post(s.URL()+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var out struct {
		Usage struct {
			PromptTokens  int `json:"prompt_tokens"`
			PromptDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("completion on %s: %d %s", s.URL(), resp.StatusCode, raw)
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return 0, err
	}
	if out.Usage.PromptTokens != len(tokens) {
		return 0, fmt.Errorf("the simulator counted %d prompt tokens, sent %d", out.Usage.PromptTokens, len(tokens))
	}
	return out.Usage.PromptDetails.CachedTokens, nil
}

// prompt is n token ids derived from seed: distinct seeds share nothing.
func prompt(seed, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = 1000 + seed*100_000 + i
	}
	return out
}
