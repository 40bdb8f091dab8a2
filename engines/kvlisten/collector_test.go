package kvlisten

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/index"
)

// newDialingEngine is an engine in llm-d's topology: its PUB socket dials the
// collector at collectorEP and publishes under topic, numbering batches from
// first (llm-d-inference-sim numbers from 1); its replay ROUTER is bound.
func newDialingEngine(t *testing.T, collectorEP, topic string, first uint64) *engine {
	t.Helper()
	return newDialingEngineReplayAt(t, collectorEP, topic, first, "tcp://127.0.0.1:0")
}

// newDialingEngineReplayAt is newDialingEngine with its replay socket bound at
// replayEP (an engine restarted at its old address).
func newDialingEngineReplayAt(t *testing.T, collectorEP, topic string, first uint64, replayEP string) *engine {
	t.Helper()
	ctx := context.Background()
	e := &engine{t: t, topic: []byte(topic), four: true, first: first, drop: map[uint64]bool{}}
	e.pub = zmq4.NewPub(ctx)
	if err := e.pub.Dial(collectorEP); err != nil {
		t.Fatal(err)
	}
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

func newCollector(t *testing.T) (*Listeners, string) {
	t.Helper()
	l := newListeners(t)
	ep, err := l.Bind("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l, ep
}

// collected is an attachment fed by the collector: no KV events endpoint, the
// topic keys a worker registered with endpoint http://<hostPort> (and
// kv_events_topic topic, when set) would have.
func collected(ix *index.Index, p index.Partition, w index.WorkerKey, hostPort, topic, replayEP string) selection.RankAttachment {
	return selection.RankAttachment{
		Partition: p,
		Worker:    w,
		Endpoints: catalog.RankEndpoints{Replay: replayEP, HostPort: hostPort, Topic: topic},
		BlockSize: blockSize,
		Index:     ix,
	}
}

// TestCollectorRoutesByTopic: engines dial one bound socket; each message goes
// to the rank its topic (llm-d's kv@host:port@model or an explicit
// kv_events_topic) and batch dp_rank name, from sequence 1 with no loss.
func TestCollectorRoutesByTopic(t *testing.T) {
	l, ep := newCollector(t)
	ix := newIndex(t)
	a := index.WorkerKey{WorkerID: 1, DPRank: 0}
	b0 := index.WorkerKey{WorkerID: 2, DPRank: 0}
	b1 := index.WorkerKey{WorkerID: 2, DPRank: 1}
	c := index.WorkerKey{WorkerID: 3, DPRank: 0}
	ea := newDialingEngine(t, ep, "kv@127.0.0.1:8000@m", 1)
	// Two data-parallel ranks of one engine: two publishers, one topic (vLLM
	// runs one per rank), told apart by the batch's dp_rank.
	eb0 := newDialingEngine(t, ep, "kv@127.0.0.1:8001@m", 1)
	eb1 := newDialingEngine(t, ep, "kv@127.0.0.1:8001@m", 1)
	ec := newDialingEngine(t, ep, "engine-c", 0) // vLLM numbering, explicit topic
	for _, at := range []selection.RankAttachment{
		collected(ix, part, a, "127.0.0.1:8000", "", ea.replayEP),
		collected(ix, part, b0, "127.0.0.1:8001", "", eb0.replayEP),
		collected(ix, part, b1, "127.0.0.1:8001", "", eb1.replayEP),
		collected(ix, part, c, "127.0.0.1:9999", "engine-c", ec.replayEP),
	} {
		if err := l.Attach(at); err != nil {
			t.Fatal(err)
		}
	}
	ca, cb0, cb1, cc := newChain(0, 100, 5), newChain(0, 200, 3), newChain(1, 300, 4), newChain(0, 400, 2)
	type pubRank struct {
		e    *engine
		c    chain
		rank uint32
	}
	pubs := []pubRank{{ea, ca, 0}, {eb0, cb0, 0}, {eb1, cb1, 1}, {ec, cc, 0}}
	for _, p := range pubs {
		for _, batch := range p.c.batches {
			p.e.publish(batch)
		}
	}
	// Heartbeats until everything arrived: a PUB drops what it sends before
	// its connection is up, and the replay of the first batch that gets
	// through brings the rest back.
	keepPublishing(t, func() {
		for _, p := range pubs {
			p.e.publish(heartbeatBatch(p.rank))
		}
	})
	eventually(t, "every chain indexed on its rank", func() bool {
		return device(ix, a, ca.locals) == 5 && device(ix, b0, cb0.locals) == 3 &&
			device(ix, b1, cb1.locals) == 4 && device(ix, c, cc.locals) == 2
	})
	for _, w := range []index.WorkerKey{a, b0, b1, c} {
		st := status(t, l, w)
		if st.Lost != 0 || st.IncompleteReplays != 0 || st.DecodeErrors != 0 || !st.Connected {
			t.Errorf("%v: %+v, want nothing lost and connected", w, st)
		}
	}
	if device(ix, b1, cb0.locals) != 0 || device(ix, b0, cb1.locals) != 0 {
		t.Fatal("a batch went to the other dp rank of its topic")
	}
	cs, ok := l.CollectorStatus()
	if !ok || cs.Delivered == 0 || len(cs.Unmatched) != 0 || len(cs.Bound) != 1 || cs.Bound[0] != ep {
		t.Fatalf("collector status %+v (ok %v), want deliveries and nothing unmatched at %s", cs, ok, ep)
	}
}

func eventuallySleep() { time.Sleep(10 * time.Millisecond) }

// keepPublishing calls publish every 10 ms until the test ends.
func keepPublishing(t *testing.T, publish func()) {
	stop, done := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() {
		close(stop)
		<-done
	})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				publish()
				eventuallySleep()
			}
		}
	}()
}

// TestCollectorUnmatched: messages that belong to no attached rank are counted
// by reason, listed with their topic, never indexed, and the socket goes on.
func TestCollectorUnmatched(t *testing.T) {
	l, ep := newCollector(t)
	ix := newIndex(t)
	w := index.WorkerKey{WorkerID: 1}
	sub := index.WorkerKey{WorkerID: 2}
	if err := l.Attach(collected(ix, part, w, "127.0.0.1:8000", "", "")); err != nil {
		t.Fatal(err)
	}
	// A subscribed worker with the same convention keys: its own socket wins.
	subEngine := newEngine(t, false)
	at := attachment(ix, sub, subEngine.pubEP, subEngine.replayEP)
	at.Endpoints.HostPort = "127.0.0.1:8001"
	if err := l.Attach(at); err != nil {
		t.Fatal(err)
	}
	raw := zmq4.NewPub(context.Background())
	t.Cleanup(func() { raw.Close() })
	if err := raw.Dial(ep); err != nil {
		t.Fatal(err)
	}
	msgs := []struct {
		frames [][]byte
		reason string
	}{
		{[][]byte{[]byte("kv@127.0.0.1:9000@m"), be64(1), storedBatch(0, 1, nil, []uint32{1, 2, 3, 4})}, UnmatchedUnknownTopic},
		{[][]byte{[]byte("not-a-topic"), be64(1), heartbeatBatch(0)}, UnmatchedUnknownTopic},
		{[][]byte{[]byte("kv@127.0.0.1:8000@other-model"), be64(1), heartbeatBatch(0)}, UnmatchedModel},
		{[][]byte{[]byte("kv@127.0.0.1:8000@m"), be64(1), heartbeatBatch(3)}, UnmatchedRank},
		{[][]byte{[]byte("kv@127.0.0.1:8001@m"), be64(1), heartbeatBatch(0)}, UnmatchedSubscribed},
		{[][]byte{[]byte("kv@127.0.0.1:8000@m"), be64(1)}, UnmatchedMalformed},
		{[][]byte{[]byte("kv@127.0.0.1:8000@m"), []byte{1, 2}, heartbeatBatch(0)}, UnmatchedMalformed},
	}
	want := map[string]uint64{}
	for _, m := range msgs {
		want[m.reason]++
	}
	// A PUB drops messages sent before its connection is up: resend the set
	// until the first round is counted, then check one round exactly.
	eventually(t, "the raw publisher connected", func() bool {
		if err := raw.Send(zmq4.NewMsgFrom([]byte("probe"), be64(0), heartbeatBatch(0))); err != nil {
			t.Fatal(err)
		}
		eventuallySleep()
		cs, _ := l.CollectorStatus()
		return cs.Received > 0
	})
	before, _ := l.CollectorStatus()
	for _, m := range msgs {
		if err := raw.Send(zmq4.NewMsgFrom(m.frames...)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "every message counted", func() bool {
		cs, _ := l.CollectorStatus()
		return cs.Received-before.Received == uint64(len(msgs))
	})
	after, _ := l.CollectorStatus()
	for reason, n := range want {
		if got := after.Unmatched[reason] - before.Unmatched[reason]; got != n {
			t.Errorf("unmatched %s: %d, want %d", reason, got, n)
		}
	}
	if after.Delivered != before.Delivered {
		t.Errorf("delivered %d messages that match no rank", after.Delivered-before.Delivered)
	}
	if n := len(ix.Match([]uint64{1}, false, nil)); n != 0 {
		t.Fatalf("unmatched messages were indexed: %d workers", n)
	}
	var rankEntry *selection.UnmatchedTopic
	for i, u := range after.Recent {
		if u.Reason == UnmatchedRank {
			rankEntry = &after.Recent[i]
		}
	}
	if rankEntry == nil || rankEntry.Topic != "kv@127.0.0.1:8000@m" || rankEntry.DPRank == nil || *rankEntry.DPRank != 3 {
		t.Fatalf("recent unmatched %+v: want the unknown_rank topic with dp_rank 3", after.Recent)
	}
	// The subscribed worker is fed by its own socket alone: its chain arrives
	// through the subscription while the collector's copies were skipped.
	subChain := newChain(0, 500, 3)
	for _, b := range subChain.batches {
		subEngine.publish(b)
	}
	subEngine.heartbeat(0)
	eventually(t, "the subscribed worker indexed through its subscription", func() bool {
		return device(ix, sub, subChain.locals) == 3
	})
	subEngine.stopHeartbeat()
	// The socket still serves the registered worker.
	e := newDialingEngine(t, ep, "kv@127.0.0.1:8000@m", 1)
	ch := newChain(0, 10, 3)
	for _, b := range ch.batches {
		e.publish(b)
	}
	keepPublishing(t, func() { e.publish(heartbeatBatch(0)) })
	// No replay endpoint: batches sent before the connection was up are lost,
	// so only check that the stream flows.
	eventually(t, "the registered worker's stream flows", func() bool { return status(t, l, w).Applied > 0 })
}

// TestCollectorRecentIsBounded: a publisher inventing topics cannot grow the
// recent list or the route cache without end.
func TestCollectorRecentIsBounded(t *testing.T) {
	l := newListeners(t)
	for i := range maxRoutes + 10 {
		topic := []byte(fmt.Sprintf("kv@10.0.0.1:%d@m", 1+i%60000))
		l.collected([][]byte{topic, be64(1), heartbeatBatch(0)})
	}
	// A megabyte topic is neither cached nor kept whole.
	l.collected([][]byte{make([]byte, 1<<20), be64(1), heartbeatBatch(0)})
	l.coll.statMu.Lock()
	for _, u := range l.coll.recent {
		if len(u.Topic) > maxTopicBytes {
			t.Errorf("a %d-byte topic is kept in the recent list", len(u.Topic))
		}
	}
	n := len(l.coll.recent)
	got := l.coll.unmatched[UnmatchedUnknownTopic]
	l.coll.statMu.Unlock()
	l.mu.Lock()
	routes := len(l.coll.routes)
	l.mu.Unlock()
	if n != maxRecentUnmatched || routes > maxRoutes || got != uint64(maxRoutes+11) {
		t.Fatalf("recent %d (max %d), routes %d (max %d), counted %d", n, maxRecentUnmatched, routes, maxRoutes, got)
	}
}

// TestCollectorAttachWithoutBind: a rank without an endpoint needs a bound
// collector.
func TestCollectorAttachWithoutBind(t *testing.T) {
	l := newListeners(t)
	err := l.Attach(collected(newIndex(t), part, index.WorkerKey{WorkerID: 1}, "127.0.0.1:8000", "", ""))
	if err == nil {
		t.Fatal("attached a collector-fed rank without a collector socket")
	}
}

// TestCollectorLateRegistrationReplays: a worker registered after its engine
// has published catches up through its replay endpoint as soon as it is
// attached, so nothing it published while unknown is lost or waits for its
// next batch.
func TestCollectorLateRegistrationReplays(t *testing.T) {
	l, ep := newCollector(t)
	ix := newIndex(t)
	w := index.WorkerKey{WorkerID: 5}
	e := newDialingEngine(t, ep, "kv@127.0.0.1:8005@m", 1)
	ch := newChain(0, 50, 6)
	for _, b := range ch.batches {
		e.publish(b) // unknown worker: counted unmatched
	}
	eventually(t, "the unregistered engine's messages counted", func() bool {
		e.publish(heartbeatBatch(0))
		eventuallySleep()
		cs, _ := l.CollectorStatus()
		return cs.Unmatched[UnmatchedUnknownTopic] > 0
	})
	if err := l.Attach(collected(ix, part, w, "127.0.0.1:8005", "", e.replayEP)); err != nil {
		t.Fatal(err)
	}
	// The engine is idle now: the catch-up at registration alone brings the
	// chain in.
	eventually(t, "the chain replayed", func() bool { return device(ix, w, ch.locals) == 6 })
	// Later live batches continue the sequence without a gap.
	more := newChain(0, 80, 2)
	for _, b := range more.batches {
		e.publish(b)
	}
	eventually(t, "live batches after the catch-up", func() bool { return device(ix, w, more.locals) == 2 })
	if st := status(t, l, w); st.Lost != 0 || st.Replays != 1 || st.Stale != 0 || st.Gaps != 0 {
		t.Fatalf("%+v: want one replay (the catch-up), nothing lost, stale or gapped", st)
	}
}

// TestCollectorDropsHostilePeers: garbage and a frame header announcing a
// terabyte disconnect their peers, are counted by reason, and the socket goes
// on serving a real publisher.
func TestCollectorDropsHostilePeers(t *testing.T) {
	l, ep := newCollector(t)
	addr := strings.TrimPrefix(ep, "tcp://")
	greeting := func() []byte {
		g := make([]byte, 64)
		g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 0
		copy(g[12:], "NULL")
		return g
	}
	huge := append(greeting(), 0x06, 0, 0, 1, 0, 0, 0, 0, 0) // a LONG COMMAND frame of 2^40 bytes
	for _, payload := range [][]byte{[]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n" + strings.Repeat("x", 64)), huge} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(payload); err != nil {
			t.Fatal(err)
		}
		// The collector hangs up (EOF or a reset), well before the deadline.
		_ = c.SetReadDeadline(time.Now().Add(waitFor))
		_, err = io.Copy(io.Discard, c)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatal("the collector did not hang up on a hostile peer")
		}
		c.Close()
	}
	eventually(t, "both peers counted", func() bool {
		cs, _ := l.CollectorStatus()
		return cs.Rejected["bad_greeting"] == 1 && cs.Rejected["oversized_frame"] == 1
	})
	ix := newIndex(t)
	w := index.WorkerKey{WorkerID: 4}
	e := newDialingEngine(t, ep, "kv@127.0.0.1:8004@m", 1)
	if err := l.Attach(collected(ix, part, w, "127.0.0.1:8004", "", e.replayEP)); err != nil {
		t.Fatal(err)
	}
	ch := newChain(0, 60, 3)
	for _, b := range ch.batches {
		e.publish(b)
	}
	eventually(t, "a real publisher still indexed", func() bool {
		e.publish(heartbeatBatch(0))
		eventuallySleep()
		return device(ix, w, ch.locals) == 3
	})
}

// An engine behind the collector restarts under the same topic and replay
// address: the collector's socket stays up, so the restart shows only as
// batches counting up again below the watermark. After three of them the
// rank drops the old engine's blocks and catches up on the new stream.
func TestCollectorPublisherRestart(t *testing.T) {
	l, ep := newCollector(t)
	ix := newIndex(t)
	w := index.WorkerKey{WorkerID: 9}
	topic := "kv@127.0.0.1:8009@m"
	e1 := newDialingEngine(t, ep, topic, 1)
	if err := l.Attach(collected(ix, part, w, "127.0.0.1:8009", "", e1.replayEP)); err != nil {
		t.Fatal(err)
	}
	old := newChain(0, 200, 6)
	for _, b := range old.batches {
		e1.publish(b)
	}
	eventually(t, "the first engine's chain, and live batches after it", func() bool {
		e1.publish(heartbeatBatch(0))
		eventuallySleep()
		return device(ix, w, old.locals) == 6 && status(t, l, w).LastSeq >= 30
	})
	replayEP := e1.replayEP
	e1.close()

	e2 := newDialingEngineReplayAt(t, ep, topic, 1, replayEP)
	fresh := newChain(0, 700, 4)
	for _, b := range fresh.batches {
		e2.publish(b) // maybe before its socket connected: the replay has them
	}
	eventually(t, "the restarted engine's chain", func() bool {
		e2.publish(heartbeatBatch(0))
		eventuallySleep()
		return device(ix, w, fresh.locals) == 4
	})
	if got := device(ix, w, old.locals); got != 0 {
		t.Fatalf("%d of the first engine's 6 blocks survived its restart", got)
	}
	if st := status(t, l, w); st.Restarts != 1 || st.Lost != 0 {
		t.Fatalf("%+v: want one restart recognized and nothing lost", st)
	}
}
