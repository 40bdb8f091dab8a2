package floorpicker

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	"github.com/kvselect/kvselect/internal/peerproc"
)

// Config is one floor picker process.
type Config struct {
	// ExtProcPort serves ext_proc (plaintext); HTTPPort serves /metrics
	// and /health. Both on 127.0.0.1.
	ExtProcPort, HTTPPort int
	Endpoints             []string
	// ServerOptions are the grpc.Server's: pass the picker's own
	// (extproc.ServerOptions) to measure its gRPC stack's floor.
	ServerOptions []grpc.ServerOption
}

// Run serves until ctx ends.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	reg := prometheus.NewRegistry()
	s, err := New(cfg.Endpoints, reg)
	if err != nil {
		return err
	}
	grpcLn, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(cfg.ExtProcPort)))
	if err != nil {
		return fmt.Errorf("floorpicker: ext_proc listener: %w", err)
	}
	httpLn, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(cfg.HTTPPort)))
	if err != nil {
		grpcLn.Close()
		return fmt.Errorf("floorpicker: HTTP listener: %w", err)
	}
	g := grpc.NewServer(cfg.ServerOptions...)
	extprocv3.RegisterExternalProcessorServer(g, s)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	errs := make(chan error, 2)
	go func() { errs <- g.Serve(grpcLn) }()
	go func() { errs <- hs.Serve(httpLn) }()
	log.Info("floor picker serving", "ext_proc", grpcLn.Addr().String(), "http", httpLn.Addr().String(), "endpoints", strings.Join(cfg.Endpoints, ","))
	select {
	case <-ctx.Done():
		err = nil
	case err = <-errs:
		err = fmt.Errorf("floorpicker: %w", err)
	}
	g.Stop()
	shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if serr := hs.Shutdown(shut); serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = fmt.Errorf("floorpicker: %w", serr)
	}
	return err
}

// ExtProcAddr is where the picker serves ext_proc (host:port, plaintext).
func (c Config) ExtProcAddr() string { return "127.0.0.1:" + strconv.Itoa(c.ExtProcPort) }

// MetricsURL is its /metrics.
func (c Config) MetricsURL() string { return c.httpURL() + "/metrics" }

func (c Config) httpURL() string { return "http://127.0.0.1:" + strconv.Itoa(c.HTTPPort) }

// Start runs command (the floor-picker command, e.g. kvbench floor-picker,
// after any wrapper such as taskset) with cfg's flags, its output to log,
// and waits until it serves.
func Start(ctx context.Context, command []string, cfg Config, log io.Writer) (*peerproc.Helper, error) {
	if len(command) == 0 {
		return nil, errors.New("floorpicker: no command serves the floor picker (kvbench floor-picker)")
	}
	argv := append(slices.Clone(command), Args(cfg)...)
	return peerproc.StartHelper(ctx, "floor picker", argv, log, cfg.httpURL()+"/health")
}

// Flags are the floor-picker command's flags (kvbench floor-picker).
type Flags struct {
	extProcPort, httpPort int
	endpoints             string
}

// Register defines the flags on fs.
func (f *Flags) Register(fs *flag.FlagSet) {
	fs.IntVar(&f.extProcPort, "extproc-port", 0, "ext_proc `port` on 127.0.0.1 (required)")
	fs.IntVar(&f.httpPort, "http-port", 0, "/metrics and /health `port` on 127.0.0.1 (required)")
	fs.StringVar(&f.endpoints, "endpoints", "", "the engines' `host:port`s, comma-separated (required)")
}

// Args are the command-line arguments that set cfg's ports and endpoints.
func Args(cfg Config) []string {
	return []string{"-extproc-port", strconv.Itoa(cfg.ExtProcPort), "-http-port", strconv.Itoa(cfg.HTTPPort),
		"-endpoints", strings.Join(cfg.Endpoints, ",")}
}

// Config checks the parsed flags and returns the configuration they name,
// without server options.
func (f *Flags) Config() (Config, error) {
	cfg := Config{ExtProcPort: f.extProcPort, HTTPPort: f.httpPort}
	for _, e := range strings.Split(f.endpoints, ",") {
		if e = strings.TrimSpace(e); e == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(e); err != nil {
			return cfg, fmt.Errorf("-endpoints: %w", err)
		}
		cfg.Endpoints = append(cfg.Endpoints, e)
	}
	switch {
	case cfg.ExtProcPort <= 0 || cfg.ExtProcPort > 65535 || cfg.HTTPPort <= 0 || cfg.HTTPPort > 65535:
		return cfg, errors.New("-extproc-port and -http-port must be ports (1-65535)")
	case len(cfg.Endpoints) == 0:
		return cfg, errors.New("-endpoints names no engine")
	}
	return cfg, nil
}

// Serve checks the parsed flags and serves until ctx ends, with opts as the
// grpc.Server's options: the floor-picker command, wherever it is run.
func (f *Flags) Serve(ctx context.Context, opts []grpc.ServerOption, log *slog.Logger) error {
	cfg, err := f.Config()
	if err != nil {
		return err
	}
	cfg.ServerOptions = opts
	return Run(ctx, cfg, log)
}
