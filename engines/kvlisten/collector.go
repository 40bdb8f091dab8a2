package kvlisten

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvselect/kvselect/engines/kvevents"
	"github.com/kvselect/kvselect/internal/zmqguard"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
)

// Collector mode. In llm-d's topology every engine's PUB socket dials one
// collector that binds a SUB socket (vLLM does this whenever its
// kv-events-config endpoint is not a wildcard), and the topic names the
// engine: kv@<pod-ip>:<port>@<model>. Bind opens such a socket; its goroutine
// reads every message, finds the registered ranks its topic and batch rank
// name (route), and hands the message to each rank's inbox. From there a
// collector-fed rank runs exactly as a subscribed one: the same sequence
// cursor, gap replay through its replay endpoint, and writer lane.

// Reasons a collector message reaches no rank, in
// selection.CollectorStatus.Unmatched and
// kvselect_kv_events_collector_messages_total{result}.
const (
	// UnmatchedUnknownTopic: no worker has this kv_events_topic, and the topic is not
	// kv@<host>:<port>@<model> with the host and port of a worker's endpoint.
	UnmatchedUnknownTopic = "unknown_topic"
	// UnmatchedModel: workers have that host and port, but another model_name.
	UnmatchedModel = "model_mismatch"
	// UnmatchedRank: the worker is known, the batch's dp_rank is not one of its ranks.
	UnmatchedRank = "unknown_rank"
	// UnmatchedSubscribed: the worker's ranks have kv_events endpoints of their
	// own and are fed by their subscriptions; the collector's copy is skipped.
	UnmatchedSubscribed = "subscribed"
	// UnmatchedMalformed: not [topic, seq (8 bytes), payload], or a payload
	// whose rank cannot be read when the topic names several ranks.
	UnmatchedMalformed = "malformed"
)

// maxRecentUnmatched bounds selection.CollectorStatus.Recent; maxRoutes bounds the
// topic cache, which a publisher inventing topics must not grow without end.
// maxTopicBytes bounds a topic that is cached or listed: a frame may be
// megabytes long, and a topic longer than this names no worker anyway.
const (
	maxRecentUnmatched = 32
	maxRoutes          = 4096
	maxTopicBytes      = 1024
)

// liveMsg is one collector message for a rank.
type liveMsg struct {
	seq     uint64
	payload []byte
}

// route is what one topic resolves to against the attached ranks.
type route struct {
	byRank map[uint32][]*rank // collector-fed ranks by dp rank
	def    []*rank            // per worker, its lowest rank: batches naming none
	reason string             // why the topic matches nothing, when byRank is empty
}

// collector is the routing state of the bind sockets. Its tables are guarded by
// Listeners.mu; its counters by its own mutex.
type collector struct {
	routes map[string]*route // topic → resolved route; cleared on every attach and detach

	statMu    sync.Mutex
	bound     []string
	received  uint64
	delivered uint64
	unmatched map[string]uint64
	recent    []selection.UnmatchedTopic
	dropped   map[string]uint64 // connections the guard dropped, by reason
}

// rejected counts a connection zmqguard dropped.
func (c *collector) rejected(reason string) {
	c.statMu.Lock()
	defer c.statMu.Unlock()
	if c.dropped == nil {
		c.dropped = make(map[string]uint64)
	}
	c.dropped[reason]++
}

// Bind opens a collector socket: a SUB bound at endpoint (tcp://host:port, port
// 0 picks one), subscribed to every topic. It returns the bound address.
// Ranks attached without a KV events endpoint are fed from every bound socket.
//
// The socket lets the network dial in, so it is bound through zmqguard: a
// peer announcing a frame over Options.MaxFrameBytes, more than a few frames
// in one message, anything that is not ZMTP, or a handshake it does not finish
// is disconnected before zmq4 allocates or blocks on its say-so, and counted
// in CollectorStatus.Rejected by reason.
func (l *Listeners) Bind(endpoint string) (string, error) {
	if !strings.HasPrefix(endpoint, "tcp://") {
		return "", fmt.Errorf("kvlisten: collector %q: only tcp:// endpoints can be bound", endpoint)
	}
	if err := catalog.ValidateZMQEndpoint(endpoint); err != nil {
		return "", fmt.Errorf("kvlisten: collector: %w", err)
	}
	l.mu.Lock()
	if l.closed || l.ctx.Err() != nil {
		l.mu.Unlock()
		return "", ErrClosed
	}
	l.mu.Unlock()
	sub := zmq4.NewSub(l.ctx, zmq4.WithLogger(l.zlog))
	if err := zmqguard.Listen(sub, endpoint, l.opts.MaxFrameBytes, l.coll.rejected,
		zmqguard.WithMaxFrames(maxCollectorFrames)); err != nil {
		sub.Close()
		return "", fmt.Errorf("kvlisten: collector: bind %s: %w", endpoint, err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		sub.Close()
		return "", fmt.Errorf("kvlisten: collector: subscribe: %w", err)
	}
	addr := endpoint
	if a := sub.Addr(); a != nil {
		addr = "tcp://" + a.String()
	}
	c := &l.coll
	c.statMu.Lock()
	c.bound = append(c.bound, addr)
	c.statMu.Unlock()
	l.mu.Lock()
	l.collecting = true
	l.mu.Unlock()
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		defer sub.Close()
		l.collect(sub)
	}()
	l.opts.Logger.Info("kv events collector bound", "endpoint", addr)
	return addr, nil
}

// maxCollectorFrames caps the frames of one collector message: publishers
// send three, and zmq4 holds every frame of a message until its last.
const maxCollectorFrames = 8

// collect reads one bound socket until the listeners close.
func (l *Listeners) collect(sub zmq4.Socket) {
	failures := 0
	for {
		msg, err := sub.Recv()
		if err != nil {
			if l.ctx.Err() != nil {
				return
			}
			// On a bound SUB an error is one peer leaving or being dropped;
			// the others go on. Only a run of failures with nothing between
			// them (which no peer should cause) slows the loop down.
			l.opts.Logger.Debug("kv events collector: a peer's connection ended", "err", err)
			if failures++; failures >= 100 {
				failures = 0
				select {
				case <-time.After(10 * time.Millisecond):
				case <-l.ctx.Done():
					return
				}
			}
			continue
		}
		failures = 0
		if msg.Type == zmq4.CmdMsg {
			continue // a ZMTP command (PING, say), not a publisher's message
		}
		l.collected(msg.Frames)
	}
}

// collected routes one message to the ranks it belongs to.
func (l *Listeners) collected(frames [][]byte) {
	topic, seq, payload, err := kvevents.ParseMessage(frames)
	if err != nil {
		var t []byte
		if len(frames) > 0 {
			t = frames[0]
		}
		l.coll.count(t, UnmatchedMalformed, nil)
		return
	}
	targets, reason, dp := l.route(topic, payload)
	if len(targets) == 0 {
		l.coll.count(topic, reason, dp)
		return
	}
	l.coll.count(topic, "", nil)
	m := liveMsg{seq: seq, payload: payload}
	for _, r := range targets {
		select {
		case r.inbox <- m:
		case <-r.ctx.Done(): // detached meanwhile
		}
	}
}

// route finds the collector-fed ranks a message belongs to: the topic selects
// a worker (cached per topic), the batch's dp_rank one of its ranks. With no
// target, reason says why and dp is the batch's rank when it was read.
func (l *Listeners) route(topic, payload []byte) (targets []*rank, reason string, dp *uint32) {
	if len(topic) > maxTopicBytes {
		return nil, UnmatchedUnknownTopic, nil
	}
	l.mu.Lock()
	rt := l.coll.routes[string(topic)]
	if rt == nil {
		rt = l.resolve(topic)
		if len(l.coll.routes) >= maxRoutes {
			clear(l.coll.routes)
		}
		l.coll.routes[string(topic)] = rt
	}
	l.mu.Unlock()
	if len(rt.byRank) == 0 {
		return nil, rt.reason, nil
	}
	n, present, err := kvevents.BatchRank(payload)
	switch {
	case err != nil:
		if len(rt.def) == 1 && len(rt.byRank) == 1 {
			// One rank only: it takes the batch, and its decoder counts the
			// bad payload while its cursor keeps the sequence straight.
			return rt.def, "", nil
		}
		return nil, UnmatchedMalformed, nil
	case !present:
		return rt.def, "", nil
	}
	if rs := rt.byRank[n]; len(rs) > 0 {
		return rs, "", nil
	}
	return nil, UnmatchedRank, &n
}

// resolve matches a topic against the attached ranks. It runs under l.mu.
// An explicit kv_events_topic wins over llm-d's kv@<host>:<port>@<model>
// convention; a rank with a KV events endpoint of its own is never fed here.
func (l *Listeners) resolve(topic []byte) *route {
	var cands []*rank
	for _, r := range l.ranks {
		if r.a.Endpoints.Topic != "" && r.a.Endpoints.Topic == string(topic) {
			cands = append(cands, r)
		}
	}
	if len(cands) == 0 {
		hp, model, ok := kvevents.ParseTopic(topic)
		if !ok {
			return &route{reason: UnmatchedUnknownTopic}
		}
		norm, ok := catalog.HostPort(string(hp))
		if !ok {
			return &route{reason: UnmatchedUnknownTopic}
		}
		sameAddr := false
		for _, r := range l.ranks {
			if r.a.Endpoints.HostPort != norm || r.a.Endpoints.Topic != "" {
				continue
			}
			sameAddr = true
			if r.a.Partition.Model == string(model) {
				cands = append(cands, r)
			}
		}
		if len(cands) == 0 {
			if sameAddr {
				return &route{reason: UnmatchedModel}
			}
			return &route{reason: UnmatchedUnknownTopic}
		}
	}
	rt := &route{byRank: make(map[uint32][]*rank)}
	lowest := make(map[uint64]*rank)
	for _, r := range cands {
		if r.inbox == nil {
			continue // subscribed
		}
		rt.byRank[r.a.Worker.DPRank] = append(rt.byRank[r.a.Worker.DPRank], r)
		if lo := lowest[r.a.Worker.WorkerID]; lo == nil || r.a.Worker.DPRank < lo.a.Worker.DPRank {
			lowest[r.a.Worker.WorkerID] = r
		}
	}
	if len(rt.byRank) == 0 {
		return &route{reason: UnmatchedSubscribed}
	}
	for _, r := range lowest {
		rt.def = append(rt.def, r)
	}
	return rt
}

// count records one message's outcome: delivered when reason is "".
func (c *collector) count(topic []byte, reason string, dp *uint32) {
	c.statMu.Lock()
	defer c.statMu.Unlock()
	c.received++
	if reason == "" {
		c.delivered++
		return
	}
	if c.unmatched == nil {
		c.unmatched = make(map[string]uint64)
	}
	c.unmatched[reason]++
	if len(topic) > maxTopicBytes {
		topic = topic[:maxTopicBytes]
	}
	now := time.Now()
	for i := range c.recent {
		u := &c.recent[i]
		if u.Topic == string(topic) && u.Reason == reason {
			u.Count++
			u.LastSeen, u.DPRank = now, dp
			// Move it to the front: newest first.
			moved := *u
			copy(c.recent[1:i+1], c.recent[:i])
			c.recent[0] = moved
			return
		}
	}
	u := selection.UnmatchedTopic{Topic: string(topic), Reason: reason, DPRank: dp, Count: 1, LastSeen: now}
	if len(c.recent) < maxRecentUnmatched {
		c.recent = append(c.recent, selection.UnmatchedTopic{})
	}
	copy(c.recent[1:], c.recent[:len(c.recent)-1])
	c.recent[0] = u
}

// CollectorStatus implements selection.EventsCollector: the collector
// sockets' counters; ok is false when no socket is bound.
func (l *Listeners) CollectorStatus() (st selection.CollectorStatus, ok bool) {
	c := &l.coll
	c.statMu.Lock()
	defer c.statMu.Unlock()
	if len(c.bound) == 0 {
		return selection.CollectorStatus{}, false
	}
	st = selection.CollectorStatus{
		Bound:     slices.Clone(c.bound),
		Received:  c.received,
		Delivered: c.delivered,
		Unmatched: make(map[string]uint64, len(c.unmatched)),
		Recent:    slices.Clone(c.recent),
		Rejected:  maps.Clone(c.dropped),
	}
	for k, v := range c.unmatched {
		st.Unmatched[k] = v
	}
	if st.Rejected == nil {
		st.Rejected = map[string]uint64{}
	}
	return st, true
}

// errNoCollector is returned by Attach for a rank without an endpoint when no
// collector socket is bound.
var errNoCollector = errors.New("kvlisten: rank without kv events endpoint and no collector socket bound (--kv-events-bind)")

// inboxed is a collector-fed rank's loop: messages from the collector go
// through the same cursor as a subscription's. It starts with a catch-up.
func (r *rank) inboxed() {
	// Connected means listened for: the collector socket is bound for as long
	// as the rank is attached.
	r.update(func(s *RankStatus) { s.Connected = true })
	r.catchUp()
	for {
		select {
		case m := <-r.inbox:
			r.handle(m.seq, m.payload)
		case <-r.ctx.Done():
			return
		}
	}
}

// catchUp asks the rank's replay endpoint, as soon as the rank is attached,
// for every batch the engine still holds. An engine dialing the collector
// publishes whether or not anyone registered it, and a worker is usually
// registered (by discovery, say) after its engine started: without the
// catch-up, what the engine stored before would stay out of the index until
// its next batch arrived and exposed the gap. Batches the answer passed over
// are counted lost; an engine that cannot be reached is left to the live
// path, which replays on the first batch as in subscribe mode.
func (r *rank) catchUp() {
	ep := r.a.Endpoints.Replay
	if ep == "" {
		return
	}
	r.update(func(st *RankStatus) { st.Replays++ })
	rg := newReplayRange(0, math.MaxUint64)
	requested, err := r.l.requestReplay(r.ctx, ep, 0, func(s uint64, payload []byte) bool {
		if rg.take(s) {
			r.accept(s, payload, true)
			r.caughtUpTo = s + 1
		}
		return true // open-ended: everything the ring holds
	})
	if !requested {
		r.log.Debug("kv events catch-up replay not possible yet", "replay_endpoint", ep, "err", err)
		return
	}
	if lost := rg.missing(); lost > 0 {
		_, _, reason := rg.result()
		r.update(func(st *RankStatus) {
			st.IncompleteReplays++
			st.LastIncompleteReason = reason
			st.Lost += lost
		})
		r.log.Warn("incomplete kv events catch-up replay", "reason", reason, "lost", lost, "replay_endpoint", ep)
	}
}
