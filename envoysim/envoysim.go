// Package envoysim is an ext_proc client that drives an external processor
// the way Envoy's ext_proc HTTP filter does (Envoy's
// source/extensions/filters/http/ext_proc and
// api/envoy/service/ext_proc/v3/external_processor.proto): the message order
// of each processing mode, protocol_config on the first message, the
// endpoint-picker metadata of GIE's endpoint picker protocol, proposal 004
// (subset hint on the request, served endpoint on the response), and the
// stream ending Envoy uses for every HTTP request — a half-close immediately
// followed by a reset (the filter's onDestroy closes, then resets, the gRPC
// stream).
//
// It is the gateway half of kvselect's tests, the EPP conformance suite
// (conformance/epp), `kvbench extproc` and the trace-replay demo: one
// Exchange is one HTTP request. Start sends the request headers and body as
// the mode prescribes and returns the routing decision (destination, the
// headers the worker would get, the body Envoy would forward, or the
// immediate response); the caller then feeds the worker's response headers,
// body chunks and trailers through the Exchange, and ends it with Close (the
// normal end) or Abort (a downstream reset).
//
// Envoy rules it enforces on the processor, reported as *ProtocolError: in
// every mode but FULL_DUPLEX_STREAMED exactly one response per message, of
// the matching kind; in FULL_DUPLEX_STREAMED the headers response before any
// body response and streamed (not buffered) body mutations. Envoy behaviour
// it reproduces: dynamic metadata is taken from every response and merged
// (Decision.LBMetadata, with an EPP's endpoint scores in
// Decision.EndpointScores); header mutations Envoy's default mutation rules
// refuse are not applied but listed (Decision.RejectedHeaders); a processor
// that closes the stream with an OK status during the response has finished,
// and the rest of the response passes through. Hangup ends an exchange as a
// gateway that never sends the response phase does (NGINX Gateway Fabric's
// endpoint picker shim). InsecureTLS dials a picker
// serving a self-signed certificate.
package envoysim

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvselect/kvselect/internal/vtcodec"
)

// Body send modes, re-exported for callers that do not import the filter
// protos.
const (
	None               = filterv3.ProcessingMode_NONE
	Streamed           = filterv3.ProcessingMode_STREAMED
	Buffered           = filterv3.ProcessingMode_BUFFERED
	BufferedPartial    = filterv3.ProcessingMode_BUFFERED_PARTIAL
	FullDuplexStreamed = filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
)

// Protocol 004 names.
const (
	MetadataLB         = "envoy.lb"
	MetadataSubsetHint = "envoy.lb.subset_hint"
	KeyDestination     = "x-gateway-destination-endpoint"
	KeySubset          = "x-gateway-destination-endpoint-subset"
	KeyServed          = "x-gateway-destination-endpoint-served"
	// KeyScores is not in proposal 004: llm-d's endpoint picker adds it to
	// envoy.lb with --emit-endpoint-scores (every scored endpoint to its
	// score, the picked one included).
	KeyScores = "x-gateway-destination-endpoint-scores"
)

// DefaultChunkSize is how a body is cut into messages in the streamed modes
// when Request.ChunkSize is zero (the size of an Envoy buffer slice).
const DefaultChunkSize = 16 << 10

// Modes are the filter's processing modes for bodies; headers and trailers
// are always SEND (the GIE reference configuration).
type Modes struct {
	Request, Response filterv3.ProcessingMode_BodySendMode
	// OmitProtocolConfig leaves protocol_config out of the first message,
	// as Envoy releases before it existed did.
	OmitProtocolConfig bool
}

// GIE is the reference configuration: FULL_DUPLEX_STREAMED both ways.
var GIE = Modes{Request: FullDuplexStreamed, Response: FullDuplexStreamed}

// Header is one HTTP header; keys are sent lower-cased, as Envoy does.
type Header struct{ Key, Value string }

// Request is one HTTP request as the gateway sees it.
type Request struct {
	Method    string // default POST (GET when Body is nil)
	Path      string // default /v1/chat/completions
	Authority string // default "gateway"
	Headers   []Header
	// Body is the request body; nil means none (headers end the stream).
	Body []byte
	// ChunkSize cuts Body in the streamed modes (DefaultChunkSize when 0).
	ChunkSize int
	Trailers  []Header
	Modes     Modes
	// SubsetHint sets envoy.lb.subset_hint as a list; SubsetHintString as a
	// comma-separated string (what header-to-metadata filters produce). The
	// hint is present when either is non-nil.
	SubsetHint       []string
	SubsetHintString *string
}

// Decision is the processor's routing answer to a request.
type Decision struct {
	// Destination is x-gateway-destination-endpoint as the processor set it;
	// MetadataDestination is the same from envoy.lb dynamic metadata.
	Destination, MetadataDestination string
	// LBMetadata is the whole envoy.lb namespace of the dynamic metadata the
	// processor emitted on the request path, fields merged across responses
	// as Envoy merges them (a later response's field replaces an earlier
	// one's); nil when it emitted none.
	LBMetadata *structpb.Struct
	// EndpointScores is envoy.lb's x-gateway-destination-endpoint-scores, a
	// struct of endpoint to score (llm-d's EPP with --emit-endpoint-scores);
	// nil when absent.
	EndpointScores map[string]float64
	// Endpoint is the primary (first) endpoint, Fallbacks the rest in order.
	Endpoint  string
	Fallbacks []string
	// SetHeaders are the request headers the processor set (last wins);
	// RemovedHeaders the ones it removed.
	SetHeaders     map[string]string
	RemovedHeaders []string
	// RejectedHeaders are header mutations Envoy's default mutation rules
	// refuse (setting host, :authority, :scheme, :method or x-envoy-*;
	// removing any ":" header or host): left out of SetHeaders and
	// RemovedHeaders, as Envoy ignores them, unless its configuration sets
	// disallow_is_error, which turns each into a 500.
	RejectedHeaders []string
	// ClearRouteCache is set when any decision response asked for it.
	ClearRouteCache bool
	// Body is what Envoy forwards upstream: the processor's streamed body in
	// FULL_DUPLEX_STREAMED, the (possibly replaced) body otherwise.
	Body []byte
	// BodyMessages counts the streamed body responses (FULL_DUPLEX_STREAMED).
	BodyMessages int
	// Immediate is set when the processor answered locally; the exchange is
	// over then.
	Immediate *Immediate
}

// Immediate is a local reply.
type Immediate struct {
	Status  int
	Headers map[string]string
	Body    []byte
	Details string
}

// ProtocolError is a processor answer Envoy would reject.
type ProtocolError struct{ Msg string }

func (e *ProtocolError) Error() string { return "ext_proc protocol violation: " + e.Msg }

func protoErr(format string, args ...any) error {
	return &ProtocolError{Msg: fmt.Sprintf(format, args...)}
}

// ErrClosed is returned by calls on an exchange that already ended.
var ErrClosed = errors.New("envoysim: exchange ended")

// envoyWindow is Envoy's default HTTP/2 stream and connection window
// (initial_stream_window_size / initial_connection_window_size, 256 MiB).
const envoyWindow = 256 << 20

// DialOptions are the gRPC client settings that make a connection behave like
// Envoy's to an ext_proc cluster: Envoy's large HTTP/2 flow-control windows,
// so that many concurrent streams with bodies never wait for window updates.
// Messages are encoded by internal/vtcodec (the same protobuf, cheaper to
// produce), so a load generator spends less of the machine on itself.
// Credentials are the caller's.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithInitialWindowSize(envoyWindow),
		grpc.WithInitialConnWindowSize(envoyWindow),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(vtcodec.NewCodec())),
	}
}

// InsecureTLS is the transport credential for a picker serving TLS with a
// certificate the client cannot verify, as GIE's and llm-d's endpoint pickers
// do by default (--secure-serving with a self-signed certificate) and Envoy's
// ext_proc cluster accepts when its upstream TLS context has no validation
// context: TLS 1.2 or later, ALPN h2, the peer's certificate unchecked.
func InsecureTLS() grpc.DialOption {
	return grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		InsecureSkipVerify: true, // the picker's certificate is self-signed; see above
		MinVersion:         tls.VersionTLS12,
	}))
}

// Client opens exchanges on one gRPC connection.
type Client struct {
	c extprocv3.ExternalProcessorClient
}

// New returns a client over cc (a *grpc.ClientConn).
func New(cc grpc.ClientConnInterface) *Client {
	return &Client{c: extprocv3.NewExternalProcessorClient(cc)}
}

// Exchange is one HTTP request's ext_proc stream.
type Exchange struct {
	modes  Modes
	stream extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
	ctx    context.Context
	first  bool // the next message is the first of the stream

	mu      sync.Mutex
	queue   []*extprocv3.ProcessingResponse
	recvErr error
	notify  chan struct{}

	received []*extprocv3.ProcessingResponse // every response, in order
	sent     int
	ended    bool

	respBuf []byte // BUFFERED response body being collected
	respEOS bool   // the streamed response body reached end_of_stream
	// processorDone: the processor closed the stream with an OK status
	// during the response; the rest passes through.
	processorDone bool
}

// Start opens a stream and sends the request as Envoy would in req.Modes,
// returning the routing decision. On an immediate response the exchange is
// already ended; otherwise the caller continues with the response and must
// end the exchange with Close or Abort.
func (c *Client) Start(ctx context.Context, req *Request) (*Exchange, *Decision, error) {
	sctx, cancel := context.WithCancel(ctx)
	st, err := c.c.Process(sctx)
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("open ext_proc stream: %w", err)
	}
	x := &Exchange{modes: req.Modes, stream: st, cancel: cancel, ctx: sctx, first: true, notify: make(chan struct{}, 1)}
	go x.recvLoop()
	d, err := x.request(req)
	if err != nil || d.Immediate != nil {
		x.Close()
	}
	if err != nil {
		return nil, nil, err
	}
	return x, d, nil
}

func (x *Exchange) recvLoop() {
	for {
		r, err := x.stream.Recv()
		x.mu.Lock()
		if err != nil {
			x.recvErr = err
		} else {
			x.queue = append(x.queue, r)
		}
		x.mu.Unlock()
		select {
		case x.notify <- struct{}{}:
		default:
		}
		if err != nil {
			return
		}
	}
}

// next waits for the processor's next response.
func (x *Exchange) next() (*extprocv3.ProcessingResponse, error) {
	for {
		if r, ok, err := x.poll(); ok || err != nil {
			return r, err
		}
		select {
		case <-x.notify:
		case <-x.ctx.Done():
			return nil, x.ctx.Err()
		}
	}
}

// poll returns a queued response without waiting.
func (x *Exchange) poll() (*extprocv3.ProcessingResponse, bool, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if len(x.queue) > 0 {
		r := x.queue[0]
		x.queue[0] = nil
		x.queue = x.queue[1:]
		x.received = append(x.received, r)
		return r, true, nil
	}
	if x.recvErr != nil {
		return nil, false, fmt.Errorf("ext_proc stream ended: %w", x.recvErr)
	}
	return nil, false, nil
}

func (x *Exchange) send(m *extprocv3.ProcessingRequest) error {
	if x.ended {
		return ErrClosed
	}
	if x.first {
		x.first = false
		if !x.modes.OmitProtocolConfig {
			m.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: x.modes.Request, ResponseBodyMode: x.modes.Response}
		}
	}
	x.sent++
	if err := x.stream.Send(m); err != nil {
		return fmt.Errorf("send to ext_proc: %w", err)
	}
	return nil
}

// Received returns every response the processor sent so far, in order.
func (x *Exchange) Received() []*extprocv3.ProcessingResponse {
	x.mu.Lock()
	defer x.mu.Unlock()
	return append([]*extprocv3.ProcessingResponse(nil), x.received...)
}

// Close ends the exchange as Envoy's filter does when the HTTP stream is
// destroyed, normally or not: half-close, then reset.
func (x *Exchange) Close() {
	if x == nil || x.ended {
		return
	}
	x.ended = true
	_ = x.stream.CloseSend()
	x.cancel()
}

// Hangup ends the exchange as a gateway that never sends the response
// phase does once it has the decision — NGINX Gateway Fabric's endpoint
// picker shim (cmd/gateway/endpoint_picker.go in nginx/nginx-gateway-fabric)
// half-closes after the request body and reads until the processor ends the
// stream: half-close, wait for that end, then close. It returns nil when
// the processor ended the stream with an OK status (so its end-of-stream
// handling has run), the stream error otherwise.
func (x *Exchange) Hangup() error {
	if x == nil || x.ended {
		return ErrClosed
	}
	x.ended = true
	defer x.cancel()
	if err := x.stream.CloseSend(); err != nil {
		return fmt.Errorf("half-close: %w", err)
	}
	for {
		if _, ok, err := x.poll(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		} else if ok {
			continue // anything more the processor sends is ignored, as the shim does
		}
		select {
		case <-x.notify:
		case <-x.ctx.Done():
			return x.ctx.Err()
		}
	}
}

// Abort resets the stream without a half-close (a downstream reset or a
// gateway crash seen from the processor).
func (x *Exchange) Abort() {
	if x == nil || x.ended {
		return
	}
	x.ended = true
	x.cancel()
}

func headerMap(hs []Header) *corev3.HeaderMap {
	m := &corev3.HeaderMap{Headers: make([]*corev3.HeaderValue, 0, len(hs))}
	for _, h := range hs {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: strings.ToLower(h.Key), RawValue: []byte(h.Value)})
	}
	return m
}

func subsetMetadata(req *Request) *corev3.Metadata {
	var v *structpb.Value
	switch {
	case req.SubsetHint != nil:
		vals := make([]*structpb.Value, len(req.SubsetHint))
		for i, s := range req.SubsetHint {
			vals[i] = structpb.NewStringValue(s)
		}
		v = structpb.NewListValue(&structpb.ListValue{Values: vals})
	case req.SubsetHintString != nil:
		v = structpb.NewStringValue(*req.SubsetHintString)
	default:
		return nil
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		MetadataSubsetHint: {Fields: map[string]*structpb.Value{KeySubset: v}},
	}}
}
