package envoysim_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"slices"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvselect/kvselect/envoysim"
)

// scripted is a processor that answers the i-th request message with
// answers[i] (possibly several responses, possibly none) and records the
// messages it received.
type scripted struct {
	extprocv3.UnimplementedExternalProcessorServer
	answers [][]*extprocv3.ProcessingResponse
	got     chan *extprocv3.ProcessingRequest
	// endAfter, when positive, ends the stream once that many messages were
	// answered, with endErr as the status (nil: OK).
	endAfter int
	endErr   error
}

func (s *scripted) Process(st extprocv3.ExternalProcessor_ProcessServer) error {
	for i := 0; ; i++ {
		if s.endAfter > 0 && i == s.endAfter {
			return s.endErr
		}
		req, err := st.Recv()
		if err != nil {
			return nil
		}
		s.got <- req
		if i < len(s.answers) {
			for _, a := range s.answers[i] {
				if err := st.Send(a); err != nil {
					return err
				}
			}
		}
	}
}

func client(t *testing.T, p *scripted) *envoysim.Client {
	t.Helper()
	return clientWith(t, p, nil, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// clientWith serves p with the server options and dials it with the dial
// options.
func clientWith(t *testing.T, p *scripted, sopts []grpc.ServerOption, dopts ...grpc.DialOption) *envoysim.Client {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(sopts...)
	extprocv3.RegisterExternalProcessorServer(g, p)
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), dopts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return envoysim.New(conn)
}

func one(r *extprocv3.ProcessingResponse) []*extprocv3.ProcessingResponse {
	return []*extprocv3.ProcessingResponse{r}
}

var (
	headersOK = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}
	bodyOK    = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}}
)

// Answers Envoy would reject are protocol errors; the first message carries
// protocol_config with the configured modes.
func TestProtocolViolationsAreReported(t *testing.T) {
	buffered := envoysim.Modes{Request: envoysim.Buffered, Response: envoysim.Buffered}
	cases := []struct {
		name    string
		modes   envoysim.Modes
		answers [][]*extprocv3.ProcessingResponse
	}{
		{"body response to request headers", buffered, [][]*extprocv3.ProcessingResponse{one(bodyOK)}},
		{"headers response to the body", buffered, [][]*extprocv3.ProcessingResponse{one(headersOK), one(headersOK)}},
		// FULL_DUPLEX_STREAMED: headers and body go out, then the processor
		// answers the body with a plain (not streamed) body response.
		{"unstreamed body in full duplex", envoysim.GIE, [][]*extprocv3.ProcessingResponse{nil, {headersOK, bodyOK}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := &scripted{answers: tc.answers, got: make(chan *extprocv3.ProcessingRequest, 16)}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, _, err := client(t, p).Start(ctx, &envoysim.Request{Modes: tc.modes, Body: []byte(`{}`)})
			var pe *envoysim.ProtocolError
			if !errors.As(err, &pe) {
				t.Fatalf("err = %v, want a *ProtocolError", err)
			}
			pc := (<-p.got).GetProtocolConfig()
			if pc == nil || pc.GetRequestBodyMode() != tc.modes.Request || pc.GetResponseBodyMode() != tc.modes.Response {
				t.Fatalf("first message protocol_config %v", pc)
			}
		})
	}
}

// An immediate response ends the exchange at once, in any mode.
func TestImmediateResponseEndsTheExchange(t *testing.T) {
	imm := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{Body: []byte(`{"error":"no"}`)}}}
	p := &scripted{answers: [][]*extprocv3.ProcessingResponse{one(imm)}, got: make(chan *extprocv3.ProcessingRequest, 16)}
	x, d, err := client(t, p).Start(context.Background(), &envoysim.Request{Modes: envoysim.Modes{Request: envoysim.Buffered}, Body: []byte(`{}`)})
	if err != nil || d.Immediate == nil || string(d.Immediate.Body) != `{"error":"no"}` {
		t.Fatalf("decision %+v, err %v", d, err)
	}
	if _, err := x.ResponseHeaders(envoysim.Response{}, true); !errors.Is(err, envoysim.ErrClosed) {
		t.Fatalf("use after the immediate response: %v", err)
	}
}

// withLB is r with envoy.lb dynamic metadata.
func withLB(r *extprocv3.ProcessingResponse, fields map[string]*structpb.Value) *extprocv3.ProcessingResponse {
	r = proto.Clone(r).(*extprocv3.ProcessingResponse)
	r.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{
		envoysim.MetadataLB: structpb.NewStructValue(&structpb.Struct{Fields: fields}),
	}}
	return r
}

func streamedBody(b []byte, eos bool) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
		Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: b, EndOfStream: eos}}}}}}}
}

// The decision carries the whole envoy.lb namespace, merged over every
// response of the request path as Envoy merges dynamic metadata (the body
// response's keys join the headers response's), and the EPP's endpoint
// scores as numbers.
func TestDecisionCarriesTheWholeLBMetadata(t *testing.T) {
	scores := structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
		"10.0.0.1:8000": structpb.NewNumberValue(5), "10.0.0.2:8000": structpb.NewNumberValue(2.5)}})
	headers := withLB(headersOK, map[string]*structpb.Value{
		envoysim.KeyDestination: structpb.NewStringValue("10.0.0.1:8000"), envoysim.KeyScores: scores})
	body := withLB(streamedBody([]byte(`{}`), true), map[string]*structpb.Value{"x-extra": structpb.NewStringValue("late")})
	p := &scripted{answers: [][]*extprocv3.ProcessingResponse{nil, {headers, body}}, got: make(chan *extprocv3.ProcessingRequest, 16)}
	x, d, err := client(t, p).Start(context.Background(), &envoysim.Request{Modes: envoysim.GIE, Body: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	if d.MetadataDestination != "10.0.0.1:8000" {
		t.Fatalf("metadata destination %q", d.MetadataDestination)
	}
	if d.EndpointScores["10.0.0.1:8000"] != 5 || d.EndpointScores["10.0.0.2:8000"] != 2.5 || len(d.EndpointScores) != 2 {
		t.Fatalf("endpoint scores %v", d.EndpointScores)
	}
	f := d.LBMetadata.GetFields()
	if f[envoysim.KeyDestination].GetStringValue() != "10.0.0.1:8000" || f["x-extra"].GetStringValue() != "late" || f[envoysim.KeyScores] == nil {
		t.Fatalf("envoy.lb %v", d.LBMetadata)
	}
}

// A processor may answer any message by closing the stream: with an OK status
// during the response, Envoy stops calling it and the rest of the response
// passes through untouched; with an error status the exchange fails.
func TestProcessorCloseDuringTheResponse(t *testing.T) {
	for _, tc := range []struct {
		name   string
		endErr error
		ok     bool
	}{
		{"ok status passes the response through", nil, true},
		{"error status fails the exchange", status.Error(codes.Internal, "boom"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			decided := withLB(headersOK, map[string]*structpb.Value{envoysim.KeyDestination: structpb.NewStringValue("10.0.0.1:8000")})
			// Messages: request headers, request body (answered), then
			// the response headers find the stream ended.
			p := &scripted{answers: [][]*extprocv3.ProcessingResponse{nil, {decided, streamedBody([]byte(`{}`), true)}},
				got: make(chan *extprocv3.ProcessingRequest, 16), endAfter: 2, endErr: tc.endErr}
			x, _, err := client(t, p).Start(context.Background(), &envoysim.Request{Modes: envoysim.GIE, Body: []byte(`{}`)})
			if err != nil {
				t.Fatal(err)
			}
			defer x.Close()
			hr, err := x.ResponseHeaders(envoysim.Response{Served: "10.0.0.1:8000"}, false)
			if !tc.ok {
				if err == nil {
					t.Fatalf("response headers after an error close: %+v", hr)
				}
				return
			}
			if err != nil || !hr.ProcessorClosed || !x.ProcessorClosed() {
				t.Fatalf("response headers: %+v, %v", hr, err)
			}
			for i, chunk := range []string{"data: a\n\n", "data: [DONE]\n\n"} {
				got, err := x.ResponseBody([]byte(chunk), i == 1)
				if err != nil || string(got) != chunk {
					t.Fatalf("chunk %d: forwarded %q, %v", i, got, err)
				}
			}
		})
	}
}

// InsecureTLS reaches a processor serving a self-signed certificate, as GIE's
// and llm-d's pickers do by default.
func TestInsecureTLSReachesASelfSignedProcessor(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "picker"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"picker.invalid"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	p := &scripted{answers: [][]*extprocv3.ProcessingResponse{nil, {withLB(headersOK, map[string]*structpb.Value{
		envoysim.KeyDestination: structpb.NewStringValue("10.0.0.1:8000")}), streamedBody([]byte(`{}`), true)}},
		got: make(chan *extprocv3.ProcessingRequest, 16)}
	sopts := []grpc.ServerOption{grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}}))}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	x, d, err := clientWith(t, p, sopts, envoysim.InsecureTLS()).Start(ctx, &envoysim.Request{Modes: envoysim.GIE, Body: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	x.Close()
	if d.MetadataDestination != "10.0.0.1:8000" {
		t.Fatalf("decision %+v", d)
	}
	// The same processor refuses a plaintext client: the test exercises TLS.
	_, _, err = clientWith(t, p, sopts, grpc.WithTransportCredentials(insecure.NewCredentials())).Start(ctx, &envoysim.Request{Modes: envoysim.GIE, Body: []byte(`{}`)})
	if err == nil {
		t.Fatal("a plaintext client reached the TLS processor")
	}
}

// Mutations Envoy's default header mutation rules refuse are reported apart
// and not applied: llm-d's endpoint picker echoes every request header,
// :authority, :method and :scheme included.
func TestRefusedHeaderMutationsAreReported(t *testing.T) {
	set := func(k, v string) *corev3.HeaderValueOption {
		return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)}}
	}
	headers := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
		Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{
			SetHeaders: []*corev3.HeaderValueOption{set(envoysim.KeyDestination, "10.0.0.1:8000"), set(":authority", "gateway"),
				set(":method", "POST"), set(":path", "/v1/completions"), set("X-Envoy-Retry-On", "5xx"), set("Content-Length", "2")},
			RemoveHeaders: []string{":scheme", "x-drop"},
		}}}}}
	p := &scripted{answers: [][]*extprocv3.ProcessingResponse{nil, {headers, streamedBody([]byte(`{}`), true)}}, got: make(chan *extprocv3.ProcessingRequest, 16)}
	x, d, err := client(t, p).Start(context.Background(), &envoysim.Request{Modes: envoysim.GIE, Body: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	x.Close()
	slices.Sort(d.RejectedHeaders)
	if want := []string{":authority", ":method", ":scheme", "x-envoy-retry-on"}; !slices.Equal(d.RejectedHeaders, want) {
		t.Fatalf("rejected %v, want %v", d.RejectedHeaders, want)
	}
	if d.SetHeaders[":path"] != "/v1/completions" || d.SetHeaders["content-length"] != "2" || d.Endpoint != "10.0.0.1:8000" {
		t.Fatalf("set headers %v", d.SetHeaders)
	}
	if _, ok := d.SetHeaders[":authority"]; ok || !slices.Equal(d.RemovedHeaders, []string{"x-drop"}) {
		t.Fatalf("applied a refused mutation: set %v, removed %v", d.SetHeaders, d.RemovedHeaders)
	}
}

// Hangup half-closes after the decision and returns once the processor
// ended the stream, with its status: the end NGINX Gateway Fabric's shim
// gives every stream.
func TestHangupWaitsForTheProcessorsEnd(t *testing.T) {
	buffered := envoysim.Modes{Request: envoysim.Buffered, Response: envoysim.Buffered}
	for _, tc := range []struct {
		name    string
		endErr  error
		wantErr codes.Code
	}{
		{"processor ends with OK", nil, codes.OK},
		{"processor fails", status.Error(codes.Internal, "boom"), codes.Internal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &scripted{answers: [][]*extprocv3.ProcessingResponse{one(headersOK), one(bodyOK)}, got: make(chan *extprocv3.ProcessingRequest, 16)}
			if tc.endErr != nil {
				p.endAfter, p.endErr = 2, tc.endErr
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			x, _, err := client(t, p).Start(ctx, &envoysim.Request{Modes: buffered, Body: []byte(`{}`)})
			if err != nil {
				t.Fatal(err)
			}
			err = x.Hangup()
			if got := status.Code(errors.Unwrap(err)); (tc.wantErr == codes.OK) != (err == nil) || (err != nil && got != tc.wantErr) {
				t.Fatalf("hangup: %v (code %v), want code %v", err, got, tc.wantErr)
			}
			if len(p.got) != 2 {
				t.Fatalf("processor got %d messages, want the headers and the body only", len(p.got))
			}
			if !errors.Is(x.Hangup(), envoysim.ErrClosed) {
				t.Fatal("a second hangup did not report the exchange ended")
			}
		})
	}
}
