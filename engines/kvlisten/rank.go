package kvlisten

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvselect/kvselect/engines/kvevents"
	"github.com/kvselect/kvselect/internal/zmqdial"
	"github.com/kvselect/kvselect/selection"
)

// rank is one rank's listener. Everything but st is owned by its goroutine.
type rank struct {
	l      *Listeners
	a      selection.RankAttachment
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	log    *slog.Logger
	lane   chan job
	// inbox carries the collector's messages for a rank attached without a
	// KV events endpoint; nil for a subscribed rank.
	inbox chan liveMsg

	// Owned by the rank goroutine.
	cur cursor
	// newSession is set when a subscriber session begins and cleared by its
	// first batch.
	newSession bool
	// caughtUpTo is one past the last batch a collector-fed rank's catch-up
	// replay applied (0: none): live copies of those batches, queued
	// meanwhile, are expected duplicates, not stale batches.
	caughtUpTo uint64

	// Owned by the rank's writer lane.
	dec *kvevents.Decoder
	buf *laneBuffers // shared with the lane's other ranks

	mu sync.Mutex
	st RankStatus
}

// stop cancels the rank, waits for its goroutine and then for its lane to pass
// everything the rank queued. A lane only ends at Close, after every rank.
func (r *rank) stop() {
	r.cancel()
	<-r.done
	l := r.l
	l.laneMu.RLock()
	if l.lanesClosed {
		l.laneMu.RUnlock()
		return // Close drained and ended the lanes
	}
	b := make(chan struct{})
	r.lane <- job{barrier: b} // the lane drains without locks, so this send ends
	l.laneMu.RUnlock()
	<-b
}

func (r *rank) update(fn func(*RankStatus)) {
	r.mu.Lock()
	fn(&r.st)
	r.mu.Unlock()
}

// run keeps a SUB session up, reconnecting with capped exponential backoff.
// The cursor survives reconnections: a publisher that comes back at the same
// address continues its sequence, and what it sent meanwhile is a gap.
func (r *rank) run() {
	if r.inbox != nil {
		r.inboxed()
		return
	}
	zmqdial.Redial(r.ctx, r.l.opts.ReconnectMin, r.l.opts.ReconnectMax,
		func() (bool, error) {
			received, err := r.session()
			r.update(func(s *RankStatus) { s.Connected = false })
			return received, err
		},
		func(err error, wait time.Duration) {
			r.update(func(s *RankStatus) {
				s.Reconnects++
				s.LastError = err.Error()
			})
			r.log.Warn("kv events subscriber disconnected; reconnecting", "err", err, "retry_in", wait)
		})
}

// session dials the publisher and consumes messages until an error. It reports
// whether any message arrived.
func (r *rank) session() (received bool, err error) {
	sub := zmq4.NewSub(r.ctx,
		zmq4.WithLogger(r.l.zlog),
		zmq4.WithDialerMaxRetries(0),
		zmq4.WithDialerTimeout(r.l.opts.DialTimeout))
	defer sub.Close()
	dctx, cancel := context.WithTimeout(r.ctx, r.l.opts.DialTimeout)
	err = zmqdial.Dial(dctx, sub, r.l.dialable(r.a.Endpoints.KVEvents))
	cancel()
	if err != nil {
		return false, err
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		return false, err
	}
	r.update(func(s *RankStatus) { s.Connected = true })
	r.newSession = true
	for {
		msg, err := sub.Recv()
		if err != nil {
			return received, err
		}
		received = true
		r.live(msg.Frames)
	}
}

// live runs one live message through the sequence cursor: a stale batch is
// skipped, a batch after a gap (or the first one, when the publisher was
// already past seq 0) waits for the replay of what was missed, and then it is
// accepted. A missing batch that replay cannot bring back is counted as lost;
// the live batch is applied anyway, as Dynamo's listener does, since the
// stream has no other way to recover.
func (r *rank) live(frames [][]byte) {
	_, s, payload, err := kvevents.ParseMessage(frames)
	if err != nil {
		r.update(func(st *RankStatus) { st.DecodeErrors++ })
		r.log.Warn("dropping malformed kv events message", "err", err)
		return
	}
	r.handle(s, payload)
}

// handle runs one live batch, from the rank's socket or the collector, through
// the sequence cursor.
func (r *rank) handle(s uint64, payload []byte) {
	firstOfSession := r.newSession
	r.newSession = false
	switch o := r.cur.observe(s); o.verdict {
	case verdictStale:
		if s < r.caughtUpTo {
			return
		}
		last, _ := r.cur.watermark()
		if r.cur.restarted(s, firstOfSession) {
			r.restart(s, last)
			r.handle(s, payload) // from a fresh cursor: catch up from 0, then apply
			return
		}
		r.update(func(st *RankStatus) { st.Stale++ })
		r.log.Debug("skipping stale kv events batch", "seq", s, "last", last)
		return
	case verdictReplay:
		if o.gap {
			last, _ := r.cur.watermark()
			r.update(func(st *RankStatus) { st.Gaps++ })
			r.log.Info("kv events sequence gap", "last", last, "seq", s)
		}
		r.replay(o.from, o.to)
	}
	r.accept(s, payload, false)
}

// restart starts the rank over after its publisher restarted with a fresh
// sequence: an engine that restarts has an empty cache, so the blocks its
// earlier incarnation published are dropped (on the writer lane, after the
// batches queued before), and the cursor forgets the old watermark, so that
// the new stream is caught up from its start like a first subscription.
// Without this a crashed and restarted engine at the same address would have
// every batch skipped as stale and its old blocks kept for good.
func (r *rank) restart(seq, last uint64) {
	r.cur = cursor{}
	r.caughtUpTo = 0
	r.update(func(st *RankStatus) {
		st.Restarts++
		st.Synced = false
	})
	r.log.Warn("kv events publisher restarted with a fresh sequence: dropping the rank's blocks and catching up on the new stream",
		"last", last, "seq", seq)
	select {
	case r.lane <- job{r: r, purge: true}:
	case <-r.ctx.Done():
	}
}

// accept advances the watermark to s and queues the batch on the rank's lane.
func (r *rank) accept(s uint64, payload []byte, replayed bool) {
	r.cur.advance(s)
	if !replayed && s >= r.caughtUpTo {
		// The live stream has passed the catch-up: no copy of a caught-up
		// batch can follow, and a batch below it is stale again.
		r.caughtUpTo = 0
	}
	r.update(func(st *RankStatus) {
		st.Synced = true
		st.LastSeq = s
	})
	select {
	case r.lane <- job{r: r, seq: s, payload: payload, replayed: replayed}:
	case <-r.ctx.Done():
	}
}

// replay requests [start, target) from the rank's replay endpoint and accepts,
// in order, what the replay range lets through. What is missing is logged and
// recorded; the caller goes on with the live batch either way.
func (r *rank) replay(start, target uint64) {
	rg := newReplayRange(start, target)
	ep := r.a.Endpoints.Replay
	if ep == "" {
		if _, lost, _ := rg.result(); lost > 0 {
			r.update(func(st *RankStatus) {
				st.Lost += lost
				st.LastIncompleteReason = ReasonNoReplayEndpoint
			})
			r.log.Warn(fmt.Sprintf("no replay endpoint: %d batches lost", lost), "from", start, "to", target)
		}
		return
	}
	r.update(func(st *RankStatus) { st.Replays++ })
	requested, err := r.l.requestReplay(r.ctx, ep, start, func(s uint64, payload []byte) bool {
		if rg.take(s) {
			r.accept(s, payload, true)
		}
		return !rg.past(s)
	})
	got, lost, reason := rg.result()
	if got == 0 && (!requested || err != nil) {
		// No answer ended with the END marker, so nothing shows that the
		// publisher numbers from 1: all of the range is unaccounted for.
		// (result takes an empty but complete answer to [0, 1) as a
		// publisher numbering from 1; a vLLM engine whose batch 0 a new
		// subscriber missed while its replay endpoint was down looks the same
		// without the answer, and its batch 0 is lost.)
		lost = rg.target - rg.start
		if lost > 0 {
			reason = ReasonEmpty
			if !requested {
				reason = ReasonFailed
			}
		}
	}
	if reason == "" {
		return
	}
	r.update(func(st *RankStatus) {
		st.IncompleteReplays++
		st.LastIncompleteReason = reason
		st.Lost += lost
	})
	r.log.Warn("incomplete kv events replay", "reason", reason, "from", start, "to", target,
		"received", got, "lost", lost, "replay_endpoint", ep, "err", err)
}
