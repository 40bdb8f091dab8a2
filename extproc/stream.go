package extproc

import (
	"context"
	"errors"
	"fmt"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvselect/kvselect/selection"
)

// stream is one HTTP request's state, owned by its stream goroutine. The
// request side reads the request (request.go, selectinput.go), books it and
// sends the routing decision (route.go), the response side (response.go)
// follows the response, and bk (booking.go) is the reservation both drive
// until it is freed.
type stream struct {
	s   *Server
	srv extprocv3.ExternalProcessor_ProcessServer
	ctx context.Context

	// Processing modes from the first message's protocol_config; without
	// it (Envoy before protocol_config existed) Options.AssumedModes, by
	// default FULL_DUPLEX_STREAMED, the GIE reference configuration.
	modesKnown bool
	modes      BodyModes

	// Request side.
	id        identity
	body      []byte
	early     earlyIDs // the prompt's ids read as the body arrives (earlyids.go)
	headersIn bool     // request headers seen (once per stream)
	picked    bool     // routing decision sent

	// The routing decision: where the booking is, and the fallbacks the
	// gateway may try after it.
	primary   string
	fallbacks []selection.RankEndpoint
	worker    uint64 // the worker behind primary
	outcome   bool   // the response's outcome was reported to the health checks

	bk booking
	ex exchange // the request's span and metrics (observe.go)

	// rewrite is the model the body was rewritten to (rewrite.go).
	rewrite modelRewrite

	// Response side.
	// responseSeen: a response message came (a response phase exists);
	// cleanEnd: the gateway half-closed the stream (keepToEstimate).
	responseSeen, cleanEnd bool
	sse                    bool
	counter                tokenCounter
	// echo is the message every streamed response chunk goes back in,
	// reused: one allocation less per chunk.
	echo streamedMsg
}

func newStream(s *Server, srv extprocv3.ExternalProcessor_ProcessServer) *stream {
	st := &stream{s: s, srv: srv, ctx: srv.Context(), bk: booking{core: s.svc, m: s.metrics, log: s.log}}
	st.early.pool = s.ids
	// A no-op span until the request headers start the real one.
	st.ex.ctx, st.ex.span = st.ctx, trace.SpanFromContext(context.Background())
	return st
}

// handle dispatches one message from Envoy.
func (st *stream) handle(req *extprocv3.ProcessingRequest) error {
	if pc := req.GetProtocolConfig(); pc != nil && !st.modesKnown {
		st.modesKnown, st.modes = true, BodyModes{Request: pc.GetRequestBodyMode(), Response: pc.GetResponseBodyMode()}
	}
	if !st.picked {
		if e, ok := subsetHint(req.GetMetadataContext()); ok {
			st.id.subset, st.id.hasSubset = e, true
		}
	}
	switch r := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return st.onRequestHeaders(r.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return st.onRequestBody(r.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return st.onRequestTrailers()
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		st.responseSeen = true
		return st.onResponseHeaders(r.ResponseHeaders, req.GetMetadataContext())
	case *extprocv3.ProcessingRequest_ResponseBody:
		st.responseSeen = true
		return st.onResponseBody(r.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		st.responseSeen = true
		return st.onResponseTrailers()
	}
	return nil
}

// bodyModes are the modes in effect: announced, else assumed.
func (st *stream) bodyModes() BodyModes {
	switch {
	case st.modesKnown:
		return st.modes
	case st.s.opts.AssumedModes != nil:
		return *st.s.opts.AssumedModes
	}
	return BodyModes{Request: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, Response: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}
}

func (st *stream) requestMode() filterv3.ProcessingMode_BodySendMode  { return st.bodyModes().Request }
func (st *stream) responseMode() filterv3.ProcessingMode_BodySendMode { return st.bodyModes().Response }

func (st *stream) send(r *extprocv3.ProcessingResponse) error { return st.srv.Send(r) }

// sendWith sends r carrying the routing decision's dynamic metadata.
func (st *stream) sendWith(r *extprocv3.ProcessingResponse, md *structpb.Struct) error {
	r.DynamicMetadata = md
	return st.srv.Send(r)
}

// localReply is an immediate response: the picker answers the request itself
// with code and {"error": msg}, and the exchange ends there. The request side
// returns it as its error, so that every caller stops as it does on any
// error and nothing goes on as if the request were routed; Process sends it
// (reply) and ends the stream without a stream error.
type localReply struct {
	code typev3.StatusCode
	msg  string
	// retryAfter, when set, is the Retry-After header's value.
	retryAfter string
}

func (r *localReply) Error() string {
	return fmt.Sprintf("immediate response %d: %s", r.code, r.msg)
}

// immediateErr answers a selection error with its mapped status.
func (st *stream) immediateErr(err error) error {
	code := statusOf(err)
	if code >= 500 && selection.KindOf(err) == selection.KindInternal {
		st.s.log.Warn("extproc: selection failed", "err", err)
	}
	r := &localReply{code: code, msg: err.Error()}
	if se, ok := errors.AsType[*selection.Error](err); ok {
		r.retryAfter = se.RetryAfterHeader()
	}
	return r
}

// immediate is the local reply of code and msg, as the error that ends the
// exchange.
func immediate(code typev3.StatusCode, msg string) error {
	return &localReply{code: code, msg: msg}
}

// reply sends a local reply, the exchange's last message.
func (st *stream) reply(r *localReply) error {
	st.s.metrics.immediateResponse(r.code)
	st.immediateSeen(int(r.code), r.msg)
	resp := immediateResponse(r.code, r.msg)
	if r.retryAfter != "" {
		ir := resp.GetImmediateResponse()
		ir.Headers.SetHeaders = append(ir.Headers.SetHeaders, setHeader("retry-after", r.retryAfter))
	}
	return st.send(resp)
}
