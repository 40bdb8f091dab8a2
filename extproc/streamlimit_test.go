package extproc_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/extproc"
	"github.com/kvselect/kvselect/internal/metricstest"
)

// TestStreamLimit holds the limit's worth of real picker streams open on a
// loopback gRPC server: the next stream is refused with RESOURCE_EXHAUSTED
// before it sends anything, the health service still answers (Check and
// Watch), and closing one stream lets a new one through.
func TestStreamLimit(t *testing.T) {
	for _, tc := range []struct {
		name string
		max  int
	}{{"one", 1}, {"three", 3}} {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, setup{})
			lim := extproc.NewStreamLimiter(tc.max)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			g := grpc.NewServer(append(extproc.ServerOptions(), lim.ServerOption())...)
			h.srv.Register(g)
			go func() { _ = g.Serve(ln) }()
			t.Cleanup(g.Stop)
			conn, err := grpc.NewClient(ln.Addr().String(), append(envoysim.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close() })
			client := envoysim.New(conn)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			t.Cleanup(cancel)

			body := func(i int) []byte {
				return fmt.Appendf(nil, `{"model":%q,"stream":true,"prompt":[%d,2,3,4,5,6,7,8]}`, model, i)
			}
			held := make([]*envoysim.Exchange, tc.max)
			for i := range held {
				x, d, err := client.Start(ctx, &envoysim.Request{Modes: envoysim.GIE, Body: body(i)})
				if err != nil || d.Immediate != nil {
					t.Fatalf("stream %d within the limit: %v %+v", i, err, d)
				}
				held[i] = x
			}
			if n := lim.Active(); n != int64(tc.max) {
				t.Fatalf("%d streams counted, want %d", n, tc.max)
			}

			// Over the limit: refused on arrival, whatever it would send.
			st, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
			if err != nil {
				t.Fatal(err)
			}
			_, err = st.Recv()
			if status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("stream over the limit: %v, want RESOURCE_EXHAUSTED", err)
			}
			if lim.Rejected() != 1 {
				t.Fatalf("rejected %d, want 1", lim.Rejected())
			}

			// The health service is not limited.
			hc := healthpb.NewHealthClient(conn)
			if r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: extproc.ServiceName}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("health Check at the limit: %v %v", r, err)
			}
			wctx, wcancel := context.WithCancel(ctx)
			w, err := hc.Watch(wctx, &healthpb.HealthCheckRequest{Service: extproc.ServiceName})
			if err != nil {
				t.Fatal(err)
			}
			if r, err := w.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("health Watch at the limit: %v %v", r, err)
			}
			wcancel()

			// One stream ends; its place goes to the next.
			held[0].Close()
			eventually(t, "the closed stream's place to be freed", func() bool { return lim.Active() == int64(tc.max-1) })
			x, d, err := client.Start(ctx, &envoysim.Request{Modes: envoysim.GIE, Body: body(99)})
			if err != nil || d.Immediate != nil {
				t.Fatalf("stream after one closed: %v %+v", err, d)
			}
			held[0] = x
			if lim.Rejected() != 1 {
				t.Fatalf("rejected %d, want still 1", lim.Rejected())
			}
			for _, x := range held {
				x.Close()
			}
			eventually(t, "every place to be freed", func() bool { return lim.Active() == 0 })
			h.idle(t)

			m := metricstest.Series(t, lim)
			if m["kvselect_extproc_streams_rejected_total"] != 1 || m["kvselect_extproc_streams_limit"] != float64(tc.max) {
				t.Errorf("metrics %v", m)
			}
		})
	}
}

// TestStreamLimitOff: zero (the default) installs nothing and refuses nothing.
func TestStreamLimitOff(t *testing.T) {
	lim := extproc.NewStreamLimiter(0)
	if _, ok := lim.ServerOption().(grpc.EmptyServerOption); !ok {
		t.Fatalf("unlimited: ServerOption is %T, want grpc.EmptyServerOption", lim.ServerOption())
	}
	var nilLim *extproc.StreamLimiter
	if _, ok := nilLim.ServerOption().(grpc.EmptyServerOption); !ok {
		t.Fatal("nil limiter: want grpc.EmptyServerOption")
	}
	called := 0
	info := &grpc.StreamServerInfo{FullMethod: "/" + extproc.ServiceName + "/Process"}
	for range 10 {
		if err := lim.Intercept(nil, nil, info, func(any, grpc.ServerStream) error { called++; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if called != 10 || lim.Rejected() != 0 {
		t.Fatalf("called %d, rejected %d", called, lim.Rejected())
	}
}
