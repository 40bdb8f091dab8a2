package fleet

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/kvselect/kvselect/bench/mooncake"
	"github.com/kvselect/kvselect/internal/peerproc"
)

// Family is a kind of engine.
type Family string

// The engine families: kvselect's mock worker, and the llm-d project's vLLM
// simulator, an engine kvselect's authors did not write.
const (
	FamilyMock Family = "mock"
	FamilySim  Family = "llmd-sim"
)

// Noun names a family's engines in a report.
func (f Family) Noun() string {
	if f == FamilySim {
		return "llm-d-inference-sim engines"
	}
	return "mock workers"
}

// Models the engines serve: the mock worker's default, and a name the
// simulator's dummy tokenizer serves without a download.
const (
	MockModel = "mock-model"
	SimModel  = "fake-model"
)

// Engine is how every engine of a fleet runs: the mock worker's flags of
// these names, or the simulator's equivalents. Zero fields are left to the
// engine's defaults.
type Engine struct {
	BlockSize int
	// PoolBlocks is the KV pool: the mock's --num-gpu-blocks, the
	// simulator's --kv-cache-size.
	PoolBlocks int
	// PrefillPerToken and DecodePerToken are the timing model before
	// Speedup: the mock's --prefill-time-per-token and
	// --decode-time-per-token, the simulator's --prefill-time-per-token and
	// --inter-token-latency.
	PrefillPerToken, DecodePerToken time.Duration
	// Speedup is the mock's --speedup; the simulator, which has none, runs
	// the times divided by it.
	Speedup float64
	// MaxNumSeqs and MaxModelLen are the simulator's (and the mock's in
	// llm-d's topology); a registered mock worker takes them in Extra.
	MaxNumSeqs, MaxModelLen int
	// Extra are more mock worker flags, SimExtra more simulator flags.
	Extra, SimExtra []string
}

// MockWorkerArgs are a mock worker's flags for e, Extra last.
func (e Engine) MockWorkerArgs() []string {
	var args []string
	if e.BlockSize > 0 {
		args = append(args, "--block-size", strconv.Itoa(e.BlockSize))
	}
	if e.PoolBlocks > 0 {
		args = append(args, "--num-gpu-blocks", strconv.Itoa(e.PoolBlocks))
	}
	if e.Speedup > 0 {
		args = append(args, "--speedup", strconv.FormatFloat(e.Speedup, 'g', -1, 64))
	}
	args = append(args, "--prefill-time-per-token", e.PrefillPerToken.String(), "--decode-time-per-token", e.DecodePerToken.String())
	return append(args, e.Extra...)
}

// SimModelLen is a --max-model-len that admits every request of a trace
// slice sent with blockTokens tokens per trace block and at most maxOutput
// output tokens: the simulator refuses prompt + max_tokens above it (1024 by
// default).
func SimModelLen(reqs []mooncake.Request, blockTokens, maxOutput int) int {
	longest := 0
	for _, r := range reqs {
		longest = max(longest, len(r.HashIDs)*blockTokens)
	}
	return max(1024, longest+maxOutput+64)
}

// scaled is d divided by the speed-up, for engines that take no speed-up.
func (e Engine) scaled(d time.Duration) time.Duration {
	if e.Speedup > 0 {
		return time.Duration(float64(d) / e.Speedup)
	}
	return d
}

// CollectorEngine is an engine in llm-d's topology: its KV events dial a
// collector (kvselect's --kv-events-bind, or the endpoint picker's
// subscriber) under a topic naming its address, so a picker learns of it by
// registration, with its replay endpoint and no event endpoint of its own.
type CollectorEngine interface {
	URL() string
	HostPort() string
	ReplayEndpoint() string
	Stop()
}

// CollectorEngines is how to start engines in llm-d's topology.
type CollectorEngines struct {
	Binaries
	Family    Family
	N         int
	Collector string // the ZMQ endpoint their PUB sockets dial
	Engine    Engine
	// Dir holds their logs, named [Prefix-]sim-N.log or mockworker-N.log.
	Dir, Prefix string
	// Ports are the HTTP ports, chosen beforehand when a picker must know
	// the engines before they start; free ports when nil.
	Ports []int
}

// StartCollectorEngines starts the engines, each with a replay endpoint,
// and waits until each answers /health. On error it returns the ones that
// started, for the caller to stop.
func StartCollectorEngines(ctx context.Context, c CollectorEngines) ([]CollectorEngine, error) {
	var engines []CollectorEngine
	for i := range c.N {
		port := 0
		if i < len(c.Ports) {
			port = c.Ports[i]
		} else {
			var err error
			if port, err = peerproc.FreePort(); err != nil {
				return engines, err
			}
		}
		replay, err := peerproc.FreePort()
		if err != nil {
			return engines, err
		}
		e, err := c.start(ctx, i, port, replay)
		if err != nil {
			return engines, err
		}
		engines = append(engines, e)
	}
	return engines, nil
}

// start starts engine i with its log.
func (c CollectorEngines) start(ctx context.Context, i, port, replay int) (CollectorEngine, error) {
	name, what, hint := fmt.Sprintf("sim-%d", i+1), "llm-d-inference-sim", ""
	if c.Family == FamilyMock {
		name, what, hint = fmt.Sprintf("mockworker-%d", i+1), "kvselect-mockworker", "; build it with `make build`"
	}
	if c.Prefix != "" {
		name = c.Prefix + "-" + name
	}
	logPath := filepath.Join(c.Dir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	e := c.Engine
	var p CollectorEngine
	if c.Family == FamilyMock {
		p, err = peerproc.StartMockWorker(ctx, peerproc.MockWorker{
			Binary: c.MockWorker, Model: SimModel, Port: port, Collector: c.Collector, ReplayPort: replay,
			BlockSize: e.BlockSize, KVBlocks: e.PoolBlocks, PrefillPerToken: e.scaled(e.PrefillPerToken), DecodePerToken: e.scaled(e.DecodePerToken),
			MaxNumSeqs: e.MaxNumSeqs, MaxModelLen: e.MaxModelLen, Log: logf,
		})
	} else {
		p, err = peerproc.StartSim(ctx, peerproc.Sim{
			Binary: c.Sim, Model: SimModel, Port: port, ZMQEndpoint: c.Collector, ReplayPort: replay,
			BlockSize: e.BlockSize, KVCacheSize: e.PoolBlocks, Log: logf,
			Extra: append([]string{
				"--prefill-time-per-token", e.scaled(e.PrefillPerToken).String(),
				"--inter-token-latency", e.scaled(e.DecodePerToken).String(),
				"--max-num-seqs", strconv.Itoa(e.MaxNumSeqs),
				"--max-model-len", strconv.Itoa(e.MaxModelLen),
			}, e.SimExtra...),
		})
	}
	if err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s %d (log %s): %w%s", what, i+1, logPath, err, hint)
	}
	return loggedEngine{p, logf}, nil
}

// loggedEngine closes an engine's log when it stops.
type loggedEngine struct {
	CollectorEngine
	log io.Closer
}

func (e loggedEngine) Stop() {
	e.CollectorEngine.Stop()
	e.log.Close()
}

// RegisterCollectorEngine registers engine id with kvselect, fed through its
// collector: no kv_events_endpoint, the replay endpoint for catch-up.
func (k *KVSelect) RegisterCollectorEngine(ctx context.Context, id uint64, e CollectorEngine, blockSize, poolBlocks int) error {
	err := k.RegisterWorker(ctx, map[string]any{
		"worker_id": id, "model_name": SimModel, "endpoint": e.URL(), "replay_endpoint": e.ReplayEndpoint(),
		"block_size": blockSize, "total_kv_blocks": poolBlocks,
	})
	if err != nil {
		return fmt.Errorf("register %s: %w", e.URL(), err)
	}
	return nil
}

// EPP is llm-d's endpoint picker as a harness runs it: peerproc's
// configuration, its log at Dir/Name.log.
type EPP struct {
	peerproc.EPP
	Name string
}

// StartEPP starts llm-d's endpoint picker and waits until it serves; stop
// ends it and closes its log.
func StartEPP(ctx context.Context, c EPP) (p *peerproc.EPPProcess, stop func(), err error) {
	logf, err := os.Create(filepath.Join(c.Dir, c.Name+".log"))
	if err != nil {
		return nil, nil, err
	}
	c.EPP.Log = logf
	if p, err = peerproc.StartEPP(ctx, c.EPP); err != nil {
		logf.Close()
		return nil, nil, err
	}
	return p, func() { p.Stop(); logf.Close() }, nil
}
