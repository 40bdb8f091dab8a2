package server

import (
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvselect/kvselect/httpadmin"
	"github.com/kvselect/kvselect/internal/access"
	"github.com/kvselect/kvselect/internal/tracing"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/flow"
	"github.com/kvselect/kvselect/selection/rewrite"
)

// readHeaderTimeout bounds how long a client may take to send request headers
// (slowloris). --http-read-timeout bounds the whole request, body included;
// there is no write timeout by default: a selection may wait in the scheduler
// queue for as long as its client allows (limits.go).
const readHeaderTimeout = 10 * time.Second

// idleTimeout closes keep-alive connections a client forgot; without it they
// would stay open forever (no ReadTimeout is set to fall back on).
const idleTimeout = 2 * time.Minute

// fronts is what the REST API and the picker both serve over.
type fronts struct {
	svc        *selection.Service
	tokenizer  selection.Tokenizer // nil: text prompts route on the text index
	objectives *flow.Objectives
	rewrites   *rewrite.Rules // the picker's model rewrites
	tracing    *tracing.Tracing
	limits     *limiters // per-client limits of both ports (limits.go)
	log        *slog.Logger
	served     chan<- error // why a server stopped serving
}

// restServer is the running REST API.
type restServer struct {
	http *http.Server
	addr net.Addr
}

// startREST serves the REST API (httpadmin, with GET /metrics from metrics)
// on restHost and --port: behind the per-client connection limit, in TLS
// with --tls-cert-path, with the authentication of conf. A serve error goes
// to f.served.
func startREST(o *options, f *fronts, conf startup, peers httpadmin.PeerManager, metrics *prometheus.Registry, version string) (*restServer, error) {
	host, log := restHost(o), f.log
	ln, err := net.Listen(listenNetwork(host), net.JoinHostPort(host, strconv.FormatUint(o.port, 10)))
	if err != nil {
		return nil, err
	}
	// Refused connections are closed before they cost a TLS handshake.
	metrics.MustRegister(f.limits)
	ln = f.limits.listener(ln)
	if tlsLn, err := o.auth.listen(ln, host, log); err != nil {
		_ = ln.Close()
		return nil, err
	} else {
		ln = tlsLn
	}
	var auth access.Authorizer
	switch {
	case conf.authz != nil:
		metrics.MustRegister(conf.authz)
		metrics.MustRegister(conf.authMetrics...)
		auth = conf.authz
	case !isLoopback(host) && !o.auth.allowOpenAdmin:
		log.Warn("the REST API serves worker registration, reservations and replica peers WITHOUT AUTHENTICATION on a non-loopback address: anyone who reaches it can reroute prompts. Set --auth-token-file or --auth-kubernetes (docs/security.md), or --auth-allow-unauthenticated on a trusted network",
			"addr", ln.Addr().String())
	}
	srv := &http.Server{
		Handler: f.limits.middleware(httpadmin.New(f.svc, httpadmin.Options{
			Logger:     log,
			Peers:      peers,
			Metrics:    promhttp.HandlerFor(metrics, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}),
			Pprof:      o.enablePprof,
			Tokenizer:  f.tokenizer,
			Auth:       auth,
			Objectives: f.objectives,
			Tracing:    f.tracing,
			// REST callers that book and never free (--rest-booking-end).
			EstimateEnds: o.bookEnd.rest == restEndEstimate,
		})),
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	o.limits.applyHTTP(srv)
	log.Info("kvselect listening", append([]any{
		slog.String("addr", ln.Addr().String()),
		slog.String("version", versionString(version)),
	}, append(policyAttrs(conf.initial), configAttrs(conf.initial.cfg)...)...)...)
	go func() { f.served <- srv.Serve(ln) }()
	return &restServer{http: srv, addr: ln.Addr()}, nil
}
