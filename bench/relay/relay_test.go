package relay

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/extproc"
	"github.com/kvselect/kvselect/mockworker"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

// setup is a real picker in front of a real mock worker, and a relay to
// them.
func setup(t *testing.T) (*selection.Service, *Relay, *httptest.Server) {
	t.Helper()
	w, err := mockworker.New(mockworker.Config{Model: "m", WorkerID: 1, BlockSize: 4, NumBlocks: 64, MaxNumSeqs: 4, DPSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	ws := httptest.NewServer(w.Handler())
	t.Cleanup(ws.Close)

	rc := routerconfig.Default()
	rc.UseKVEvents = false
	svc, err := selection.New(selection.Config{Router: rc, Rand: rand.New(rand.NewPCG(1, 1))})
	if err != nil {
		t.Fatal(err)
	}
	ep := ws.URL
	if _, err := svc.UpsertWorker(context.Background(), catalog.Record{WorkerID: 1, ModelName: "m", Endpoint: &ep, BlockSize: ptr(uint32(4))}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(extproc.ServerOptions()...)
	extproc.New(svc, extproc.Options{}).Register(g)
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), append(envoysim.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })

	return svc, &Relay{Picker: envoysim.New(conn), HTTP: ws.Client()}, ws
}

// waitUnbooked waits until the picker holds no booking, or fails t.
func waitUnbooked(t *testing.T, svc *selection.Service) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		left := uint64(0)
		for _, m := range svc.Inspect().Loads(nil, nil) {
			for _, l := range m.Loads {
				left += l.ActiveRequests
			}
		}
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d bookings left", left)
		}
	}
}

// A request relayed through a real picker to a real mock worker: every
// streamed token is an event, the first is the TTFT, and the picker's
// booking is gone once Do returns (it saw the whole response path).
func TestDoThroughPickerToWorker(t *testing.T) {
	svc, r, ws := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	body := []byte(`{"model":"m","prompt":[1,2,3,4,5,6,7,8],"max_tokens":5,"stream":true}`)
	res, err := r.Do(ctx, "/v1/completions", body)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != http.StatusOK || len(res.Events) != 5 || res.TTFT != res.Events[0] || res.TTFT < res.Pick || len(res.ITLs()) != 4 {
		t.Fatalf("result = %+v", res)
	}
	for _, l := range svc.Inspect().Loads(nil, nil)[0].Loads {
		if l.ActiveRequests != 0 {
			t.Fatalf("booking left after the relayed response: %+v", l)
		}
	}
	// A bad request: the worker's 400 comes back as an error with its text.
	if _, err := r.Do(ctx, "/v1/completions", []byte(`{"model":"m","prompt":[1],"max_tokens":-1}`)); err == nil || !strings.Contains(err.Error(), "400") {
		t.Fatalf("err = %v", err)
	}
	// Direct times the same way without a picker.
	d, err := Direct(ctx, ws.Client(), ws.URL+"/v1/completions", body)
	if err != nil || len(d.Events) != 5 || d.Decision != nil {
		t.Fatalf("direct = %+v, %v", d, err)
	}
}

// A client that gives up at each stage leaves the exchange aborted, no
// error and no booking; a slow reader gets every token; a worker that cannot
// be reached is Envoy's 503 through the picker.
func TestClientMisbehaviour(t *testing.T) {
	svc, r, ws := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	body := []byte(`{"model":"m","prompt":[1,2,3,4,5,6,7,8],"max_tokens":5,"stream":true}`)
	for _, stage := range []Stage{StageRequest, StageRouted, StageResponseHeaders, StageResponseBody} {
		rr := *r
		rr.Abandon = stage
		res, err := rr.Do(ctx, "/v1/completions", body)
		want := stage
		if stage == StageRequest && res.Abandoned == StageRouted {
			want = StageRouted // the decision came before the client gave up
		}
		if err != nil || res.Abandoned != want || res.Abandoned.String() == "" {
			t.Fatalf("abandon %s: %+v, %v", stage, res, err)
		}
		waitUnbooked(t, svc)
	}
	slow := *r
	slow.ReadSize, slow.ReadDelay = 16, time.Millisecond
	if res, err := slow.Do(ctx, "/v1/completions", body); err != nil || len(res.Events) != 5 || res.Abandoned != StageNone {
		t.Fatalf("slow reader: %+v, %v", res, err)
	}
	waitUnbooked(t, svc)
	ws.Close()
	down := *r
	down.Envoy503 = true
	res, err := down.Do(ctx, "/v1/completions", body)
	var pe *PickerError
	if err == nil || errors.As(err, &pe) || res.Status != 503 {
		t.Fatalf("unreachable worker: %+v, %v", res, err)
	}
	waitUnbooked(t, svc)
}

func TestEventScannerCountsTextEventsAcrossReads(t *testing.T) {
	role := `data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}` + "\n\n"
	tok := func(s string) string {
		return fmt.Sprintf(`data: {"choices":[{"index":0,"delta":{"content":%q}}]}`+"\n\n", s)
	}
	stream := role + tok(" the") + tok(" cat") + `data: {"choices":[],"usage":{"completion_tokens":2}}` + "\n\n" + "data: [DONE]\n\n"
	for _, cut := range []int{1, 7, 64, len(stream)} {
		var s eventScanner
		n := 0
		for i := 0; i < len(stream); i += cut {
			n += s.feed([]byte(stream[i:min(i+cut, len(stream))]))
		}
		if n != 2 {
			t.Errorf("reads of %d bytes: %d text events, want 2", cut, n)
		}
	}
	for _, tc := range []struct {
		in   string
		want bool
	}{
		{`{"choices":[{"index":0,"text":" of"}]}`, true},
		{`{"choices":[{"index":0,"text":""}]}`, false},
		{role, false},
		{role[:20], false},
	} {
		if got := HasText([]byte(tc.in)); got != tc.want {
			t.Errorf("HasText(%q) = %v", tc.in, got)
		}
	}
}

func ptr[T any](v T) *T { return &v }
