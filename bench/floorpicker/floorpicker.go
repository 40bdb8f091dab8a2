// Package floorpicker is the least an endpoint picker can do over Envoy's
// ext_proc and still take part in every exchange the way GIE's endpoint
// picker protocol asks (proposal 004, FULL_DUPLEX_STREAMED both ways): it
// collects the request body, names a destination round-robin (the
// x-gateway-destination-endpoint header and the envoy.lb metadata), streams
// the body back, answers the response headers and streams every response
// chunk back. It reads nothing from the body, indexes no KV events and
// scrapes no engine.
//
// kvbench vs-epp runs it as the picker "floor": what it costs per request
// on the same traffic, the same gRPC stack and the same core is the part of
// any Go picker's cost that the protocol itself sets (the messages, their
// copies, the syscalls), below which no policy work can go. A picker's
// figures above the floor's are its own work.
package floorpicker

import (
	"errors"
	"io"
	"strconv"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvselect/kvselect/extproc"
)

// HistogramName is the floor's decision histogram: from the request's last
// body message to the decision and the body sent back.
const HistogramName = "floorpicker_pick_duration_seconds"

// Server is the floor picker's ext_proc service.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer
	endpoints []string
	next      atomic.Uint64
	pick      prometheus.Histogram
	maxBody   int // extproc.DefaultMaxBodyBytes, as kvselect; smaller in tests
}

// New returns a floor picker over endpoints (host:port, at least one),
// its histogram registered with reg (nil: not registered).
func New(endpoints []string, reg prometheus.Registerer) (*Server, error) {
	if len(endpoints) == 0 {
		return nil, errors.New("floorpicker: no endpoints to route to")
	}
	s := &Server{endpoints: endpoints, maxBody: extproc.DefaultMaxBodyBytes, pick: prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    HistogramName,
		Help:    "Time from the request's last body message to the routing decision and the body sent back.",
		Buckets: extproc.PickBuckets(),
	})}
	if reg != nil {
		if err := reg.Register(s.pick); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Process serves one HTTP request's exchange.
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	var body []byte
	routed := false // the request's decision was sent
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		var resp *extprocv3.ProcessingResponse
		switch r := req.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			if !r.RequestHeaders.GetEndOfStream() {
				// The decision waits for the body, held in one buffer
				// of its announced length.
				body = make([]byte, 0, min(contentLength(r.RequestHeaders), s.maxBody))
				continue
			}
			resp, routed = s.route(0), true
		case *extprocv3.ProcessingRequest_RequestBody:
			if len(body)+len(r.RequestBody.GetBody()) > s.maxBody {
				return status.Errorf(codes.ResourceExhausted, "floorpicker: request body over %d bytes", s.maxBody)
			}
			body = append(body, r.RequestBody.GetBody()...)
			if !r.RequestBody.GetEndOfStream() {
				continue
			}
			if err := s.routeWithBody(stream, body, true); err != nil {
				return err
			}
			body, routed = nil, true
			continue
		case *extprocv3.ProcessingRequest_RequestTrailers:
			// A body ended by trailers: the decision and the body (unless
			// the body already ended the request), then the trailers'
			// answer.
			if !routed {
				if err := s.routeWithBody(stream, body, false); err != nil {
					return err
				}
				body, routed = nil, true
			}
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
		case *extprocv3.ProcessingRequest_ResponseBody:
			resp = streamed(false, r.ResponseBody.GetBody(), r.ResponseBody.GetEndOfStream())
		case *extprocv3.ProcessingRequest_ResponseTrailers:
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}
		default:
			return errors.New("floorpicker: a processing request of no known kind")
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

// contentLength is the request's announced body length (0: none or not a
// number): a size to reserve, within maxBody, not to trust.
func contentLength(h *extprocv3.HttpHeaders) int {
	for _, hv := range h.GetHeaders().GetHeaders() {
		if hv.GetKey() != "content-length" {
			continue
		}
		v := hv.GetRawValue()
		if len(v) == 0 {
			v = []byte(hv.GetValue())
		}
		n, err := strconv.Atoi(string(v))
		if err != nil || n < 0 {
			return 0
		}
		return n
	}
	return 0
}

// routeWithBody sends the decision for a request of body, then the body in
// ≤ extproc.BodyChunkBytes streamed messages (the size kvselect and llm-d's
// picker stream a body back in, so the floor sends as many messages); eos
// marks the last one end_of_stream (false when trailers follow).
func (s *Server) routeWithBody(stream extprocv3.ExternalProcessor_ProcessServer, body []byte, eos bool) error {
	start := time.Now()
	if err := stream.Send(s.route(len(body))); err != nil {
		return err
	}
	for b := body; ; {
		n := min(len(b), extproc.BodyChunkBytes)
		last := n == len(b)
		if err := stream.Send(streamed(true, b[:n], eos && last)); err != nil {
			return err
		}
		if b = b[n:]; last {
			break
		}
	}
	s.pick.Observe(time.Since(start).Seconds())
	return nil
}

// route is the request headers' answer naming the next endpoint; with a
// body of n bytes (n > 0) it also sets content-length, as a picker that may
// have changed the body must.
func (s *Server) route(n int) *extprocv3.ProcessingResponse {
	dest := s.endpoints[(s.next.Add(1)-1)%uint64(len(s.endpoints))]
	set := []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: extproc.HeaderDestination, RawValue: []byte(dest)}}}
	if n > 0 {
		set = append(set, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "content-length", RawValue: []byte(strconv.Itoa(n))}})
	}
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: set}}}},
		DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			extproc.MetadataLB: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
				extproc.HeaderDestination: structpb.NewStringValue(dest),
			}}),
		}},
	}
}

// streamed is a FULL_DUPLEX_STREAMED body message sent back: the request's
// (request true) or the response's.
func streamed(request bool, b []byte, eos bool) *extprocv3.ProcessingResponse {
	br := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
		Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: b, EndOfStream: eos}}}}}
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
}
