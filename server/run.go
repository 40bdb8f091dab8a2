package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kvselect/kvselect/internal/tracing"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/rewrite"
)

// run is Run with its options applied. It reads as the startup order; the
// shutdown runs in the reverse order, after drain: the upkeep goroutines, the
// replica mesh, the KV-event listeners, the spans still buffered, the SIGHUP
// handler.
func run(ctx context.Context, args []string, set *settings) error {
	o, done, err := parseCommandLine(args, set)
	if done || err != nil {
		return err
	}

	// Configuration, logging, tracing.
	log := set.loggerFor(o)
	conf, err := configure(o, set, log)
	if err != nil {
		return err
	}
	if err := o.extproc.sessionsFromEnv(o.set, set.lookup); err != nil {
		return err
	}
	hup, stopHUP := catchHUP(o, set)
	defer stopHUP()
	tr, flushSpans, err := startTracing(ctx, set, log)
	if err != nil {
		return err
	}
	defer flushSpans()
	metrics := newRegistry()

	// The core, with the KV-event listeners it attaches worker ranks to.
	cfg := conf.initial.cfg
	closeKV, err := startKVEvents(ctx, o, set.lookup, &cfg, metrics, log)
	if err != nil {
		return err
	}
	defer closeKV()
	svc, err := newCore(o, cfg, metrics, log)
	if err != nil {
		return err
	}

	// Adapters: the replica mesh, index recovery, discovery, the tokenizer.
	peers, closeMesh, err := startMesh(ctx, o, svc, cfg.Router.SessionAffinityTTL.IsSet(), metrics, log)
	if err != nil {
		return err
	}
	defer closeMesh()
	if len(o.indexerPeers) > 0 {
		// Recovery runs once the server answers /health; /ready waits for it.
		svc.Replica().SetIndexRecovery(selection.RecoveryPending)
	}
	objectives, watched, err := loadObjectives(o, conf.file, log)
	if err != nil {
		return err
	}
	rewrites := new(rewrite.Rules) // the pool's InferenceModelRewrites, for the picker
	startDiscovery, err := prepareDiscovery(o.discovery, cfg.EventsCollector, svc, watched, rewrites, log)
	if err != nil {
		return err
	}
	tokenizer, err := o.tokenize.start(ctx, svc, metrics, log)
	if err != nil {
		return err
	}

	// Fronts: the REST API (with the status pages: /metrics, pprof) and the
	// endpoint picker, under one set of per-client limits.
	served := make(chan error, 2) // the REST and the ext_proc server
	f := &fronts{svc: svc, tokenizer: tokenizer, objectives: objectives, rewrites: rewrites, tracing: tr, limits: o.limits.build(), log: log, served: served}
	rest, err := startREST(o, f, conf, peers, metrics, set.version)
	if err != nil {
		return err
	}
	picker, err := startExtProc(o, f, metrics)
	if err != nil {
		_ = rest.http.Close()
		return err
	}
	set.announce(Listening{REST: rest.addr, ExtProc: picker.address()})

	// Upkeep and reloads until the context ends or a server fails.
	stopUpkeep := startUpkeep(ctx, o, svc, startDiscovery, newReloader(o, set, svc, conf, objectives, hup, log), metrics, log)
	defer stopUpkeep()
	serveErr := awaitStop(ctx, served, o.shutdownTimeout, log)
	return drain(svc, picker, rest, o.shutdownTimeout, serveErr, log)
}

// parseCommandLine parses args; done after --help and --version, which it
// prints.
func parseCommandLine(args []string, set *settings) (o *options, done bool, err error) {
	o, err = parseFlags(args)
	switch {
	case errors.Is(err, errHelp):
		writeHelp(set.stdout)
		return nil, true, nil
	case err != nil:
		return nil, true, err
	case o.version:
		fmt.Fprintln(set.stdout, versionString(set.version))
		return nil, true, nil
	}
	return o, false, nil
}

// awaitStop waits until ctx ends (serveErr nil) or a server fails
// (serveErr says how).
func awaitStop(ctx context.Context, served <-chan error, timeout time.Duration, log *slog.Logger) (serveErr error) {
	select {
	case <-ctx.Done():
		log.Info("shutting down", "cause", context.Cause(ctx).Error(), "timeout", timeout.String())
	case serveErr = <-served:
		log.Error("server failed", "err", serveErr)
	}
	return serveErr
}

// drain stops the server in Dynamo's order. Selection first, as Dynamo's
// service shuts down: from here selections, bookings and catalog upserts get
// 503 and queued selections are released, while DELETE /workers and the
// in-flight requests still complete. Then the picker's streams and the REST
// connections finish, within timeout together. serveErr is a server's
// failure, the cause of the stop.
func drain(svc *selection.Service, picker *extprocServer, rest *restServer, timeout time.Duration, serveErr error, log *slog.Logger) error {
	svc.Shutdown()
	log.Info("selection service stopped admitting selections")
	start := time.Now()
	sctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	picker.shutdown(sctx)
	if err := rest.http.Shutdown(sctx); err != nil {
		_ = rest.http.Close()
		log.Error("graceful shutdown timed out; closed remaining connections", "timeout", timeout.String())
		return fmt.Errorf("graceful shutdown: %w", err)
	}
	if serveErr != nil {
		return serveErr
	}
	log.Info("shutdown complete", "took", time.Since(start).Round(time.Millisecond).String())
	return nil
}

// catchHUP catches SIGHUP, the config file's reload signal, unless the
// program gave its own trigger (WithReload) or there is no file; nil then.
// It is caught before anything listens: a signal sent as soon as the server
// answers must reload it, not end it (a signal's default action). stop
// restores the default.
func catchHUP(o *options, set *settings) (hup <-chan os.Signal, stop func()) {
	if o.configFile == "" || set.reload != nil {
		return nil, func() {}
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGHUP)
	return ch, func() { signal.Stop(ch) }
}

// startTracing sets up OpenTelemetry tracing from the OTEL_* environment; off
// without an exporter. flush sends the spans still buffered, on the way out.
func startTracing(ctx context.Context, set *settings, log *slog.Logger) (tr *tracing.Tracing, flush func(), err error) {
	tr, err = tracing.FromEnv(ctx, set.lookup, versionString(set.version))
	if err != nil {
		return nil, nil, &UsageError{err}
	}
	if tr.Enabled {
		log.Info("tracing on: OTLP spans for both fronts (OTEL_* environment)", "protocol", tr.Protocol)
	}
	return tr, func() {
		flush, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := tr.Shutdown(flush); err != nil {
			log.Warn("tracing: flushing spans at exit failed", "err", err)
		}
	}, nil
}

// newRegistry is what GET /metrics on the REST port serves: process and Go
// runtime metrics, plus what each component registers.
func newRegistry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
}

// listenNetwork binds an IPv4 literal (Dynamo's 0.0.0.0) to IPv4 only, as
// Dynamo does: Go's "tcp" would turn 0.0.0.0 into a dual-stack [::] socket.
// "::" (or a hostname, or "") keeps Go's dual-stack behaviour.
func listenNetwork(host string) string {
	if ip, err := netip.ParseAddr(host); err == nil && ip.Is4() {
		return "tcp4"
	}
	return "tcp"
}

func newLogger(o *options, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: o.logLevel}
	if o.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

func versionString(version string) string {
	v, rev := version, ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				rev = s.Value[:12]
			}
		}
	}
	if v == "" {
		v = "devel"
	}
	if rev != "" && !strings.Contains(v, rev) {
		v += " " + rev
	}
	return "kvselect " + v + " " + runtime.Version()
}
