// Package fleet starts, on loopback, the processes the harnesses measure:
// kvselect (the only place the benchmarks run its binary: KVSelect), the
// engines behind it — kvselect's mock workers, registered with it or in
// llm-d's topology, and llm-d-inference-sim — and llm-d's endpoint picker
// (StartEPP, through internal/peerproc). A Fleet is the common shape: one
// kvselect and its engines, waited for until kvselect routes to every one
// of them. Process is the restartable child process underneath, which the
// soak run also kills, pauses and restarts.
package fleet

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"

	"github.com/kvselect/kvselect/bench/relay"
	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/internal/peerproc"
)

// Config is a fleet to start.
type Config struct {
	Binaries
	Family  Family
	Workers int
	Engine  Engine
	// PerWorker, when set, adds mock worker flags of worker i (0-based).
	PerWorker func(i int) []string
	// Dir holds the logs: [Prefix-]kvselect.log, [Prefix-]worker-N.log,
	// [Prefix-]sim-N.log.
	Dir, Prefix  string
	KVSelectArgs []string
	// ExtProcTLS serves the picker over TLS (a self-signed certificate,
	// --extproc-secure-serving), which Conn dials without verifying it.
	ExtProcTLS bool
	// HTTP is the client for kvselect's REST API and the engines.
	HTTP *http.Client
	// Progress hears what started and where the status page is; nil: nothing.
	Progress io.Writer
}

// Fleet is a running kvselect and its engines.
type Fleet struct {
	KV      *KVSelect
	Model   string   // what the engines serve
	Workers []string // host:port of each engine, worker id i+1 at index i
	HTTP    *http.Client
	Conn    *grpc.ClientConn // to the picker, as Envoy dials it (TLS with Config.ExtProcTLS)
	procs   []*Process
	engines []CollectorEngine
}

// Start starts kvselect and the engines and waits until kvselect sees every
// engine's KV events. Mock workers register themselves and publish on
// sockets kvselect subscribes to; simulators dial kvselect's KV events
// collector (--kv-events-bind, llm-d's topology) and are registered over
// REST, their replay endpoints letting kvselect catch up on what they
// published before.
func Start(ctx context.Context, c Config) (_ *Fleet, err error) {
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return nil, err
	}
	fl := &Fleet{Model: MockModel, HTTP: c.HTTP}
	if fl.HTTP == nil {
		fl.HTTP = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxIdleConns: 1024}}
	}
	defer func() {
		if err != nil {
			fl.Stop()
		}
	}()
	ports, err := FreePorts(3)
	if err != nil {
		return nil, err
	}
	var collector string
	args := c.KVSelectArgs
	if c.Family == FamilySim {
		fl.Model, collector = SimModel, "tcp://127.0.0.1:"+strconv.Itoa(ports[2])
		args = append([]string{"--kv-events-bind", collector}, args...)
	}
	if c.ExtProcTLS {
		args = append([]string{"--extproc-secure-serving"}, args...)
	}
	if fl.KV, err = StartKVSelect(ctx, KVSelectConfig{Binary: c.KVSelect, Name: c.name("kvselect"), Dir: c.Dir,
		Port: ports[0], ExtProcPort: ports[1], Args: args, HTTP: fl.HTTP}); err != nil {
		return nil, err
	}
	if c.Family == FamilySim {
		err = fl.startSims(ctx, c, collector)
	} else {
		err = fl.startMockWorkers(c)
	}
	if err != nil {
		return nil, err
	}
	if c.Progress != nil {
		if c.Family == FamilySim {
			fmt.Fprintf(c.Progress, "%s: started kvselect (REST %s, ext_proc %s, KV events collector %s) and %d %s; waiting for their KV event streams...\n",
				c.Prefix, fl.KV.REST, fl.KV.ExtProc, collector, c.Workers, c.Family.Noun())
		} else {
			fmt.Fprintf(c.Progress, "started kvselect (REST %s, ext_proc %s) and %d %s; waiting for their KV event streams...\n",
				fl.KV.REST, fl.KV.ExtProc, c.Workers, c.Family.Noun())
		}
		fmt.Fprintf(c.Progress, "status page (live while this runs): %s/ui/\n", fl.KV.REST)
	}
	if err := fl.KV.WaitWorkers(ctx, c.Workers, 60*time.Second); err != nil {
		return nil, fmt.Errorf("%w (logs in %s)", err, c.Dir)
	}
	if fl.Conn, err = fl.KV.Dial(c.ExtProcTLS); err != nil {
		return nil, err
	}
	return fl, nil
}

// name is a log's name under the fleet's prefix.
func (c Config) name(n string) string {
	if c.Prefix == "" {
		return n
	}
	return c.Prefix + "-" + n
}

// startMockWorkers starts the mock workers, each registering itself with
// kvselect as worker i+1 on a free port.
func (fl *Fleet) startMockWorkers(c Config) error {
	for i := range c.Workers {
		port, err := peerproc.FreePort()
		if err != nil {
			return err
		}
		args := append([]string{"--host", "127.0.0.1", "--port", strconv.Itoa(port), "--worker-id", strconv.Itoa(i + 1),
			"--register", fl.KV.REST, "--log-level", "warn"}, c.Engine.MockWorkerArgs()...)
		if c.PerWorker != nil {
			args = append(args, c.PerWorker(i)...)
		}
		p := NewProcess(c.name(fmt.Sprintf("worker-%d", i+1)), c.MockWorker, c.Dir, args...)
		if err := p.Start(); err != nil {
			return err
		}
		fl.procs = append(fl.procs, p)
		fl.Workers = append(fl.Workers, "127.0.0.1:"+strconv.Itoa(port))
	}
	return nil
}

// startSims starts the simulators, their PUB sockets dialing kvselect's
// collector (bound already, so nothing they publish is lost), and registers
// each: kvselect matches the topic of each message, kv@<host>:<port>@<model>,
// to the worker whose endpoint has that host:port.
func (fl *Fleet) startSims(ctx context.Context, c Config, collector string) error {
	engines, err := StartCollectorEngines(ctx, CollectorEngines{Binaries: c.Binaries, Family: FamilySim, N: c.Workers,
		Collector: collector, Engine: c.Engine, Dir: c.Dir, Prefix: c.Prefix})
	fl.engines = engines
	if err != nil {
		return err
	}
	for i, e := range engines {
		fl.Workers = append(fl.Workers, e.HostPort())
		if err := fl.KV.RegisterCollectorEngine(ctx, uint64(i+1), e, c.Engine.BlockSize, c.Engine.PoolBlocks); err != nil {
			return err
		}
	}
	return nil
}

// Stop ends the engines first (mock workers deregister), then kvselect.
func (fl *Fleet) Stop() {
	if fl.Conn != nil {
		fl.Conn.Close()
	}
	for _, e := range fl.engines {
		e.Stop()
	}
	for i := len(fl.procs) - 1; i >= 0; i-- {
		fl.procs[i].Stop(10 * time.Second)
	}
	if fl.KV != nil {
		fl.KV.Stop()
	}
}

// Relay sends requests through the fleet's picker to its engines, as Envoy
// does.
func (fl *Fleet) Relay() *relay.Relay {
	return &relay.Relay{Picker: envoysim.New(fl.Conn), HTTP: fl.HTTP}
}

// Worker is the index of the engine at host:port, -1 for none.
func (fl *Fleet) Worker(endpoint string) int {
	for i, w := range fl.Workers {
		if w == endpoint {
			return i
		}
	}
	return -1
}

// WorkerByID is the index of the mock worker that named itself id (its
// x-kvselect-worker-id, i+1 for index i), -1 for none.
func (fl *Fleet) WorkerByID(id string) int {
	n, err := strconv.Atoi(id)
	if err != nil || n < 1 || n > len(fl.Workers) {
		return -1
	}
	return n - 1
}

// EngineRequests sums the requests the workers hold, running and waiting.
func (fl *Fleet) EngineRequests(ctx context.Context) (float64, error) {
	return EngineRequests(ctx, fl.HTTP, fl.Workers)
}

// CacheCounters sums the engines' prefix-cache counters (tokens).
func (fl *Fleet) CacheCounters(ctx context.Context) (queries, hits float64, err error) {
	return CacheCounters(ctx, fl.HTTP, fl.Workers)
}

// ResetCaches empties every mock worker's prefix cache (vLLM's POST
// /reset_prefix_cache); the workers publish AllBlocksCleared, so kvselect's
// index empties too.
func (fl *Fleet) ResetCaches(ctx context.Context) error {
	for _, w := range fl.Workers {
		status, body, err := Call(ctx, fl.HTTP, http.MethodPost, "http://"+w+"/reset_prefix_cache", nil)
		if err == nil && status != http.StatusOK {
			err = fmt.Errorf("%d %.200s", status, body)
		}
		if err != nil {
			return fmt.Errorf("reset %s: %w", w, err)
		}
	}
	return nil
}

// SetFailRate makes mock worker id (1-based) fail that share of its
// requests with a 500 (POST /admin/faults).
func (fl *Fleet) SetFailRate(ctx context.Context, id int, rate float64) error {
	status, body, err := Call(ctx, fl.HTTP, http.MethodPost, "http://"+fl.Workers[id-1]+"/admin/faults", fmt.Appendf(nil, `{"fail_rate":%g}`, rate))
	if err == nil && status != http.StatusOK {
		err = fmt.Errorf("%d %s", status, strings.TrimSpace(string(body)))
	}
	if err != nil {
		return fmt.Errorf("set faults of worker %d: %w", id, err)
	}
	return nil
}
