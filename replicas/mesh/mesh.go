// Package mesh is the replica synchronization peer plane of Dynamo's
// standalone selection service ("Peer Planes" in
// https://docs.nvidia.com/dynamo/dev/components/router/standalone-selection-service;
// lib/kv-router/src/services/common/replica_sync.rs at commit 02165d72): a ZMQ
// PUB socket bound on --replica-sync-port carries this replica's booking
// admissions, prefill completions and frees (dynamo.slot-tracker.v1) and its
// session bindings (dynamo.session-affinity.v1); one SUB socket per peer — the
// --replica-sync-peers endpoints and those registered at run time through
// /replica_sync/register_peer — feeds the peers' events back into the local
// selection.Service, which books them as expiring mirrored reservations.
//
// Messages are two frames, [topic, MessagePack payload], in Dynamo's v1
// envelope (envelope.go), so a kvselect replica and a Dynamo selector can share
// a mesh. Synchronization is best effort and bounded, as the "Consistency
// Invariants" of that page say: bounded outbound queues that drop when full, no
// acknowledgement, ordering across peers, replay or resync; events for unknown
// workers, partitions, ranks or block sizes are dropped and counted (Stats).
// Output-block growth never leaves the replica.
//
// A mesh without a key trusts every message, as Dynamo's does: anyone who can
// reach the sync port, or get a replica to subscribe to them, can book load,
// free bookings and bind sessions on every replica. Options.Key closes that
// without a transport security go-zeromq lacks (it has no CURVE): each message
// gains a third frame, an HMAC-SHA256 tag over the topic, the payload and a
// (sender, epoch, sequence) header, checked before anything is decoded, and a
// per-stream replay window drops repeats (auth.go has the framing and the
// rules). Rejections are counted by reason, never applied, and logged at most
// once per reason every 10 s, so a flood costs one HMAC per message and no log
// volume. A keyed mesh does not interoperate with unkeyed replicas or Dynamo
// peers in either direction: they drop each other's messages.
package mesh

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvselect/kvselect/internal/zmqguard"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/affinity"
	"github.com/kvselect/kvselect/selection/catalog"
)

// Defaults for Options: Dynamo's replica-sync queue bounds (100,000 lifecycle
// events, 4,096 bindings) and ZMQ reconnect backoff.
const (
	DefaultBookingQueue = 100_000
	DefaultBindingQueue = 4_096
	DefaultReconnectMin = 100 * time.Millisecond
	DefaultReconnectMax = 5 * time.Second
	DefaultDialTimeout  = 2 * time.Second
	DefaultResolveEvery = 10 * time.Second
)

// Replica is what the mesh needs of the local service;
// (*selection.Service).Replica() is one.
type Replica interface {
	ReplicaID() uint64
	ObserveReplicas(selection.ReplicaObserver)
	ApplyRemoteBooking(selection.BookingEvent) selection.RemoteOutcome
	ApplyRemoteBinding(selection.SessionBinding) (selection.RemoteOutcome, affinity.ApplyOutcome)
}

// Options configures a Mesh.
type Options struct {
	// Bind is the PUB endpoint, "tcp://*:<port>" for --replica-sync-port.
	// A port of 0 picks a free one (Addr reports it); the server's flag
	// refuses 0, as Dynamo does.
	Bind string
	// Peers are the initial SUB endpoints (--replica-sync-peers).
	Peers []string
	// Affinity subscribes to the session-affinity topic (only when session
	// affinity is on, as Dynamo subscribes to it).
	Affinity bool
	Logger   *slog.Logger
	// BookingQueue and BindingQueue bound the outbound queues (100,000 and
	// 4,096); a full queue drops the event and counts it.
	BookingQueue, BindingQueue int
	// ReconnectMin and ReconnectMax bound the per-peer redial backoff
	// (100 ms doubling to 5 s, Dynamo's ZMQ reconnect settings).
	ReconnectMin, ReconnectMax time.Duration
	// DialTimeout bounds one TCP connect attempt (2 s).
	DialTimeout time.Duration
	// ResolvePeers subscribes to every address a peer's host name resolves
	// to, re-resolved every ResolveEvery (10 s), skipping this replica's own
	// PUB address. A Kubernetes headless Service name then reaches every
	// replica of a Deployment, where a plain ZMQ connect would reach one.
	ResolvePeers bool
	ResolveEvery time.Duration
	// Resolver looks host names up; net.DefaultResolver when nil.
	Resolver *net.Resolver
	// Key authenticates the mesh (LoadKey reads one; at least MinKeyBytes
	// bytes). Every replica must hold it: messages are signed with it, and
	// messages without a valid tag, or replayed, are dropped before decoding.
	// Nil leaves the mesh unauthenticated and wire-compatible with Dynamo; a
	// non-nil key shorter than MinKeyBytes fails Start.
	Key []byte
	// Keys are further keys accepted when verifying, for rolling key
	// rotation: add the new key here everywhere, then make it Key everywhere,
	// then drop the old one. When Key is nil, Keys[0] signs.
	Keys [][]byte
}

// Mesh is one replica's side of the replica mesh. It implements
// selection.ReplicaObserver (outbound) and, with Register, Deregister and
// Peers, the dynamic peer membership the REST API's /replica_sync/* routes
// manage (the server hands it to httpadmin as its PeerManager).
type Mesh struct {
	r      Replica
	opts   Options
	log    *slog.Logger
	zlog   *log.Logger
	ctx    context.Context
	cancel context.CancelFunc
	pub    zmq4.Socket
	topics []string

	bookings chan selection.BookingEvent
	bindings chan selection.SessionBinding
	pubDone  chan struct{}

	selfPort string   // the bound PUB port
	selfIPs  []net.IP // this host's addresses (ResolvePeers skips our own socket)

	auth      *authenticator // nil: unauthenticated mesh
	rejectLog [numRejectReasons]logLimiter

	mu     sync.Mutex
	closed bool
	peers  map[string]*peer

	c counters
}

var _ selection.ReplicaObserver = (*Mesh)(nil)

// counters are the mesh's statistics, updated without locks.
type counters struct {
	bookingsPublished, bookingsDropped atomic.Uint64
	bindingsPublished, bindingsDropped atomic.Uint64
	sendErrors                         atomic.Uint64
	received, malformed                atomic.Uint64
	rejected                           [numRejectReasons]atomic.Uint64 // by rejectReason
	bookingOutcomes                    [16]atomic.Uint64               // by selection.RemoteOutcome
	bindingOutcomes                    [16]atomic.Uint64
}

func (c *counters) count(by *[16]atomic.Uint64, o selection.RemoteOutcome) {
	if int(o) < len(by) {
		by[o].Add(1)
	}
}

// Stats is a snapshot of the mesh's counters.
type Stats struct {
	BookingsPublished uint64 // booking events handed to the PUB socket
	BookingsDropped   uint64 // booking events dropped: outbound queue full
	BindingsPublished uint64
	BindingsDropped   uint64
	SendErrors        uint64 // PUB sends that failed (the event is lost)
	Received          uint64 // messages received from all peers
	Malformed         uint64 // messages dropped undecoded: frames, topic or payload (with a key: authenticated ones)
	// Rejected counts, with a key, the messages dropped before decoding by
	// reason (RejectedUnauthenticated, RejectedReplayed, RejectedMalformed);
	// they are not in Malformed. Zero counts are left out.
	Rejected map[string]uint64
	// Bookings and Bindings count what the service did with each decoded
	// event, by selection.RemoteOutcome name ("applied", "unknown_worker",
	// "block_size_mismatch", …).
	Bookings map[string]uint64
	Bindings map[string]uint64
	// Peers has one row per address subscribed to (one per configured peer,
	// or one per resolved address with ResolvePeers), sorted.
	Peers []PeerStatus
}

// ErrClosed is returned by Register after Close.
var ErrClosed = errors.New("mesh: mesh closed")

// Start binds the PUB socket, connects to the initial peers and starts
// publishing r's events. A bind failure or an invalid peer endpoint fails
// Start and releases the socket, so the port is free again (as Dynamo's
// service.rs test that a bad peer endpoint fails startup checks). The mesh
// runs until ctx ends or Close is called.
func Start(ctx context.Context, r Replica, opts Options) (*Mesh, error) {
	if err := catalog.ValidateZMQEndpoint(opts.Bind); err != nil {
		return nil, fmt.Errorf("replica sync bind: %w", err)
	}
	for _, ep := range opts.Peers {
		if err := catalog.ValidateZMQEndpoint(ep); err != nil {
			return nil, fmt.Errorf("invalid replica peer endpoint `%s`: %w", ep, err)
		}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.BookingQueue <= 0 {
		opts.BookingQueue = DefaultBookingQueue
	}
	if opts.BindingQueue <= 0 {
		opts.BindingQueue = DefaultBindingQueue
	}
	if opts.ReconnectMin <= 0 {
		opts.ReconnectMin = DefaultReconnectMin
	}
	if opts.ReconnectMax <= 0 {
		opts.ReconnectMax = DefaultReconnectMax
	}
	opts.ReconnectMax = max(opts.ReconnectMax, opts.ReconnectMin)
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = DefaultDialTimeout
	}
	if opts.ResolveEvery <= 0 {
		opts.ResolveEvery = DefaultResolveEvery
	}
	if opts.Resolver == nil {
		opts.Resolver = net.DefaultResolver
	}
	var keys [][]byte
	if opts.Key != nil {
		keys = append(keys, opts.Key)
	}
	keys = append(keys, opts.Keys...)
	var auth *authenticator
	if len(keys) > 0 {
		var err error
		if auth, err = newAuthenticator(keys, r.ReplicaID()); err != nil {
			return nil, fmt.Errorf("replica sync key: %w", err)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	m := &Mesh{
		r: r, opts: opts, log: opts.Logger.With("component", "replica-sync"),
		zlog: log.New(io.Discard, "", 0), ctx: ctx, cancel: cancel,
		topics:   []string{TopicSlotTracker},
		bookings: make(chan selection.BookingEvent, opts.BookingQueue),
		bindings: make(chan selection.SessionBinding, opts.BindingQueue),
		pubDone:  make(chan struct{}),
		peers:    make(map[string]*peer),
		auth:     auth,
	}
	if opts.Affinity {
		m.topics = append(m.topics, TopicSessionAffinity)
	}
	m.pub = zmq4.NewPub(ctx, zmq4.WithLogger(m.zlog))
	// The socket's own queue is bounded too: when subscribers cannot keep up,
	// messages beyond it are dropped (best effort, like Dynamo's send timeout 0).
	if err := m.pub.SetOption(zmq4.OptionHWM, opts.BookingQueue+opts.BindingQueue); err != nil {
		cancel()
		m.pub.Close()
		return nil, fmt.Errorf("replica sync: %w", err)
	}
	if err := m.listen(opts.Bind); err != nil {
		cancel()
		m.pub.Close()
		return nil, fmt.Errorf("failed to bind replica publisher to `%s`: %w", opts.Bind, err)
	}
	m.selfPort, m.selfIPs = portOf(m.pub.Addr()), localIPs()
	go m.publish()
	for _, ep := range opts.Peers {
		m.mu.Lock()
		if _, dup := m.peers[ep]; !dup {
			m.startPeer(ep)
		}
		m.mu.Unlock()
	}
	r.ObserveReplicas(m)
	context.AfterFunc(ctx, func() { _ = m.Close() })
	m.log.Info("replica sync started", "bind", m.Addr().String(), "peers", opts.Peers,
		"replica_id", r.ReplicaID(), "topics", m.topics, "authenticated", auth != nil, "keys", len(keys))
	return m, nil
}

// Addr is the bound PUB address (with the real port when Bind asked for 0).
func (m *Mesh) Addr() net.Addr { return m.pub.Addr() }

// Close stops publishing, disconnects every peer and releases the port. It is
// idempotent.
func (m *Mesh) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	peers := make([]*peer, 0, len(m.peers))
	for _, p := range m.peers {
		peers = append(peers, p)
	}
	m.mu.Unlock()
	m.r.ObserveReplicas(nil)
	m.cancel()
	for _, p := range peers {
		p.cancel()
		<-p.done
	}
	<-m.pubDone
	return m.pub.Close()
}

// BookingChanged queues a booking event for the peers (selection.ReplicaObserver).
// It never blocks: a full queue drops the event.
func (m *Mesh) BookingChanged(ev selection.BookingEvent) {
	select {
	case m.bookings <- ev:
	default:
		if m.c.bookingsDropped.Add(1)&(1<<10-1) == 1 {
			m.log.Warn("replica sync outbound queue full; dropping booking events", "dropped", m.c.bookingsDropped.Load())
		}
	}
}

// SessionBound queues a session binding for the peers.
func (m *Mesh) SessionBound(b selection.SessionBinding) {
	if !m.opts.Affinity {
		return
	}
	select {
	case m.bindings <- b:
	default:
		m.c.bindingsDropped.Add(1)
	}
}

// publish encodes queued events onto the PUB socket until the mesh stops.
func (m *Mesh) publish() {
	defer close(m.pubDone)
	topicBooking, topicBinding := []byte(TopicSlotTracker), []byte(TopicSessionAffinity)
	var seq uint64
	for {
		var topic, payload []byte
		select {
		case <-m.ctx.Done():
			return
		case ev := <-m.bookings:
			topic, payload = topicBooking, AppendBooking(nil, &ev)
			m.c.bookingsPublished.Add(1)
		case b := <-m.bindings:
			topic, payload = topicBinding, AppendBinding(nil, &b)
			m.c.bindingsPublished.Add(1)
		}
		msg := zmq4.NewMsgFrom(topic, payload)
		if m.auth != nil {
			// The socket queues the message: each needs its own frame.
			seq++
			msg.Frames = append(msg.Frames, m.auth.seal(make([]byte, 0, authFrameLen), seq, topic, payload))
		}
		if err := m.pub.Send(msg); err != nil {
			m.c.sendErrors.Add(1)
			if m.ctx.Err() == nil {
				m.log.Warn("replica publish failed", "err", err)
			}
		}
	}
}

// Register connects to a peer (POST /replica_sync/register_peer); created is
// false when it was already connected. The connection is made in the
// background: an unreachable peer is retried with backoff, as a ZMQ connect is.
func (m *Mesh) Register(endpoint string) (bool, error) {
	if err := catalog.ValidateZMQEndpoint(endpoint); err != nil {
		return false, &selection.Error{Kind: selection.KindBadRequest, Message: err.Error()}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false, &selection.Error{Kind: selection.KindUnavailable, Message: "replica peer manager is unavailable"}
	}
	if _, ok := m.peers[endpoint]; ok {
		return false, nil
	}
	m.startPeer(endpoint)
	m.log.Info("replica peer registered", "endpoint", endpoint)
	return true, nil
}

// Deregister disconnects a peer (POST /replica_sync/deregister_peer).
func (m *Mesh) Deregister(endpoint string) error {
	if err := catalog.ValidateZMQEndpoint(endpoint); err != nil {
		return &selection.Error{Kind: selection.KindBadRequest, Message: err.Error()}
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return &selection.Error{Kind: selection.KindUnavailable, Message: "replica peer manager is unavailable"}
	}
	p, ok := m.peers[endpoint]
	delete(m.peers, endpoint)
	m.mu.Unlock()
	if !ok {
		// Dynamo's text for POST /replica_sync/deregister_peer's 404.
		return &selection.Error{Kind: selection.KindNotFound, Message: "peer not found"}
	}
	p.cancel()
	<-p.done
	m.log.Info("replica peer deregistered", "endpoint", endpoint)
	return nil
}

// Peers lists the peer endpoints, sorted (GET /replica_sync/peers). Dynamic
// membership is in memory only: a restart keeps --replica-sync-peers alone.
func (m *Mesh) Peers() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.peers))
	for ep := range m.peers {
		out = append(out, ep)
	}
	slices.Sort(out)
	return out
}

// Stats snapshots the counters and the peers' states.
func (m *Mesh) Stats() Stats {
	st := Stats{
		BookingsPublished: m.c.bookingsPublished.Load(), BookingsDropped: m.c.bookingsDropped.Load(),
		BindingsPublished: m.c.bindingsPublished.Load(), BindingsDropped: m.c.bindingsDropped.Load(),
		SendErrors: m.c.sendErrors.Load(), Received: m.c.received.Load(), Malformed: m.c.malformed.Load(),
		Bookings: map[string]uint64{}, Bindings: map[string]uint64{}, Rejected: map[string]uint64{},
	}
	for r := rejectUnauthenticated; r < numRejectReasons; r++ {
		if n := m.c.rejected[r].Load(); n > 0 {
			st.Rejected[r.String()] = n
		}
	}
	for _, o := range selection.RemoteOutcomes {
		if n := m.c.bookingOutcomes[o].Load(); n > 0 {
			st.Bookings[o.String()] = n
		}
		if n := m.c.bindingOutcomes[o].Load(); n > 0 {
			st.Bindings[o.String()] = n
		}
	}
	m.mu.Lock()
	for _, p := range m.peers {
		st.Peers = p.appendStatus(st.Peers)
	}
	m.mu.Unlock()
	slices.SortFunc(st.Peers, func(a, b PeerStatus) int {
		return cmp.Or(cmp.Compare(a.Peer, b.Peer), cmp.Compare(a.Endpoint, b.Endpoint))
	})
	return st
}

// handle decodes one message and applies it to the local service. With a
// key, the message is authenticated first and nothing of it is decoded unless
// it passes.
func (m *Mesh) handle(from string, frames [][]byte) {
	m.c.received.Add(1)
	if m.auth != nil {
		if r := m.auth.open(frames); r != accepted {
			m.reject(from, r)
			return
		}
		frames = frames[:2]
	}
	if len(frames) != 2 {
		m.c.malformed.Add(1)
		m.log.Debug("dropping malformed replica message", "peer", from, "frames", len(frames))
		return
	}
	switch string(frames[0]) {
	case TopicSlotTracker:
		ev, err := DecodeBooking(frames[1])
		if err != nil {
			m.c.malformed.Add(1)
			m.log.Debug("dropping malformed replica payload", "peer", from, "err", err)
			return
		}
		out := m.r.ApplyRemoteBooking(ev)
		m.c.count(&m.c.bookingOutcomes, out)
		if out != selection.RemoteApplied && out != selection.RemoteOwn {
			m.log.Debug("dropped replica booking event", "peer", from, "outcome", out.String(), "kind", ev.Kind.String(),
				"request_id", ev.RequestID, "model_name", ev.Partition.Model, "routing_group", ev.Partition.RoutingGroup,
				"worker_id", ev.Worker.WorkerID, "dp_rank", ev.Worker.DPRank, "block_size", ev.BlockSize)
		}
	case TopicSessionAffinity:
		if !m.opts.Affinity {
			return
		}
		b, err := DecodeBinding(frames[1])
		if err != nil {
			m.c.malformed.Add(1)
			m.log.Debug("dropping malformed session affinity payload", "peer", from, "err", err)
			return
		}
		out, table := m.r.ApplyRemoteBinding(b)
		m.c.count(&m.c.bindingOutcomes, out)
		if out != selection.RemoteApplied && out != selection.RemoteOwn {
			m.log.Debug("dropped replica session binding", "peer", from, "outcome", out.String(), "table", table.String(),
				"session_id", b.SessionID, "model_name", b.Partition.Model, "routing_group", b.Partition.RoutingGroup,
				"worker_id", b.WorkerID)
		}
	default:
		m.c.malformed.Add(1)
		m.log.Debug("dropping replica message with unexpected topic", "peer", from)
	}
}

// reject counts a message the authentication dropped, and warns at most once
// per reason every rejectLogEvery.
func (m *Mesh) reject(from string, r rejectReason) {
	n := m.c.rejected[r].Add(1)
	if !m.rejectLog[r].allow(time.Now(), rejectLogEvery) {
		return
	}
	var msg string
	switch r {
	case rejectUnauthenticated:
		msg = "dropping unauthenticated replica messages: no or invalid HMAC tag (is the peer running without the replica sync key, or with another one? every replica must share it)"
	case rejectReplayed:
		msg = "dropping replayed replica messages: a sequence already accepted from the same sender (a replay, or a second subscription to the same peer)"
	default:
		msg = "dropping replica messages with an unreadable authentication frame"
	}
	m.log.Warn(msg, "peer", from, "reason", r.String(), "rejected_total", n, "next_report_in", rejectLogEvery.String())
}

// maxSubscriberFrame caps what a peer that dials the publisher may send in one
// frame: subscribers only send subscriptions, a topic of a few bytes each.
const maxSubscriberFrame = 64 << 10

// listen binds the publisher. Peers dial it, so a tcp:// endpoint is bound
// through zmqguard: without it zmq4 would allocate whatever frame size a peer
// announces, and a truncated handshake would crash the process.
func (m *Mesh) listen(ep string) error {
	if !strings.HasPrefix(ep, "tcp://") {
		return m.pub.Listen(ep)
	}
	return zmqguard.Listen(m.pub, ep, maxSubscriberFrame, func(reason string) {
		m.log.Warn("replica sync: dropped a peer connection that broke the wire protocol", "reason", reason)
	}, zmqguard.WithMaxFrames(4))
}
