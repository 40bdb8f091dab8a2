package extproc_test

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvselect/kvselect/extproc"
)

func TestHealthServiceReportsServingThenShutdown(t *testing.T) {
	h := start(t, setup{})
	conn, err := grpc.NewClient(h.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	check := func(name string) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: name})
		if err != nil {
			t.Fatalf("check %q: %v", name, err)
		}
		return r.GetStatus()
	}
	for _, n := range []string{"", extproc.ServiceName, "inference-extension"} {
		if s := check(n); s != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("%q: %v", n, s)
		}
	}
	h.srv.Shutdown()
	if s := check(extproc.ServiceName); s != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("after Shutdown: %v", s)
	}
}
