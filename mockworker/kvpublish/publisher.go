package kvpublish

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Defaults of vLLM's ZmqEventPublisher (vllm/distributed/kv_events.py).
const (
	DefaultRingSize = 10_000  // buffer_steps
	DefaultHWM      = 100_000 // hwm
)

// endSeq is the sequence frame of the replay END marker: -1 as a signed 8-byte
// big-endian integer (vLLM's END_SEQ).
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// ErrClosed is returned by Publish and PublishRaw after Close.
var ErrClosed = errors.New("kvpublish: publisher closed")

// Options configures a Publisher.
type Options struct {
	// Endpoint is the address the PUB socket binds, e.g. "tcp://127.0.0.1:0"
	// (port 0 picks a free port; Endpoint() tells which) or vLLM's default
	// "tcp://*:5557"; with Connect, the collector it dials.
	Endpoint string
	// Connect dials Endpoint instead of binding it: llm-d's topology, where
	// every engine's PUB socket connects to one collector (vLLM connects when
	// its endpoint has no wildcard). Unlike vLLM the publisher does not guess
	// from the address: kvselect's subscribe mode dials engines, so binding
	// stays the default.
	Connect bool
	// ReplayEndpoint is the address the ROUTER replay socket binds; "" serves
	// no replay, like vLLM without replay_endpoint.
	ReplayEndpoint string
	// Topic is frame 0 of every live message ("" like vLLM's default, or
	// "kv-events" as Dynamo's integrations set it).
	Topic string
	// RingSize is how many encoded batches the replay ring keeps (vLLM's
	// buffer_steps); 0 means DefaultRingSize.
	RingSize int
	// HWM bounds the PUB send queue; a batch sent while the queue is full is
	// dropped, as ZMQ's high-water mark drops (the ring still holds it). 0
	// means DefaultHWM, negative means unbounded.
	HWM int
	// Shape is the event layout inside batches built by Publish (ShapeMap,
	// vLLM's current encoding, by default).
	Shape Shape
	// ReplayTopicFrame makes replay replies carry the topic, 4 frames after the
	// identity ([empty, topic, seq, payload], vLLM after PR #45177) instead of
	// 3 ([empty, seq, payload], earlier vLLM and SGLang).
	ReplayTopicFrame bool
	// DropLive is a test hook: when it returns true for a sequence number the
	// batch is not sent live, but it is still numbered and enters the replay
	// ring, as a batch lost between publisher and subscriber would.
	DropLive func(seq uint64) bool
	// Now stamps the batches built by Publish (time.Now when nil).
	Now func() time.Time
	// Logger receives replay and socket diagnostics (slog.Default when nil).
	Logger *slog.Logger
}

// Stats counts what a Publisher did.
type Stats struct {
	Published         uint64 // batches numbered (live-sent or not)
	LiveDropped       uint64 // batches DropLive kept off the PUB socket
	ReplayRequests    uint64 // well-formed replay requests served
	BadReplayRequests uint64 // malformed replay requests (ignored, as vLLM does)
	Replayed          uint64 // batches sent in replay replies
}

// ringEntry is one published batch: frame holds the 8-byte big-endian sequence
// number followed by the payload, so that one allocation serves both frames.
// Entries are immutable once published: the PUB queue and replay replies send
// them without the publisher's lock.
type ringEntry struct {
	seq   uint64
	frame []byte
}

func (e ringEntry) seqFrame() []byte { return e.frame[:8:8] }
func (e ringEntry) payload() []byte  { return e.frame[8:] }

// Publisher is one engine rank's KV event publisher: a PUB socket plus an
// optional ROUTER replay endpoint backed by a ring of the last batches. It is
// safe for concurrent use; batches are numbered 0, 1, 2… in the order Publish
// and PublishRaw calls take the publisher's lock, and are sent in that order.
type Publisher struct {
	opts     Options
	log      *slog.Logger
	topic    []byte
	endpoint string
	replayEP string

	ctx    context.Context
	cancel context.CancelFunc
	pub    zmq4.Socket
	router zmq4.Socket
	wg     sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	next    uint64
	ring    []ringEntry // circular; ring[head] is the oldest once full
	head    int
	scratch []byte
	stats   Stats
}

// New binds the publisher's sockets. ctx bounds the sockets' lifetime; Close
// releases them earlier.
func New(ctx context.Context, opts Options) (*Publisher, error) {
	if opts.Endpoint == "" {
		return nil, errors.New("kvpublish: Endpoint is required")
	}
	if opts.RingSize < 0 {
		return nil, fmt.Errorf("kvpublish: negative RingSize %d", opts.RingSize)
	}
	if opts.Shape != ShapeMap && opts.Shape != ShapePositional {
		return nil, fmt.Errorf("kvpublish: unknown Shape %d", opts.Shape)
	}
	if opts.RingSize == 0 {
		opts.RingSize = DefaultRingSize
	}
	if opts.HWM == 0 {
		opts.HWM = DefaultHWM
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	lg := opts.Logger
	if lg == nil {
		lg = slog.Default()
	}
	p := &Publisher{
		opts:  opts,
		log:   lg.With("component", "kvpublish"),
		topic: []byte(opts.Topic),
		ring:  make([]ringEntry, 0, min(opts.RingSize, 1024)),
	}
	p.ctx, p.cancel = context.WithCancel(ctx)
	// zmq4 logs through the standard logger; route it to slog at debug level.
	zlog := log.New(io.Discard, "", 0)
	if h := p.log.Handler(); h.Enabled(ctx, slog.LevelDebug) {
		zlog = slog.NewLogLogger(h, slog.LevelDebug)
	}

	p.pub = zmq4.NewPub(p.ctx, zmq4.WithLogger(zlog))
	if opts.HWM > 0 {
		if err := p.pub.SetOption(zmq4.OptionHWM, opts.HWM); err != nil {
			p.shutdown()
			return nil, fmt.Errorf("kvpublish: set PUB high-water mark: %w", err)
		}
	}
	if opts.Connect {
		// zmq4 redials a lost connection; the first dial must succeed.
		if err := p.pub.Dial(opts.Endpoint); err != nil {
			p.shutdown()
			return nil, fmt.Errorf("kvpublish: dial collector %s: %w", opts.Endpoint, err)
		}
		p.endpoint = opts.Endpoint
	} else {
		if err := p.pub.Listen(opts.Endpoint); err != nil {
			p.shutdown()
			return nil, fmt.Errorf("kvpublish: bind PUB %s: %w", opts.Endpoint, err)
		}
		p.endpoint = boundEndpoint(opts.Endpoint, p.pub.Addr())
	}

	if opts.ReplayEndpoint != "" {
		p.router = zmq4.NewRouter(p.ctx, zmq4.WithLogger(zlog))
		if err := p.router.Listen(opts.ReplayEndpoint); err != nil {
			p.shutdown()
			return nil, fmt.Errorf("kvpublish: bind replay ROUTER %s: %w", opts.ReplayEndpoint, err)
		}
		p.replayEP = boundEndpoint(opts.ReplayEndpoint, p.router.Addr())
		p.wg.Add(1)
		go p.serveReplay()
	}
	return p, nil
}

// boundEndpoint is the address a subscriber dials to reach a socket bound on
// ep: the actual port when ep asked for port 0, and loopback when ep bound
// every interface, so that the result is always dialable from this host.
func boundEndpoint(ep string, addr net.Addr) string {
	ta, ok := addr.(*net.TCPAddr)
	if !ok {
		return ep
	}
	host := ta.IP.String()
	if ta.IP == nil || ta.IP.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "tcp://" + net.JoinHostPort(host, fmt.Sprint(ta.Port))
}

// Endpoint is the dialable address of the PUB socket, or the collector it
// dials (Options.Connect).
func (p *Publisher) Endpoint() string { return p.endpoint }

// ReplayEndpoint is the dialable address of the replay ROUTER, "" without one.
func (p *Publisher) ReplayEndpoint() string { return p.replayEP }

// NextSeq is the sequence number the next published batch will get.
func (p *Publisher) NextSeq() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.next
}

// Stats returns the publisher's counters.
func (p *Publisher) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Publish encodes events as one batch (Options.Shape, stamped with the current
// time, dpRank nil = None) and publishes it. It returns the batch's sequence
// number.
func (p *Publisher) Publish(dpRank *int, events ...Event) (seq uint64, err error) {
	ts := p.opts.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, ErrClosed
	}
	// Encode into the reusable scratch buffer, then copy once into the frame
	// the socket and the ring keep: zmq4 sends from a queue after Send returns,
	// so the bytes handed to it must never be reused.
	p.scratch = AppendBatchShape(p.scratch[:0], p.opts.Shape,
		float64(ts.UnixNano())/1e9, events, dpRank)
	return p.publishLocked(p.scratch)
}

// PublishRaw publishes an already encoded payload (copied) under the next
// sequence number, e.g. a malformed batch in a decoder test.
func (p *Publisher) PublishRaw(payload []byte) (seq uint64, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, ErrClosed
	}
	return p.publishLocked(payload)
}

func (p *Publisher) publishLocked(payload []byte) (uint64, error) {
	seq := p.next
	frame := make([]byte, 8+len(payload))
	binary.BigEndian.PutUint64(frame, seq)
	copy(frame[8:], payload)
	e := ringEntry{seq: seq, frame: frame}

	// vLLM appends to the ring after sending; the order does not matter here
	// since replay reads the ring under the same lock.
	if len(p.ring) < p.opts.RingSize {
		p.ring = append(p.ring, e)
	} else {
		p.ring[p.head] = e
		p.head = (p.head + 1) % len(p.ring)
	}
	p.next++
	p.stats.Published++

	if p.opts.DropLive != nil && p.opts.DropLive(seq) {
		p.stats.LiveDropped++
		return seq, nil
	}
	// SendMulti writes the three frames with one writev instead of one write
	// per frame header and body.
	if err := p.pub.SendMulti(zmq4.NewMsgFrom(p.topic, e.seqFrame(), e.payload())); err != nil {
		return seq, fmt.Errorf("kvpublish: send seq %d: %w", seq, err)
	}
	return seq, nil
}

// replaySince returns the ring entries with seq >= start, oldest first. If the
// ring has overflowed past start the reply simply begins at the oldest entry
// kept, as vLLM's does: the caller sees the first seq > start and knows.
func (p *Publisher) replaySince(start uint64) []ringEntry {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []ringEntry
	n := len(p.ring)
	for i := range n {
		e := p.ring[(p.head+i)%n]
		if e.seq >= start {
			out = append(out, e)
		}
	}
	return out
}

// parseReplayRequest validates a request as the ROUTER receives it:
// [identity, empty delimiter, start seq as 8 bytes big-endian], which is what a
// DEALER's two frames [empty, start seq] become; vLLM's _service_replay ignores
// any other shape.
func parseReplayRequest(frames [][]byte) (id []byte, start uint64, err error) {
	if len(frames) != 3 {
		return nil, 0, fmt.Errorf("%d frames, want 3 (identity, empty, start seq)", len(frames))
	}
	if len(frames[1]) != 0 {
		return nil, 0, fmt.Errorf("delimiter frame is %d bytes, want empty", len(frames[1]))
	}
	if len(frames[2]) != 8 {
		return nil, 0, fmt.Errorf("start seq frame is %d bytes, want 8", len(frames[2]))
	}
	return frames[0], binary.BigEndian.Uint64(frames[2]), nil
}

// serveReplay answers replay requests one at a time until Close. Like vLLM's
// publisher thread, a malformed request is logged and ignored; a well-formed
// one gets every buffered batch from its start on and then the END marker.
// Unlike vLLM, live publishing does not wait while a replay is sent: replies
// go out from a snapshot of the ring taken when the request arrived.
func (p *Publisher) serveReplay() {
	defer p.wg.Done()
	for {
		msg, err := p.router.Recv()
		if err != nil {
			if p.ctx.Err() != nil {
				return
			}
			p.log.Debug("replay receive failed", "err", err)
			// A socket error other than Close: don't spin on it.
			select {
			case <-p.ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		id, start, err := parseReplayRequest(msg.Frames)
		if err != nil {
			p.mu.Lock()
			p.stats.BadReplayRequests++
			p.mu.Unlock()
			p.log.Warn("invalid kv events replay request", "err", err)
			continue
		}
		entries := p.replaySince(start)
		p.mu.Lock()
		p.stats.ReplayRequests++
		p.mu.Unlock()
		sent := 0
		for _, e := range entries {
			if err := p.router.Send(p.replyMsg(id, e.seqFrame(), e.payload())); err != nil {
				p.log.Warn("kv events replay cut short", "start", start, "sent", sent, "err", err)
				break
			}
			sent++
		}
		p.mu.Lock()
		p.stats.Replayed += uint64(sent)
		p.mu.Unlock()
		if err := p.router.Send(p.replyMsg(id, endSeq, nil)); err != nil && p.ctx.Err() == nil {
			p.log.Warn("kv events replay end marker not sent", "start", start, "err", err)
		}
		p.log.Debug("served kv events replay", "start", start, "batches", sent)
	}
}

func (p *Publisher) replyMsg(id, seq, payload []byte) zmq4.Msg {
	if p.opts.ReplayTopicFrame {
		return zmq4.NewMsgFrom(id, []byte{}, p.topic, seq, payload)
	}
	return zmq4.NewMsgFrom(id, []byte{}, seq, payload)
}

// Close stops the replay server and closes both sockets. Batches still queued
// for sending may be lost, as with vLLM's linger 0. It is safe to call twice.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	return p.shutdown()
}

func (p *Publisher) shutdown() error {
	p.cancel()
	var errs []error
	if p.pub != nil {
		if err := p.pub.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close PUB: %w", err))
		}
	}
	if p.router != nil {
		if err := p.router.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close replay ROUTER: %w", err))
		}
	}
	p.wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("kvpublish: %w", err)
	}
	return nil
}
