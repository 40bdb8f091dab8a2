// Package zmqguard binds a go-zeromq (zmq4) socket so that peers cannot make
// the process allocate, crash or stall on their say-so.
//
// zmq4 trusts what a peer announces. It reads a ZMTP frame by allocating
// make([]byte, size) for whatever size the frame header states, so one header
// announcing a terabyte panics the process or exhausts its memory; it decodes
// the handshake's metadata without bounds checks, so a truncated property
// panics it; and it runs each accepted connection's handshake in the socket's
// only accept goroutine, so one peer that connects and stays silent stops the
// socket from accepting anyone else. A socket that dials out to known engines
// can live with that; a socket that binds and lets the network dial in (the
// KV-event collector) cannot.
//
// Listen binds such a socket through a transport of this package whose
// connections parse the inbound byte stream as ZMTP 3 while zmq4 reads it
// (FrameGuard) and drop the peer, before zmq4 sees the offending bytes, at the
// first frame over the size cap or the first byte that is not ZMTP framing;
// and that close a connection whose peer has not finished its handshake in
// time. Only the read direction is guarded: what the socket writes is its own.
//
// What the guard does not bound: the number of connections, and what honest
// framing costs (each connection may hold one frame of up to the cap while it
// arrives, and a multi-part message grows with every frame unless
// WithMaxFrames caps it).
package zmqguard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// DefaultHandshakeTimeout is how long a peer has, from the TCP accept, to send
// its greeting and its side of the handshake. A real engine does both at once.
const DefaultHandshakeTimeout = 10 * time.Second

// ErrUnsupportedEndpoint is returned for an endpoint that is not tcp://.
var ErrUnsupportedEndpoint = errors.New("only tcp:// endpoints can be guarded")

// Option adjusts Listen.
type Option func(*config)

// WithHandshakeTimeout sets how long a peer has to finish its side of the
// handshake before it is dropped (reason "handshake_timeout"); d <= 0 waits
// forever. zmq4 handshakes in its single accept goroutine, so until then no
// other peer can connect. The timeout also closes connections whose handshake
// zmq4 gave up on without closing them (a mechanism it does not speak).
func WithHandshakeTimeout(d time.Duration) Option {
	return func(c *config) { c.handshakeTimeout = d }
}

// WithMaxFrames caps the frames of one multi-part message (reason
// "too_many_frames"); n <= 0 leaves them uncapped, the default.
func WithMaxFrames(n int) Option {
	return func(c *config) { c.limits.MaxFrames = max(n, 0) }
}

type config struct {
	limits           Limits
	handshakeTimeout time.Duration
	onReject         func(reason string)
}

// registered numbers the transports Listen registers. zmq4 keeps transports
// in a process-wide registry with no way to unregister, so each guarded bind
// takes a name of its own there for the life of the process; one small entry
// per bind is negligible. The counter only has to keep those names apart.
var registered atomic.Uint64

// Listen binds sock at endpoint (tcp://host:port, port 0 allowed) so that
// every accepted connection is read through a guard: a peer announcing a ZMTP
// frame larger than maxFrame bytes (or sending bytes that are not ZMTP 3.x
// framing after the greeting) is disconnected before the frame is allocated,
// and onReject is called with a short reason ("oversized_frame", "bad_greeting", ...).
//
// maxFrame bounds command frames too, so it must leave room for the
// handshake (a few hundred bytes at least). onReject may be nil; it is called
// at most once per connection, from the goroutine that noticed, and must not
// block. A peer that has not finished its side of the handshake
// DefaultHandshakeTimeout after connecting is dropped too
// ("handshake_timeout"; see WithHandshakeTimeout). sock.Addr() reports the
// bound TCP address as usual.
//
// A peer dropped after its handshake, like one that disconnects, makes one
// sock.Recv return an error (zmq4 passes each connection's read error on);
// the socket goes on serving the other peers.
func Listen(sock zmq4.Socket, endpoint string, maxFrame int64, onReject func(reason string), opts ...Option) error {
	hostport, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return fmt.Errorf("zmqguard: listen %q: %w", endpoint, ErrUnsupportedEndpoint)
	}
	if maxFrame <= 0 {
		return fmt.Errorf("zmqguard: listen %s: frame cap %d is not positive", endpoint, maxFrame)
	}
	cfg := config{
		limits:           Limits{MaxFrame: maxFrame},
		handshakeTimeout: DefaultHandshakeTimeout,
		onReject:         onReject,
	}
	for _, o := range opts {
		o(&cfg)
	}
	name, err := register(guardTransport{cfg: cfg, tcp: transport.New("tcp")})
	if err != nil {
		return fmt.Errorf("zmqguard: listen %s: %w", endpoint, err)
	}
	if err := sock.Listen(name + "://" + hostport); err != nil {
		return fmt.Errorf("zmqguard: listen %s: %w", endpoint, err)
	}
	return nil
}

// Dialer registers a guarded transport for dialing and returns its scheme:
// a socket that dials "<scheme>://host:port" instead of "tcp://host:port"
// reads the peer it reached through the same guard and read-ahead as Listen
// gives accepted peers. A dialing socket talks to a peer it chose, but a
// broken or hostile engine must not crash or stall the process either. One
// registration serves any number of sockets.
func Dialer(maxFrame int64, onReject func(reason string), opts ...Option) (scheme string, err error) {
	if maxFrame <= 0 {
		return "", fmt.Errorf("zmqguard: dialer: frame cap %d is not positive", maxFrame)
	}
	cfg := config{limits: Limits{MaxFrame: maxFrame}, handshakeTimeout: DefaultHandshakeTimeout, onReject: onReject}
	for _, o := range opts {
		o(&cfg)
	}
	name, err := register(guardTransport{cfg: cfg, tcp: transport.New("tcp")})
	if err != nil {
		return "", fmt.Errorf("zmqguard: dialer: %w", err)
	}
	return name, nil
}

// register adds t to zmq4's registry under a fresh name and returns it. A
// name can only be taken already if something else registered it, so a few
// tries are plenty.
func register(t guardTransport) (string, error) {
	var err error
	for range 8 {
		name := fmt.Sprintf("zmqguard-tcp-%d", registered.Add(1))
		if err = zmq4.RegisterTransport(name, t); err == nil {
			return name, nil
		}
	}
	return "", fmt.Errorf("register transport: %w", err)
}

// guardTransport is a zmq4 transport over TCP whose connections, accepted or
// dialed, are read through a guard.
type guardTransport struct {
	cfg config
	tcp transport.Transport
}

func (t guardTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	nc, err := t.tcp.Dial(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	return newConn(nc, t.cfg, nil), nil
}

func (t guardTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("guarded listener: %w", err)
	}
	return &listener{Listener: ln, cfg: t.cfg, pending: map[*conn]struct{}{}}, nil
}

// Addr normalizes host:port the way zmq4's own tcp transport does ("*" and
// an empty host mean every interface, "*" as port means any).
func (t guardTransport) Addr(ep string) (string, error) { return t.tcp.Addr(ep) }

// listener wraps every accepted connection in a guard, and on Close also
// closes the connections still in their handshake: zmq4 only closes the ones
// it has taken over, and its accept goroutine may be blocked reading one.
type listener struct {
	net.Listener
	cfg config

	mu      sync.Mutex
	pending map[*conn]struct{} // accepted, handshake not done; nil once closed
}

func (l *listener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	if l.pending == nil {
		l.mu.Unlock()
		nc.Close()
		return nil, net.ErrClosed
	}
	c := newConn(nc, l.cfg, l)
	l.pending[c] = struct{}{}
	l.mu.Unlock()
	return c, nil
}

// newConn wraps nc in a guard and starts its handshake watch; ln is the
// listener that accepted it, nil for a dialed connection.
func newConn(nc net.Conn, cfg config, ln *listener) *conn {
	c := &conn{Conn: nc, guard: NewFrameGuard(cfg.limits), onReject: cfg.onReject, ln: ln}
	if d := cfg.handshakeTimeout; d > 0 {
		c.mu.Lock()
		c.timer = time.AfterFunc(d, func() {
			c.reject(&RejectError{Reason: ReasonHandshakeTimeout, Detail: fmt.Sprintf("no handshake within %v", d)})
		})
		c.mu.Unlock()
	}
	return c
}

func (l *listener) Close() error {
	err := l.Listener.Close()
	l.mu.Lock()
	pending := l.pending
	l.pending = nil
	l.mu.Unlock()
	for c := range pending {
		c.Close()
	}
	return err
}

func (l *listener) forget(c *conn) {
	l.mu.Lock()
	delete(l.pending, c)
	l.mu.Unlock()
}

type connState uint8

const (
	stateOpen connState = iota
	stateRejected
	stateClosed
)

// conn passes reads through its FrameGuard before handing them on. zmq4
// reads a connection from one goroutine at a time (the accept goroutine
// during the handshake, then the socket's reader), and readMu holds any other
// caller to that.
type conn struct {
	net.Conn
	guard    *FrameGuard
	onReject func(string)
	ln       *listener

	readMu    sync.Mutex
	handshook bool // guarded by readMu
	// Read-ahead, guarded by readMu: zmq4 reads a frame's flags, size and
	// body with separate small reads, each a system call on a bare TCP
	// connection; reading ahead serves them from one. Bytes are fed to the
	// guard as they enter the buffer, so zmq4 still sees nothing unchecked.
	buf        []byte
	head, tail int   // buf[head:tail] is checked and not yet handed on
	readErr    error // the error that came with buffered bytes, for after them

	mu     sync.Mutex
	state  connState
	rejErr *RejectError
	timer  *time.Timer
}

// readAhead is the read-ahead buffer of one connection.
const readAhead = 32 << 10

func (c *conn) Read(p []byte) (int, error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	if err := c.rejection(); err != nil {
		return 0, err
	}
	if c.head < c.tail {
		n := copy(p, c.buf[c.head:c.tail])
		c.head += n
		return n, nil
	}
	if err := c.readErr; err != nil {
		return 0, err
	}
	// A read as large as the buffer (a frame body) goes straight into p.
	dst := p
	if len(p) < readAhead {
		if c.buf == nil {
			c.buf = make([]byte, readAhead)
		}
		dst = c.buf
	}
	n, err := c.Conn.Read(dst)
	if n > 0 {
		if rej := c.guard.feed(dst[:n]); rej != nil {
			c.reject(rej)
			return 0, rej
		}
		if !c.handshook && c.guard.HandshakeDone() {
			c.handshook = true
			c.settle()
		}
	}
	if err != nil {
		if rej := c.rejection(); rej != nil {
			return 0, rej // the handshake timer closed the connection under us
		}
		if !c.handshook && peerGone(err) {
			// The peer hung up before finishing its handshake. zmq4 does
			// not close a dialed connection whose handshake failed, so the
			// descriptor would stay open until the handshake timer, which
			// would then blame the peer for a timeout: close it now.
			c.Close()
		}
	}
	if n > 0 && len(p) < readAhead {
		m := copy(p, c.buf[:n])
		c.head, c.tail = m, n
		if m < n {
			c.readErr, err = err, nil // hand on the rest first
		}
		return m, err
	}
	return n, err
}

// peerGone reports whether a read error means the connection is over: the
// end of the stream or a network error other than a timeout (a deadline zmq4
// set is not the peer's doing).
func peerGone(err error) bool {
	var ne net.Error
	return errors.Is(err, io.EOF) || (errors.As(err, &ne) && !ne.Timeout())
}

// rejection returns the reason the connection was dropped, or nil.
func (c *conn) rejection() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rejErr == nil {
		return nil
	}
	return c.rejErr
}

// reject drops the peer, unless the connection is closed already, and tells
// the caller why.
func (c *conn) reject(rej *RejectError) {
	c.mu.Lock()
	if c.state != stateOpen {
		c.mu.Unlock()
		return
	}
	c.state, c.rejErr = stateRejected, rej
	c.mu.Unlock()
	c.settle()
	c.Conn.Close()
	if c.onReject != nil {
		c.onReject(rej.Reason)
	}
}

func (c *conn) Close() error {
	c.mu.Lock()
	if c.state == stateOpen {
		c.state = stateClosed
	}
	c.mu.Unlock()
	c.settle()
	return c.Conn.Close()
}

// settle ends the handshake watch: the timer and the listener's claim.
func (c *conn) settle() {
	c.mu.Lock()
	t := c.timer
	c.mu.Unlock()
	if t != nil {
		t.Stop()
	}
	if c.ln != nil {
		c.ln.forget(c)
	}
}
