package netlimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvselect/kvselect/internal/metricstest"
)

// eventually polls cond generously: the machine may be slow and shared, so
// only the outcome is asserted, never how soon it came.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// acceptServer accepts from a limited loopback listener; each admitted
// connection is greeted with one byte, so a client tells admission (the byte)
// from refusal (EOF) without any timing.
type acceptServer struct {
	lim   *ConnLimiter
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	done  chan struct{}
}

func startAccepting(t *testing.T, lim ConnLimits) *acceptServer {
	t.Helper()
	inner, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &acceptServer{lim: NewConnLimiter(lim), done: make(chan struct{})}
	s.ln = s.lim.Listener(inner)
	go func() {
		defer close(s.done)
		for {
			c, err := s.ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte{'k'})
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		s.ln.Close()
		<-s.done
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
	})
	return s
}

// dialFrom connects from a loopback source address (127.0.0.x: Linux answers
// for the whole 127/8 on lo, which gives the test several clients) and
// reports whether the server admitted the connection.
func (s *acceptServer) dialFrom(t *testing.T, src string) (net.Conn, bool) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp4", s.ln.Addr().String())
	if err != nil {
		if src != "127.0.0.1" {
			t.Skipf("cannot dial from %s (%v): this host has no 127/8 on loopback", src, err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second)) // bounds the test only
	var b [1]byte
	n, err := c.Read(b[:])
	switch {
	case n == 1:
		return c, true
	case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed), isReset(err):
		return c, false
	default:
		t.Fatalf("dial from %s: read %d bytes, %v", src, n, err)
		return nil, false
	}
}

func isReset(err error) bool { return err != nil && strings.Contains(err.Error(), "reset by peer") }

// TestConnLimiterRefusesOverLimit dials in sequence from two client addresses
// and checks which connections are admitted, and the counts.
func TestConnLimiterRefusesOverLimit(t *testing.T) {
	for _, tc := range []struct {
		name      string
		lim       ConnLimits
		dials     []string // source address of each dial, in order
		admitted  []bool
		perClient uint64 // refusals by reason
		total     uint64
	}{
		{
			name:     "unlimited",
			dials:    []string{"127.0.0.1", "127.0.0.1", "127.0.0.1", "127.0.0.2"},
			admitted: []bool{true, true, true, true},
		},
		{
			name:      "per client",
			lim:       ConnLimits{PerClient: 2},
			dials:     []string{"127.0.0.1", "127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2", "127.0.0.2", "127.0.0.1"},
			admitted:  []bool{true, true, false, true, true, false, false},
			perClient: 3,
		},
		{
			name:     "total",
			lim:      ConnLimits{Total: 3},
			dials:    []string{"127.0.0.1", "127.0.0.2", "127.0.0.1", "127.0.0.2", "127.0.0.1"},
			admitted: []bool{true, true, true, false, false},
			total:    2,
		},
		{
			name:      "both: the total is checked first",
			lim:       ConnLimits{PerClient: 1, Total: 2},
			dials:     []string{"127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2"},
			admitted:  []bool{true, false, true, false},
			perClient: 1,
			total:     1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startAccepting(t, tc.lim)
			var got []bool
			clients := map[string]bool{}
			for _, src := range tc.dials {
				_, ok := s.dialFrom(t, src)
				got = append(got, ok)
				if ok {
					clients[src] = true
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.admitted) {
				t.Errorf("admitted %v, want %v", got, tc.admitted)
			}
			admitted := 0
			for _, ok := range tc.admitted {
				if ok {
					admitted++
				}
			}
			st := s.lim.Stats()
			want := ConnStats{Active: admitted, Clients: len(clients), RejectedPerClient: tc.perClient, RejectedTotal: tc.total}
			if st != want {
				t.Errorf("stats %+v, want %+v", st, want)
			}
			m := metricstest.Series(t, s.lim)
			for k, v := range map[string]float64{
				"kvselect_http_connections_active":                            float64(admitted),
				"kvselect_http_connection_clients":                            float64(len(clients)),
				"kvselect_http_connections_rejected_total{reason=per_client}": float64(tc.perClient),
				"kvselect_http_connections_rejected_total{reason=total}":      float64(tc.total),
			} {
				if m[k] != v {
					t.Errorf("%s = %v, want %v", k, m[k], v)
				}
			}
		})
	}
}

// TestConnLimiterReleasesOnce: however often and from however many goroutines
// a connection is closed, its place is freed once; freed places admit new
// connections; the wrapper keeps CloseWrite.
func TestConnLimiterReleasesOnce(t *testing.T) {
	s := startAccepting(t, ConnLimits{PerClient: 2})
	for range 2 {
		if _, ok := s.dialFrom(t, "127.0.0.1"); !ok {
			t.Fatal("refused under the limit")
		}
	}
	if _, ok := s.dialFrom(t, "127.0.0.1"); ok {
		t.Fatal("admitted over the limit")
	}
	s.mu.Lock()
	conns := append([]net.Conn(nil), s.conns...)
	s.conns = nil
	s.mu.Unlock()
	if _, ok := conns[0].(interface{ CloseWrite() error }); !ok {
		t.Error("an admitted connection lost CloseWrite")
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { conns[0].Close() })
	}
	wg.Wait()
	if st := s.lim.Stats(); st.Active != 1 || st.Clients != 1 {
		t.Fatalf("after closing one connection 8 times: %+v, want 1 active", st)
	}
	conns[1].Close()
	conns[1].Close()
	if st := s.lim.Stats(); st.Active != 0 || st.Clients != 0 {
		t.Fatalf("after closing both: %+v, want none", st)
	}
	for range 2 {
		if _, ok := s.dialFrom(t, "127.0.0.1"); !ok {
			t.Fatal("refused after the places were freed")
		}
	}
}

// TestConnLimiterUnderHTTPServer: connections an http.Server closes (idle
// keep-alives at Close, refused ones) leave no count behind, and a refused
// client gets an error, not a hang.
func TestConnLimiterUnderHTTPServer(t *testing.T) {
	lim := NewConnLimiter(ConnLimits{PerClient: 2})
	inner, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			<-release
		}
		io.WriteString(w, "ok")
	})}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lim.Listener(inner)) }()
	url := "http://" + inner.Addr().String()

	// Two requests held open take both places; a third connection is refused.
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			tr := &http.Transport{DisableKeepAlives: true}
			defer tr.CloseIdleConnections()
			res, err := (&http.Client{Transport: tr}).Get(url + "/hold")
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
		})
	}
	eventually(t, "two connections held", func() bool { return lim.Stats().Active == 2 })
	tr := &http.Transport{}
	c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	if res, err := c.Get(url + "/"); err == nil {
		res.Body.Close()
		t.Fatalf("a third connection was served: %d", res.StatusCode)
	}
	if st := lim.Stats(); st.RejectedPerClient < 1 {
		t.Fatalf("no refusal counted: %+v", st)
	}
	close(release)
	wg.Wait()
	eventually(t, "held connections released", func() bool { return lim.Stats().Active == 0 })

	// A keep-alive connection stays open after its request; srv.Close closes
	// it through the wrapper.
	res, err := c.Get(url + "/")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if st := lim.Stats(); st.Active != 1 {
		t.Fatalf("keep-alive connection: %+v, want 1 active", st)
	}
	srv.Close()
	<-served
	tr.CloseIdleConnections()
	if st := lim.Stats(); st.Active != 0 || st.Clients != 0 {
		t.Fatalf("after Close: %+v", st)
	}
}

// fakeClock is a settable time source for the rate limiter.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *fakeClock { return &fakeClock{t: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

var (
	addrA = netip.MustParseAddr("192.0.2.1")
	addrB = netip.MustParseAddr("2001:db8::1")
)

// TestRateLimiterBuckets walks token buckets on a fake clock: the burst, the
// refill, Retry-After's wait, and the independence of clients.
func TestRateLimiterBuckets(t *testing.T) {
	type step struct {
		advance time.Duration
		addr    netip.Addr
		ok      bool
		wait    time.Duration // when refused
	}
	for _, tc := range []struct {
		name  string
		rate  float64
		burst int
		steps []step
	}{
		{
			name: "burst then refill", rate: 2, burst: 3,
			steps: []step{
				{0, addrA, true, 0}, {0, addrA, true, 0}, {0, addrA, true, 0},
				{0, addrA, false, 500 * time.Millisecond},
				{0, addrB, true, 0}, // another client has its own bucket
				{250 * time.Millisecond, addrA, false, 250 * time.Millisecond},
				{250 * time.Millisecond, addrA, true, 0},
				{0, addrA, false, 500 * time.Millisecond},
				{10 * time.Second, addrA, true, 0}, // refilled to the burst, no more
				{0, addrA, true, 0}, {0, addrA, true, 0},
				{0, addrA, false, 500 * time.Millisecond},
			},
		},
		{
			name: "slow rate", rate: 0.1, burst: 1,
			steps: []step{
				{0, addrA, true, 0},
				{0, addrA, false, 10 * time.Second},
				{4 * time.Second, addrA, false, 6 * time.Second},
				{6 * time.Second, addrA, true, 0},
			},
		},
		{
			name: "burst below 1 is 1", rate: 1, burst: 0,
			steps: []step{{0, addrA, true, 0}, {0, addrA, false, time.Second}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock()
			l := NewRateLimiter(RateLimits{Rate: tc.rate, Burst: tc.burst, Now: clk.Now})
			refused := 0
			for i, s := range tc.steps {
				clk.Add(s.advance)
				ok, wait := l.Allow(s.addr)
				if ok != s.ok || (!ok && (wait-s.wait).Abs() > time.Millisecond) {
					t.Fatalf("step %d: Allow(%v) = %v, %v; want %v, %v", i, s.addr, ok, wait, s.ok, s.wait)
				}
				if !ok {
					refused++
				}
			}
			if st := l.Stats(); st.Limited != uint64(refused) {
				t.Errorf("limited %d, want %d", st.Limited, refused)
			}
		})
	}
}

// TestRateLimiterTableIsBounded: a flood of source addresses never holds more
// than MaxClients buckets, the overflow is counted, and clients idle long
// enough for a full bucket are forgotten without loss.
func TestRateLimiterTableIsBounded(t *testing.T) {
	clk := newClock()
	l := NewRateLimiter(RateLimits{Rate: 1, Burst: 5, MaxClients: 64, Now: clk.Now})
	a := netip.MustParseAddr("10.0.0.0")
	for i := range 10_000 {
		if ok, _ := l.Allow(a); !ok {
			t.Fatalf("address %d refused on its first request", i)
		}
		if n := l.Stats().Clients; n > 64 {
			t.Fatalf("%d clients remembered, want at most 64", n)
		}
		a = a.Next()
	}
	if st := l.Stats(); st.Clients != 64 || st.Evicted != 10_000-64 {
		t.Fatalf("after 10,000 addresses: %+v", st)
	}
	// A client that used its burst is remembered while its bucket refills
	// (taking the place of one more of the flood).
	for range 5 {
		l.Allow(addrA)
	}
	if ok, _ := l.Allow(addrA); ok {
		t.Fatal("sixth request of the burst allowed")
	}
	// Burst/rate = 5 s later every bucket is full: one request forgets them all.
	clk.Add(5 * time.Second)
	if ok, _ := l.Allow(addrB); !ok {
		t.Fatal("refused")
	}
	if st := l.Stats(); st.Clients != 1 {
		t.Fatalf("idle clients kept: %+v", st)
	}
	m := metricstest.Series(t, l)
	if m["kvselect_http_rate_limit_evictions_total"] != 10_000-64+1 || m["kvselect_http_rate_limited_requests_total"] != 1 || m["kvselect_http_rate_limit_clients"] != 1 {
		t.Errorf("metrics %v", m)
	}
}

// TestRateLimitMiddleware serves a real loopback server: 429 with Retry-After
// and the JSON envelope past the burst, the exempt probes never limited, the
// bucket refilled by the (fake) clock.
func TestRateLimitMiddleware(t *testing.T) {
	clk := newClock()
	l := NewRateLimiter(RateLimits{Rate: 0.5, Burst: 2, Exempt: []string{"/health", "/ready"}, Now: clk.Now})
	srv := httptest.NewServer(l.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	})))
	t.Cleanup(srv.Close)
	get := func(path string) (*http.Response, string) {
		t.Helper()
		res, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res, string(b)
	}
	for _, tc := range []struct {
		advance    time.Duration
		path       string
		status     int
		retryAfter string
	}{
		{0, "/select", 200, ""},
		{0, "/loads", 200, ""},
		{0, "/select", 429, "2"}, // one token at 0.5/s: 2 s
		{0, "/health", 200, ""},
		{0, "/ready", 200, ""},
		{0, "/health/", 429, "2"}, // exempt paths match exactly
		{1500 * time.Millisecond, "/select", 429, "1"},
		{500 * time.Millisecond, "/select", 200, ""},
	} {
		clk.Add(tc.advance)
		res, body := get(tc.path)
		if res.StatusCode != tc.status || res.Header.Get("Retry-After") != tc.retryAfter {
			t.Fatalf("GET %s: %d Retry-After %q, want %d %q (%s)", tc.path, res.StatusCode, res.Header.Get("Retry-After"), tc.status, tc.retryAfter, body)
		}
		if tc.status != 429 {
			continue
		}
		if ct := res.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("Content-Type %q", ct)
		}
		var env map[string]any
		if err := json.Unmarshal([]byte(body), &env); err != nil || len(env) != 1 || !strings.Contains(fmt.Sprint(env["error"]), "too many requests") {
			t.Errorf("body %q: want {\"error\": \"too many requests...\"}", body)
		}
	}
	if st := l.Stats(); st.Limited != 3 {
		t.Errorf("limited %d, want 3", st.Limited)
	}
}

// TestClientAddr keys IPv4-mapped IPv6 peers as their IPv4 address, and gives
// no address for peers without one.
func TestClientAddr(t *testing.T) {
	for _, tc := range []struct {
		in   net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.7"), Port: 1}, "192.0.2.7"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8::2"), Port: 1}, "2001:db8::2"},
		{&net.UnixAddr{Name: "/run/x.sock", Net: "unix"}, "invalid IP"},
		{nil, "invalid IP"},
	} {
		if got := ClientAddr(tc.in).String(); got != tc.want {
			t.Errorf("ClientAddr(%v) = %s, want %s", tc.in, got, tc.want)
		}
	}
}
