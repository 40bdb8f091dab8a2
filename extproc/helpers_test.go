package extproc_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/extproc"
	"github.com/kvselect/kvselect/internal/metricstest"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/bookingend"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/flow"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

const (
	model     = "llama"
	blockSize = 4
)

// harness is a real gRPC server on 127.0.0.1 serving the picker over one
// selection.Service, and an envoysim client connected to it.
type harness struct {
	svc    *selection.Service
	srv    *extproc.Server
	client *envoysim.Client
	addr   string
}

type setup struct {
	opts    extproc.Options
	router  func(*routerconfig.Config)
	workers []catalog.Record
	// kvEvents runs the service with KV events on (production's default);
	// workers get an event endpoint nothing listens on.
	kvEvents bool
	// flow turns flow control on (it needs router_queue_threshold).
	flow *flow.Config
	// clock is the service's clock; time.Now when nil.
	clock func() time.Time
	// maxEstimate caps the estimated end of bookings kept past their
	// stream (bookingend.DefaultMax when zero).
	maxEstimate time.Duration
	// listeners receives the ranks' KV-event attachments (kvEvents on),
	// so a test can feed their indexes as engines would.
	listeners selection.Listeners
}

func ptr[T any](v T) *T { return &v }

// worker registers worker id at ip:port.
func worker(id uint64, hostport string) catalog.Record {
	return catalog.Record{WorkerID: id, ModelName: model, Endpoint: ptr("http://" + hostport), BlockSize: ptr(uint32(blockSize))}
}

func fourWorkers() []catalog.Record {
	out := make([]catalog.Record, 4)
	for i := range out {
		out[i] = worker(uint64(i+1), fmt.Sprintf("10.0.0.%d:8000", i+1))
	}
	return out
}

func start(t testing.TB, s setup) *harness {
	t.Helper()
	rc := routerconfig.Default()
	rc.UseKVEvents = s.kvEvents // off: the approximate index learns from routing decisions, no engines here
	if s.router != nil {
		s.router(&rc)
	}
	svc, err := selection.New(selection.Config{Router: rc, Rand: rand.New(rand.NewPCG(7, 7)), Flow: s.flow, Clock: s.clock,
		BookingEnd: bookingend.Config{Max: s.maxEstimate}, Listeners: s.listeners})
	if err != nil {
		t.Fatal(err)
	}
	if s.workers == nil {
		s.workers = fourWorkers()
	}
	for i, w := range s.workers {
		if s.kvEvents {
			w.KVEventsEndpoint = ptr(fmt.Sprintf("tcp://127.0.0.1:%d", 30000+i))
		}
		if _, err := svc.UpsertWorker(context.Background(), w); err != nil {
			t.Fatal(err)
		}
	}
	h := &harness{svc: svc, srv: extproc.New(svc, s.opts)}
	h.addr = serve(t, h.srv)
	conn, err := grpc.NewClient(h.addr, append(envoysim.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	h.client = envoysim.New(conn)
	return h
}

func serve(t testing.TB, srv *extproc.Server) string {
	t.Helper()
	return serveWith(t, srv.Register)
}

// serveWith serves what register registers on loopback, with the picker's
// server options, until the test ends, and returns the address.
func serveWith(t testing.TB, register func(*grpc.Server)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(extproc.ServerOptions()...)
	register(g)
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	return ln.Addr().String()
}

// loads returns the partition's load rows keyed by worker id.
func (h *harness) loads() map[uint64]selection.PotentialLoad {
	out := map[uint64]selection.PotentialLoad{}
	for _, m := range h.svc.Inspect().Loads(nil, nil) {
		for _, l := range m.Loads {
			out[l.WorkerID] = l
		}
	}
	return out
}

func (h *harness) activeRequests() int {
	n := 0
	for _, l := range h.loads() {
		n += int(l.ActiveRequests)
	}
	return n
}

// eventually polls cond until it holds or a generous deadline passes: the
// server frees a booking after the client saw the stream end.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (h *harness) idle(t testing.TB) {
	t.Helper()
	eventually(t, "every booking to be freed", func() bool {
		for _, l := range h.loads() {
			if l.ActiveRequests != 0 || l.PotentialDecodeBlocks != 0 || l.PotentialPrefillTokens != 0 {
				return false
			}
		}
		return h.srv.Active() == 0
	})
}

func chatBody(text string, stream bool) []byte {
	return fmt.Appendf(nil, `{"model":%q,"stream":%v,"messages":[{"role":"user","content":%q}]}`, model, stream, text)
}

// sseChunks is an OpenAI streaming response of n token chunks, then [DONE].
func sseChunks(n int) [][]byte {
	out := make([][]byte, 0, n+1)
	for i := range n {
		out = append(out, fmt.Appendf(nil, "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}]}\n\n", i))
	}
	return append(out, []byte("data: [DONE]\n\n"))
}

func sseHeaders() []envoysim.Header {
	return []envoysim.Header{{Key: "content-type", Value: "text/event-stream"}}
}

func (h *harness) start(t testing.TB, req *envoysim.Request) (*envoysim.Exchange, *envoysim.Decision) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	x, d, err := h.client.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	return x, d
}

// finish plays a streamed response through the exchange and ends it.
func finish(t testing.TB, x *envoysim.Exchange, served string, chunks [][]byte) []byte {
	t.Helper()
	if _, err := x.ResponseHeaders(envoysim.Response{Served: served, Headers: sseHeaders()}, false); err != nil {
		t.Fatal(err)
	}
	var got []byte
	for i, c := range chunks {
		out, err := x.ResponseBody(c, i == len(chunks)-1)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, out...)
	}
	x.Close()
	return got
}

func workerIDOf(d *envoysim.Decision) string { return d.SetHeaders[extproc.HeaderWorkerID] }

func join(bs [][]byte) string {
	var sb strings.Builder
	for _, b := range bs {
		sb.Write(b)
	}
	return sb.String()
}

// prefillWorker registers a prefill worker (role prefill: it joins the
// prefill routing group) at ip:port.
func prefillWorker(id uint64, hostport string) catalog.Record {
	w := worker(id, hostport)
	w.Role = ptr(catalog.RolePrefill)
	return w
}

// wantSeries checks the picker's series named in want; on a mismatch it logs
// them all.
func wantSeries(t *testing.T, srv *extproc.Server, want map[string]float64) {
	t.Helper()
	got := metricstest.Series(t, srv)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if t.Failed() {
		t.Logf("all series: %v", got)
	}
}
