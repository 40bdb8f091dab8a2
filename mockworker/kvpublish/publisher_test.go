package kvpublish

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvselect/kvselect/engines/kvevents"
)

// waitFor is generous: two shared cores, and -race.
const waitFor = 20 * time.Second

var fixedNow = func() time.Time { return time.Unix(1700000000, 500_000_000) }

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newPub(t *testing.T, opts Options) *Publisher {
	t.Helper()
	if opts.Endpoint == "" {
		opts.Endpoint = "tcp://127.0.0.1:0"
	}
	if opts.Logger == nil {
		opts.Logger = quiet()
	}
	if opts.Now == nil {
		opts.Now = fixedNow
	}
	p, err := New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
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

type liveMsg struct {
	topic   []byte
	seq     uint64
	payload []byte
}

// subscribe dials a real SUB socket to p and returns a channel of its live
// messages, parsed by kvselect's own frame parser.
func subscribe(t *testing.T, p *Publisher) <-chan liveMsg {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sub := zmq4.NewSub(ctx)
	if err := sub.Dial(p.Endpoint()); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	out := make(chan liveMsg, 1<<16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			msg, err := sub.Recv()
			if err != nil {
				return
			}
			topic, seq, payload, err := kvevents.ParseMessage(msg.Frames)
			if err != nil {
				t.Errorf("bad live message: %v", err)
				return
			}
			out <- liveMsg{topic, seq, payload}
		}
	}()
	t.Cleanup(func() { cancel(); sub.Close(); <-done })
	return out
}

// warmUp publishes empty batches until the subscriber receives one (a PUB
// drops what it sends before the subscription reaches it) and drains them. It
// returns the next sequence number the subscriber will see.
func warmUp(t *testing.T, p *Publisher, ch <-chan liveMsg) uint64 {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		if _, err := p.Publish(nil); err != nil {
			t.Fatal(err)
		}
		select {
		case m := <-ch:
			last := p.NextSeq() - 1
			for m.seq != last {
				m = recvLive(t, ch)
			}
			return last + 1
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("subscriber never received a batch")
		}
	}
}

func recvLive(t *testing.T, ch <-chan liveMsg) liveMsg {
	t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(waitFor):
		t.Fatal("timed out waiting for a live message")
	}
	return liveMsg{}
}

// replay sends one request over a real DEALER and returns the replies up to
// and including the END marker, frames as the DEALER sees them.
func replay(t *testing.T, ep string, request ...[]byte) [][][]byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	d := zmq4.NewDealer(ctx)
	defer d.Close()
	if err := d.Dial(ep); err != nil {
		t.Fatal(err)
	}
	if err := d.Send(zmq4.NewMsgFrom(request...)); err != nil {
		t.Fatal(err)
	}
	var out [][][]byte
	for {
		msg, err := d.Recv()
		if err != nil {
			t.Fatalf("replay recv after %d replies: %v", len(out), err)
		}
		out = append(out, msg.Frames)
		f := msg.Frames
		if len(f) >= 3 && bytes.Equal(f[len(f)-2], endSeq) && len(f[len(f)-1]) == 0 {
			return out
		}
	}
}

func be64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func replayRequest(start uint64) [][]byte { return [][]byte{{}, be64(start)} }

// batchFor is the payload Publish(nil, AllBlocksCleared) ... would not tell
// apart; tests publish raw payloads whose bytes name their position instead.
func payloadN(i int) []byte { return AppendBatch(nil, float64(i), nil, &i) }

func TestLiveMessagesAreVLLMFrames(t *testing.T) {
	for _, topic := range []string{"", "kv-events"} {
		t.Run("topic="+topic, func(t *testing.T) {
			p := newPub(t, Options{Topic: topic})
			ch := subscribe(t, p)
			next := warmUp(t, p, ch)
			rank := 1
			ev := &BlockStored{BlockHashes: []uint64{h1}, TokenIDs: tokens(0, 4), BlockSize: 4, Medium: "GPU"}
			seq, err := p.Publish(&rank, ev)
			if err != nil {
				t.Fatal(err)
			}
			if seq != next {
				t.Fatalf("seq %d, want %d", seq, next)
			}
			m := recvLive(t, ch)
			if string(m.topic) != topic || m.seq != seq {
				t.Fatalf("got topic %q seq %d, want %q %d", m.topic, m.seq, topic, seq)
			}
			if exp := AppendBatch(nil, 1700000000.5, []Event{ev}, &rank); !bytes.Equal(m.payload, exp) {
				t.Fatalf("payload\ngot  %x\nwant %x", m.payload, exp)
			}
		})
	}
}

// TestSequencesConsecutiveUnderConcurrency: concurrent publishers get distinct
// consecutive sequence numbers, and the wire carries them in order.
func TestSequencesConsecutiveUnderConcurrency(t *testing.T) {
	p := newPub(t, Options{HWM: -1})
	ch := subscribe(t, p)
	first := warmUp(t, p, ch)
	const goroutines, each = 4, 200
	var mu sync.Mutex
	var seqs []uint64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				var s uint64
				var err error
				if i%2 == 0 {
					s, err = p.Publish(&g, &BlockRemoved{BlockHashes: []uint64{uint64(i)}})
				} else {
					s, err = p.PublishRaw(payloadN(i))
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				seqs = append(seqs, s)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.Sort(seqs)
	for i, s := range seqs {
		if s != first+uint64(i) {
			t.Fatalf("seq[%d] = %d, want %d", i, s, first+uint64(i))
		}
	}
	for i := range goroutines * each {
		if m := recvLive(t, ch); m.seq != first+uint64(i) {
			t.Fatalf("live message %d has seq %d, want %d", i, m.seq, first+uint64(i))
		}
	}
}

func TestReplay(t *testing.T) {
	cases := []struct {
		name      string
		ring      int
		topic     bool
		published int
		start     uint64
		wantSeqs  []uint64
	}{
		{"from-zero", 0, false, 5, 0, []uint64{0, 1, 2, 3, 4}},
		{"from-middle", 0, false, 5, 3, []uint64{3, 4}},
		{"past-the-end", 0, false, 5, 9, nil},
		{"topic-frame", 0, true, 3, 1, []uint64{1, 2}},
		// The ring kept only 6..9: the reply starts at the oldest kept, and the
		// caller detects the gap from the first seq (vLLM sends no other signal).
		{"ring-overflow", 4, false, 10, 2, []uint64{6, 7, 8, 9}},
		{"ring-overflow-inside", 4, false, 10, 7, []uint64{7, 8, 9}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newPub(t, Options{Topic: "kv-events", ReplayEndpoint: "tcp://127.0.0.1:0",
				RingSize: c.ring, ReplayTopicFrame: c.topic})
			for i := range c.published {
				if _, err := p.PublishRaw(payloadN(i)); err != nil {
					t.Fatal(err)
				}
			}
			replies := replay(t, p.ReplayEndpoint(), replayRequest(c.start)...)
			var seqs []uint64
			for i, f := range replies {
				if c.topic {
					if len(f) != 4 || len(f[0]) != 0 || string(f[1]) != "kv-events" {
						t.Fatalf("reply %d: want [empty, topic, seq, payload], got %q", i, f)
					}
					f = [][]byte{f[0], f[2], f[3]}
				}
				if len(f) != 3 || len(f[0]) != 0 || len(f[1]) != 8 {
					t.Fatalf("reply %d: want [empty, seq, payload], got %q", i, f)
				}
				if i == len(replies)-1 {
					break // END marker, checked by replay()
				}
				s := binary.BigEndian.Uint64(f[1])
				if !bytes.Equal(f[2], payloadN(int(s))) {
					t.Fatalf("reply seq %d: payload differs from the live one", s)
				}
				seqs = append(seqs, s)
			}
			if !slices.Equal(seqs, c.wantSeqs) {
				t.Fatalf("replayed seqs %v, want %v", seqs, c.wantSeqs)
			}
			eventually(t, "stats", func() bool { return p.Stats().ReplayRequests == 1 })
			if st := p.Stats(); st.Replayed != uint64(len(c.wantSeqs)) {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// TestMalformedReplayRequestIgnored: like vLLM, a bad request gets no reply
// and the endpoint keeps serving good ones.
func TestMalformedReplayRequestIgnored(t *testing.T) {
	p := newPub(t, Options{ReplayEndpoint: "tcp://127.0.0.1:0"})
	if _, err := p.PublishRaw(payloadN(0)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	d := zmq4.NewDealer(ctx)
	defer d.Close()
	if err := d.Dial(p.ReplayEndpoint()); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][][]byte{
		{{}, {1, 2, 3}},         // short seq
		{{}},                    // no seq
		{{1}, be64(0)},          // non-empty delimiter
		{{}, be64(0), []byte{}}, // extra frame
	} {
		if err := d.Send(zmq4.NewMsgFrom(bad...)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "4 bad requests counted", func() bool { return p.Stats().BadReplayRequests == 4 })
	if got := replay(t, p.ReplayEndpoint(), replayRequest(0)...); len(got) != 2 {
		t.Fatalf("good request after bad ones: %d replies, want 2", len(got))
	}
}

// TestDropLive: a dropped batch is numbered and kept for replay but never sent
// live; the subscriber sees the gap.
func TestDropLive(t *testing.T) {
	var drop sync.Map
	p := newPub(t, Options{ReplayEndpoint: "tcp://127.0.0.1:0",
		DropLive: func(s uint64) bool { _, ok := drop.Load(s); return ok }})
	ch := subscribe(t, p)
	first := warmUp(t, p, ch)
	drop.Store(first+1, true)
	drop.Store(first+2, true)
	for i := range 4 {
		if _, err := p.PublishRaw(payloadN(i)); err != nil {
			t.Fatal(err)
		}
	}
	if m := recvLive(t, ch); m.seq != first {
		t.Fatalf("first live seq %d, want %d", m.seq, first)
	}
	if m := recvLive(t, ch); m.seq != first+3 {
		t.Fatalf("after the drop live seq %d, want %d", m.seq, first+3)
	}
	if st := p.Stats(); st.LiveDropped != 2 {
		t.Fatalf("stats %+v", st)
	}
	replies := replay(t, p.ReplayEndpoint(), replayRequest(first+1)...)
	if len(replies) != 4 { // first+1, first+2, first+3, END
		t.Fatalf("%d replies, want 4", len(replies))
	}
	for i, f := range replies[:2] {
		if s := binary.BigEndian.Uint64(f[1]); s != first+1+uint64(i) || !bytes.Equal(f[2], payloadN(1+i)) {
			t.Fatalf("reply %d: seq %d", i, s)
		}
	}
}

func TestNewValidates(t *testing.T) {
	cases := []struct {
		name string
		opts Options
	}{
		{"no-endpoint", Options{}},
		{"negative-ring", Options{Endpoint: "tcp://127.0.0.1:0", RingSize: -1}},
		{"bad-shape", Options{Endpoint: "tcp://127.0.0.1:0", Shape: 9}},
		{"bad-transport", Options{Endpoint: "nope://x"}},
		{"bad-replay", Options{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:notaport"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.opts.Logger = quiet()
			if p, err := New(context.Background(), c.opts); err == nil {
				p.Close()
				t.Fatal("New accepted invalid options")
			}
		})
	}
}

func TestEndpointsAreDialable(t *testing.T) {
	p := newPub(t, Options{Endpoint: "tcp://*:0", ReplayEndpoint: "tcp://0.0.0.0:0"})
	for _, ep := range []string{p.Endpoint(), p.ReplayEndpoint()} {
		if !bytes.HasPrefix([]byte(ep), []byte("tcp://127.0.0.1:")) || bytes.HasSuffix([]byte(ep), []byte(":0")) {
			t.Fatalf("endpoint %q is not a dialable loopback address", ep)
		}
	}
	if newPub(t, Options{}).ReplayEndpoint() != "" {
		t.Fatal("replay endpoint without ReplayEndpoint")
	}
}

func TestClose(t *testing.T) {
	p := newPub(t, Options{ReplayEndpoint: "tcp://127.0.0.1:0"})
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := p.Publish(nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Publish after Close: %v", err)
	}
	if _, err := p.PublishRaw(nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("PublishRaw after Close: %v", err)
	}
}

func FuzzParseReplayRequest(f *testing.F) {
	f.Add([]byte("id"), []byte{}, be64(7), 3)
	f.Add([]byte{}, []byte{1}, []byte{1, 2}, 2)
	f.Fuzz(func(t *testing.T, id, delim, seq []byte, n int) {
		frames := [][]byte{id, delim, seq, id}
		frames = frames[:max(0, min(n, len(frames)))]
		gotID, start, err := parseReplayRequest(frames)
		valid := len(frames) == 3 && len(delim) == 0 && len(seq) == 8
		if (err == nil) != valid {
			t.Fatalf("frames %q: err %v, valid %v", frames, err, valid)
		}
		if err == nil && (!bytes.Equal(gotID, id) || start != binary.BigEndian.Uint64(seq)) {
			t.Fatalf("parsed %q %d", gotID, start)
		}
	})
}
