// Package extproc is kvselect's Envoy external processor: a gRPC
// envoy.service.ext_proc.v3.ExternalProcessor that speaks the Gateway API
// Inference Extension endpoint-picker protocol (GIE proposal 004,
// https://github.com/kubernetes-sigs/gateway-api-inference-extension/tree/main/docs/proposals/004-endpoint-picker-protocol),
// so kvselect runs as the endpoint picker (EPP) of an InferencePool behind
// Envoy, Envoy Gateway, kgateway, Istio or any GIE gateway.
//
// One gRPC stream is one HTTP request. The stream goroutine reads the
// request's identity from headers and body without tokenizing itself —
// block hashes or token ids the gateway or client already has, else the
// prompt text: the engine's ids for it when a selection.Tokenizer is set
// (SetTokenizer; tokenize.go), else selection hashes it in character
// blocks — and books it with
// selection.Service.SelectAndReserve, answers with the destination header and
// envoy.lb metadata, then follows the response: the served-endpoint metadata
// moves the booking when another endpoint served it
// (selection.Service.RebookServed), the first response body chunk completes
// the prefill, streamed output grows the booking by output blocks, and the
// end of the response frees it. However the stream ends — response end,
// Envoy's close and reset, a cancelled context, a Send error — the booking
// is freed exactly once (booking.go).
//
// The front translates; it does not decide. Which worker, what load and which
// error all come from selection.Service; kinds map to immediate-response
// status codes in one table (kindStatus). The README's "ext_proc endpoint
// picker" section is the header contract; docs/extproc.md has the message
// flows per processing mode.
package extproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/kvselect/kvselect/internal/sizepool"
	"github.com/kvselect/kvselect/internal/tracing"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/flow"
	"github.com/kvselect/kvselect/selection/randsrc"
	"github.com/kvselect/kvselect/selection/rewrite"
)

// ServiceName is the ext_proc gRPC service; the health service reports it.
const ServiceName = "envoy.service.ext_proc.v3.ExternalProcessor"

// healthNames are the health-check service names reported SERVING: the
// overall server, the ext_proc service (Envoy's cluster health check), and
// the names protocol 004's health checking defines (liveness, readiness) and
// the one GIE's chart and conformance manifests probe (inference-extension).
var healthNames = []string{"", ServiceName, "inference-extension", "liveness", "readiness"}

// Defaults.
const (
	// DefaultMaxBodyBytes bounds a buffered request body (flag
	// --extproc-max-body-bytes). GIE's lwepp caps at 10 MiB; 16 MiB leaves room
	// for long contexts and inline images.
	DefaultMaxBodyBytes = 16 << 20
	// BodyChunkBytes is the largest body message sent back to Envoy
	// (GIE's BodyByteLimit, under Envoy's ~64 KiB per-message guidance).
	BodyChunkBytes = 62000
)

// Options configures the ext_proc front.
type Options struct {
	// Logger receives stream-level problems; slog.Default() when nil.
	Logger *slog.Logger
	// Fallbacks is how many ordered fallback endpoints follow the primary in
	// x-gateway-destination-endpoint (protocol 004 v0.4). 0 sends only the
	// primary.
	Fallbacks int
	// MaxBodyBytes bounds the request body the picker buffers
	// (FULL_DUPLEX_STREAMED, BUFFERED); a larger body gets a 413 immediate
	// response. 0 means DefaultMaxBodyBytes.
	MaxBodyBytes int
	// DefaultModel is the partition of requests that name no model the
	// picker can see: no x-kvselect-model-name header and no body model
	// (requests without a body, STREAMED and NONE request modes, which route
	// on headers alone). Empty means Dynamo's "default" partition.
	DefaultModel string
	// AssumedModes are the body send modes taken for a stream whose first
	// message carries no protocol_config (Envoy releases before it existed):
	// they must match the filter's processing_mode, which the picker cannot
	// see otherwise. nil means FULL_DUPLEX_STREAMED both ways, GIE's
	// configuration.
	AssumedModes *BodyModes
	// TestPickHeader enables the GIE conformance hooks: the
	// test-epp-endpoint-selection request header restricts the pick to the
	// listed endpoints (over the subset hint), and responses carry
	// x-conformance-test-served-endpoint. Off in production.
	TestPickHeader bool
	// Disaggregate asks for a prefill/decode decision on every request
	// (selection.SelectRequest.Disaggregated): a model with a prefill pool
	// has its prompt prefilled remotely or locally by Dynamo's conditional
	// rules, and a remote prefill's worker goes to the decode worker in
	// PrefillHeader and HeaderPrefillEndpoint. Models without a prefill pool
	// are routed as before.
	Disaggregate bool
	// PrefillHeader is the request header that names the prefill worker's
	// host:port; HeaderPrefiller (llm-d's) when empty. A client's own copy
	// of it, or of HeaderPrefillEndpoint, never reaches the worker.
	PrefillHeader string
	// Objectives maps the InferenceObjective a request names
	// (HeaderObjective) to its flow control priority; nil knows none.
	Objectives *flow.Objectives
	// SessionHeaders are the request headers that carry a session id (session
	// affinity's key), in order of precedence: the first one a request
	// sends with a value wins, then the body's nvext session. nil means
	// DefaultSessionHeaders(); empty reads sessions from the body alone. At
	// most MaxSessionHeaders lower-case names (CheckSessionHeaders).
	SessionHeaders []string
	// SessionAsFairnessID makes a request's session its flow control tenant
	// when it sends no fairness id header, so that agent sessions share a
	// band fairly with each other.
	SessionAsFairnessID bool
	// Rewrites are the pool's InferenceModelRewrite rules (rewrite.go); nil
	// has none.
	Rewrites *rewrite.Rules
	// Rand draws the rewrite target of requests without a session; nil
	// seeds a source of its own.
	Rand *rand.Rand
	// Tracing is where request spans go and how trace context is read from
	// and written to the request headers; tracing.Off() when nil.
	Tracing *tracing.Tracing
	// BookingEnd says what ends a booking whose response the stream did
	// not see end (bookingend.go); BookingEndAuto when zero.
	BookingEnd BookingEnd
}

// BodyModes are the request and response body send modes of Envoy's ext_proc
// filter (processing_mode.request_body_mode / response_body_mode).
type BodyModes struct {
	Request, Response filterv3.ProcessingMode_BodySendMode
}

// ParseBodyMode reads a body send mode by its Envoy name, case-insensitive:
// none, streamed, buffered, buffered_partial or full_duplex_streamed.
func ParseBodyMode(s string) (filterv3.ProcessingMode_BodySendMode, error) {
	v, ok := filterv3.ProcessingMode_BodySendMode_value[strings.ToUpper(strings.TrimSpace(s))]
	if !ok {
		return 0, fmt.Errorf("body send mode %q: want none, streamed, buffered, buffered_partial or full_duplex_streamed", s)
	}
	return filterv3.ProcessingMode_BodySendMode(v), nil
}

// Server is the ext_proc server. It implements
// extprocv3.ExternalProcessorServer; Register adds it and the gRPC health
// service to a grpc.Server.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	svc    *selection.Service
	opts   Options
	log    *slog.Logger
	addrs  addrCache
	health *health.Server

	active   atomic.Int64 // streams in flight
	metrics  *metrics
	requests *requestMetrics // per model, from the response path (observe.go)
	unknown  unknownObjectives
	// deprecatedWarned: the first use of each deprecatedHeaders name was
	// logged.
	deprecatedWarned [len(deprecatedHeaders)]atomic.Bool

	tokenizing atomic.Pointer[tokenizing] // SetTokenizer

	// rewriteRand draws rewrite targets without a session (rewrite.go).
	rewriteRand *randsrc.Source

	// bodies keeps request body buffers of long prompts for the next
	// request (appendBody, releaseBody), ids their token id arrays
	// (earlyIDs, pick).
	bodies *sizepool.Pool[byte]
	ids    *sizepool.Pool[uint32]
}

// pooledBodyBytes is the smallest body buffer kept for reuse: a 16k-token
// prompt's body as ids, below which the allocator's own reuse does as well.
const pooledBodyBytes = 64 << 10

// pooledIDs is the smallest token id array kept for reuse: the ids of a
// body of pooledBodyBytes.
const pooledIDs = 16 << 10

var (
	_ extprocv3.ExternalProcessorServer = (*Server)(nil)
	_ prometheus.Collector              = (*Server)(nil)
)

// New returns the ext_proc front over svc.
func New(svc *selection.Service, opts Options) *Server {
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.Fallbacks < 0 {
		opts.Fallbacks = 0
	}
	if opts.Tracing == nil {
		opts.Tracing = tracing.Off()
	}
	if opts.SessionHeaders == nil {
		opts.SessionHeaders = DefaultSessionHeaders()
	}
	if len(opts.SessionHeaders) > MaxSessionHeaders {
		// CheckSessionHeaders is the caller's; past the bound the picker
		// would index out of identity.sessions.
		opts.SessionHeaders = opts.SessionHeaders[:MaxSessionHeaders]
	}
	s := &Server{svc: svc, opts: opts, log: opts.Logger, health: health.NewServer(), metrics: newMetrics(), bodies: sizepool.New[byte](pooledBodyBytes), ids: sizepool.New[uint32](pooledIDs),
		requests: newRequestMetrics(), rewriteRand: newRewriteSource(opts.Rand)}
	if s.log == nil {
		s.log = slog.Default()
	}
	for _, n := range healthNames {
		s.health.SetServingStatus(n, healthpb.HealthCheckResponse_SERVING)
	}
	return s
}

// Register registers the ext_proc service and the standard gRPC health
// service on g.
func (s *Server) Register(g *grpc.Server) {
	extprocv3.RegisterExternalProcessorServer(g, s)
	healthpb.RegisterHealthServer(g, s.health)
}

// Shutdown reports NOT_SERVING on every health name, so gateways stop sending
// new streams while the in-flight ones finish.
func (s *Server) Shutdown() { s.health.Shutdown() }

// SessionHeaders is the session header list in effect, in order.
func (s *Server) SessionHeaders() []string { return slices.Clone(s.opts.SessionHeaders) }

// Active is the number of streams in flight.
func (s *Server) Active() int64 { return s.active.Load() }

// Process serves one HTTP request's ext_proc stream.
func (s *Server) Process(srv extprocv3.ExternalProcessor_ProcessServer) (err error) {
	s.active.Add(1)
	s.metrics.streams.Add(1)
	defer func() {
		s.active.Add(-1)
		if err != nil {
			s.metrics.streamErrors.Add(1)
		}
	}()
	st := newStream(s, srv)
	defer st.end()
	// One message value for the whole stream: decoding resets it, and
	// nothing of a message outlives its handling (bodies are copied into
	// the stream's buffer, echoes are encoded before the next receive).
	req := new(extprocv3.ProcessingRequest)
	for {
		if err := srv.RecvMsg(req); err != nil {
			// Envoy ends every stream, normal or not, with a half-close
			// immediately followed by a reset (its ext_proc filter closes
			// the stream so when the HTTP stream is destroyed): both are a
			// normal end here.
			if errors.Is(err, io.EOF) {
				// The gateway half-closed: a clean end (keepToEstimate).
				st.cleanEnd = true
				return nil
			}
			if status.Code(err) == codes.Canceled || errors.Is(err, context.Canceled) {
				return nil
			}
			return status.Errorf(codes.Unknown, "receive: %v", err)
		}
		if err := st.handle(req); err != nil {
			// A local reply is the exchange's last message, not a failure.
			if r, ok := errors.AsType[*localReply](err); ok {
				return st.reply(r)
			}
			return err
		}
	}
}

// kindStatus is the one table from selection error kinds to immediate-response
// status codes (protocol 004 asks for 503 when no endpoint is ready and 429
// when the request is shed).
var kindStatus = map[selection.Kind]typev3.StatusCode{
	selection.KindBadRequest:  typev3.StatusCode_BadRequest,
	selection.KindNotFound:    typev3.StatusCode_NotFound,
	selection.KindConflict:    typev3.StatusCode_Conflict,
	selection.KindNotReady:    typev3.StatusCode_ServiceUnavailable,
	selection.KindOverloaded:  typev3.StatusCode_TooManyRequests,
	selection.KindUnavailable: typev3.StatusCode_ServiceUnavailable,
	selection.KindInternal:    typev3.StatusCode_InternalServerError,
}

func statusOf(err error) typev3.StatusCode {
	if c, ok := kindStatus[selection.KindOf(err)]; ok {
		return c
	}
	return typev3.StatusCode_InternalServerError
}
