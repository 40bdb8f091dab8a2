// Package peerproc runs third-party peers as real processes on loopback, for
// the interop tests and the side-by-side benchmarks: llm-d-inference-sim (the
// llm-d project's vLLM simulator, which publishes real KV events) and llm-d's
// endpoint picker, plus kvselect's own mock worker set up the way the
// simulator runs (mockworker.go). Third-party binaries are found through
// environment variables, so that a test skips with a clear message where a
// peer is not installed and fails where CI requires it.
package peerproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvselect/kvselect/internal/logwatch"
)

// Environment variables naming the peer binaries, and the switches that make
// a missing binary a failure instead of a skip.
const (
	EnvSim        = "KVSELECT_LLMD_SIM"
	EnvEPP        = "KVSELECT_LLMD_EPP"
	EnvRequireSim = "KVSELECT_REQUIRE_LLMD_SIM"
	EnvRequireAll = "KVSELECT_REQUIRE_PEERS"
	// EnvRequireObserve makes a missing Prometheus, promtool or Chromium
	// (ObserveTool) a failure.
	EnvRequireObserve = "KVSELECT_REQUIRE_OBSERVE"
)

// simHowTo says where the simulator comes from when it is missing.
const simHowTo = "build it from github.com/llm-d/llm-d-inference-sim " +
	"(CGO_ENABLED=0 go build ./cmd/llm-d-inference-sim) and set " + EnvSim + " to the binary"

const eppHowTo = "build it from github.com/llm-d/llm-d-router " +
	"(CGO_ENABLED=0 go build ./cmd/epp) and set " + EnvEPP + " to the binary"

// SimBinary returns the simulator's path from KVSELECT_LLMD_SIM. Without it
// the test is skipped, or fails when KVSELECT_REQUIRE_LLMD_SIM or
// KVSELECT_REQUIRE_PEERS is set.
func SimBinary(tb testing.TB) string {
	tb.Helper()
	return binary(tb, EnvSim, simHowTo, EnvRequireSim, EnvRequireAll)
}

// EPPBinary returns llm-d's endpoint picker from KVSELECT_LLMD_EPP; skipped
// without it unless KVSELECT_REQUIRE_PEERS is set.
func EPPBinary(tb testing.TB) string {
	tb.Helper()
	return binary(tb, EnvEPP, eppHowTo, EnvRequireAll)
}

// ObserveTool returns the path of an observability tool on PATH:
// prometheus or promtool (Debian's prometheus package) or chromium. Without
// it the test is skipped, or fails when KVSELECT_REQUIRE_OBSERVE is set.
func ObserveTool(tb testing.TB, name string) string {
	tb.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	const howTo = "apt install prometheus chromium"
	if os.Getenv(EnvRequireObserve) != "" {
		tb.Fatalf("%s not found (required: %s is set); %s", name, EnvRequireObserve, howTo)
		return ""
	}
	tb.Skipf("%s not found; %s (%s=1 makes this a failure)", name, howTo, EnvRequireObserve)
	return ""
}

func binary(tb testing.TB, env, howTo string, require ...string) string {
	tb.Helper()
	path := os.Getenv(env)
	var problem string
	if path == "" {
		problem = env + " is not set"
	} else if st, err := os.Stat(path); err != nil {
		problem = fmt.Sprintf("%s=%s: %v", env, path, err)
	} else if st.IsDir() || st.Mode()&0o111 == 0 {
		problem = fmt.Sprintf("%s=%s is not an executable file", env, path)
	}
	if problem == "" {
		return path
	}
	for _, r := range require {
		if os.Getenv(r) != "" {
			tb.Fatalf("%s (required: %s is set); %s", problem, r, howTo)
			return ""
		}
	}
	tb.Skipf("%s; %s", problem, howTo)
	return ""
}

// FreePort returns a TCP port that was free on 127.0.0.1 a moment ago. The
// simulator rejects --port 0, and its KV event topic names its port, so ports
// are chosen before it starts.
//
// The port comes from below the kernel's ephemeral range when it can: a
// port the kernel hands out for ":0" is one it also hands out as the source
// port of outgoing connections, and on a machine running many tests one of
// those can take it in the seconds before the process that was meant to
// listen there starts.
//
// A port is never handed out twice in one process: it is only checked free,
// not held, so two calls a moment apart could otherwise both return it (a
// simulator was once given the same port for its HTTP server and its replay
// socket, and failed to start).
func FreePort() (int, error) {
	issued.Lock()
	defer issued.Unlock()
	if issued.ports == nil {
		issued.ports = make(map[int]bool)
	}
	lo, hi := 10000, ephemeralStart()-1
	for range 64 {
		if hi <= lo {
			break
		}
		port := lo + rand.IntN(hi-lo+1)
		if issued.ports[port] {
			continue
		}
		if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port)); err == nil {
			l.Close()
			issued.ports[port] = true
			return port, nil
		}
	}
	for range 64 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !issued.ports[port] {
			issued.ports[port] = true
			return port, nil
		}
	}
	return 0, errors.New("free port: every port the kernel offered was handed out before")
}

// issued is the set of ports FreePort has returned in this process. It is
// package state because what it guards is: ports are one namespace for the
// whole process (and machine), whichever test or harness asks.
var issued struct {
	sync.Mutex
	ports map[int]bool
}

// ephemeralStart is the first port of the kernel's ephemeral range (Linux's
// ip_local_port_range; 32768, its default, elsewhere or when unreadable).
func ephemeralStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n < 1024 {
		return 32768
	}
	return n
}

// Sim configures one llm-d-inference-sim process.
type Sim struct {
	Binary string
	Model  string // served model name ("fake-model" when empty)
	Port   int    // HTTP port; required (the simulator rejects 0)
	// ZMQEndpoint is the collector its PUB socket dials (tcp://127.0.0.1:N).
	ZMQEndpoint string
	// ReplayPort, when set, binds its replay ROUTER on 127.0.0.1.
	ReplayPort  int
	BlockSize   int  // 16 when 0
	KVCacheSize int  // blocks; 1024 when 0
	MapEvents   bool // --use-vllm-map-event-format
	Extra       []string
	// Log receives the process's stdout and stderr; discarded when nil.
	Log io.Writer
}

// SimProcess is a running simulator.
type SimProcess struct {
	*Engine
	cfg Sim
}

// Config returns what it was started with.
func (p *SimProcess) Config() Sim { return p.cfg }

// withDefaults fills in the defaults the fields document.
func (cfg Sim) withDefaults() Sim {
	if cfg.Model == "" {
		cfg.Model = "fake-model"
	}
	if cfg.BlockSize == 0 {
		cfg.BlockSize = 16
	}
	if cfg.KVCacheSize == 0 {
		cfg.KVCacheSize = 1024
	}
	return cfg
}

// SimArgs is the command line and the environment StartSim runs, defaults
// filled in.
func SimArgs(cfg Sim) (args, env []string) {
	cfg = cfg.withDefaults()
	args = []string{
		"--model", cfg.Model, "--force-dummy-tokenizer",
		"--port", strconv.Itoa(cfg.Port),
		"--enable-kvcache", "--kv-cache-size", strconv.Itoa(cfg.KVCacheSize),
		"--block-size", strconv.Itoa(cfg.BlockSize),
	}
	if cfg.ZMQEndpoint != "" {
		args = append(args, "--zmq-endpoint", cfg.ZMQEndpoint)
	}
	if cfg.ReplayPort != 0 {
		args = append(args, "--kv-events-replay-endpoint", "tcp://127.0.0.1:"+strconv.Itoa(cfg.ReplayPort))
	}
	if cfg.MapEvents {
		args = append(args, "--use-vllm-map-event-format")
	}
	// The topic names POD_IP; without it the simulator does not start.
	return append(args, cfg.Extra...), []string{"POD_IP=127.0.0.1"}
}

// StartSim starts a simulator and waits until GET /health answers 200.
func StartSim(ctx context.Context, cfg Sim) (*SimProcess, error) {
	cfg = cfg.withDefaults()
	if cfg.Port == 0 {
		return nil, errors.New("peerproc: the simulator needs a port (it rejects 0)")
	}
	args, env := SimArgs(cfg)
	e, err := startEngine(ctx, "simulator", cfg.Binary, args, env, cfg.Log, cfg.Port, cfg.ReplayPort, cfg.Model)
	if err != nil {
		return nil, err
	}
	return &SimProcess{Engine: e, cfg: cfg}, nil
}

// Engine is a running engine process on loopback: the simulator or the mock
// worker, serving HTTP on its port, publishing KV events under llm-d's topic
// and, with a replay port, answering replays.
type Engine struct {
	port, replayPort int
	model            string
	cmd              *exec.Cmd
	done             chan struct{}
}

// URL is the engine's HTTP base URL.
func (e *Engine) URL() string { return "http://127.0.0.1:" + strconv.Itoa(e.port) }

// HostPort is its address as its KV event topic names it.
func (e *Engine) HostPort() string { return "127.0.0.1:" + strconv.Itoa(e.port) }

// ReplayEndpoint is its replay ROUTER, "" when it has none.
func (e *Engine) ReplayEndpoint() string {
	if e.replayPort == 0 {
		return ""
	}
	return "tcp://127.0.0.1:" + strconv.Itoa(e.replayPort)
}

// Topic is the topic its KV events carry: kv@127.0.0.1:<port>@<model>.
func (e *Engine) Topic() string { return "kv@" + e.HostPort() + "@" + e.model }

// startEngine runs bin with args (and env added to the environment), its
// output to log, and waits until GET /health answers 200: the simulator exits
// 0 even when its startup fails, so health, not the exit status, says whether
// it runs.
func startEngine(ctx context.Context, what, bin string, args, env []string, log io.Writer, port, replayPort int, model string) (*Engine, error) {
	cmd := exec.Command(bin, args...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	e := &Engine{port: port, replayPort: replayPort, model: model, cmd: cmd}
	done, err := launch(ctx, cmd, log, e.URL()+"/health")
	if err != nil {
		return nil, fmt.Errorf("peerproc: %s on port %d: %w", what, port, err)
	}
	e.done = done
	return e, nil
}

// launch starts cmd, its output to log (nil: discarded), and waits until GET
// healthURL answers 200; done closes when the process has exited. On an error
// the process is stopped.
func launch(ctx context.Context, cmd *exec.Cmd, log io.Writer, healthURL string) (done chan struct{}, err error) {
	if log == nil {
		log = io.Discard
	}
	cmd.Stdout, cmd.Stderr = log, log
	DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	done = make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	if err := waitHealthy(ctx, healthURL, done); err != nil {
		stop(cmd, done)
		return nil, err
	}
	return done, nil
}

// Helper is a process of this repository's own started by StartHelper (a
// bench harness's picker, for one).
type Helper struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// StartHelper runs argv, its output to log, and waits until GET healthURL
// answers 200.
func StartHelper(ctx context.Context, what string, argv []string, log io.Writer, healthURL string) (*Helper, error) {
	if len(argv) == 0 {
		return nil, fmt.Errorf("peerproc: %s: no command", what)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	done, err := launch(ctx, cmd, log, healthURL)
	if err != nil {
		return nil, fmt.Errorf("peerproc: %s: %w", what, err)
	}
	return &Helper{cmd: cmd, done: done}, nil
}

// Pid is the process id.
func (h *Helper) Pid() int { return h.cmd.Process.Pid }

// Stop ends the process (SIGTERM, then SIGKILL after 5 s) and waits for it.
func (h *Helper) Stop() { stop(h.cmd, h.done) }

// Stop ends the process (SIGTERM, then SIGKILL after 5 s) and waits for it.
func (e *Engine) Stop() { stop(e.cmd, e.done) }

// Kill ends the process with SIGKILL, as a crash would.
func (e *Engine) Kill() {
	_ = e.cmd.Process.Kill()
	<-e.done
}

func stop(cmd *exec.Cmd, done chan struct{}) {
	select {
	case <-done:
		return
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// waitHealthy polls url until it answers 200, the process exits, or ctx ends
// (30 s at most).
func waitHealthy(ctx context.Context, url string, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	client := &http.Client{Timeout: time.Second}
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-exited:
			return errors.New("exited before it was healthy")
		case <-ctx.Done():
			return fmt.Errorf("not healthy: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// LogBuffer keeps what a process printed, for a test to show when it fails;
// safe for concurrent writes.
type LogBuffer = logwatch.Buffer
