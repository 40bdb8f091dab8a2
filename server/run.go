package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvselect/kvselect/engines/kvlisten"
	"github.com/kvselect/kvselect/engines/tokenize"
	"github.com/kvselect/kvselect/httpadmin"
	"github.com/kvselect/kvselect/internal/access"
	"github.com/kvselect/kvselect/internal/tracing"
	"github.com/kvselect/kvselect/replicas/mesh"
	"github.com/kvselect/kvselect/replicas/recovery"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/flow"
)

// envKVEventsBind is --kv-events-bind's variable.
const envKVEventsBind = "KVSELECT_KV_EVENTS_BIND"

// readHeaderTimeout bounds how long a client may take to send request headers
// (slowloris). --http-read-timeout bounds the whole request, body included;
// there is no write timeout by default: a selection may wait in the scheduler
// queue for as long as its client allows (limits.go).
const readHeaderTimeout = 10 * time.Second

// idleTimeout closes keep-alive connections a client forgot; without it they
// would stay open forever (no ReadTimeout is set to fall back on).
const idleTimeout = 2 * time.Minute

// run is Run with its options applied.
func run(ctx context.Context, args []string, set *settings) error {
	o, err := parseFlags(args)
	switch {
	case errors.Is(err, errHelp):
		writeHelp(set.stdout)
		return nil
	case err != nil:
		return err
	case o.version:
		fmt.Fprintln(set.stdout, versionString(set.version))
		return nil
	}

	log := set.logger
	if log == nil {
		log = newLogger(o, set.stderr)
	}
	var file *configFile
	if o.configFile != "" {
		if file, err = readConfigFile(o.configFile); err != nil {
			return &UsageError{err}
		}
	}
	initial, err := resolveConfig(o, set.lookup, file, set.policy, log)
	if err != nil {
		return err
	}
	cfg := initial.cfg
	// Who may call the REST API (auth.go); nil when nobody is authenticated.
	authz, authMetrics, err := o.auth.authorizer(file, o.discovery.poolNamespace, o.discovery.kubeconfig, log)
	if err != nil {
		return err
	}
	log.Debug("router configuration", routerAttrs(cfg.Router, false)...)
	// SIGHUP is caught before anything listens: a signal sent as soon as the
	// server answers must reload it, not end it (a signal's default action).
	var hup chan os.Signal
	if o.configFile != "" && set.reload == nil {
		hup = make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
	}
	// OpenTelemetry tracing from the OTEL_* environment; off without an
	// exporter. Spans still buffered are flushed on the way out.
	tr, err := tracing.FromEnv(ctx, set.lookup, versionString(set.version))
	if err != nil {
		return &UsageError{err}
	}
	defer func() {
		flush, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := tr.Shutdown(flush); err != nil {
			log.Warn("tracing: flushing spans at exit failed", "err", err)
		}
	}()
	if tr.Enabled {
		log.Info("tracing on: OTLP spans for both fronts (OTEL_* environment)", "protocol", tr.Protocol)
	}
	// GET /metrics on the REST port: process and Go runtime metrics plus what
	// each component registers.
	metrics := prometheus.NewRegistry()
	metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	binds := o.kvEventsBind
	if !o.set["kv-events-bind"] {
		if v, ok := set.lookup(envKVEventsBind); ok && strings.TrimSpace(v) != "" {
			if binds, err = parseList(v, validateBindEndpoint); err != nil {
				return &UsageError{fmt.Errorf("%s: %w", envKVEventsBind, err)}
			}
		}
	}
	if len(binds) > 0 && !cfg.Router.UseKVEvents {
		return &UsageError{errors.New("--kv-events-bind needs KV events on (DYN_ROUTER_USE_KV_EVENTS is false)")}
	}
	if cfg.Router.UseKVEvents {
		// One ZMQ SUB per registered worker rank, with replay gap recovery; the
		// service attaches and detaches ranks as the catalog changes, and
		// --threads writer lanes apply the events. Collector sockets feed the
		// ranks registered without an endpoint of their own.
		kv := kvlisten.New(ctx, kvlisten.Options{Logger: log, Lanes: cfg.Router.EventThreads, MaxFrameBytes: o.kvEventsMaxFrame})
		defer kv.Close()
		for _, ep := range binds {
			if _, err := kv.Bind(ep); err != nil {
				return err
			}
		}
		cfg.Listeners = kv
		cfg.EventsCollector = len(binds) > 0
		metrics.MustRegister(kv)
	}
	if err := loadTrackingKey(&cfg); err != nil {
		return err
	}
	cfg.Engine = o.engines.config()
	o.disagg.apply(&cfg, log)
	flowMetrics := newFlowMetrics()
	o.flow.apply(&cfg, flowMetrics)
	svc, err := selection.New(cfg)
	if err != nil {
		// Only configuration reaches New (a key of the wrong size, say).
		if path, ok := cfg.Router.TrackingKeyFile.Get(); ok {
			err = fmt.Errorf("tracking key file %s: %w", path, err)
		}
		return &UsageError{err}
	}
	metrics.MustRegister(disaggMetrics{svc: svc})  // kvselect_prefill_decisions_total
	metrics.MustRegister(routingMetrics{svc: svc}) // kvselect_selection_*
	flowMetrics.svc = svc
	metrics.MustRegister(flowMetrics) // kvselect_flow_*
	if fc := svc.Inspect().FlowConfig(); fc != nil {
		log.Info("flow control on: waiting requests ordered by priority band and tenant fairness", "fairness", fc.Fairness.String(),
			"queue_ttl", fc.TTL.String(), "max_bytes", fc.MaxBytes, "max_band_bytes", fc.MaxBandBytes, "max_tenants", fc.MaxTenants)
	}
	// Replica sync: admissions, prefill completions, frees and session
	// bindings go out on a PUB socket and come in from every peer's (Dynamo's
	// "Peer Planes"). A port that cannot be bound stops the server, as in
	// Dynamo.
	var peers httpadmin.PeerManager
	if o.set["replica-sync-port"] {
		keys := make([][]byte, 0, len(o.replicaSyncKeys))
		for _, path := range o.replicaSyncKeys {
			key, err := mesh.LoadKey(path)
			if err != nil {
				return &UsageError{fmt.Errorf("--replica-sync-key-file: %w", err)}
			}
			keys = append(keys, key)
		}
		var signKey []byte
		if len(keys) > 0 {
			signKey, keys = keys[0], keys[1:]
		}
		// Not stopped by the signal: frees made while in-flight requests drain
		// still reach the peers; the deferred Close ends the mesh after that.
		m, err := mesh.Start(context.WithoutCancel(ctx), svc.Replica(), mesh.Options{
			Bind:         "tcp://*:" + strconv.FormatUint(o.replicaSyncPort, 10),
			Peers:        o.replicaSyncPeers,
			Affinity:     cfg.Router.SessionAffinityTTL.IsSet(),
			ResolvePeers: o.replicaSyncResolve,
			Logger:       log,
			Key:          signKey,
			Keys:         keys,
		})
		if err != nil {
			return err
		}
		defer m.Close()
		metrics.MustRegister(m)
		if signKey == nil {
			log.Warn("replica sync runs without --replica-sync-key-file: anyone who reaches the port can inject bookings and session bindings (docs/replicas.md)", "port", o.replicaSyncPort)
		} else {
			log.Info("replica sync messages authenticated (HMAC-SHA256)", "verify_keys", 1+len(keys))
		}
		peers = m
	}
	// Index recovery runs while the server already answers /health; /ready
	// stays 503 until it is over (recovery package doc).
	if len(o.indexerPeers) > 0 {
		svc.Replica().SetIndexRecovery(selection.RecoveryPending)
	}

	// Workers from a file or an InferencePool, through the same catalog calls
	// as POST/DELETE /workers (discovery.go); /ready waits for the first sync.
	// InferenceObjective priorities (flow control), from the config file
	// and the pool's namespace; the picker looks names up in them.
	objectives := new(flow.Objectives)
	fileObjectives, err := file.objectives()
	if err != nil {
		return &UsageError{err}
	}
	objectives.Set(flow.SourceFile, fileObjectives)
	var watched *flow.Objectives // the pool's InferenceObjectives matter only to flow control
	if o.flow.mode != flowOff {
		watched = objectives
	} else if len(fileObjectives) > 0 {
		log.Warn("the config file has objectives but --flow-control is off: their priorities order nothing", "file", o.configFile)
	}
	startDiscovery, err := prepareDiscovery(o.discovery, cfg.EventsCollector, svc, watched, log)
	if err != nil {
		return err
	}

	// Text prompts tokenized by the engines (--tokenize), for both fronts.
	var tokenizer selection.Tokenizer
	if tk := o.tokenize; tk.mode != tokenize.ModeOff {
		t, err := tokenize.New(ctx, tokenize.Config{Mode: tk.mode, Endpoints: tk.endpoints, Timeout: tk.timeout,
			CacheTokens: cmp.Or(tk.cacheTokens, -1), Logger: log}, svc.Inspect())
		if err != nil {
			return &UsageError{err}
		}
		metrics.MustRegister(t)
		tokenizer = t
		log.Info("text prompts tokenized by the engines", "mode", string(tk.mode), "endpoints", tk.endpoints,
			"timeout", tk.timeout.String(), "cache_tokens", tk.cacheTokens, "forward_ids", tk.forwardIDs)
	}

	host := restHost(o)
	ln, err := net.Listen(listenNetwork(host), net.JoinHostPort(host, strconv.FormatUint(o.port, 10)))
	if err != nil {
		return err
	}
	// Refused connections are closed before they cost a TLS handshake.
	limits := o.limits.build()
	metrics.MustRegister(limits)
	ln = limits.listener(ln)
	if tlsLn, err := o.auth.listen(ln, host, log); err != nil {
		_ = ln.Close()
		return err
	} else {
		ln = tlsLn
	}
	var auth access.Authorizer
	switch {
	case authz != nil:
		metrics.MustRegister(authz)
		metrics.MustRegister(authMetrics...)
		auth = authz
	case !isLoopback(host) && !o.auth.allowOpenAdmin:
		log.Warn("the REST API serves worker registration, reservations and replica peers WITHOUT AUTHENTICATION on a non-loopback address: anyone who reaches it can reroute prompts. Set --auth-token-file or --auth-kubernetes (docs/security.md), or --auth-allow-unauthenticated on a trusted network",
			"addr", ln.Addr().String())
	}
	srv := &http.Server{
		Handler: limits.middleware(httpadmin.New(svc, httpadmin.Options{
			Logger:     log,
			Peers:      peers,
			Metrics:    promhttp.HandlerFor(metrics, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}),
			Pprof:      o.enablePprof,
			Tokenizer:  tokenizer,
			Auth:       auth,
			Objectives: objectives,
			Tracing:    tr,
		})),
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	o.limits.applyHTTP(srv)
	log.Info("kvselect listening", append([]any{
		slog.String("addr", ln.Addr().String()),
		slog.String("version", versionString(set.version)),
	}, append(policyAttrs(initial), configAttrs(cfg)...)...)...)

	served := make(chan error, 2) // the REST and the ext_proc server
	go func() { served <- srv.Serve(ln) }()
	// The endpoint picker (Envoy ext_proc) beside the REST port, over the same
	// service.
	picker, err := startExtProc(o, svc, tokenizer, objectives, tr, limits.streamOption(), log, served)
	if err != nil {
		_ = srv.Close()
		return err
	}
	listening := Listening{REST: ln.Addr()}
	if picker != nil {
		metrics.MustRegister(picker.picker) // kvselect_extproc_*
		listening.ExtProc = picker.addr
	}
	if set.listening != nil {
		set.listening(listening)
	}

	upkeep, stopUpkeep := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { Upkeep(upkeep, svc, upkeepInterval(svc)) })
	startDiscovery(upkeep, &wg)
	// Engine metrics and health probes: stopped with the upkeep, before the
	// service shuts down.
	waitEngines := o.engines.startEngines(upkeep, svc, metrics, log)
	wg.Go(waitEngines)
	if len(o.indexerPeers) > 0 {
		wg.Go(func() {
			recovery.Run(upkeep, svc.Replica(), recovery.Options{Peers: o.indexerPeers, Logger: log, TokenFile: o.indexerPeersToken})
		})
	}
	// SIGHUP re-reads the config file (the policy parameters), unless the
	// program gave its own trigger; the signal is caught from before the
	// listeners open (hup above).
	if o.configFile != "" || set.reload != nil {
		r := &reloader{o: o, lookup: set.lookup, embedded: set.policy, svc: svc, log: log, cur: initial, auth: authz, objectives: objectives}
		wg.Go(func() { r.run(upkeep, hup, set.reload) })
	}
	defer func() {
		stopUpkeep()
		wg.Wait()
	}()

	var serveErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down", "cause", context.Cause(ctx).Error(), "timeout", o.shutdownTimeout.String())
	case serveErr = <-served:
		log.Error("server failed", "err", serveErr)
	}

	// Selection first, as Dynamo's service shuts down: from here selections,
	// bookings and catalog upserts get 503 and queued selections are
	// released, while DELETE /workers and the in-flight requests still
	// complete.
	svc.Shutdown()
	log.Info("selection service stopped admitting selections")
	start := time.Now()
	sctx, cancel := context.WithTimeout(context.Background(), o.shutdownTimeout)
	defer cancel()
	picker.shutdown(sctx)
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
		log.Error("graceful shutdown timed out; closed remaining connections", "timeout", o.shutdownTimeout.String())
		return fmt.Errorf("graceful shutdown: %w", err)
	}
	if serveErr != nil {
		return serveErr
	}
	log.Info("shutdown complete", "took", time.Since(start).Round(time.Millisecond).String())
	return nil
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
