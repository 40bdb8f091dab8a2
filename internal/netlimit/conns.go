// Package netlimit bounds what one client may take from a server, so that a
// single misbehaving host — a runaway retry loop, a leaking connection pool, a
// slowloris — cannot use up the file descriptors, goroutines or request
// capacity every other client shares.
//
// Two limits, both keyed by the client's IP address as the socket sees it:
//
//   - ConnLimiter caps concurrent connections per client (and in total) at
//     the listener: a connection over the cap is closed as soon as it is
//     accepted, before any byte of it is read, and counted.
//   - RateLimiter is net/http middleware with a token bucket per client
//     (golang.org/x/time/rate): a request over the rate is answered 429 with
//     Retry-After and the REST API's {"error": "..."} envelope. The clients it
//     remembers are bounded, so a flood of source addresses cannot grow its
//     memory without bound.
//
// The address is the TCP peer's, never a forwarded-for header: a header is
// the client's to write, so honouring it would let any client pick its own
// bucket. Behind a proxy or a NAT every client shares the proxy's address and
// its limits; set them for the busiest such address, or off.
//
// Both implement prometheus.Collector; the metric names start with the prefix
// their options give (kvselect_http for the REST port).
package netlimit

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultMetricPrefix names the REST port's metrics.
const DefaultMetricPrefix = "kvselect_http"

// Rejection reasons, the reason label of <prefix>_connections_rejected_total.
const (
	ReasonPerClient = "per_client" // the client already had PerClient connections
	ReasonTotal     = "total"      // the server already had Total connections
)

// ConnLimits configures a ConnLimiter. A zero field is no limit.
type ConnLimits struct {
	// PerClient is the most connections open at once from one IP address.
	// Connections whose peer has no IP address (a Unix socket, a pipe) are
	// not limited per client; Total still counts them.
	PerClient int
	// Total is the most connections open at once over all clients.
	Total int
	// MetricPrefix starts the metric names; DefaultMetricPrefix when empty.
	MetricPrefix string
}

// ConnLimiter counts the open connections of the listeners it wraps and
// refuses those over its limits. One ConnLimiter may wrap several listeners;
// the limits are shared.
type ConnLimiter struct {
	lim ConnLimits

	mu       sync.Mutex
	perAddr  map[netip.Addr]int // open connections per client; no zero entries
	total    int
	rejected [2]atomic.Uint64 // ReasonPerClient, ReasonTotal

	descActive, descClients, descRejected *prometheus.Desc
}

// ConnStats is a snapshot of a ConnLimiter.
type ConnStats struct {
	Active            int    // connections open now
	Clients           int    // distinct client addresses among them
	RejectedPerClient uint64 // connections closed at accept: over PerClient
	RejectedTotal     uint64 // connections closed at accept: over Total
}

// NewConnLimiter returns a limiter with the given limits; negative limits are
// read as zero (no limit).
func NewConnLimiter(lim ConnLimits) *ConnLimiter {
	lim.PerClient, lim.Total = max(lim.PerClient, 0), max(lim.Total, 0)
	if lim.MetricPrefix == "" {
		lim.MetricPrefix = DefaultMetricPrefix
	}
	p := lim.MetricPrefix
	return &ConnLimiter{
		lim:     lim,
		perAddr: make(map[netip.Addr]int),
		descActive: prometheus.NewDesc(p+"_connections_active",
			"Connections open now (accepted and admitted by the connection limits).", nil, nil),
		descClients: prometheus.NewDesc(p+"_connection_clients",
			"Distinct client IP addresses with at least one open connection.", nil, nil),
		descRejected: prometheus.NewDesc(p+"_connections_rejected_total",
			"Connections closed as soon as they were accepted, by the limit they were over: per_client (the client's address had its maximum open already) or total.",
			[]string{"reason"}, nil),
	}
}

// Limits returns the limits in force.
func (c *ConnLimiter) Limits() ConnLimits { return c.lim }

// Listener wraps ln: its Accept returns only connections within the limits,
// and closes the others itself (they never reach the server). Closing a
// returned connection frees its place, exactly once however often it is
// closed. Accept's errors are ln's.
func (c *ConnLimiter) Listener(ln net.Listener) net.Listener {
	return &listener{Listener: ln, lim: c}
}

// Stats returns the current counts.
func (c *ConnLimiter) Stats() ConnStats {
	c.mu.Lock()
	st := ConnStats{Active: c.total, Clients: len(c.perAddr)}
	c.mu.Unlock()
	st.RejectedPerClient, st.RejectedTotal = c.rejected[0].Load(), c.rejected[1].Load()
	return st
}

// admit books a connection from addr (valid or not), or counts its refusal.
func (c *ConnLimiter) admit(addr netip.Addr) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lim.Total > 0 && c.total >= c.lim.Total {
		c.rejected[1].Add(1)
		return false
	}
	if addr.IsValid() {
		if n := c.perAddr[addr]; c.lim.PerClient > 0 && n >= c.lim.PerClient {
			c.rejected[0].Add(1)
			return false
		}
		c.perAddr[addr]++
	}
	c.total++
	return true
}

// release frees what admit booked for addr.
func (c *ConnLimiter) release(addr netip.Addr) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total--
	if addr.IsValid() {
		if n := c.perAddr[addr] - 1; n > 0 {
			c.perAddr[addr] = n
		} else {
			delete(c.perAddr, addr)
		}
	}
}

// Describe implements prometheus.Collector.
func (c *ConnLimiter) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.descActive
	ch <- c.descClients
	ch <- c.descRejected
}

// Collect implements prometheus.Collector.
func (c *ConnLimiter) Collect(ch chan<- prometheus.Metric) {
	st := c.Stats()
	ch <- prometheus.MustNewConstMetric(c.descActive, prometheus.GaugeValue, float64(st.Active))
	ch <- prometheus.MustNewConstMetric(c.descClients, prometheus.GaugeValue, float64(st.Clients))
	ch <- prometheus.MustNewConstMetric(c.descRejected, prometheus.CounterValue, float64(st.RejectedPerClient), ReasonPerClient)
	ch <- prometheus.MustNewConstMetric(c.descRejected, prometheus.CounterValue, float64(st.RejectedTotal), ReasonTotal)
}

// ClientAddr is the IP address a limit keys a peer on: the TCP (or UDP)
// peer's address, IPv4-mapped IPv6 addresses unmapped so that a dual-stack
// socket counts an IPv4 client once. It is not valid for peers without an IP
// address.
func ClientAddr(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case *net.TCPAddr:
		return a.AddrPort().Addr().Unmap()
	case *net.UDPAddr:
		return a.AddrPort().Addr().Unmap()
	case nil:
		return netip.Addr{}
	}
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

type listener struct {
	net.Listener
	lim *ConnLimiter
}

// Accept returns the next connection within the limits. Refused connections
// are closed here and the loop goes on, so the server never sees them and
// never backs off: a refusal is not an Accept error.
func (l *listener) Accept() (net.Conn, error) {
	for {
		nc, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		addr := ClientAddr(nc.RemoteAddr())
		if !l.lim.admit(addr) {
			_ = nc.Close()
			continue
		}
		return &conn{Conn: nc, lim: l.lim, addr: addr}, nil
	}
}

// conn is an admitted connection; Close frees its place once.
type conn struct {
	net.Conn
	lim      *ConnLimiter
	addr     netip.Addr
	released atomic.Bool
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	if c.released.CompareAndSwap(false, true) {
		c.lim.release(c.addr)
	}
	return err
}

// CloseWrite half-closes the connection when the underlying one can: net/http
// does so before closing a connection after an error answer, and the REST
// front after a 413, so that the client reads the answer instead of a reset.
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// NetConn returns the connection underneath, for code that needs its concrete
// type (socket options). Closing it directly bypasses the limiter's count:
// close the wrapper.
func (c *conn) NetConn() net.Conn { return c.Conn }
