package kvlisten

import (
	"context"
	"encoding/binary"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvselect/kvselect/internal/zmqdial"
)

// The replay client. An engine started with a replay endpoint (vLLM's
// ZmqEventPublisher replay_endpoint, vllm/distributed/kv_events.py) binds a
// ROUTER socket there and keeps its latest encoded batches in a ring. A DEALER
// asks with [empty, start (8 bytes big-endian)]; the engine answers with one
// message per buffered batch whose sequence number is start or later, oldest
// first, with the same payload bytes as the live message, then an END marker
// whose sequence number is -1 and whose payload is empty. The replies carry
// the publisher's topic as an extra frame in newer vLLM versions, so both
// [empty, seq, payload] and [empty, topic, seq, payload] are read. Nothing in
// the answer says batches older than the ring were lost: the caller compares
// what came back with what it asked for (replayRange).

// requestReplay asks the replay endpoint ep for every batch from start on and
// hands each reply to batch in arrival order, until batch wants no more, the
// END marker, a reply it cannot read, ReplayTimeout without a reply, or the
// end of ctx. requested reports whether the request went out; err is what
// ended the exchange, nil when batch, a marker or an unreadable reply did.
//
// The engine sends its whole ring from start on, whatever the caller needs:
// a listener that missed one batch of an engine whose ring holds 10,000
// (vLLM's default) would read 10,000 replies for it, and one running behind
// would pay that for every gap. Closing the socket once the range is in
// leaves the rest unread; the engine's ROUTER drops what it can no longer
// deliver.
func (l *Listeners) requestReplay(ctx context.Context, ep string, start uint64, batch func(seq uint64, payload []byte) (more bool)) (requested bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// zmq4 applies no deadline to the handshake or to a Recv on a live
	// connection: the timer cancels the exchange once it has been idle too long.
	idle := time.AfterFunc(l.opts.DialTimeout+l.opts.ReplayTimeout, cancel)
	defer idle.Stop()
	d := zmq4.NewDealer(ctx,
		zmq4.WithLogger(l.zlog),
		zmq4.WithDialerMaxRetries(0),
		zmq4.WithDialerTimeout(l.opts.DialTimeout),
		zmq4.WithTimeout(l.opts.ReplayTimeout))
	defer d.Close()
	if err := zmqdial.Dial(ctx, d, l.dialable(ep)); err != nil {
		return false, err
	}
	var req [8]byte
	binary.BigEndian.PutUint64(req[:], start)
	idle.Reset(l.opts.ReplayTimeout)
	if err := d.Send(zmq4.NewMsgFrom([]byte{}, req[:])); err != nil {
		return false, err
	}
	for {
		idle.Reset(l.opts.ReplayTimeout)
		msg, err := d.Recv()
		if err != nil {
			return true, err
		}
		seq, payload, ok := parseReplayReply(msg.Frames)
		if !ok {
			return true, nil
		}
		if !batch(seq, payload) {
			return true, nil
		}
	}
}

// parseReplayReply reads one reply as the DEALER sees it. ok is false for the
// END marker and for anything that is not a batch (a sequence frame that is
// not 8 bytes, an empty payload, another frame count): either ends the replay.
func parseReplayReply(frames [][]byte) (seq uint64, payload []byte, ok bool) {
	var seqF []byte
	switch len(frames) {
	case 3: // [empty, seq, payload]
		seqF, payload = frames[1], frames[2]
	case 4: // [empty, topic, seq, payload]
		seqF, payload = frames[2], frames[3]
	}
	if len(seqF) != 8 || len(payload) == 0 {
		return 0, nil, false
	}
	return binary.BigEndian.Uint64(seqF), payload, true
}
