package server

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/kvselect/kvselect/extproc"
	"github.com/kvselect/kvselect/httpadmin"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

// parseLimits registers the limit flags on a fresh FlagSet and parses args.
func parseLimits(t *testing.T, args ...string) (*limitFlags, []error) {
	t.Helper()
	l := &limitFlags{}
	fs := flag.NewFlagSet("kvselect", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	l.register(fs)
	if err := fs.Parse(args); err != nil {
		return l, []error{err}
	}
	return l, l.validate()
}

func TestLimitFlags(t *testing.T) {
	l, errs := parseLimits(t)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if got, want := *l, (limitFlags{maxConnsPerClient: 512, maxHeaderBytes: 65536, readTimeout: time.Minute}); got != want {
		t.Errorf("defaults %+v, want %+v", got, want)
	}
	for _, tc := range []struct {
		args  []string
		burst int
		err   string // a fragment of the error; "" = valid
	}{
		{args: []string{"--rate-limit-per-client", "10"}, burst: 20},
		{args: []string{"--rate-limit-per-client", "0.2"}, burst: 1},
		{args: []string{"--rate-limit-per-client", "2.5"}, burst: 5},
		{args: []string{"--rate-limit-per-client", "10", "--rate-limit-burst", "3"}, burst: 3},
		{args: []string{"--max-conns-per-client", "0", "--http-read-timeout", "0", "--http-write-timeout", "30s", "--extproc-max-streams", "1000"}, burst: 1},
		{args: []string{"--max-conns-per-client", "-1"}, err: "--max-conns-per-client -1"},
		{args: []string{"--rate-limit-per-client", "-1"}, err: "--rate-limit-per-client -1"},
		{args: []string{"--rate-limit-per-client", "NaN"}, err: "--rate-limit-per-client NaN"},
		{args: []string{"--rate-limit-per-client", "2e6"}, err: "up to 1e+06"},
		{args: []string{"--rate-limit-burst", "5"}, err: "--rate-limit-burst requires --rate-limit-per-client"},
		{args: []string{"--rate-limit-per-client", "1", "--rate-limit-burst", "-1"}, err: "--rate-limit-burst -1"},
		{args: []string{"--max-header-bytes", "100"}, err: "--max-header-bytes 100: must be at least 1024"},
		{args: []string{"--http-read-timeout", "-1s"}, err: "--http-read-timeout -1s"},
		{args: []string{"--http-write-timeout", "-1s"}, err: "--http-write-timeout -1s"},
		{args: []string{"--extproc-max-streams", "-3"}, err: "--extproc-max-streams -3"},
	} {
		l, errs := parseLimits(t, tc.args...)
		err := errors.Join(errs...)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%v: error %v, want one with %q", tc.args, err, tc.err)
		case tc.err == "" && l.burst() != tc.burst:
			t.Errorf("%v: burst %d, want %d", tc.args, l.burst(), tc.burst)
		}
	}
}

// TestLimitApplyHTTP: the server gets the flags' values; the header timeout is
// rest.go's unless the whole-request timeout is shorter.
func TestLimitApplyHTTP(t *testing.T) {
	for _, tc := range []struct {
		args       []string
		header     time.Duration
		read, writ time.Duration
	}{
		{nil, readHeaderTimeout, time.Minute, 0},
		{[]string{"--http-read-timeout", "3s", "--http-write-timeout", "1m"}, 3 * time.Second, 3 * time.Second, time.Minute},
		{[]string{"--http-read-timeout", "0"}, readHeaderTimeout, 0, 0},
	} {
		l, errs := parseLimits(t, tc.args...)
		if len(errs) > 0 {
			t.Fatal(errs)
		}
		var srv http.Server
		l.applyHTTP(&srv)
		if srv.ReadHeaderTimeout != tc.header || srv.ReadTimeout != tc.read || srv.WriteTimeout != tc.writ || srv.MaxHeaderBytes != 65536 {
			t.Errorf("%v: header %s read %s write %s max header %d", tc.args, srv.ReadHeaderTimeout, srv.ReadTimeout, srv.WriteTimeout, srv.MaxHeaderBytes)
		}
	}
}

// limitedServer serves handler on loopback as run.go will: the limits'
// listener, middleware and server settings. connState, when set, is the
// server's ConnState hook.
func limitedServer(t *testing.T, l *limitFlags, handler http.Handler, connState func(net.Conn, http.ConnState)) (addr string, lim *limiters) {
	t.Helper()
	lim = l.build()
	inner, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: lim.middleware(handler), IdleTimeout: idleTimeout, ConnState: connState}
	l.applyHTTP(srv)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lim.listener(inner)) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return inner.Addr().String(), lim
}

var okHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	_, _ = io.WriteString(w, `{"status":"ok"}`)
})

// getFresh sends GET path on a new connection and closes it.
func getFresh(t *testing.T, addr, path string) int {
	t.Helper()
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	res, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Get("http://" + addr + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}

// pollUntil polls cond generously; only the outcome is asserted, never how soon.
func pollUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestLimitSlowloris opens many connections from one client that send their
// request headers a byte at a time, forever, and never close on their own. The
// server must close every one — over the per-client limit at once, the others
// at the header timeout (300 ms here; 10 s in production) — while its open
// connections never exceed the limit, and its goroutines come back to where
// they were. No latency is asserted: the machine may be slow and shared.
//
// With no per-client limit the header timeout alone closes them all; the
// goroutines then peak at one per connection, which is what the limit bounds.
func TestLimitSlowloris(t *testing.T) {
	for _, perClient := range []int{64, 0} {
		t.Run(fmt.Sprintf("max-conns-per-client %d", perClient), func(t *testing.T) { slowloris(t, perClient) })
	}
}

func slowloris(t *testing.T, perClient int) {
	const conns = 200
	bound := conns // connections the server may hold at once
	if perClient > 0 {
		bound = perClient
	}
	l, errs := parseLimits(t, "--max-conns-per-client", fmt.Sprint(perClient))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	l.headerTimeout = 300 * time.Millisecond
	var admitted int64 // connections the server admitted, from its ConnState reports
	var served atomic.Int64
	states := make(chan http.ConnState, conns*4)
	addr, lim := limitedServer(t, l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			served.Add(1)
		}
		okHandler(w, r)
	}), func(_ net.Conn, s http.ConnState) { states <- s })
	if code := getFresh(t, addr, "/health"); code != 200 {
		t.Fatalf("GET /health before: %d", code)
	}
	pollUntil(t, "the warm-up connection to close", func() bool { return lim.conns.Stats().Active == 0 })
	drain := func() {
		for {
			select {
			case s := <-states:
				if s == http.StateNew {
					admitted++
				}
			default:
				return
			}
		}
	}
	drain()
	admitted = 0
	before := runtime.NumGoroutine()
	heapBefore := heapInUse()

	open := make([]net.Conn, 0, conns)
	for range conns {
		c, err := net.Dial("tcp4", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, "POST /select HTTP/1.1\r\nHost: kvselect\r\nX-Slow: "); err != nil {
			t.Fatal(err)
		}
		open = append(open, c)
	}
	// One goroutine trickles a byte to every connection still open until
	// writing fails: the server closed it (EPIPE or a reset; the first write
	// after the server's close may still be accepted by the kernel).
	peakGoroutines, peakActive := 0, 0
	peakHeap := heapBefore
	deadline := time.Now().Add(60 * time.Second)
	for len(open) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d slow connections still open: the server does not close them", len(open))
		}
		peakGoroutines = max(peakGoroutines, runtime.NumGoroutine())
		peakActive = max(peakActive, lim.conns.Stats().Active)
		peakHeap = max(peakHeap, heapInUse())
		still := open[:0]
		for _, c := range open {
			if _, err := c.Write([]byte{'x'}); err != nil {
				c.Close()
				continue
			}
			still = append(still, c)
		}
		open = still
		time.Sleep(20 * time.Millisecond)
	}
	pollUntil(t, "the server to forget every connection", func() bool { return lim.conns.Stats().Active == 0 })
	after := before + 1000
	pollUntil(t, "goroutines to return to their count before", func() bool {
		after = runtime.NumGoroutine()
		return after <= before+2
	})
	drain()
	st := lim.conns.Stats()
	t.Logf("%d slow connections, --max-conns-per-client %d: %d admitted and closed at the header timeout, %d refused at accept; "+
		"open at most %d; goroutines %d before, peak %d, %d after; heap in use %d KiB before, peak +%d KiB",
		conns, perClient, admitted, st.RejectedPerClient, peakActive, before, peakGoroutines, after, heapBefore>>10, (peakHeap-heapBefore)>>10)
	if peakActive > bound {
		t.Errorf("%d connections open at once, over the limit of %d", peakActive, bound)
	}
	if admitted+int64(st.RejectedPerClient) != conns {
		t.Errorf("%d admitted + %d refused, want %d", admitted, st.RejectedPerClient, conns)
	}
	if n := served.Load(); n != 0 {
		t.Errorf("%d slow requests reached the handler", n)
	}
	// A connection holds at most a goroutine or two on the server (its serve
	// loop; TLS or a background read would be another): the peak must stay
	// near the limit's worth, however many connections were tried.
	if most := before + 2*bound + 16; peakGoroutines > most {
		t.Errorf("goroutines peaked at %d, over %d (%d before)", peakGoroutines, most, before)
	}
	// Memory the same way: a connection waiting for its headers holds its
	// buffers (4 KiB each way) and net/http's connection state, well under
	// 64 KiB; the client side of this test is in the same heap, and
	// the race detector adds its own.
	if most := uint64(2*bound)*64<<10 + 16<<20; peakHeap-heapBefore > most {
		t.Errorf("heap in use grew by %d KiB, over %d KiB for %d connections", (peakHeap-heapBefore)>>10, most>>10, bound)
	}
	if code := getFresh(t, addr, "/health"); code != 200 {
		t.Fatalf("GET /health after: %d", code)
	}
}

// heapInUse is the live heap's size now (after a collection, so that garbage
// does not count).
func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// TestLimitHeaderBytes: request headers over --max-header-bytes get 431 and
// the server goes on serving; headers under it are served.
func TestLimitHeaderBytes(t *testing.T) {
	l, errs := parseLimits(t)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	addr, _ := limitedServer(t, l, okHandler, nil)
	for _, tc := range []struct {
		header int // bytes of one header's value
		status int
	}{
		{32 << 10, 200},
		// net/http reads MaxHeaderBytes plus 4 KiB of slack before refusing.
		{100 << 10, 431},
		{1 << 20, 431},
	} {
		c, err := net.Dial("tcp4", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(60 * time.Second)) // bounds the test only
		// Written concurrently: past the limit the server stops reading, and
		// the answer comes before the request is all sent.
		go func() {
			fmt.Fprintf(c, "GET /health HTTP/1.1\r\nHost: kvselect\r\nX-Big: %s\r\n\r\n", strings.Repeat("a", tc.header))
		}()
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%d-byte header: %v", tc.header, err)
		}
		res.Body.Close()
		c.Close()
		if res.StatusCode != tc.status {
			t.Errorf("%d-byte header: %d, want %d", tc.header, res.StatusCode, tc.status)
		}
		if code := getFresh(t, addr, "/health"); code != 200 {
			t.Fatalf("GET /health after a %d-byte header: %d", tc.header, code)
		}
	}
}

// TestLimitReadTimeoutSparesQueuedRequests: --http-read-timeout bounds
// sending the request, not the handler. A request whose body has been read
// may wait (as a selection waits in the scheduler queue) well past the
// timeout, keep its context and get its answer.
func TestLimitReadTimeoutSparesQueuedRequests(t *testing.T) {
	l, errs := parseLimits(t, "--http-read-timeout", "200ms")
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	addr, _ := limitedServer(t, l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		time.Sleep(600 * time.Millisecond) // three read timeouts: the "queue"
		if err := r.Context().Err(); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}), nil)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	res, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Post("http://"+addr+"/select", "application/json", strings.NewReader(`{"token_ids":[1,2,3]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || string(b) != "ok" {
		t.Fatalf("%d %q", res.StatusCode, b)
	}
}

// TestLimitRateMiddleware: with a rate set, the REST port answers 429 past
// the burst, and never for the probes.
func TestLimitRateMiddleware(t *testing.T) {
	l, errs := parseLimits(t, "--rate-limit-per-client", "0.001", "--rate-limit-burst", "2")
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	addr, lim := limitedServer(t, l, okHandler, nil)
	var got []int
	for _, p := range []string{"/loads", "/loads", "/loads", "/health", "/ready", "/loads"} {
		got = append(got, getFresh(t, addr, p))
	}
	if want := "[200 200 429 200 200 429]"; fmt.Sprint(got) != want {
		t.Fatalf("statuses %v, want %s", got, want)
	}
	if st := lim.rate.Stats(); st.Limited != 2 {
		t.Fatalf("limited %d, want 2", st.Limited)
	}
}

// TestLimitCollector: one collector reports every limit's metrics, the rate
// limiter's only when it is on, and registers cleanly beside the picker's
// (no name in common); the stream option is empty without a limit.
func TestLimitCollector(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
		not  []string
	}{
		{
			want: []string{"kvselect_http_connections_active", "kvselect_http_connection_clients", "kvselect_http_connections_rejected_total",
				"kvselect_extproc_streams_rejected_total", "kvselect_extproc_streams_limit"},
			not: []string{"kvselect_http_rate_limited_requests_total"},
		},
		{
			args: []string{"--rate-limit-per-client", "5", "--extproc-max-streams", "8"},
			want: []string{"kvselect_http_connections_rejected_total", "kvselect_http_rate_limited_requests_total",
				"kvselect_http_rate_limit_clients", "kvselect_http_rate_limit_evictions_total", "kvselect_extproc_streams_limit"},
		},
	} {
		l, errs := parseLimits(t, tc.args...)
		if len(errs) > 0 {
			t.Fatal(errs)
		}
		lim := l.build()
		_, empty := lim.streamOption().(grpc.EmptyServerOption)
		if empty != (l.extprocMaxStreams == 0) {
			t.Errorf("%v: stream option %T", tc.args, lim.streamOption())
		}
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(lim, extproc.New(nil, extproc.Options{}))
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		names := map[string]bool{}
		for _, mf := range mfs {
			names[mf.GetName()] = true
		}
		for _, n := range tc.want {
			if !names[n] {
				t.Errorf("%v: no %s", tc.args, n)
			}
		}
		for _, n := range tc.not {
			if names[n] {
				t.Errorf("%v: %s without rate limiting", tc.args, n)
			}
		}
	}
}

// TestLimitOversizeBodyThroughLimits: the REST front's graceful 413 (it
// hijacks the connection, half-closes it and drains the body) works through
// the limited listener and the rate middleware, and the connection's place
// is freed afterwards.
func TestLimitOversizeBodyThroughLimits(t *testing.T) {
	rc := routerconfig.Default()
	rc.UseKVEvents = false
	svc, err := selection.New(selection.Config{Router: rc})
	if err != nil {
		t.Fatal(err)
	}
	l, errs := parseLimits(t, "--max-conns-per-client", "4", "--rate-limit-per-client", "100")
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	addr, lim := limitedServer(t, l, httpadmin.New(svc, httpadmin.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}), nil)
	c, err := net.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(60 * time.Second)) // bounds the test only
	body := append([]byte(`{"model_name":"m","token_ids":[`), bytes.Repeat([]byte("1,"), 4_500_000)...)
	body = append(body, "1]}"...)
	fmt.Fprintf(c, "POST /select HTTP/1.1\r\nHost: kvselect\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
	if _, err := c.Write(body); err != nil {
		t.Fatalf("writing the 9 MB body: %v (reset instead of answered)", err)
	}
	raw, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	if !bytes.HasPrefix(raw, []byte("HTTP/1.1 413 ")) || !bytes.HasSuffix(raw, []byte(`{"error":"Failed to buffer the request body: length limit exceeded"}`)) {
		t.Fatalf("answer %q", raw)
	}
	c.Close()
	pollUntil(t, "the hijacked connection's place to be freed", func() bool { return lim.conns.Stats().Active == 0 })
	if code := getFresh(t, addr, "/health"); code != 200 {
		t.Fatalf("GET /health after: %d", code)
	}
}
