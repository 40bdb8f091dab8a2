package extproc_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvselect/kvselect/bench/floorpicker"
	"github.com/kvselect/kvselect/extproc"
)

// BenchmarkConnPerRequest is NGINX Gateway Fabric's way to the picker: a new
// gRPC connection for every request (dial, one Process stream carrying the
// headers and then the whole body in one message, half-close, read to the
// end, close), as NGF's shim does (cmd/gateway/endpoint_picker.go in
// nginx/nginx-gateway-fabric), one request at a time. "kvselect" is the
// picker over 64 workers; "floor" is bench/floorpicker, which answers the
// same messages with a destination and does nothing else, served with the
// same server options: the difference between the two is what kvselect adds
// to a connection's cost. ns/op is the request's wall time, cpu-ns/op the
// process's CPU per request (client and server together). As behind NGF,
// no response phase ends the bookings; the harness runs no upkeep to end
// them at their estimates, so they stay open for the run.
func BenchmarkConnPerRequest(b *testing.B) {
	bodies := benchBodies("tokens")
	for _, server := range []string{"kvselect", "floor"} {
		b.Run(server, func(b *testing.B) {
			var addr string
			if server == "kvselect" {
				addr = benchPicker(b, extproc.Options{}).addr
			} else {
				floor, err := floorpicker.New([]string{"10.1.0.1:8000"}, nil)
				if err != nil {
					b.Fatal(err)
				}
				addr = serveWith(b, func(g *grpc.Server) { extprocv3.RegisterExternalProcessorServer(g, floor) })
			}
			b.ReportAllocs()
			cpu0 := processCPU()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := shimRequest(context.Background(), addr, bodies[i%len(bodies)]); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// shimRequest is one request as NGF's shim sends it; it fails unless the
// answer names a destination in its header mutation, where the shim reads it.
func shimRequest(ctx context.Context, addr string, body []byte) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	st, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		return err
	}
	headers := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/completions")},
		{Key: "content-type", RawValue: []byte("application/json")},
	}}
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: headers}}}); err != nil {
		return err
	}
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}); err != nil {
		return err
	}
	if err := st.CloseSend(); err != nil {
		return err
	}
	routed := false
	for {
		r, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		for _, h := range r.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
			routed = routed || strings.EqualFold(h.GetHeader().GetKey(), extproc.HeaderDestination)
		}
	}
	if !routed {
		return errors.New("the answer named no destination")
	}
	return nil
}
