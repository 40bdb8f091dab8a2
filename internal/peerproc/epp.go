package peerproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// EPPProfile names a scheduling profile of llm-d's endpoint picker that
// GenerateEPPConfig knows.
type EPPProfile string

const (
	// EPPDefault is the precise prefix-cache configuration of the picker's
	// own sample for file discovery: the prefix-cache scorer fed by the
	// engines' KV events (weight 3), the queue scorer and the KV-cache
	// utilisation scorer fed by each engine's /metrics (weight 1 each), the
	// highest total score wins.
	EPPDefault EPPProfile = "default"
	// EPPTuned is the scorer mix of llm-d-router's own precise-prefix
	// performance test (test/perf/config/router-configs/precise-prefix.yaml
	// at v0.10.0): the active-request scorer, counted by the picker itself
	// and so never stale (weight 4), KV-cache utilisation (2), precise prefix
	// cache (2) and the no-hit LRU scorer, which spreads requests that hit
	// nowhere over the least recently used endpoints (2); speculative
	// indexing records the picked endpoint's blocks at the decision, before
	// the engine's KV events confirm them.
	EPPTuned EPPProfile = "tuned"
)

// EPP configures one llm-d endpoint picker (llm-d-router's cmd/epp) run
// without Kubernetes: file discovery of the endpoints, its KV events
// subscriber bound where the engines dial.
type EPP struct {
	Binary string
	// Dir receives the generated EndpointPickerConfig and endpoints file.
	Dir string
	// Endpoints are the engines, host:port with an IPv4 literal host (file
	// discovery's rule; the endpoint's identity is address:port).
	Endpoints []string
	// ZMQEndpoint is where its precise-prefix-cache producer binds the SUB
	// socket the engines' PUB sockets dial (tcp://127.0.0.1:N).
	ZMQEndpoint string
	Model       string // "fake-model" when empty
	BlockSize   int    // 16 when 0; must be the engines' block size
	Profile     EPPProfile
	// GRPCPort serves ext_proc, HealthPort gRPC health, MetricsPort
	// Prometheus metrics (unauthenticated: --metrics-endpoint-auth=false).
	GRPCPort, HealthPort, MetricsPort int
	// Secure serves ext_proc over TLS with a self-signed certificate (the
	// picker's default); false serves plaintext.
	Secure bool
	// Wrap prefixes the command, e.g. taskset -c 0 to pin it to a CPU.
	Wrap  []string
	Extra []string
	// Log receives the process's stdout and stderr; discarded when nil.
	Log io.Writer
}

// EPPProcess is a running endpoint picker.
type EPPProcess struct {
	cfg  EPP
	cmd  *exec.Cmd
	done chan struct{}
}

// Addr is its ext_proc address.
func (p *EPPProcess) Addr() string { return "127.0.0.1:" + strconv.Itoa(p.cfg.GRPCPort) }

// MetricsURL is its Prometheus endpoint.
func (p *EPPProcess) MetricsURL() string {
	return "http://127.0.0.1:" + strconv.Itoa(p.cfg.MetricsPort) + "/metrics"
}

// Pid is the picker's process id (a Wrap command such as taskset execs it in
// place, keeping the id).
func (p *EPPProcess) Pid() int { return p.cmd.Process.Pid }

// Config returns what it was started with, defaults filled in.
func (p *EPPProcess) Config() EPP { return p.cfg }

// Stop ends the process (SIGTERM, then SIGKILL after 5 s) and waits for it.
// The picker's own drain window (--drain-timeout) is set to zero at start, so
// SIGTERM ends it at once.
func (p *EPPProcess) Stop() { stop(p.cmd, p.done) }

// GenerateEPPConfig returns the EndpointPickerConfig and the endpoints file
// for cfg. endpointsPath is where the endpoints file will be written.
func GenerateEPPConfig(cfg EPP, endpointsPath string) (config, endpoints string, err error) {
	if cfg.Model == "" {
		cfg.Model = "fake-model"
	}
	if cfg.BlockSize == 0 {
		cfg.BlockSize = 16
	}
	if len(cfg.Endpoints) == 0 {
		return "", "", errors.New("peerproc: the endpoint picker needs at least one endpoint")
	}
	var eps strings.Builder
	eps.WriteString("endpoints:\n")
	for _, ep := range cfg.Endpoints {
		host, port, ok := strings.Cut(ep, ":")
		if !ok || host == "" || port == "" {
			return "", "", fmt.Errorf("peerproc: endpoint %q is not host:port", ep)
		}
		fmt.Fprintf(&eps, "  - name: %q\n    address: %q\n    port: %q\n", "ep-"+strings.ReplaceAll(ep, ":", "-"), host, port)
	}
	var scorers, profile, speculative string
	switch cfg.Profile {
	case EPPDefault, "":
		scorers = `- type: queue-scorer
- type: kv-cache-utilization-scorer
`
		profile = `  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: kv-cache-utilization-scorer
    weight: 1
`
	case EPPTuned:
		speculative = "    speculativeIndexing: true\n"
		scorers = `- type: inflight-load-producer
- type: active-request-scorer
- type: kv-cache-utilization-scorer
- type: no-hit-lru-scorer
  parameters:
    prefixMatchInfoProducerName: precise-prefix-cache-producer
`
		profile = `  - pluginRef: active-request-scorer
    weight: 4
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: no-hit-lru-scorer
    weight: 2
`
	default:
		return "", "", fmt.Errorf("peerproc: unknown endpoint picker profile %q", cfg.Profile)
	}
	// Token-id prompts pass through the token producer untouched; text
	// prompts would be rendered by the first engine (the simulator serves
	// vLLM's render endpoint with its dummy tokenizer, no network).
	config = fmt.Sprintf(`apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- name: file-disc
  type: file-discovery
  parameters:
    path: %q
    watchFile: false
- type: token-producer
  parameters:
    modelName: %q
    vllm:
      url: %q
- type: precise-prefix-cache-producer
  parameters:
%s    tokenProcessorConfig:
      blockSize: %d
    kvEventsConfig:
      zmqEndpoint: %q
      topicFilter: "kv@"
    indexerConfig:
      kvBlockIndexConfig:
        enableMetrics: false
- type: prefix-cache-scorer
  parameters:
    prefixMatchInfoProducerName: precise-prefix-cache-producer
- type: metrics-data-source
- type: core-metrics-extractor
%s- type: max-score-picker
- type: single-profile-handler
dataLayer:
  discovery:
    pluginRef: file-disc
  sources:
  - pluginRef: metrics-data-source
    extractors:
    - pluginRef: core-metrics-extractor
schedulingProfiles:
- name: default
  plugins:
%s  - pluginRef: max-score-picker
`, endpointsPath, cfg.Model, "http://"+cfg.Endpoints[0], speculative, cfg.BlockSize, cfg.ZMQEndpoint, scorers, profile)
	return config, eps.String(), nil
}

// StartEPP writes the picker's configuration into cfg.Dir, starts it and
// waits until its gRPC health service answers SERVING. Start it before the
// engines: their PUB sockets dial its SUB socket, and what they publish
// before it is bound is lost (the picker has no replay).
func StartEPP(ctx context.Context, cfg EPP) (*EPPProcess, error) {
	if cfg.Model == "" {
		cfg.Model = "fake-model"
	}
	if cfg.BlockSize == 0 {
		cfg.BlockSize = 16
	}
	if cfg.Profile == "" {
		cfg.Profile = EPPDefault
	}
	if cfg.GRPCPort == 0 || cfg.HealthPort == 0 || cfg.MetricsPort == 0 {
		return nil, errors.New("peerproc: the endpoint picker needs its gRPC, health and metrics ports")
	}
	epPath := filepath.Join(cfg.Dir, "endpoints.yaml")
	config, endpoints, err := GenerateEPPConfig(cfg, epPath)
	if err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(cfg.Dir, "epp-config.yaml")
	if err := os.WriteFile(epPath, []byte(endpoints), 0o644); err != nil {
		return nil, fmt.Errorf("peerproc: %w", err)
	}
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		return nil, fmt.Errorf("peerproc: %w", err)
	}
	args := []string{
		"--pool-name", "sims", "--pool-namespace", "local", "--config-file", cfgPath,
		"--grpc-port", strconv.Itoa(cfg.GRPCPort), "--grpc-health-port", strconv.Itoa(cfg.HealthPort),
		"--metrics-port", strconv.Itoa(cfg.MetricsPort), "--metrics-endpoint-auth=false",
		"--secure-serving=" + strconv.FormatBool(cfg.Secure), "--tracing=false", "--emit-endpoint-scores",
		"--enable-pprof=false", "--drain-timeout=0s",
		// Its log at the default verbosity is a line or two per request.
		"--zap-log-level=error",
	}
	args = append(args, cfg.Extra...)
	argv := append(append([]string(nil), cfg.Wrap...), cfg.Binary)
	argv = append(argv, args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	out := cfg.Log
	if out == nil {
		out = io.Discard
	}
	cmd.Stdout, cmd.Stderr = out, out
	DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("peerproc: start %s: %w", argv[0], err)
	}
	p := &EPPProcess{cfg: cfg, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	if err := waitServing(ctx, "127.0.0.1:"+strconv.Itoa(cfg.HealthPort), p.done); err != nil {
		p.Stop()
		return nil, fmt.Errorf("peerproc: endpoint picker on port %d: %w", cfg.GRPCPort, err)
	}
	return p, nil
}

// waitServing polls a gRPC health service until it answers SERVING, the
// process exits, or ctx ends (30 s at most). The picker's health port is
// plaintext even when ext_proc serves TLS (it is meant for kubelet probes).
func waitServing(ctx context.Context, addr string, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("health client: %w", err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	var last error
	for {
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		resp, err := hc.Check(cctx, &healthpb.HealthCheckRequest{})
		ccancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		if err != nil {
			last = err
		} else {
			last = fmt.Errorf("health %s", resp.GetStatus())
		}
		select {
		case <-exited:
			return errors.New("exited before it was serving")
		case <-ctx.Done():
			return fmt.Errorf("not serving: %w (last: %v)", ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
