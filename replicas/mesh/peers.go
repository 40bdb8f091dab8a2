package mesh

import (
	"context"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvselect/kvselect/internal/zmqdial"
)

// peer is one configured peer endpoint (--replica-sync-peers or registered):
// one subscription to it, or with Options.ResolvePeers and a host name, one
// per address the name resolves to.
type peer struct {
	ep     string
	cancel context.CancelFunc
	done   chan struct{} // closed once every subscription has stopped

	mu         sync.Mutex
	subs       map[string]*sub // by dialed endpoint
	resolveErr string
}

// sub is one SUB connection with its reconnect loop.
type sub struct {
	ep     string
	cancel context.CancelFunc
	done   chan struct{}

	mu sync.Mutex
	st PeerStatus
}

// PeerStatus is the state of one subscription.
type PeerStatus struct {
	Peer       string // the configured peer endpoint
	Endpoint   string // the endpoint dialed (the peer itself, or one resolved address)
	Connected  bool   // dialed and subscribed
	Received   uint64 // messages received
	Reconnects uint64 // sessions that ended in an error
	LastError  string // the latest connection or resolution error
}

func (s *sub) update(fn func(*PeerStatus)) {
	s.mu.Lock()
	fn(&s.st)
	s.mu.Unlock()
}

// startPeer launches the peer's subscriptions; the caller holds m.mu.
func (m *Mesh) startPeer(ep string) {
	ctx, cancel := context.WithCancel(m.ctx)
	p := &peer{ep: ep, cancel: cancel, done: make(chan struct{}), subs: make(map[string]*sub)}
	m.peers[ep] = p
	go m.runPeer(ctx, p)
}

// runPeer keeps the peer's subscriptions in step with what its endpoint names.
func (m *Mesh) runPeer(ctx context.Context, p *peer) {
	defer close(p.done)
	defer p.stopAll()
	host, port, ok := m.resolvable(p.ep)
	if !ok {
		p.reconcile(ctx, m, []string{p.ep})
		<-ctx.Done()
		return
	}
	for {
		lctx, cancel := context.WithTimeout(ctx, m.opts.DialTimeout)
		addrs, err := m.opts.Resolver.LookupHost(lctx, host)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			// Keep what we have: a DNS hiccup must not cut the mesh.
			p.mu.Lock()
			p.resolveErr = err.Error()
			p.mu.Unlock()
			m.log.Debug("replica peer name did not resolve", "peer", p.ep, "err", err)
		} else {
			want := make([]string, 0, len(addrs))
			for _, a := range addrs {
				if !m.isSelf(a, port) {
					want = append(want, "tcp://"+net.JoinHostPort(a, port))
				}
			}
			p.mu.Lock()
			p.resolveErr = ""
			p.mu.Unlock()
			p.reconcile(ctx, m, want)
		}
		t := time.NewTimer(m.opts.ResolveEvery)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// resolvable reports whether the peer's endpoint is a tcp host name to expand.
func (m *Mesh) resolvable(ep string) (host, port string, ok bool) {
	if !m.opts.ResolvePeers {
		return "", "", false
	}
	addr, found := strings.CutPrefix(ep, "tcp://")
	if !found {
		return "", "", false
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "*" || net.ParseIP(host) != nil {
		return "", "", false
	}
	return host, port, true
}

// isSelf reports whether ip:port is this replica's own PUB socket, which a
// headless Service lists among the peers once the replica is ready.
func (m *Mesh) isSelf(ip, port string) bool {
	if port != m.selfPort {
		return false
	}
	a := net.ParseIP(ip)
	return a != nil && slices.ContainsFunc(m.selfIPs, a.Equal)
}

// reconcile starts subscriptions to the endpoints in want and stops the others.
func (p *peer) reconcile(ctx context.Context, m *Mesh, want []string) {
	p.mu.Lock()
	var stop []*sub
	keep := make(map[string]bool, len(want))
	for _, ep := range want {
		keep[ep] = true
		if _, ok := p.subs[ep]; !ok {
			sctx, cancel := context.WithCancel(ctx)
			s := &sub{ep: ep, cancel: cancel, done: make(chan struct{}), st: PeerStatus{Peer: p.ep, Endpoint: ep}}
			p.subs[ep] = s
			go m.runSub(sctx, s)
			if ep != p.ep {
				m.log.Info("replica peer address added", "peer", p.ep, "endpoint", ep)
			}
		}
	}
	for _, ep := range slices.Sorted(maps.Keys(p.subs)) {
		if !keep[ep] {
			stop = append(stop, p.subs[ep])
			delete(p.subs, ep)
			m.log.Info("replica peer address removed", "peer", p.ep, "endpoint", ep)
		}
	}
	p.mu.Unlock()
	for _, s := range stop {
		s.cancel()
		<-s.done
	}
}

func (p *peer) stopAll() {
	p.mu.Lock()
	subs := slices.Collect(maps.Values(p.subs))
	p.subs = map[string]*sub{}
	p.mu.Unlock()
	for _, s := range subs {
		s.cancel()
		<-s.done
	}
}

// appendStatus appends a row per subscription, or one row carrying the
// resolution error while the name resolves to nothing.
func (p *peer) appendStatus(dst []PeerStatus) []PeerStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.subs) == 0 {
		return append(dst, PeerStatus{Peer: p.ep, LastError: p.resolveErr})
	}
	for _, s := range p.subs {
		s.mu.Lock()
		dst = append(dst, s.st)
		s.mu.Unlock()
	}
	return dst
}

// runSub keeps a SUB session up, redialing with capped exponential backoff; a
// session that received something resets the backoff.
func (m *Mesh) runSub(ctx context.Context, s *sub) {
	defer close(s.done)
	zmqdial.Redial(ctx, m.opts.ReconnectMin, m.opts.ReconnectMax,
		func() (bool, error) {
			received, err := m.session(ctx, s)
			s.update(func(st *PeerStatus) { st.Connected = false })
			return received, err
		},
		func(err error, wait time.Duration) {
			s.update(func(st *PeerStatus) {
				st.Reconnects++
				st.LastError = err.Error()
			})
			m.log.Debug("replica peer disconnected; reconnecting", "endpoint", s.ep, "err", err, "retry_in", wait)
		})
}

// session dials, subscribes and applies messages until an error.
func (m *Mesh) session(ctx context.Context, s *sub) (received bool, err error) {
	sock := zmq4.NewSub(ctx, zmq4.WithLogger(m.zlog), zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(m.opts.DialTimeout))
	defer sock.Close()
	dctx, cancel := context.WithTimeout(ctx, m.opts.DialTimeout)
	err = zmqdial.Dial(dctx, sock, s.ep)
	cancel()
	if err != nil {
		return false, err
	}
	for _, t := range m.topics {
		if err := sock.SetOption(zmq4.OptionSubscribe, t); err != nil {
			return false, err
		}
	}
	s.update(func(st *PeerStatus) { st.Connected = true })
	m.log.Debug("replica peer connected", "endpoint", s.ep)
	for {
		msg, err := sock.Recv()
		if err != nil {
			return received, err
		}
		received = true
		s.update(func(st *PeerStatus) { st.Received++ })
		m.handle(s.ep, msg.Frames)
	}
}

// localIPs lists the addresses of this host's interfaces, to recognize our own
// PUB socket among a name's addresses.
func localIPs() []net.IP {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []net.IP
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			out = append(out, n.IP)
		}
	}
	return out
}

func portOf(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok {
		return strconv.Itoa(t.Port)
	}
	return ""
}
