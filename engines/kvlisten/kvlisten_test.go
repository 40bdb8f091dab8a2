package kvlisten

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/tinylib/msgp/msgp"

	"github.com/kvselect/kvselect/internal/peerproc"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/kvhash"
)

const (
	blockSize = 4
	waitFor   = 10 * time.Second
)

// ---- a tiny msgpack batch encoder (msgspec array_like shape) ----

func arr(elems ...[]byte) []byte {
	out := msgp.AppendArrayHeader(nil, uint32(len(elems)))
	for _, e := range elems {
		out = append(out, e...)
	}
	return out
}

func storedBatch(rank uint32, hash uint64, parent *uint64, tokens []uint32) []byte {
	hs := msgp.AppendArrayHeader(nil, 1)
	hs = msgp.AppendUint64(hs, hash)
	par := msgp.AppendNil(nil)
	if parent != nil {
		par = msgp.AppendUint64(nil, *parent)
	}
	toks := msgp.AppendArrayHeader(nil, uint32(len(tokens)))
	for _, t := range tokens {
		toks = msgp.AppendUint32(toks, t)
	}
	ev := arr(msgp.AppendString(nil, "BlockStored"), hs, par, toks,
		msgp.AppendUint64(nil, blockSize), msgp.AppendNil(nil), msgp.AppendString(nil, "GPU"), msgp.AppendNil(nil))
	return arr(msgp.AppendFloat64(nil, 1700000000.5), arr(ev), msgp.AppendUint32(nil, rank))
}

// heartbeatBatch is a batch without events: harmless to the index.
func heartbeatBatch(rank uint32) []byte {
	return arr(msgp.AppendFloat64(nil, 1700000000.5), arr(), msgp.AppendUint32(nil, rank))
}

// chain is n single-block batches forming one prefix: block i holds tokens
// [4(base+i), 4(base+i)+4) and has engine hash base+i, parent base+i-1.
type chain struct {
	batches [][]byte
	locals  []uint64
}

func newChain(rank uint32, base uint64, n int) chain {
	var c chain
	var all []uint32
	for i := range n {
		t0 := uint32(4 * (int(base) + i)) // distinct bases give distinct content
		toks := []uint32{t0, t0 + 1, t0 + 2, t0 + 3}
		all = append(all, toks...)
		var parent *uint64
		if i > 0 {
			p := base + uint64(i) - 1
			parent = &p
		}
		c.batches = append(c.batches, storedBatch(rank, base+uint64(i), parent, toks))
	}
	c.locals = kvhash.LocalBlockHashes(all, "", "", kvhash.BlockOptions{BlockSize: blockSize})
	return c
}

// ---- a test engine: PUB + ROUTER replay ring ----

type engine struct {
	t        *testing.T
	pub      zmq4.Socket
	router   zmq4.Socket
	pubEP    string
	replayEP string
	topic    []byte
	four     bool   // reply with 4 frames (topic included)
	first    uint64 // the first sequence number: 0 as vLLM, 1 as llm-d-inference-sim

	mu     sync.Mutex
	ring   [][]byte // every payload by seq
	floor  uint64   // replay serves only seq >= floor (simulates ring overflow)
	drop   map[uint64]bool
	served int

	closeOnce sync.Once
	hbStop    chan struct{}
	hbDone    chan struct{}
	wg        sync.WaitGroup
}

func newEngine(t *testing.T, four bool) *engine {
	return newEngineAt(t, four, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", nil)
}

// newEngineAt binds the given endpoints; the ring starts as a copy of ring, so
// that a restarted publisher can continue an earlier sequence.
func newEngineAt(t *testing.T, four bool, pubEP, replayEP string, ring [][]byte) *engine {
	t.Helper()
	ctx := context.Background()
	e := &engine{t: t, topic: []byte("kv-events"), four: four, drop: map[uint64]bool{}}
	e.ring = append(e.ring, ring...)
	e.pub = zmq4.NewPub(ctx)
	if err := e.pub.Listen(pubEP); err != nil {
		t.Fatal(err)
	}
	e.pubEP = "tcp://" + e.pub.Addr().String()
	e.router = zmq4.NewRouter(ctx)
	if err := e.router.Listen(replayEP); err != nil {
		t.Fatal(err)
	}
	e.replayEP = "tcp://" + e.router.Addr().String()
	e.wg.Add(1)
	go e.serveReplay()
	t.Cleanup(e.close)
	return e
}

func be64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// publish appends payload to the ring and publishes it live unless its seq is
// marked dropped. It returns the seq.
func (e *engine) publish(payload []byte) uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.first + uint64(len(e.ring))
	e.ring = append(e.ring, payload)
	if !e.drop[s] {
		if err := e.pub.Send(zmq4.NewMsgFrom(e.topic, be64(s), payload)); err != nil {
			e.t.Errorf("publish %d: %v", s, err)
		}
	}
	return s
}

// history appends payload to the ring without publishing it: a batch published
// while nobody was subscribed. (zmq4's PUB sends from a queue, so a batch Sent
// just before a subscriber connects may still reach it; tests that need a batch
// to be missed use this.)
func (e *engine) history(payload []byte) uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ring = append(e.ring, payload)
	return e.first + uint64(len(e.ring)) - 1
}

func (e *engine) lastSeq() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.first + uint64(len(e.ring)) - 1
}

func (e *engine) serveReplay() {
	defer e.wg.Done()
	for {
		msg, err := e.router.Recv()
		if err != nil {
			return
		}
		f := msg.Frames
		if len(f) != 3 || len(f[2]) != 8 {
			e.t.Errorf("bad replay request: %d frames", len(f))
			continue
		}
		id, start := f[0], binary.BigEndian.Uint64(f[2])
		e.mu.Lock()
		e.served++
		from := max(start, e.floor, e.first)
		var out [][][]byte
		for s := from; s < e.first+uint64(len(e.ring)); s++ {
			if e.four {
				out = append(out, [][]byte{id, {}, e.topic, be64(s), e.ring[s-e.first]})
			} else {
				out = append(out, [][]byte{id, {}, be64(s), e.ring[s-e.first]})
			}
		}
		e.mu.Unlock()
		end := [][]byte{id, {}, be64(^uint64(0)), {}}
		if e.four {
			end = [][]byte{id, {}, e.topic, be64(^uint64(0)), {}}
		}
		for _, m := range append(out, end) {
			if err := e.router.Send(zmq4.NewMsgFrom(m...)); err != nil {
				break
			}
		}
	}
}

// heartbeat publishes an empty batch every 10 ms until stopHeartbeat.
func (e *engine) heartbeat(rank uint32) {
	e.hbStop, e.hbDone = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(e.hbDone)
		tk := time.NewTicker(10 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-e.hbStop:
				return
			case <-tk.C:
				e.publish(heartbeatBatch(rank))
			}
		}
	}()
}

func (e *engine) stopHeartbeat() {
	if e.hbStop != nil {
		close(e.hbStop)
		<-e.hbDone
		e.hbStop = nil
	}
}

func (e *engine) close() {
	e.closeOnce.Do(e.doClose)
}

func (e *engine) doClose() {
	e.stopHeartbeat()
	e.pub.Close()
	e.router.Close()
	e.wg.Wait()
}

// ---- helpers ----

var part = index.Partition{Model: "m", RoutingGroup: "g"}

func newIndex(t *testing.T) *index.Index {
	t.Helper()
	ix, err := index.New(index.Config{BlockSize: blockSize})
	if err != nil {
		t.Fatal(err)
	}
	return ix
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newListeners(t *testing.T) *Listeners {
	t.Helper()
	l := New(context.Background(), Options{Logger: quietLogger(), ReconnectMin: 20 * time.Millisecond, ReconnectMax: 200 * time.Millisecond})
	t.Cleanup(l.Close)
	return l
}

func attachment(ix *index.Index, w index.WorkerKey, pubEP, replayEP string) selection.RankAttachment {
	return selection.RankAttachment{
		Partition: part,
		Worker:    w,
		Endpoints: catalog.RankEndpoints{KVEvents: pubEP, Replay: replayEP},
		BlockSize: blockSize,
		Index:     ix,
	}
}

// device is how many leading blocks of locals worker w holds on device.
func device(ix *index.Index, w index.WorkerKey, locals []uint64) uint32 {
	for _, o := range ix.Match(locals, false, nil) {
		if o.Worker == w {
			return o.Device
		}
	}
	return 0
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func status(t *testing.T, l *Listeners, w index.WorkerKey) RankStatus {
	t.Helper()
	st, ok := l.Status(part, w)
	if !ok {
		t.Fatalf("no status for %v", w)
	}
	return st
}

// attachSynced attaches a rank and waits, with the engine's heartbeat running,
// until its cursor is synced.
func attachSynced(t *testing.T, l *Listeners, e *engine, a selection.RankAttachment) {
	t.Helper()
	if err := l.Attach(a); err != nil {
		t.Fatal(err)
	}
	e.heartbeat(a.Worker.DPRank)
	eventually(t, "synced", func() bool { return status(t, l, a.Worker).Synced })
}

// ---- tests ----

func TestStreamAllBlocks(t *testing.T) {
	for _, four := range []bool{false, true} {
		name := "replay3frames"
		if four {
			name = "replay4frames"
		}
		t.Run(name, func(t *testing.T) {
			e := newEngine(t, four)
			ix := newIndex(t)
			l := newListeners(t)
			w := index.WorkerKey{WorkerID: 7, DPRank: 1}
			c := newChain(w.DPRank, 1000, 10)
			if err := l.Attach(attachment(ix, w, e.pubEP, e.replayEP)); err != nil {
				t.Fatal(err)
			}
			// Published while the subscriber connects: some or all are missed live
			// and recovered by the initial replay.
			for _, b := range c.batches {
				e.publish(b)
			}
			e.heartbeat(w.DPRank)
			eventually(t, "10 blocks indexed", func() bool { return device(ix, w, c.locals) == 10 })
			e.stopHeartbeat()
			last := e.lastSeq()
			eventually(t, "caught up", func() bool { st := status(t, l, w); return st.Synced && st.LastSeq == last })
			st := status(t, l, w)
			if st.IncompleteReplays != 0 || st.Lost != 0 || st.Failed != 0 || st.DecodeErrors != 0 {
				t.Fatalf("unexpected status %+v", st)
			}
			if !st.Connected {
				t.Fatalf("not connected: %+v", st)
			}
			if st.Applied != last+1 {
				t.Fatalf("applied %d batches, want %d", st.Applied, last+1)
			}
			// A query on another worker's view: exactly the stored prefix, nothing more.
			longer := append(append([]uint64(nil), c.locals...), 12345)
			if got := device(ix, w, longer); got != 10 {
				t.Fatalf("device overlap %d, want 10", got)
			}
		})
	}
}

func TestGapReplayed(t *testing.T) {
	e := newEngine(t, false)
	ix := newIndex(t)
	l := newListeners(t)
	w := index.WorkerKey{WorkerID: 9, DPRank: 0}
	attachSynced(t, l, e, attachment(ix, w, e.pubEP, e.replayEP))
	e.stopHeartbeat()

	c := newChain(w.DPRank, 5000, 6)
	e.mu.Lock()
	next := uint64(len(e.ring))
	e.drop[next+2] = true // the third block never goes out live
	e.drop[next+3] = true // nor the fourth
	e.mu.Unlock()
	for _, b := range c.batches {
		e.publish(b)
	}
	e.heartbeat(w.DPRank)
	eventually(t, "6 blocks indexed", func() bool { return device(ix, w, c.locals) == 6 })
	st := status(t, l, w)
	if st.Gaps < 1 {
		t.Fatalf("no gap recorded: %+v", st)
	}
	if st.IncompleteReplays != 0 || st.Lost != 0 || st.LastIncompleteReason != "" {
		t.Fatalf("unexpected incomplete replay: %+v", st)
	}
	if st.Replayed < 2 {
		t.Fatalf("replayed %d batches, want >= 2: %+v", st.Replayed, st)
	}
}

func TestReplayRingOverflow(t *testing.T) {
	e := newEngine(t, true)
	ix := newIndex(t)
	l := newListeners(t)
	w := index.WorkerKey{WorkerID: 11, DPRank: 0}
	c := newChain(w.DPRank, 9000, 10)
	// Published before anyone subscribes; the ring has since dropped seq 0..4.
	for _, b := range c.batches {
		e.history(b)
	}
	e.mu.Lock()
	e.floor = 5
	e.mu.Unlock()
	if err := l.Attach(attachment(ix, w, e.pubEP, e.replayEP)); err != nil {
		t.Fatal(err)
	}
	e.heartbeat(w.DPRank)
	eventually(t, "incomplete replay recorded", func() bool { return status(t, l, w).IncompleteReplays >= 1 })
	st := status(t, l, w)
	if st.LastIncompleteReason != ReasonStartedAfterRequested {
		t.Fatalf("reason %q, want %q (%+v)", st.LastIncompleteReason, ReasonStartedAfterRequested, st)
	}
	if st.Lost != 5 || st.IncompleteReplays != 1 {
		t.Fatalf("lost %d in %d incomplete replays, want 5 in 1: %+v", st.Lost, st.IncompleteReplays, st)
	}
	if got := device(ix, w, c.locals); got != 0 {
		t.Fatalf("device overlap %d without the first blocks, want 0", got)
	}
}

func TestNoReplayEndpoint(t *testing.T) {
	e := newEngine(t, false)
	ix := newIndex(t)
	l := newListeners(t)
	w := index.WorkerKey{WorkerID: 12, DPRank: 0}
	c := newChain(w.DPRank, 100, 4)
	for _, b := range c.batches {
		e.history(b)
	}
	attachSynced(t, l, e, attachment(ix, w, e.pubEP, ""))
	st := status(t, l, w)
	if st.Lost != 4 || st.Replays != 0 {
		t.Fatalf("lost %d with %d replays, want 4 and 0: %+v", st.Lost, st.Replays, st)
	}
	// What GET /workers shows: the view is known to be incomplete, and why.
	rs, ok := l.RankEventsStatus(part, w)
	if !ok || rs.Complete || rs.LostBatches != 4 || rs.IncompleteReason != ReasonNoReplayEndpoint || rs.LastSequence == nil {
		t.Fatalf("rank events status %+v (ok %v), want incomplete with 4 lost for %q", rs, ok, ReasonNoReplayEndpoint)
	}
}

func TestDetachReattach(t *testing.T) {
	e := newEngine(t, false)
	ix := newIndex(t)
	l := newListeners(t)
	w := index.WorkerKey{WorkerID: 13, DPRank: 2}
	c := newChain(w.DPRank, 300, 5)
	for _, b := range c.batches {
		e.publish(b)
	}
	a := attachment(ix, w, e.pubEP, e.replayEP)
	if err := l.Attach(a); err != nil {
		t.Fatal(err)
	}
	e.heartbeat(w.DPRank)
	eventually(t, "5 blocks indexed", func() bool { return device(ix, w, c.locals) == 5 })

	l.Detach(part, w)
	if _, ok := l.Status(part, w); ok {
		t.Fatal("status after Detach")
	}
	ix.RemoveRank(w) // what the service does after Detach
	if got := device(ix, w, c.locals); got != 0 {
		t.Fatalf("device overlap %d after purge", got)
	}
	l.Detach(part, w) // idempotent

	if err := l.Attach(a); err != nil {
		t.Fatal(err)
	}
	// A fresh watermark: the initial replay brings the whole history back.
	eventually(t, "5 blocks indexed again", func() bool { return device(ix, w, c.locals) == 5 })
	st := status(t, l, w)
	if st.Replays < 1 || st.IncompleteReplays != 0 {
		t.Fatalf("unexpected status after re-attach: %+v", st)
	}
}

func TestReconnectSameEndpoint(t *testing.T) {
	e := newEngine(t, false)
	ix := newIndex(t)
	l := newListeners(t)
	w := index.WorkerKey{WorkerID: 15, DPRank: 0}
	attachSynced(t, l, e, attachment(ix, w, e.pubEP, e.replayEP))
	e.close()
	eventually(t, "disconnect noticed", func() bool { return status(t, l, w).Reconnects >= 1 })
	e.mu.Lock()
	ring := e.ring
	e.mu.Unlock()

	// The publisher comes back on the same endpoints and continues its sequence;
	// the listener reconnects on its own and keeps its watermark.
	e2 := newEngineAt(t, false, e.pubEP, e.replayEP, ring)
	c := newChain(w.DPRank, 800, 4)
	for _, b := range c.batches {
		e2.publish(b)
	}
	e2.heartbeat(w.DPRank)
	eventually(t, "4 blocks indexed after reconnect", func() bool { return device(ix, w, c.locals) == 4 })
	st := status(t, l, w)
	if st.IncompleteReplays != 0 || st.Lost != 0 {
		t.Fatalf("unexpected status after reconnect: %+v", st)
	}
}

func TestDialRetry(t *testing.T) {
	// The listener dials an endpoint nobody listens on yet, then retries.
	e := newEngine(t, false)
	ep := e.pubEP
	e.close()
	ix := newIndex(t)
	l := newListeners(t)
	w := index.WorkerKey{WorkerID: 14, DPRank: 0}
	if err := l.Attach(attachment(ix, w, ep, "")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a failed connection", func() bool { return status(t, l, w).Reconnects >= 1 })

	e2 := newEngine(t, false)
	l.Detach(part, w)
	if err := l.Attach(attachment(ix, w, e2.pubEP, e2.replayEP)); err != nil {
		t.Fatal(err)
	}
	c := newChain(w.DPRank, 700, 3)
	for _, b := range c.batches {
		e2.publish(b)
	}
	e2.heartbeat(w.DPRank)
	eventually(t, "3 blocks indexed", func() bool { return device(ix, w, c.locals) == 3 })
}

func TestCloseLeavesNoGoroutines(t *testing.T) {
	// The engine is outside the count: zmq4 v0.17.0's PUB keeps a writer
	// goroutine after Close (pubMWriter.run), which is the test publisher's,
	// not the listeners'.
	e := newEngine(t, false)
	ix := newIndex(t)
	before := runtime.NumGoroutine()
	l := New(context.Background(), Options{Logger: quietLogger()})
	ws := []index.WorkerKey{{WorkerID: 21, DPRank: 0}, {WorkerID: 22, DPRank: 0}}
	for _, w := range ws {
		if err := l.Attach(attachment(ix, w, e.pubEP, e.replayEP)); err != nil {
			t.Fatal(err)
		}
	}
	e.heartbeat(0)
	for _, w := range ws {
		eventually(t, "synced", func() bool { return status(t, l, w).Synced })
	}
	e.stopHeartbeat()
	last := e.lastSeq()
	for _, w := range ws {
		eventually(t, "caught up", func() bool { return status(t, l, w).LastSeq == last })
	}
	l.Close()
	l.Close() // idempotent
	if err := l.Attach(attachment(ix, ws[0], e.pubEP, "")); err != ErrClosed {
		t.Fatalf("Attach after Close: %v, want ErrClosed", err)
	}
	// Engine-side connection goroutines end once they see the SUB sockets close.
	deadline := time.Now().Add(waitFor)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			t.Fatalf("%d goroutines, %d before:\n%s", runtime.NumGoroutine(), before, buf[:n])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestDetachDuringStalledHandshake(t *testing.T) {
	// A TCP peer that accepts but never speaks ZMTP (a load balancer with no
	// backend, say): the dial times out, and Detach returns.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	l := New(context.Background(), Options{Logger: quietLogger(), DialTimeout: 50 * time.Millisecond, ReconnectMin: 10 * time.Millisecond})
	t.Cleanup(l.Close)
	w := index.WorkerKey{WorkerID: 41}
	ep := "tcp://" + ln.Addr().String()
	if err := l.Attach(attachment(newIndex(t), w, ep, ep)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a timed-out dial", func() bool { return status(t, l, w).Reconnects >= 1 })
	done := make(chan struct{})
	go func() {
		l.Detach(part, w)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(waitFor):
		t.Fatal("Detach blocked on a stalled handshake")
	}
}

func TestContextCancelStops(t *testing.T) {
	e := newEngine(t, false)
	ctx, cancel := context.WithCancel(context.Background())
	l := New(ctx, Options{Logger: quietLogger()})
	w := index.WorkerKey{WorkerID: 31}
	if err := l.Attach(attachment(newIndex(t), w, e.pubEP, e.replayEP)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "connected", func() bool { return status(t, l, w).Connected })
	cancel()
	l.Close() // returns once the rank goroutine saw the cancellation
	if err := l.Attach(attachment(newIndex(t), w, e.pubEP, "")); err != ErrClosed {
		t.Fatalf("Attach after cancel: %v", err)
	}
}

func TestAttachValidation(t *testing.T) {
	l := newListeners(t)
	w := index.WorkerKey{WorkerID: 1}
	if err := l.Attach(selection.RankAttachment{Worker: w, Endpoints: catalog.RankEndpoints{KVEvents: "tcp://127.0.0.1:1"}}); err == nil {
		t.Fatal("attach without index accepted")
	}
	a := attachment(newIndex(t), w, "tcp://127.0.0.1:1", "")
	a.BlockSize = 0
	if err := l.Attach(a); err == nil {
		t.Fatal("attach with zero block size accepted")
	}
}

// TestParentZeroAndNumberingFromOne runs llm-d-inference-sim's conventions
// through a subscribed rank: array batches whose first block names parent 0
// for "no parent", and sequences starting at 1. Both index exactly, with no
// loss reported.
func TestParentZeroAndNumberingFromOne(t *testing.T) {
	e := newEngine(t, true)
	e.first = 1
	ix := newIndex(t)
	l := newListeners(t)
	w := index.WorkerKey{WorkerID: 9}
	if err := l.Attach(attachment(ix, w, e.pubEP, e.replayEP)); err != nil {
		t.Fatal(err)
	}
	c := newChain(0, 700, 4)
	zero := uint64(0)
	c.batches[0] = storedBatch(0, 700, &zero, []uint32{2800, 2801, 2802, 2803})
	for _, b := range c.batches {
		e.publish(b)
	}
	e.heartbeat(0)
	eventually(t, "the chain indexed", func() bool { return device(ix, w, c.locals) == 4 })
	e.stopHeartbeat()
	if st := status(t, l, w); st.Lost != 0 || st.Failed != 0 || st.IncompleteReplays != 0 {
		t.Fatalf("%+v: want nothing lost or rejected", st)
	}
}

// A vLLM engine numbers its batches from 0. A listener whose first live batch
// is 1 asks for batch 0; when that replay fails, batch 0 is unaccounted for
// and counted lost, not taken for the batch 0 that llm-d-inference-sim (which
// numbers from 1) never publishes: only an answer can tell the two apart.
// (A drained worker re-registered while its replay endpoint was down lost its
// first batch this way without a warning.)
func TestFailedCatchUpCountsBatchZero(t *testing.T) {
	e := newEngine(t, false)
	ix := newIndex(t)
	l := newListeners(t)
	w := index.WorkerKey{WorkerID: 15, DPRank: 0}
	c := newChain(w.DPRank, 700, 2)
	e.history(c.batches[0]) // seq 0, published before anyone subscribed
	port, err := peerproc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	down := fmt.Sprintf("tcp://127.0.0.1:%d", port) // nothing listens
	if err := l.Attach(attachment(ix, w, e.pubEP, down)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "subscribed", func() bool { return status(t, l, w).Connected })
	// zmq4 may not deliver a batch sent the instant the subscription is up:
	// send batch 1 until the listener has it.
	eventually(t, "batch 1 applied", func() bool {
		if st := status(t, l, w); st.Synced {
			return true
		}
		e.mu.Lock()
		if len(e.ring) == 1 {
			e.ring = append(e.ring, c.batches[1])
		}
		e.mu.Unlock()
		if err := e.pub.Send(zmq4.NewMsgFrom(e.topic, be64(1), c.batches[1])); err != nil {
			t.Fatal(err)
		}
		return false
	})
	st := status(t, l, w)
	if st.LastSeq != 1 || st.Lost != 1 || st.LastIncompleteReason != ReasonFailed {
		t.Fatalf("after a failed catch-up of [0, 1): last %d, lost %d, reason %q; want 1, 1, %q",
			st.LastSeq, st.Lost, st.LastIncompleteReason, ReasonFailed)
	}
}
