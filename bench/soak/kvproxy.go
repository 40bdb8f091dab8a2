package soak

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvselect/kvselect/internal/peerproc"
	"github.com/kvselect/kvselect/internal/zmqdial"
)

// proxyMode is what the lossy proxy does to the batches passing it.
type proxyMode int32

const (
	passAll   proxyMode = iota
	dropSome            // drop a batch with probability dropRate
	duplicate           // send every batch twice
	reorder             // hold every other batch back and send it after the next
)

func (m proxyMode) String() string {
	return [...]string{"pass", "drop", "duplicate", "reorder"}[m]
}

// dropRate is the fraction of batches a dropping proxy loses.
const dropRate = 0.3

// kvProxy sits between one engine's KV event PUB socket and every replica:
// a SUB that dials the engine and a PUB the replicas subscribe to. It passes
// the messages unchanged, or drops, duplicates or reorders whole batches,
// which is what a publisher's lossy network or a buggy relay does to a
// sequence-numbered stream.
type kvProxy struct {
	ctx    context.Context
	cancel context.CancelFunc
	pub    zmq4.Socket
	port   int
	mode   atomic.Int32
	rng    *rand.Rand // used by the forwarding goroutine only
	done   chan struct{}

	forwarded, dropped, duplicated, reordered atomic.Uint64
}

// newKVProxy dials the engine's PUB socket at upstream; with bindUpstream it
// binds a SUB socket there instead, for engines that dial a collector
// (llm-d-inference-sim), and fans their stream out to every replica.
func newKVProxy(upstream string, bindUpstream bool, seed uint64) (*kvProxy, error) {
	port, err := peerproc.FreePort()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &kvProxy{ctx: ctx, cancel: cancel, port: port, rng: rand.New(rand.NewPCG(seed, 0x6b7670)), done: make(chan struct{})}
	p.pub = zmq4.NewPub(ctx)
	if err := p.pub.Listen(fmt.Sprintf("tcp://127.0.0.1:%d", port)); err != nil {
		cancel()
		return nil, fmt.Errorf("kv proxy listen: %w", err)
	}
	if bindUpstream {
		sub := zmq4.NewSub(ctx)
		if err := sub.Listen(upstream); err != nil {
			cancel()
			p.pub.Close()
			return nil, fmt.Errorf("kv proxy listen upstream: %w", err)
		}
		go func() {
			defer close(p.done)
			defer sub.Close()
			p.forward(sub, true)
		}()
		return p, nil
	}
	go func() {
		defer close(p.done)
		zmqdial.Redial(ctx, 100*time.Millisecond, time.Second, func() (bool, error) { return p.session(upstream) }, func(error, time.Duration) {})
	}()
	return p, nil
}

func (p *kvProxy) pubEndpoint() string { return fmt.Sprintf("tcp://127.0.0.1:%d", p.port) }

func (p *kvProxy) setMode(m proxyMode) { p.mode.Store(int32(m)) }

// session forwards until the upstream connection ends.
func (p *kvProxy) session(upstream string) (received bool, err error) {
	sub := zmq4.NewSub(p.ctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(time.Second))
	defer sub.Close()
	dctx, cancel := context.WithTimeout(p.ctx, time.Second)
	err = zmqdial.Dial(dctx, sub, upstream)
	cancel()
	if err != nil {
		return false, err
	}
	return p.forward(sub, false)
}

// forward passes sub's messages on until it fails. A bound socket goes on
// after an error: on a bound SUB it is one peer leaving (an engine killed),
// and the engine's next incarnation dials the same socket.
func (p *kvProxy) forward(sub zmq4.Socket, bound bool) (received bool, err error) {
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		return false, err
	}
	var held *zmq4.Msg
	for {
		msg, err := sub.Recv()
		if err != nil {
			if !bound || p.ctx.Err() != nil {
				return received, err
			}
			select {
			case <-time.After(10 * time.Millisecond):
			case <-p.ctx.Done():
			}
			continue
		}
		received = true
		switch proxyMode(p.mode.Load()) {
		case dropSome:
			if p.rng.Float64() < dropRate {
				p.dropped.Add(1)
				continue
			}
		case duplicate:
			p.send(msg)
			p.duplicated.Add(1)
		case reorder:
			if held == nil {
				held = &msg
				continue
			}
			p.send(msg)
			msg = *held
			held = nil
			p.reordered.Add(1)
		}
		if held != nil && proxyMode(p.mode.Load()) != reorder {
			p.send(*held)
			held = nil
		}
		p.send(msg)
	}
}

func (p *kvProxy) send(m zmq4.Msg) {
	if p.pub.Send(m) == nil {
		p.forwarded.Add(1)
	}
}

func (p *kvProxy) close() {
	p.cancel()
	p.pub.Close()
	<-p.done
}

// tcpProxy forwards TCP connections to one address (an engine's replay
// ROUTER socket) and can be switched down: then it closes every connection
// it holds and every new one at once, as a replay endpoint that is gone.
type tcpProxy struct {
	ln     net.Listener
	target string
	down   atomic.Bool

	mu    sync.Mutex
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

func newTCPProxy(target string) (*tcpProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &tcpProxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	p.wg.Go(p.accept)
	return p, nil
}

func (p *tcpProxy) endpoint() string { return "tcp://" + p.ln.Addr().String() }

func (p *tcpProxy) setDown(down bool) {
	p.down.Store(down)
	if down {
		p.mu.Lock()
		for c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	}
}

func (p *tcpProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.down.Load() {
			c.Close()
			continue
		}
		p.wg.Go(func() { p.pipe(c) })
	}
}

func (p *tcpProxy) pipe(c net.Conn) {
	up, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns[c], p.conns[up] = true, true
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Go(func() { io.Copy(up, c); up.Close() })
	io.Copy(c, up)
	c.Close()
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

func (p *tcpProxy) close() {
	p.ln.Close()
	p.setDown(true)
	p.wg.Wait()
}

// stalledSubscriber subscribes to a replica's mesh PUB socket and never
// reads: go-zeromq's SUB queues a few messages, then stops reading the
// connection, and the publisher's writes to it back up as a frozen peer's
// would.
type stalledSubscriber struct {
	cancel context.CancelFunc
	sub    zmq4.Socket
}

func newStalledSubscriber(endpoint string) (*stalledSubscriber, error) {
	ctx, cancel := context.WithCancel(context.Background())
	sub := zmq4.NewSub(ctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(time.Second))
	dctx, dcancel := context.WithTimeout(ctx, 2*time.Second)
	defer dcancel()
	if err := zmqdial.Dial(dctx, sub, endpoint); err != nil {
		cancel()
		return nil, err
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		cancel()
		sub.Close()
		return nil, err
	}
	return &stalledSubscriber{cancel: cancel, sub: sub}, nil
}

func (s *stalledSubscriber) close() {
	s.cancel()
	s.sub.Close()
}
