package envoysim_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvselect/kvselect/envoysim"
)

// scripted is a processor that answers the i-th request message with
// answers[i] (possibly several responses, possibly none) and records the
// messages it received.
type scripted struct {
	extprocv3.UnimplementedExternalProcessorServer
	answers [][]*extprocv3.ProcessingResponse
	got     chan *extprocv3.ProcessingRequest
}

func (s *scripted) Process(st extprocv3.ExternalProcessor_ProcessServer) error {
	for i := 0; ; i++ {
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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(g, p)
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
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
