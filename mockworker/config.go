package mockworker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/kvselect/kvselect/mockworker/kvpublish"
)

// Defaults of Config, chosen to look like one vLLM replica of a small model on
// one GPU.
const (
	DefaultModel               = "mock-model"
	DefaultBlockSize           = 16 // vLLM's default block size
	DefaultNumBlocks           = 4096
	DefaultMaxNumSeqs          = 256 // vLLM --max-num-seqs
	DefaultMaxNumBatchedTokens = 8192
	DefaultMaxModelLen         = 32768
	DefaultPrefillPerToken     = 50 * time.Microsecond // ~20k prefill tokens/s
	DefaultDecodePerToken      = 10 * time.Millisecond // inter-token latency of a lone sequence
	DefaultDecodeBatchSlowdown = 0.01                  // +1% ITL per additional running sequence
	DefaultVocabSize           = 32000
	// DefaultKVTransferPerBlock is the time to pull one KV block from a
	// prefill worker: about what vLLM's NIXL connector takes over RDMA for a
	// 16-token block of an 8B model (~2 MB at ~20 GB/s), an eighth of
	// recomputing it at DefaultPrefillPerToken.
	DefaultKVTransferPerBlock = 100 * time.Microsecond
	// DefaultPrefillTimeout bounds a decode worker's call to its prefill
	// worker.
	DefaultPrefillTimeout = time.Minute
	// DefaultPrefillerHeader is the request header that names a decode
	// request's prefill worker, host:port: the one llm-d's routing sidecar
	// reads and kvselect's picker sets.
	DefaultPrefillerHeader = "x-prefiller-host-port"
)

// Roles in disaggregated prefill/decode serving (Config.Role), as kvselect
// names them in a worker record.
const (
	RoleBoth    = "both"
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// Config describes a mock worker. Zero values take the defaults above, except
// for the timing model's, where zero is a useful value of its own.
type Config struct {
	// Model is the served model name: /v1/models lists it, requests must name
	// it, and it is the model_name the worker registers under.
	Model string
	// WorkerID identifies the worker to kvselect.
	WorkerID uint64
	// BlockSize is the number of tokens per KV block.
	BlockSize int
	// NumBlocks is the KV block pool of each data-parallel rank.
	NumBlocks int
	// DPSize is the number of data-parallel ranks, each with its own block pool,
	// scheduler and KV event publisher; DPStartRank is the global rank of the
	// first (kvselect's data_parallel_start_rank).
	DPSize      int
	DPStartRank int
	// MaxNumSeqs bounds the sequences a rank runs at once; further requests
	// wait in its FIFO queue.
	MaxNumSeqs int
	// MaxNumBatchedTokens is advertised (registration) and, with
	// PrefillStallsDecode, is the prefill chunk size; otherwise the timing
	// model does not chunk prefills.
	MaxNumBatchedTokens int
	// MaxModelLen bounds prompt plus output tokens of one request.
	MaxModelLen int

	// Timing model: a request's prefill takes PrefillPerToken per prompt token
	// that missed the prefix cache; then every output token after the first
	// takes DecodePerToken × (1 + DecodeBatchSlowdown × (running−1)), running
	// being the sequences the rank runs at that moment. All durations are
	// divided by Speedup. Unlike the other fields, zero times mean zero (a
	// worker that answers at once); the Default* constants are what the
	// command-line flags start from.
	PrefillPerToken     time.Duration
	DecodePerToken      time.Duration
	DecodeBatchSlowdown float64
	Speedup             float64
	// PrefillSlots bounds how many prefills a rank computes at once; the
	// others wait for a slot, FIFO, and the wait counts in their TTFT. 1 models
	// a GPU whose prefill throughput is shared by every request (what makes
	// load-aware routing matter); 0 lets every admitted request prefill at
	// once, as if prefill compute were unlimited.
	PrefillSlots int

	// KVEventsEndpoint is the PUB address of rank 0's KV events, vLLM style
	// ("tcp://*:5557"); rank i binds port+i, or a free port when the port is 0.
	// Empty publishes no events.
	KVEventsEndpoint string
	// KVEventsCollector is a collector every rank's PUB socket dials instead
	// of binding one (llm-d's topology: one SUB socket, bound by the endpoint
	// picker or by kvselect --kv-events-bind, hears every engine, and the
	// topic names the engine while the batch's dp_rank names the rank). It
	// excludes KVEventsEndpoint.
	KVEventsCollector string
	// ReplayEndpoint is the ROUTER address of rank 0's replay ring, offset like
	// KVEventsEndpoint; empty serves no replay. It is bound in either topology.
	ReplayEndpoint string
	// EventsTopic is the topic frame of every KV event message. A collector
	// tells engines apart by it: with KVEventsCollector it should be llm-d's
	// kv@<host>:<port>@<model> (LLMDTopic), which the command line defaults to.
	EventsTopic string
	// EventShape is the event encoding (vLLM's current map shape by default).
	EventShape kvpublish.Shape
	// ReplayRing is the number of batches each rank keeps for replay (10,000).
	ReplayRing int

	// Role is the worker's part in disaggregated prefill/decode serving
	// (pd.go): RoleBoth (the default) serves whole requests, RolePrefill the
	// prefill stage of disaggregated ones (and refuses to act as a decode
	// side), RoleDecode decodes after a remote prefill. It is registered as
	// the record's role; any role serves a plain request whole.
	Role string
	// PrefillerHeader is the request header naming the prefill worker of a
	// disaggregated request (DefaultPrefillerHeader when empty).
	PrefillerHeader string
	// KVTransferPerBlock is the time a decode worker spends pulling one KV
	// block of a remotely prefilled prompt (blocks it already caches are not
	// pulled); divided by Speedup like the other times.
	KVTransferPerBlock time.Duration
	// PrefillTimeout bounds the call to the prefill worker
	// (DefaultPrefillTimeout when 0), on top of the request's own context.
	PrefillTimeout time.Duration
	// AdvertiseAddr is the host:port other workers reach this one at; a
	// prefill stage answers it as remote_host and remote_port, where a vLLM
	// decode would pull the KV from. Empty: the Host the request was sent to.
	AdvertiseAddr string
	// PrefillStallsDecode models chunked prefill sharing the engine's steps
	// with decoding: a prefill is computed in chunks of MaxNumBatchedTokens
	// tokens, and while a chunk runs no running sequence of the rank gets a
	// token, so a long prefill makes the rank's inter-token latency spike —
	// what disaggregation removes. Off, prefill and decode never slow each
	// other.
	PrefillStallsDecode bool

	// Faults are the failure modes the worker starts in (faults.go); POST
	// /admin/faults changes them at run time.
	Faults Faults
	// FaultSeed seeds which requests FailRate fails (with WorkerID).
	FaultSeed uint64

	// VocabSize bounds token ids of tokenized text and generated tokens.
	VocabSize int
	// Clock paces the timing model; the wall clock when nil. A simulation can
	// pass a virtual clock.
	Clock Clock
	// Logger receives diagnostics; slog.Default() when nil.
	Logger *slog.Logger
}

// Clock is the time source of the timing model.
type Clock interface {
	Now() time.Time
	// Sleep waits d or until ctx ends, returning ctx's error then.
	Sleep(ctx context.Context, d time.Duration) error
}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

func (wallClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// withDefaults fills zero fields and validates the result.
func (c Config) withDefaults() (Config, error) {
	c.fillDefaults()
	errs := c.sizeErrors()
	errs = append(errs, c.servingErrors()...)
	errs = append(errs, c.kvEventsErrors()...)
	if err := errors.Join(errs...); err != nil {
		return c, fmt.Errorf("mockworker: invalid config: %w", err)
	}
	return c, nil
}

// fillDefaults sets the zero fields that have a default.
func (c *Config) fillDefaults() {
	for _, d := range []struct {
		field *int
		def   int
	}{
		{&c.BlockSize, DefaultBlockSize},
		{&c.NumBlocks, DefaultNumBlocks},
		{&c.DPSize, 1},
		{&c.MaxNumSeqs, DefaultMaxNumSeqs},
		{&c.MaxNumBatchedTokens, DefaultMaxNumBatchedTokens},
		{&c.MaxModelLen, DefaultMaxModelLen},
		{&c.ReplayRing, kvpublish.DefaultRingSize},
		{&c.VocabSize, DefaultVocabSize},
	} {
		if *d.field == 0 {
			*d.field = d.def
		}
	}
	c.Model = cmp.Or(c.Model, DefaultModel)
	c.Speedup = cmp.Or(c.Speedup, 1)
	c.Role = cmp.Or(c.Role, RoleBoth)
	c.PrefillerHeader = cmp.Or(c.PrefillerHeader, DefaultPrefillerHeader)
	c.PrefillTimeout = cmp.Or(c.PrefillTimeout, DefaultPrefillTimeout)
	if c.Clock == nil {
		c.Clock = wallClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// sizeErrors checks the sizes: the KV cache, the batch limits, the
// data-parallel ranks, the vocabulary.
func (c *Config) sizeErrors() []error {
	var errs []error
	for _, f := range []struct {
		name string
		v    int
	}{
		{"block size", c.BlockSize},
		{"num blocks", c.NumBlocks},
		{"data parallel size", c.DPSize},
		{"max num seqs", c.MaxNumSeqs},
		{"max num batched tokens", c.MaxNumBatchedTokens},
		{"max model len", c.MaxModelLen},
		{"replay ring", c.ReplayRing},
	} {
		if f.v <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %d", f.name, f.v))
		}
	}
	if c.DPStartRank < 0 || c.DPStartRank+c.DPSize > math.MaxUint32 {
		errs = append(errs, fmt.Errorf("data parallel ranks [%d, %d) out of range", c.DPStartRank, c.DPStartRank+c.DPSize))
	}
	if c.VocabSize <= firstWordID || c.VocabSize > math.MaxUint32 {
		errs = append(errs, fmt.Errorf("vocab size must be in (%d, 2^32], got %d", firstWordID, c.VocabSize))
	}
	return errs
}

// servingErrors checks how requests are served: the timing model, the
// prefill/decode role, the address advertised, the faults.
func (c *Config) servingErrors() []error {
	var errs []error
	if c.PrefillPerToken < 0 || c.DecodePerToken < 0 {
		errs = append(errs, errors.New("per-token times must not be negative"))
	}
	if c.Role != RoleBoth && c.Role != RolePrefill && c.Role != RoleDecode {
		errs = append(errs, fmt.Errorf("role must be both, prefill or decode, got %q", c.Role))
	}
	if c.KVTransferPerBlock < 0 {
		errs = append(errs, fmt.Errorf("KV transfer time per block must not be negative, got %v", c.KVTransferPerBlock))
	}
	if c.PrefillTimeout < 0 {
		errs = append(errs, fmt.Errorf("prefill timeout must not be negative, got %v", c.PrefillTimeout))
	}
	if !httpguts.ValidHeaderFieldName(c.PrefillerHeader) {
		errs = append(errs, fmt.Errorf("prefiller header %q is not an HTTP header name", c.PrefillerHeader))
	}
	if c.AdvertiseAddr != "" {
		if _, _, ok := splitHostPort(c.AdvertiseAddr); !ok {
			errs = append(errs, fmt.Errorf("advertise address %q is not host:port", c.AdvertiseAddr))
		}
	}
	if c.PrefillSlots < 0 {
		errs = append(errs, fmt.Errorf("prefill slots must be zero (unlimited) or positive, got %d", c.PrefillSlots))
	}
	if c.DecodeBatchSlowdown < 0 || math.IsNaN(c.DecodeBatchSlowdown) || math.IsInf(c.DecodeBatchSlowdown, 0) {
		errs = append(errs, fmt.Errorf("decode batch slowdown must be a non-negative number, got %v", c.DecodeBatchSlowdown))
	}
	if !(c.Speedup > 0) || math.IsInf(c.Speedup, 0) {
		errs = append(errs, fmt.Errorf("speedup must be a positive number, got %v", c.Speedup))
	}
	if err := c.Faults.validate(); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// kvEventsErrors checks the KV events: the shape, the endpoints of every
// rank, the collector, the replay.
func (c *Config) kvEventsErrors() []error {
	var errs []error
	if c.EventShape != kvpublish.ShapeMap && c.EventShape != kvpublish.ShapePositional {
		errs = append(errs, fmt.Errorf("unknown event shape %d", c.EventShape))
	}
	if c.KVEventsEndpoint != "" && c.KVEventsCollector != "" {
		errs = append(errs, errors.New("a KV events endpoint (bind) and a KV events collector (dial) exclude each other"))
	}
	if c.ReplayEndpoint != "" && c.KVEventsEndpoint == "" && c.KVEventsCollector == "" {
		errs = append(errs, errors.New("a replay endpoint needs a KV events endpoint or collector"))
	}
	if c.KVEventsCollector != "" {
		if _, err := OffsetEndpoint(c.KVEventsCollector, 0); err != nil {
			errs = append(errs, fmt.Errorf("KV events collector: %w", err))
		}
	}
	for _, ep := range []string{c.KVEventsEndpoint, c.ReplayEndpoint} {
		if ep == "" {
			continue
		}
		for r := range c.DPSize {
			if _, err := OffsetEndpoint(ep, r); err != nil {
				errs = append(errs, err)
				break
			}
		}
	}
	return errs
}

// LLMDTopic is the topic llm-d's engines publish KV events under when they
// dial a collector: kv@<host>:<port>@<model>, host and port being those of the
// engine's HTTP endpoint as the picker knows it, so that a collector can match
// a message to the endpoint it routes to (llm-d-inference-sim and llm-d's
// vLLM deployments set it this way).
func LLMDTopic(hostPort, model string) string { return "kv@" + hostPort + "@" + model }

// OffsetEndpoint is the endpoint of data-parallel rank r (0-based within the
// worker) given rank 0's, as vLLM's offset_endpoint_port: a tcp port moves up
// by r (port 0, "any free port", stays 0); ipc and inproc endpoints get a
// "_dp<r>" suffix.
func OffsetEndpoint(ep string, r int) (string, error) {
	scheme, addr, ok := strings.Cut(ep, "://")
	if !ok || addr == "" {
		return "", fmt.Errorf("endpoint %q is not scheme://address", ep)
	}
	switch scheme {
	case "ipc", "inproc":
		if r == 0 {
			return ep, nil
		}
		return fmt.Sprintf("%s_dp%d", ep, r), nil
	case "tcp":
	default:
		return "", fmt.Errorf("endpoint %q: unsupported scheme %q (tcp, ipc, inproc)", ep, scheme)
	}
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return "", fmt.Errorf("endpoint %q has no port", ep)
	}
	port, err := strconv.ParseUint(addr[i+1:], 10, 16)
	if err != nil {
		return "", fmt.Errorf("endpoint %q: invalid port: %w", ep, err)
	}
	if port == 0 || r == 0 {
		return ep, nil
	}
	if port+uint64(r) > math.MaxUint16 {
		return "", fmt.Errorf("endpoint %q: port %d + rank %d exceeds 65535", ep, port, r)
	}
	return fmt.Sprintf("tcp://%s:%d", addr[:i], port+uint64(r)), nil
}
