package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"strconv"

	"google.golang.org/grpc"

	"github.com/kvselect/kvselect/extproc"
	"github.com/kvselect/kvselect/selection"
)

// extprocFlags are the endpoint picker's flags (Envoy ext_proc, GIE protocol
// 004; docs/extproc.md).
type extprocFlags struct {
	port         uint64
	fallbacks    int
	maxBodyBytes int
	testPick     bool
	defaultModel string
}

// defaultExtProcPort is GIE's EPP port.
const defaultExtProcPort = 9002

// maxExtProcFallbacks bounds --extproc-fallbacks: a destination header of a
// few dozen endpoints is already more than any gateway retries.
const maxExtProcFallbacks = 32

func (e *extprocFlags) register(fs *flag.FlagSet) {
	fs.Uint64Var(&e.port, "extproc-port", defaultExtProcPort, "gRPC `port` of the Envoy ext_proc endpoint picker (GIE protocol 004) and its gRPC health service, on --host; 0 disables it. With --port 0 and no --extproc-port, a free port too")
	fs.IntVar(&e.fallbacks, "extproc-fallbacks", 0, "ordered fallback endpoints to append to x-gateway-destination-endpoint after the chosen one (`count`, 0 to 32); only for gateways that retry on them")
	fs.IntVar(&e.maxBodyBytes, "extproc-max-body-bytes", extproc.DefaultMaxBodyBytes, "largest request body the picker buffers, in `bytes`; larger requests get a 413 immediate response")
	fs.BoolVar(&e.testPick, "extproc-test-pick-header", false, "honour GIE conformance's test-epp-endpoint-selection request header and report x-conformance-test-served-endpoint (testing only)")
	fs.StringVar(&e.defaultModel, "extproc-default-model", "", "model (partition) of requests that name none in a header or body, e.g. bodiless requests; empty = \"default\"")
}

func (e *extprocFlags) validate() []error {
	var errs []error
	if e.port > maxPort {
		errs = append(errs, fmt.Errorf("--extproc-port %d: must be between 0 and %d", e.port, maxPort))
	}
	if e.fallbacks < 0 || e.fallbacks > maxExtProcFallbacks {
		errs = append(errs, fmt.Errorf("--extproc-fallbacks %d: must be between 0 and %d", e.fallbacks, maxExtProcFallbacks))
	}
	if e.maxBodyBytes < 1 {
		errs = append(errs, fmt.Errorf("--extproc-max-body-bytes %d: must be at least 1", e.maxBodyBytes))
	}
	return errs
}

// extprocServer is the running picker.
type extprocServer struct {
	picker *extproc.Server
	grpc   *grpc.Server
	log    *slog.Logger
}

// startExtProc serves the picker on --host:--extproc-port beside the REST
// API, over the same selection.Service; nil when disabled. Serve errors go to
// served.
func startExtProc(o *options, svc *selection.Service, log *slog.Logger, served chan<- error) (*extprocServer, error) {
	e := o.extproc
	port := e.port
	switch {
	case o.set["extproc-port"] && port == 0:
		log.Info("ext_proc endpoint picker disabled (--extproc-port 0)")
		return nil, nil
	case !o.set["extproc-port"] && o.port == 0:
		// --port 0 (tests, several processes on one host): a free port here
		// too, named by the startup log, instead of a clash on 9002.
		port = 0
	}
	ln, err := net.Listen(listenNetwork(o.host), net.JoinHostPort(o.host, strconv.FormatUint(port, 10)))
	if err != nil {
		return nil, fmt.Errorf("ext_proc listener: %w", err)
	}
	picker := extproc.New(svc, extproc.Options{Logger: log, Fallbacks: e.fallbacks, MaxBodyBytes: e.maxBodyBytes,
		TestPickHeader: e.testPick, DefaultModel: e.defaultModel})
	g := grpc.NewServer(extproc.ServerOptions()...)
	picker.Register(g)
	log.Info("ext_proc listening", "addr", ln.Addr().String(), "fallbacks", e.fallbacks, "max_body_bytes", e.maxBodyBytes,
		"test_pick_header", e.testPick)
	go func() {
		if err := g.Serve(ln); err != nil {
			served <- fmt.Errorf("ext_proc server: %w", err)
		}
	}()
	return &extprocServer{picker: picker, grpc: g, log: log}, nil
}

// shutdown reports NOT_SERVING, lets in-flight streams finish until ctx ends,
// then closes the rest (their bookings are freed by the picker's cleanup).
func (s *extprocServer) shutdown(ctx context.Context) {
	if s == nil {
		return
	}
	s.picker.Shutdown()
	done := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		s.grpc.Stop()
		<-done
		s.log.Warn("ext_proc streams still open at the shutdown timeout were closed")
	}
}
