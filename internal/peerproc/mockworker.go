package peerproc

import (
	"context"
	"errors"
	"io"
	"strconv"
	"time"
)

// MockWorker configures one kvselect-mockworker process (cmd/kvselect-mockworker)
// in llm-d's topology: its KV event PUB socket dials a collector under llm-d's
// topic, as an llm-d-inference-sim does, so that a benchmark can put either
// behind the same picker.
type MockWorker struct {
	Binary string
	Model  string // served model name ("fake-model" when empty)
	// Port is the HTTP port; required, because the topic names it and the
	// picker must know the endpoint before the worker starts.
	Port int
	// Collector is the ZMQ endpoint its PUB socket dials (tcp://127.0.0.1:N).
	Collector string
	// ReplayPort, when set, binds its replay ROUTER on 127.0.0.1.
	ReplayPort int
	BlockSize  int // 16 when 0
	KVBlocks   int // --num-gpu-blocks; 1024 when 0
	// The timing model (the mock's flags of the same names): prefill time per
	// uncached prompt token, time per output token, requests run at once.
	PrefillPerToken, DecodePerToken time.Duration
	MaxNumSeqs, MaxModelLen         int
	Extra                           []string
	// Log receives the process's stdout and stderr; discarded when nil.
	Log io.Writer
}

// MockWorkerProcess is a running mock worker.
type MockWorkerProcess struct {
	*Engine
}

// MockWorkerArgs is the command line StartMockWorker runs, defaults filled in.
func MockWorkerArgs(cfg MockWorker) []string {
	if cfg.Model == "" {
		cfg.Model = "fake-model"
	}
	if cfg.BlockSize == 0 {
		cfg.BlockSize = 16
	}
	if cfg.KVBlocks == 0 {
		cfg.KVBlocks = 1024
	}
	args := []string{
		"--host", "127.0.0.1", "--port", strconv.Itoa(cfg.Port), "--model", cfg.Model,
		"--block-size", strconv.Itoa(cfg.BlockSize), "--num-gpu-blocks", strconv.Itoa(cfg.KVBlocks),
		"--prefill-time-per-token", cfg.PrefillPerToken.String(), "--decode-time-per-token", cfg.DecodePerToken.String(),
		// llm-d-inference-sim's inter-token latency does not grow with the
		// batch, and it prefills every running request at once.
		"--decode-batch-slowdown", "0", "--prefill-slots", "0",
		"--log-level", "warn",
	}
	if cfg.MaxNumSeqs > 0 {
		args = append(args, "--max-num-seqs", strconv.Itoa(cfg.MaxNumSeqs))
	}
	if cfg.MaxModelLen > 0 {
		args = append(args, "--max-model-len", strconv.Itoa(cfg.MaxModelLen))
	}
	if cfg.Collector != "" {
		args = append(args, "--kv-events-connect", cfg.Collector)
	} else {
		args = append(args, "--kv-events=false")
	}
	if cfg.ReplayPort != 0 {
		args = append(args, "--kv-replay-endpoint", "tcp://127.0.0.1:"+strconv.Itoa(cfg.ReplayPort))
	} else {
		args = append(args, "--kv-replay=false")
	}
	return append(args, cfg.Extra...)
}

// StartMockWorker starts a mock worker and waits until GET /health answers 200.
func StartMockWorker(ctx context.Context, cfg MockWorker) (*MockWorkerProcess, error) {
	if cfg.Model == "" {
		cfg.Model = "fake-model"
	}
	if cfg.Port == 0 {
		return nil, errors.New("peerproc: the mock worker needs a port (its topic names it)")
	}
	e, err := startEngine(ctx, "mock worker", cfg.Binary, MockWorkerArgs(cfg), nil, cfg.Log, cfg.Port, cfg.ReplayPort, cfg.Model)
	if err != nil {
		return nil, err
	}
	return &MockWorkerProcess{Engine: e}, nil
}
