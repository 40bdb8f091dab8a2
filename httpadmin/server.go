// Package httpadmin is the REST API of Dynamo's standalone selection service
// (https://docs.nvidia.com/dynamo/dev/components/router/standalone-selection-service;
// lib/kv-router/src/services/selection/server.rs and error.rs),
// wire-compatible — paths, JSON field names, status codes and the
// {"error": "..."} envelope — as a thin layer over an embedded
// selection.Service. Handlers validate the wire shape of a
// request and translate it into one Service call; every decision (which worker,
// what load, which error) comes from the Service, and every error's status comes
// from one table keyed by selection.Kind (errors.go).
//
// A client written for Dynamo's `python -m dynamo.select_service` (Ray, custom
// routers, the conformance suite) works against it unchanged. The deliberate
// differences are listed in decode.go (JSON decoding) and on parseWorkerID.
//
// Dynamo's service has no authentication. With Options.Auth set, every
// route but the probes (/health, /ready) needs a scope (auth.go): the route
// table names it, and a request without one is answered 401 or 403 before
// its handler runs.
package httpadmin

import (
	"log/slog"
	"net/http"
	"net/http/pprof"
	"path"
	"strings"

	"github.com/kvselect/kvselect/internal/access"
	"github.com/kvselect/kvselect/internal/tracing"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/flow"
)

// Options configures the REST front.
type Options struct {
	// Logger receives 5xx errors and recovered panics; slog.Default() when nil.
	Logger *slog.Logger
	// Peers manages live replica-sync peers (/replica_sync/*). nil means replica
	// sync is disabled: register and deregister answer 409 and GET peers [].
	Peers PeerManager
	// Metrics, when set, serves GET /metrics (Prometheus exposition). Dynamo's
	// selection service has no such route, so without it /metrics is the
	// usual 404.
	Metrics http.Handler
	// Pprof serves Go's runtime profiles under /debug/pprof/ (net/http/pprof),
	// as GIE's endpoint picker does with --enable-pprof. Off by default: a CPU
	// profile costs the server while it runs. It needs the admin scope.
	Pprof bool
	// Auth, when set, authorizes every request but the probes against the
	// scope its route needs (auth.go). nil: no authentication, as in Dynamo.
	Auth access.Authorizer
	// Tokenizer, when set, lets /select and /select_and_reserve bodies give
	// the prompt as text ("prompt" or "messages"), tokenized by the engine
	// (text.go). nil: those fields are ignored, as Dynamo ignores them.
	Tokenizer selection.Tokenizer
	// Objectives, when set, are the objective priorities GET /flow shows.
	Objectives *flow.Objectives
	// Tracing, when on, traces every route but the probes, /metrics and the
	// status page, continuing the caller's traceparent; tracing.Off() when
	// nil.
	Tracing *tracing.Tracing
	// EstimateEnds keeps every booking made over REST (select_and_reserve,
	// reservations) to its estimated end unless it is freed first
	// (selection.Service.EndByEstimate): for callers that book and never
	// free, whose bookings would otherwise count in the loads until the
	// 300 s active-request expiry. Off: a booking lasts until freed, as in
	// Dynamo.
	EstimateEnds bool
}

// PeerManager is the replica-sync peer membership behind /replica_sync/*.
// Endpoints reach it already checked with catalog.ValidateZMQEndpoint.
type PeerManager interface {
	// Register connects to a peer; created is false when it was already present.
	Register(endpoint string) (created bool, err error)
	// Deregister disconnects a peer. An unknown peer is a *selection.Error of
	// KindNotFound, which the API answers 404 {"error":"peer not found"}.
	Deregister(endpoint string) error
	// Peers lists the connected peer endpoints, sorted.
	Peers() []string
}

// server holds the mux and what the handlers need.
type server struct {
	svc        *selection.Service
	peers      PeerManager
	log        *slog.Logger
	mux        *http.ServeMux
	tokenizer  selection.Tokenizer
	auth       access.Authorizer
	scopes     map[string]access.Scope // route pattern → the scope it needs; 0: open
	objectives *flow.Objectives
	tracing    *tracing.Tracing
	opts       Options
}

// route is one registered route. The table below is the single source of the
// mux and of the OpenAPI drift test.
type route struct {
	method, pattern string
	handle          func(*server, http.ResponseWriter, *http.Request)
	scope           access.Scope // needed when authentication is on; 0: open (the probes)
}

// routes is Dynamo's route table (server.rs), in its registration order, plus
// kvselect's worker health reports, KV events collector status and the OpenAPI document. Go's "GET" patterns also answer HEAD, as axum's get()
// does.
var routes = []route{
	{"POST", "/select", (*server).selectOnly, access.Select},
	{"POST", "/select_and_reserve", (*server).selectAndReserve, access.Select},
	{"POST", "/reservations", (*server).reserve, access.Select},
	{"POST", "/reservations/{reservation_id}/prefill_complete", (*server).prefillComplete, access.Select},
	{"POST", "/reservations/{reservation_id}/output_block", (*server).outputBlock, access.Select},
	{"DELETE", "/reservations/{reservation_id}", (*server).free, access.Select},
	{"POST", "/workers", (*server).upsertWorker, access.Admin},
	{"GET", "/workers", (*server).listWorkers, access.Read},
	{"PATCH", "/workers/{worker_id}", (*server).patchWorker, access.Admin},
	{"DELETE", "/workers/{worker_id}", (*server).deleteWorker, access.Admin},
	{"POST", "/workers/{worker_id}/health_report", (*server).reportHealth, access.Admin},
	{"GET", "/health", (*server).health, 0},
	{"GET", "/ready", (*server).ready, 0},
	{"GET", "/loads", (*server).loads, access.Read},
	{"POST", "/potential_loads", (*server).potentialLoads, access.Read},
	{"POST", "/overlap_scores", (*server).overlapScores, access.Read},
	{"GET", "/dump", (*server).dump, access.Read},
	{"POST", "/replica_sync/register_peer", (*server).registerPeer, access.Admin},
	{"POST", "/replica_sync/deregister_peer", (*server).deregisterPeer, access.Admin},
	{"GET", "/replica_sync/peers", (*server).listPeers, access.Read},
	{"GET", "/kv_events/collector", (*server).kvEventsCollector, access.Read},
	{"GET", "/flow", (*server).flow, access.Read},
	{"GET", "/policy", (*server).policy, access.Read},
	{"GET", "/openapi.json", (*server).openAPI, access.Read},
}

// New returns the REST API over svc.
func New(svc *selection.Service, opts Options) http.Handler {
	s := &server{svc: svc, peers: opts.Peers, log: opts.Logger, mux: http.NewServeMux(), tokenizer: opts.Tokenizer,
		auth: opts.Auth, scopes: make(map[string]access.Scope), objectives: opts.Objectives, tracing: opts.Tracing, opts: opts}
	if s.tracing == nil {
		s.tracing = tracing.Off()
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	handle := func(pattern string, scope access.Scope, h http.HandlerFunc) {
		s.mux.HandleFunc(pattern, h)
		s.scopes[pattern] = scope
	}
	for _, rt := range routes {
		h := rt.handle
		handle(rt.method+" "+rt.pattern, rt.scope, func(w http.ResponseWriter, r *http.Request) { h(s, w, r) })
	}
	if opts.Metrics != nil {
		handle("GET /metrics", access.Read, opts.Metrics.ServeHTTP)
	}
	// The status page (status.go): its static files carry no data and are
	// open, so a browser can load them; the data it polls needs the read
	// scope (the page asks for a token when the server wants one).
	handle("GET "+uiPath, 0, s.statusPage().ServeHTTP)
	handle("GET /ui/api/status", access.Read, s.status)
	if opts.Pprof {
		// The index without its trailing slash: ServeHTTP treats paths
		// that are not in canonical form as unknown routes. Profiles show
		// the process's memory and arguments: admin only.
		handle("GET /debug/pprof", access.Admin, pprof.Index)
		handle("GET /debug/pprof/", access.Admin, pprof.Index) // named profiles: heap, goroutine, ...
		handle("GET /debug/pprof/cmdline", access.Admin, pprof.Cmdline)
		handle("GET /debug/pprof/profile", access.Admin, pprof.Profile)
		handle("GET /debug/pprof/symbol", access.Admin, pprof.Symbol)
		handle("GET /debug/pprof/trace", access.Admin, pprof.Trace)
	}
	return s
}

// ServeHTTP replaces ServeMux's plain-text 404/405 and its path-cleaning
// redirects with Dynamo's JSON fallbacks (axum's fallback and
// method_not_allowed_fallback): a path that is not in canonical form (double
// slashes, dot segments, a trailing slash) is a route axum does not know, so it
// is a 404 here too rather than a 307 to somewhere else.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.log.Error("httpadmin: handler panic", "method", r.Method, "path", r.URL.Path, "panic", v)
			writeError(w, http.StatusInternalServerError, "internal server error", nil)
		}
	}()
	p := r.URL.EscapedPath()
	if p == "" || p[0] != '/' || path.Clean(p) != p && p != uiPath {
		refuseUnread(w, r, http.StatusNotFound, "route not found")
		return
	}
	if h, pattern := s.mux.Handler(r); pattern == "" {
		// No route for this method and path: ServeMux's own fallback knows
		// whether another method would match (405) or nothing does (404).
		var rec statusOnly
		h.ServeHTTP(&rec, r)
		if rec.code == http.StatusMethodNotAllowed {
			if allow := rec.header.Get("Allow"); allow != "" {
				w.Header().Set("Allow", allow)
			}
			refuseUnread(w, r, http.StatusMethodNotAllowed, "method not allowed")
			return
		}
		refuseUnread(w, r, http.StatusNotFound, "route not found")
		return
	} else if s.auth != nil && !s.authorize(w, r, s.scopes[pattern]) {
		return
	} else {
		s.traced(w, r, pattern, s.mux.ServeHTTP)
	}
}

// statusOnly records what ServeMux's fallback handler would answer.
type statusOnly struct {
	header http.Header
	code   int
}

func (s *statusOnly) Header() http.Header {
	if s.header == nil {
		s.header = make(http.Header)
	}
	return s.header
}
func (s *statusOnly) Write(b []byte) (int, error) { return len(b), nil }
func (s *statusOnly) WriteHeader(code int) {
	if s.code == 0 {
		s.code = code
	}
}

// policyClass reads x-dynamo-meta-policy-class as Dynamo does: trimmed, empty
// ignored. It selects the router policy class on /select and
// /select_and_reserve.
func policyClass(r *http.Request) string {
	return strings.TrimSpace(r.Header.Get("x-dynamo-meta-policy-class"))
}
