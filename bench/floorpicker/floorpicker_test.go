package floorpicker

import (
	"bytes"
	"context"
	"flag"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/internal/peerproc"
)

// serve runs the floor picker on loopback ports until the test ends and
// returns an Envoy double connected to it and its HTTP base URL.
func serve(t *testing.T, endpoints []string) (*envoysim.Client, string) {
	t.Helper()
	var ports [2]int
	for i := range ports {
		p, err := peerproc.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = p
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{ExtProcPort: ports[0], HTTPPort: ports[1], Endpoints: endpoints}, slog.New(slog.DiscardHandler))
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	base := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(base + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the floor picker never answered /health: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	conn, err := grpc.NewClient("127.0.0.1:"+strconv.Itoa(ports[0]),
		append(envoysim.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return envoysim.New(conn), base
}

// TestExchangesThroughTheFloor drives whole GIE exchanges (FULL_DUPLEX_STREAMED
// both ways) through a real gRPC server: each request is routed to the next
// endpoint, by header and envoy.lb metadata alike, its body comes back byte for
// byte (in several messages once it is longer than one), and so does every
// response chunk; a request ended by trailers and one without a body are
// answered too, and every body's decision is counted in the histogram.
func TestExchangesThroughTheFloor(t *testing.T) {
	endpoints := []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}
	client, base := serve(t, endpoints)
	long := bytes.Repeat([]byte(`{"prompt":[1,2,3,4,5,6,7,8]}`), 9000) // ~250 KB: five messages back
	cases := []struct {
		name string
		req  envoysim.Request
	}{
		{"short body", envoysim.Request{Path: "/v1/completions", Body: []byte(`{"model":"m","prompt":"hi"}`)}},
		{"long body", envoysim.Request{Path: "/v1/completions", Body: long}},
		{"body ended by trailers", envoysim.Request{Body: []byte(`{"model":"m"}`), Trailers: []envoysim.Header{{Key: "x-t", Value: "1"}}}},
		{"no body", envoysim.Request{Method: "GET", Path: "/v1/models"}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.Modes = envoysim.GIE
			x, d, err := client.Start(context.Background(), &tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if d.Immediate != nil {
				t.Fatalf("immediate response %d", d.Immediate.Status)
			}
			want := endpoints[i%len(endpoints)]
			if d.Destination != want || d.MetadataDestination != want {
				t.Errorf("routed to %q (metadata %q), want %q, the next endpoint in turn", d.Destination, d.MetadataDestination, want)
			}
			if tc.req.Body != nil {
				if !bytes.Equal(d.Body, tc.req.Body) {
					t.Errorf("body came back as %d bytes, sent %d", len(d.Body), len(tc.req.Body))
				}
				if got := d.SetHeaders["content-length"]; got != strconv.Itoa(len(tc.req.Body)) {
					t.Errorf("content-length %q, body %d bytes", got, len(tc.req.Body))
				}
			}
			if tc.name == "long body" && d.BodyMessages < 2 {
				t.Errorf("a %d-byte body came back in %d message(s)", len(long), d.BodyMessages)
			}
			hr, err := x.ResponseHeaders(envoysim.Response{Served: want}, false)
			if err != nil || hr.Immediate != nil || hr.ProcessorClosed {
				t.Fatalf("response headers: %v %+v", err, hr)
			}
			var got []byte
			sent := []string{"data: {\"a\":1}\n\n", "data: {\"a\":2}\n\n", "data: [DONE]\n\n"}
			for _, c := range sent {
				b, err := x.ResponseBody([]byte(c), false)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, b...)
			}
			b, err := x.ResponseBody(nil, true)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, b...)
			x.Close()
			if string(got) != strings.Join(sent, "") {
				t.Errorf("response came back as %q", got)
			}
		})
	}
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	m, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if want := HistogramName + "_count 3"; !strings.Contains(string(m), want) {
		t.Errorf("/metrics lacks %q (three requests had a body):\n%s", want, m)
	}
}

// TestBodyOverTheBound: a body longer than the floor holds ends the stream
// with RESOURCE_EXHAUSTED instead of growing without bound.
func TestBodyOverTheBound(t *testing.T) {
	s, err := New([]string{"10.0.0.1:8000"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.maxBody = 1000
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(g, s)
	go g.Serve(ln)
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := envoysim.New(conn)
	for _, n := range []int{1000, 1001} {
		body := bytes.Repeat([]byte("x"), n)
		_, d, err := client.Start(context.Background(), &envoysim.Request{Body: body, ChunkSize: 300, Modes: envoysim.GIE})
		switch {
		case n <= 1000 && (err != nil || !bytes.Equal(d.Body, body)):
			t.Errorf("%d bytes: %v", n, err)
		case n > 1000 && status.Code(err) != codes.ResourceExhausted:
			t.Errorf("%d bytes: error %v, want RESOURCE_EXHAUSTED", n, err)
		}
	}
}

// TestFlags checks the command's flags: the ports and endpoints it needs,
// refused with the flag named, and Args giving them back.
func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{"-extproc-port", "9002", "-http-port", "9090", "-endpoints", "a:1, b:2"}, ""},
		{[]string{"-extproc-port", "9002", "-http-port", "9090"}, "-endpoints names no engine"},
		{[]string{"-extproc-port", "9002", "-http-port", "9090", "-endpoints", "a"}, "-endpoints"},
		{[]string{"-http-port", "9090", "-endpoints", "a:1"}, "-extproc-port and -http-port"},
		{[]string{"-extproc-port", "70000", "-http-port", "9090", "-endpoints", "a:1"}, "-extproc-port and -http-port"},
	} {
		var f Flags
		fs := flag.NewFlagSet("floor-picker", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		f.Register(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		cfg, err := f.Config()
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%q: %v", tc.args, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%q: error %v, want one naming %s", tc.args, err, tc.wantErr)
		case tc.wantErr == "":
			if strings.Join(cfg.Endpoints, ",") != "a:1,b:2" || cfg.ExtProcPort != 9002 || cfg.HTTPPort != 9090 {
				t.Errorf("%q: %+v", tc.args, cfg)
			}
			if got := strings.Join(Args(cfg), " "); got != "-extproc-port 9002 -http-port 9090 -endpoints a:1,b:2" {
				t.Errorf("Args: %s", got)
			}
		}
	}
}

// TestNewNeedsEndpoints: a floor picker with nowhere to route is refused.
func TestNewNeedsEndpoints(t *testing.T) {
	if _, err := New(nil, nil); err == nil {
		t.Error("New(nil) returned no error")
	}
}
