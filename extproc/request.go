package extproc

import (
	"errors"
	"fmt"
	"strings"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvselect/kvselect/internal/tracing"
	"github.com/kvselect/kvselect/selection"
)

// onRequestHeaders decides, per mode, whether the pick waits for the body:
// FULL_DUPLEX_STREAMED defers the headers response until the body's end (the
// only mode where Envoy lets the processor read the body first); BUFFERED
// must answer the headers at once (Envoy holds the body back until the
// headers are answered, so waiting for it would deadlock) and picks on the
// body message; STREAMED and NONE route before any body reaches the
// processor, so they pick from the headers alone, as do requests without a
// body.
func (st *stream) onRequestHeaders(h *extprocv3.HttpHeaders) error {
	if st.headersIn {
		// One stream is one request: a second request would book twice.
		return status.Error(codes.InvalidArgument, "ext_proc: request headers received twice on one stream")
	}
	st.headersIn = true
	err := readHeaders(h.GetHeaders(), &st.id, st.s.opts.SessionHeaders)
	st.s.countDeprecated(st.id.deprecated)
	st.startRequest()
	if err != nil {
		return immediate(typev3.StatusCode_BadRequest, err.Error())
	}
	if h.GetEndOfStream() {
		return st.pickAndRoute(false)
	}
	switch st.requestMode() {
	case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		return nil
	case filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_BUFFERED_PARTIAL:
		return st.send(headersResponse(nil))
	default:
		return st.pickAndRoute(false)
	}
}

func (st *stream) onRequestBody(b *extprocv3.HttpBody) error {
	switch st.requestMode() {
	case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		if st.picked {
			// Body after the decision (not expected from Envoy): pass it on.
			return st.send(streamedBody(true, b.GetBody(), b.GetEndOfStream()))
		}
		if err := st.appendBody(b.GetBody()); err != nil {
			return err
		}
		if !b.GetEndOfStream() {
			if len(st.body) >= earlyMin {
				st.early.advance(st.body, int(min(st.id.contentLength, int64(st.s.opts.MaxBodyBytes))))
			}
			return nil
		}
		return st.pickAndRoute(true)
	case filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_BUFFERED_PARTIAL:
		if st.picked {
			return st.send(bodyResponse(true, nil))
		}
		if err := st.appendBody(b.GetBody()); err != nil {
			return err
		}
		return st.pickAndRoute(true)
	default:
		return st.send(bodyResponse(true, nil))
	}
}

// onRequestTrailers: a client that sends request trailers ends its body with
// them; in FULL_DUPLEX_STREAMED that is the moment to pick.
func (st *stream) onRequestTrailers() error {
	if st.requestMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED && !st.picked {
		if err := st.pickAndRouteTrailers(); err != nil {
			return err
		}
	}
	return st.send(requestTrailersResponse())
}

func (st *stream) appendBody(b []byte) error {
	if len(st.body)+len(b) > st.s.opts.MaxBodyBytes {
		return immediate(typev3.StatusCode_PayloadTooLarge,
			fmt.Sprintf("request body exceeds the picker's limit of %d bytes (--extproc-max-body-bytes)", st.s.opts.MaxBodyBytes))
	}
	if st.body == nil && st.id.contentLength > 0 {
		// One buffer of the announced size instead of append's doublings,
		// each a copy of everything so far: at long context (megabytes in
		// Envoy's 16 KiB chunks) they cost more than the parse. A long
		// body's buffer is an earlier request's, its pages still mapped.
		st.body = st.s.bodies.Get(int(min(st.id.contentLength, int64(st.s.opts.MaxBodyBytes))))
	}
	st.body = append(st.body, b...)
	return nil
}

// releaseBody gives the body buffer back for the next request once the
// request phase is over: every message that carried it (the echoed chunks,
// a rewritten body) was encoded into gRPC's own buffers when sent, and
// nothing parsed from it refers to its bytes (parsing copies what it keeps).
func (st *stream) releaseBody() {
	if st.body != nil {
		st.s.bodies.Put(st.body)
		st.body = nil
	}
}

// pick chooses and books the request's worker, and returns the decision as
// Envoy applies it: the request's selection input (readRequest), its booking
// (reserve), the header mutation and dynamic metadata (routing). An answer for
// the client is a *localReply error; any other error ends the stream.
func (st *stream) pick(withBody bool) (*extprocv3.HeaderMutation, *structpb.Struct, error) {
	defer st.s.metrics.observePick(time.Now())
	in, err := st.readRequest(withBody)
	if err != nil {
		return nil, nil, err
	}
	resp, err := st.reserve(&in)
	// The ids read from the body were hashed when the request was booked
	// (or refused) and nothing keeps them: the next request may take them.
	st.s.ids.Put(in.body.tokens)
	if err != nil {
		return nil, nil, err
	}
	mut, md := st.routing(resp)
	return mut, md, nil
}

// readRequest reads the request into its selection input under the parse
// span: what its headers and body say (readSelectInput), then what needs the
// stream: the engine's ids for a text prompt, the workers a restriction
// leaves.
func (st *stream) readRequest(withBody bool) (selectInput, error) {
	_, parse := st.startSpan(tracing.SpanParse)
	defer parse.End()
	var (
		body  []byte
		early *earlyIDs
	)
	if withBody {
		body, early = st.body, &st.early
	}
	in, err := readSelectInputEarly(&st.id, body, early, &st.s.opts)
	// The ids now belong to the request (or were not the prompt's).
	st.early = earlyIDs{}
	if err != nil {
		if errors.Is(err, errBadBody) {
			parse.SetStatus(otelcodes.Error, err.Error())
		}
		return selectInput{}, immediate(typev3.StatusCode_BadRequest, err.Error())
	}
	st.sse = in.body.stream
	st.counter.format = in.body.format
	if err := st.rewriteModel(&in, withBody); err != nil {
		return selectInput{}, err
	}
	if in.unknownObjective != "" {
		st.s.metrics.unknownObjectives.Add(1)
		st.s.unknown.warn(st.s, in.unknownObjective)
	}
	req := &in.req
	if in.tokenize {
		// The body is re-sent only in FULL_DUPLEX_STREAMED (pickAndRoute).
		st.tokenize(&in.body, req, st.requestMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	}
	if in.restrict != nil {
		if err := st.restrict(req, in.restrict); err != nil {
			return selectInput{}, err
		}
	}
	if parse.IsRecording() {
		parse.SetAttributes(attribute.String("kvselect.model", req.ModelName), attribute.Int("kvselect.body_bytes", len(st.body)),
			attribute.String("kvselect.identity", identitySource(req)), attribute.String("kvselect.request_format", in.body.format.String()))
	}
	return in, nil
}

// restrict limits the candidates to the workers whose endpoint matches one
// of r's entries (ip or ip:port); none matching is protocol 004's 503.
func (st *stream) restrict(req *selection.SelectRequest, r *restriction) error {
	ts := parseTargets(r.entries)
	var allowed []uint64
	if len(ts) > 0 {
		allowed = st.s.addrs.allowedWorkers(st.s.svc.Inspect().Endpoints(req.PartitionKey), ts)
	}
	if len(allowed) == 0 {
		return immediate(typev3.StatusCode_ServiceUnavailable,
			fmt.Sprintf("no schedulable worker matches the %s %q", r.what, strings.Join(r.entries, ",")))
	}
	req.AllowedWorkerIDs = allowed
	return nil
}

// reserve books the request (SelectAndReserve, under the select span) and
// records the booking on the stream: its id and block size, the request
// metrics, the chosen rank and its fallbacks. A selection error is the
// client's local reply, with its kind's status.
func (st *stream) reserve(in *selectInput) (*selection.SelectResponse, error) {
	sctx, sel := st.startSpan(tracing.SpanSelect)
	defer sel.End()
	resp, err := st.s.svc.SelectAndReserve(sctx, &in.req)
	if err != nil && in.fromRequestID && selection.KindOf(err) == selection.KindConflict {
		// x-request-id is not guaranteed unique (clients set it); a live
		// booking under it already exists, so this request gets its own id.
		in.req.SelectionID = nil
		resp, err = st.s.svc.SelectAndReserve(sctx, &in.req)
	}
	if err != nil {
		sel.SetStatus(otelcodes.Error, err.Error())
		return nil, st.immediateErr(err)
	}
	if sel.IsRecording() {
		sel.SetAttributes(tracing.SelectionAttributes(resp)...)
	}
	st.routed(resp)
	st.picked = true
	st.bk.booked(*resp.SelectionID, int(resp.BlockSize))
	if m := in.body.maxOutput; m != nil {
		st.bk.limit = int(*m)
	}
	st.s.metrics.routed.Add(1)
	st.primary = st.s.addrs.addr(resp.Endpoint)
	st.worker = resp.WorkerID
	st.fallbacks = resp.Fallbacks
	return resp, nil
}
