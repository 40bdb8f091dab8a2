// Package kvlisten consumes inference engines' KV events over ZMQ: one SUB
// socket per attached worker rank, or collector sockets that engines dial
// (collector.go), a sequence cursor per rank, gap recovery through the
// engine's ROUTER replay endpoint, and application of the decoded batches to
// the partition's index by a fixed set of writer lanes.
//
// The engine side is vLLM's ZmqEventPublisher (vllm/distributed/kv_events.py):
// each data-parallel rank publishes [topic, seq (8 bytes big-endian), msgpack
// batch] with seq counting from 0, and may serve replays of its recent batches
// on a ROUTER socket (replay.go describes the exchange). The consumer side
// follows Dynamo's standalone indexer
// (lib/kv-router/src/services/indexer/listener.rs in ai-dynamo/dynamo, commit
// 0c496f29): a watermark per rank, stale batches skipped, missed ones
// replayed, and a replay that comes back short logged with its reason and not
// retried.
//
// A rank's goroutine (rank.go) owns the socket and the sequence cursor
// (cursor.go, with no I/O); it hands every accepted batch, live or replayed,
// to the one writer lane the rank was given when it was attached. A lane
// decodes and applies batches in the order it received them, so the events of
// one (worker, rank) are applied in sequence order while up to Options.Lanes
// ranks are decoded and applied in parallel (Dynamo's --threads /
// DYN_ROUTER_EVENT_THREADS).
package kvlisten

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/kvselect/kvselect/engines/kvevents"
	"github.com/kvselect/kvselect/internal/zmqguard"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/index"
)

// Defaults for Options.
const (
	DefaultReconnectMin  = 100 * time.Millisecond
	DefaultReconnectMax  = 5 * time.Second
	DefaultReplayTimeout = 2 * time.Second
	DefaultDialTimeout   = 2 * time.Second
	DefaultLaneQueue     = 1024
	// DefaultMaxFrameBytes is far above any batch an engine sends: vLLM
	// flushes its events every engine step.
	DefaultMaxFrameBytes = 64 << 20
	// MaxLanes caps Options.Lanes: Dynamo accepts any u32 thread count, but
	// past a few hundred lanes nothing runs in parallel any more and each lane
	// costs a goroutine and a queue.
	MaxLanes = 256
)

// Incomplete-replay reasons, recorded in RankStatus.LastIncompleteReason.
// The first four classify a replay answer that did not cover the requested
// range (see replayRange) and are the reasons Dynamo's listener logs.
const (
	ReasonEmpty                 = "empty"                   // nothing in range came back
	ReasonStartedAfterRequested = "started_after_requested" // the ring had already dropped the start
	ReasonNonContiguous         = "non_contiguous"          // batches missing inside the range
	ReasonEndedBeforeTarget     = "ended_before_target"     // the answer stopped short of the live batch
	// ReasonFailed: the replay endpoint could not be dialed or written to.
	ReasonFailed = "replay_failed"
	// ReasonNoReplayEndpoint: a gap on a rank registered without replay_endpoint.
	ReasonNoReplayEndpoint = "no_replay_endpoint"
)

// Options configures Listeners. Zero values take the defaults.
type Options struct {
	Logger       *slog.Logger
	ReconnectMin time.Duration // first reconnect delay (100 ms)
	ReconnectMax time.Duration // reconnect delay cap (5 s)
	// ReplayTimeout is the idle read deadline of a replay: the replay is cut
	// (and recorded as incomplete) when no reply arrives for this long (2 s).
	ReplayTimeout time.Duration
	// DialTimeout bounds one TCP connect attempt (2 s).
	DialTimeout time.Duration
	// Lanes is the number of index writer goroutines (1, at most MaxLanes).
	// Ranks are spread over them round-robin as they attach.
	Lanes int
	// LaneQueue is how many batches may wait for each lane (1024) before the
	// ranks feeding it stop reading their sockets, which then buffer in ZMQ.
	LaneQueue int
	// MaxFrameBytes caps one ZMTP frame a peer may send, to a collector socket
	// (Bind) or on a connection a listener dialed: a larger one disconnects
	// the peer before it is read (64 MiB).
	MaxFrameBytes int64
}

// RankStatus is the observable state of one rank's listener.
type RankStatus struct {
	// Synced reports whether the watermark is set; LastSeq is meaningful only then.
	Synced  bool
	LastSeq uint64 // last accepted sequence number (the watermark); Applied counts what the lane has applied
	Applied uint64 // batches decoded and applied (live and replayed)
	Blocks  uint64 // block operations applied (stored + removed blocks)
	Failed  uint64 // events the index rejected (ApplyBatch failures)
	// DecodeErrors counts malformed batches and messages; they are counted and
	// dropped. A malformed message (bad frames) does not advance the watermark; a
	// batch with a good sequence number but a payload that does not decode does,
	// since replaying it would return the same bytes.
	DecodeErrors uint64
	Lost         uint64 // batches known lost: no replay endpoint or incomplete replay
	Gaps         uint64 // live sequence gaps detected (not counting the initial catch-up)
	// Stale counts live batches at or below the watermark, skipped: duplicates,
	// batches overtaken by later ones, and the first batches of a publisher
	// that restarted with a fresh sequence until the restart is recognized.
	Stale uint64
	// Restarts counts publisher restarts recognized (a new subscriber
	// session, or three consecutive batches, below the watermark): each
	// dropped the rank's blocks and caught up on the new stream from its start.
	Restarts uint64
	Replays  uint64 // replay requests made
	Replayed uint64 // batches applied from replays (included in Applied)
	// IncompleteReplays counts replays that did not return the whole requested
	// range; LastIncompleteReason is the latest reason (Reason* constants).
	IncompleteReplays    uint64
	LastIncompleteReason string
	Connected            bool   // the SUB socket is connected and subscribed; a collector-fed rank is while attached
	Reconnects           uint64 // SUB sessions that ended in an error
	LastError            string // the latest connection error, if any
}

type rankKey struct {
	p index.Partition
	w index.WorkerKey
}

// Listeners implements selection.Listeners with one goroutine per rank.
type Listeners struct {
	ctx    context.Context
	cancel context.CancelFunc
	opts   Options
	zlog   *log.Logger

	lanes    []chan job
	laneBufs []laneBuffers // by lane
	lanesWG  sync.WaitGroup
	nextLane int // guarded by mu
	// laneMu orders barrier sends against Close closing the lanes.
	laneMu      sync.RWMutex
	lanesClosed bool

	mu         sync.Mutex
	closed     bool
	ranks      map[rankKey]*rank
	collecting bool // a collector socket is bound (guarded by mu)
	guardOnce  sync.Once
	guarded    string // the zmqguard scheme tcp endpoints are dialed through (set once by guardOnce); "" = plain tcp
	coll       collector
	wg         sync.WaitGroup
}

// laneBuffers are what the ranks of one writer lane share, as the lane
// decodes and applies their batches one at a time: the decoders' scratch
// and the decoded events. One set per lane stays in the CPU caches; one per
// rank was cold again by the next batch of the rank once a thousand ranks
// took turns.
type laneBuffers struct {
	scratch kvevents.Scratch
	evs     []index.Event
}

// job is one unit of a writer lane: a batch of a rank to decode and apply, or
// a barrier to close once everything queued before it is done.
type job struct {
	r        *rank
	seq      uint64
	payload  []byte
	replayed bool
	purge    bool // drop every block of the rank (its publisher restarted)
	barrier  chan struct{}
}

var _ selection.Listeners = (*Listeners)(nil)

// ErrClosed is returned by Attach after Close or after the context ended.
var ErrClosed = errors.New("kvlisten: listeners closed")

// New returns a Listeners whose goroutines stop when ctx ends or Close is called.
func New(ctx context.Context, opts Options) *Listeners {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.ReconnectMin <= 0 {
		opts.ReconnectMin = DefaultReconnectMin
	}
	if opts.ReconnectMax <= 0 {
		opts.ReconnectMax = DefaultReconnectMax
	}
	opts.ReconnectMax = max(opts.ReconnectMax, opts.ReconnectMin)
	if opts.ReplayTimeout <= 0 {
		opts.ReplayTimeout = DefaultReplayTimeout
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = DefaultDialTimeout
	}
	opts.Lanes = min(max(opts.Lanes, 1), MaxLanes)
	if opts.LaneQueue <= 0 {
		opts.LaneQueue = DefaultLaneQueue
	}
	if opts.MaxFrameBytes <= 0 {
		opts.MaxFrameBytes = DefaultMaxFrameBytes
	}
	ctx, cancel := context.WithCancel(ctx)
	l := &Listeners{
		ctx:    ctx,
		cancel: cancel,
		opts:   opts,
		zlog:   log.New(io.Discard, "", 0),
		ranks:  make(map[rankKey]*rank),
		lanes:  make([]chan job, opts.Lanes),
	}
	l.laneBufs = make([]laneBuffers, len(l.lanes))
	l.coll.routes = make(map[string]*route)
	for i := range l.lanes {
		l.lanes[i] = make(chan job, opts.LaneQueue)
		l.lanesWG.Add(1)
		go l.write(l.lanes[i])
	}
	return l
}

// write is one writer lane: it applies the batches of the ranks assigned to it
// in arrival order. Batches of a rank that has been stopped are skipped: its
// blocks are about to be purged or replaced.
func (l *Listeners) write(lane chan job) {
	defer l.lanesWG.Done()
	for j := range lane {
		switch {
		case j.barrier != nil:
			close(j.barrier)
		case j.r.ctx.Err() != nil:
		case j.purge:
			j.r.a.Index.RemoveRank(j.r.a.Worker)
		default:
			j.r.apply(j.seq, j.payload, j.replayed)
		}
	}
}

// apply decodes one batch and applies it to the index. It runs on the rank's
// writer lane.
func (r *rank) apply(s uint64, payload []byte, replayed bool) {
	evs, _, err := r.dec.Decode(payload, r.buf.evs[:0])
	if err != nil {
		r.update(func(st *RankStatus) { st.DecodeErrors++ })
		r.log.Warn("dropping undecodable kv events batch", "seq", s, "err", err)
		return
	}
	var blocks uint64
	for i := range evs {
		blocks += uint64(len(evs[i].Blocks) + len(evs[i].Hashes))
	}
	failed, first := r.a.Index.ApplyBatch(evs)
	if r.a.Applied != nil {
		r.a.Applied(evs)
	}
	// The events point into the decoder's buffers; keep only the slice
	// capacity, and not the decoder's buffers past a long prompt's batch.
	clear(evs)
	r.buf.evs = evs[:0]
	r.dec.Trim()
	if failed > 0 {
		r.log.Debug("index rejected kv events", "seq", s, "failed", failed, "first", first)
	}
	r.update(func(st *RankStatus) {
		st.Applied++
		st.Blocks += blocks
		st.Failed += uint64(failed)
		if replayed {
			st.Replayed++
		}
	})
}

// Attach starts consuming one rank's KV events with a fresh watermark. Attaching
// a rank that is already attached replaces its listener.
func (l *Listeners) Attach(a selection.RankAttachment) error {
	if a.Index == nil {
		return errors.New("kvlisten: attachment without index")
	}
	k := rankKey{a.Partition, a.Worker}
	l.mu.Lock()
	defer l.mu.Unlock()
	buf := &l.laneBufs[l.nextLane]
	dec, err := kvevents.NewDecoder(kvevents.Config{
		WorkerID:  a.Worker.WorkerID,
		DPRank:    a.Worker.DPRank,
		BlockSize: int(a.BlockSize),
		Eagle:     a.Eagle,
		Scratch:   &buf.scratch,
	})
	if err != nil {
		return fmt.Errorf("kvlisten: %w", err)
	}
	if l.closed || l.ctx.Err() != nil {
		return ErrClosed
	}
	if a.Endpoints.KVEvents == "" && !l.collecting {
		return errNoCollector
	}
	if old := l.ranks[k]; old != nil {
		delete(l.ranks, k)
		old.stop()
	}
	ctx, cancel := context.WithCancel(l.ctx)
	r := &rank{
		l:      l,
		a:      a,
		ctx:    ctx,
		cancel: cancel,
		done:   make(chan struct{}),
		lane:   l.lanes[l.nextLane],
		dec:    dec,
		buf:    buf,
		log: l.opts.Logger.With("worker_id", a.Worker.WorkerID, "dp_rank", a.Worker.DPRank,
			"endpoint", cmp.Or(a.Endpoints.KVEvents, "collector")),
	}
	if a.Endpoints.KVEvents == "" {
		r.inbox = make(chan liveMsg, l.opts.LaneQueue)
	}
	clear(l.coll.routes)
	l.nextLane = (l.nextLane + 1) % len(l.lanes)
	l.ranks[k] = r
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		defer close(r.done)
		r.run()
	}()
	return nil
}

// Detach stops the rank's listener and waits for it to end, including the
// batches it had queued, so that no event of the rank reaches the index after
// Detach returns.
func (l *Listeners) Detach(p index.Partition, w index.WorkerKey) {
	k := rankKey{p, w}
	l.mu.Lock()
	r := l.ranks[k]
	delete(l.ranks, k)
	clear(l.coll.routes)
	l.mu.Unlock()
	if r != nil {
		r.stop()
	}
}

// Status returns the rank's listener state, if the rank is attached.
func (l *Listeners) Status(p index.Partition, w index.WorkerKey) (RankStatus, bool) {
	l.mu.Lock()
	r := l.ranks[rankKey{p, w}]
	l.mu.Unlock()
	if r == nil {
		return RankStatus{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.st, true
}

// Close stops every listener and writer lane and waits for them. It is
// idempotent.
func (l *Listeners) Close() {
	l.mu.Lock()
	l.closed = true
	l.ranks = make(map[rankKey]*rank)
	l.mu.Unlock()
	l.cancel()
	l.wg.Wait()
	l.laneMu.Lock()
	if !l.lanesClosed {
		l.lanesClosed = true
		for _, lane := range l.lanes {
			close(lane)
		}
	}
	l.laneMu.Unlock()
	l.lanesWG.Wait()
}

// dialable is the address a socket dials to reach ep: tcp endpoints go
// through a guarded scheme, registered at the first dial. Engines' sockets
// are read through the same guard as the collector's: a broken or hostile
// publisher must not make zmq4 allocate what it announces.
func (l *Listeners) dialable(ep string) string {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return ep
	}
	l.guardOnce.Do(func() {
		scheme, err := zmqguard.Dialer(l.opts.MaxFrameBytes, func(reason string) {
			l.opts.Logger.Warn("dropped a KV events connection that broke the wire protocol", "reason", reason)
		}, zmqguard.WithMaxFrames(maxCollectorFrames))
		if err != nil {
			l.opts.Logger.Warn("KV events connections are not guarded", "err", err)
			return
		}
		l.guarded = scheme
	})
	if l.guarded == "" {
		return ep
	}
	return l.guarded + "://" + rest
}
