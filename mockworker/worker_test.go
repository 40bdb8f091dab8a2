package mockworker

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvselect/kvselect/engines/kvevents"
	"github.com/kvselect/kvselect/engines/kvlisten"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/kvhash"
)

const waitFor = 30 * time.Second

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

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

// fakeClock never sleeps: it advances its time by each Sleep and records the
// durations, so the timing model is checked exactly.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sleeps = append(c.sleeps, d)
	c.now = c.now.Add(d)
	return ctx.Err()
}

// fast is a worker config whose requests take no wall time.
func fast(cfg Config) Config {
	if cfg.Clock == nil {
		cfg.Clock = &fakeClock{now: time.Unix(1700000000, 0)}
	}
	cfg.Logger = quiet()
	return cfg
}

func newWorker(t *testing.T, cfg Config) *Worker {
	t.Helper()
	w, err := New(fast(cfg))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

func toks(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

func TestTimingModel(t *testing.T) {
	clk := &fakeClock{}
	w := newWorker(t, Config{Clock: clk, BlockSize: 4, PrefillPerToken: time.Millisecond,
		DecodePerToken: 10 * time.Millisecond, DecodeBatchSlowdown: 0.5, Speedup: 2})
	ctx := context.Background()
	res, err := w.Generate(ctx, Request{Tokens: toks(300, 10), MaxTokens: 3})
	if err != nil {
		t.Fatal(err)
	}
	// 10 uncached tokens × 1 ms / 2, then two decode steps of 10 ms / 2 (alone).
	want := []time.Duration{5 * time.Millisecond, 5 * time.Millisecond, 5 * time.Millisecond}
	if !equalDurations(clk.sleeps, want) {
		t.Fatalf("sleeps %v, want %v", clk.sleeps, want)
	}
	if res.TTFT != 5*time.Millisecond || res.Latency != 15*time.Millisecond || res.CachedTokens != 0 {
		t.Fatalf("result %+v", res)
	}
	// The same prompt again: 8 tokens (2 blocks) hit, 2 are computed.
	clk.sleeps = nil
	res, err = w.Generate(ctx, Request{Tokens: toks(300, 10), MaxTokens: 1})
	if err != nil {
		t.Fatal(err)
	}
	if res.CachedTokens != 8 || !equalDurations(clk.sleeps, []time.Duration{time.Millisecond}) {
		t.Fatalf("cached %d, sleeps %v", res.CachedTokens, clk.sleeps)
	}

	// Decode slows down with the batch: hold one request mid-decode, then
	// time another one's steps.
	clk.sleeps = nil
	hold, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := w.Generate(ctx, Request{Tokens: toks(500, 4), MaxTokens: 2, OnToken: func(i int, _ uint32) error {
			if i == 0 {
				close(hold)
				<-release
			}
			return nil
		}})
		done <- err
	}()
	<-hold
	clk.mu.Lock()
	clk.sleeps = nil
	clk.mu.Unlock()
	if _, err := w.Generate(ctx, Request{Tokens: toks(700, 2), MaxTokens: 2}); err != nil {
		t.Fatal(err)
	}
	// 2 tokens prefill (1 ms), one decode step with 2 running: 10 × 1.5 / 2.
	if want := []time.Duration{time.Millisecond, 7500 * time.Microsecond}; !equalDurations(clk.sleeps, want) {
		t.Fatalf("sleeps with 2 running %v, want %v", clk.sleeps, want)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func equalDurations(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestQueueingAndAbort(t *testing.T) {
	w := newWorker(t, Config{MaxNumSeqs: 1, BlockSize: 4})
	ctx := context.Background()
	hold, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, err := w.Generate(ctx, Request{Tokens: toks(300, 8), MaxTokens: 2, OnToken: func(i int, _ uint32) error {
			if i == 0 {
				close(hold)
				<-release
			}
			return nil
		}})
		first <- err
	}()
	<-hold
	// A second request waits; cancelling it leaves the queue.
	cctx, cancel := context.WithCancel(ctx)
	second := make(chan error, 1)
	go func() {
		_, err := w.Generate(cctx, Request{Tokens: toks(400, 8), MaxTokens: 1})
		second <- err
	}()
	eventually(t, "one waiting", func() bool { l := w.Loads()[0]; return l.Running == 1 && l.Waiting == 1 })
	cancel()
	if err := <-second; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	if l := w.Loads()[0]; l.Waiting != 0 {
		t.Fatalf("loads after cancel %+v", l)
	}
	// A third waits and runs once the first finishes.
	third := make(chan error, 1)
	go func() {
		_, err := w.Generate(ctx, Request{Tokens: toks(500, 8), MaxTokens: 1})
		third <- err
	}()
	eventually(t, "third waiting", func() bool { return w.Loads()[0].Waiting == 1 })
	close(release)
	for _, ch := range []chan error{first, third} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	if l := w.Loads()[0]; l.Running != 0 || l.Waiting != 0 || l.UsedBlocks != 0 {
		t.Fatalf("loads at rest %+v", l)
	}
	// A consumer error aborts and releases.
	boom := errors.New("client gone")
	if _, err := w.Generate(ctx, Request{Tokens: toks(600, 8), MaxTokens: 5, OnToken: func(int, uint32) error { return boom }}); !errors.Is(err, boom) {
		t.Fatalf("consumer error: %v", err)
	}
	if l := w.Loads()[0]; l.Running != 0 || l.UsedBlocks != 0 {
		t.Fatalf("loads after abort %+v", l)
	}
}

func TestGenerateRejects(t *testing.T) {
	w := newWorker(t, Config{BlockSize: 4, NumBlocks: 8, MaxModelLen: 64, VocabSize: 1000, DPSize: 2, DPStartRank: 4})
	three, nine := 3, 9
	for _, c := range []struct {
		name string
		req  Request
	}{
		{"empty", Request{MaxTokens: 1}},
		{"no-output", Request{Tokens: toks(300, 4)}},
		{"too-long", Request{Tokens: toks(300, 60), MaxTokens: 5}},
		{"more-blocks-than-pool", Request{Tokens: toks(300, 40), MaxTokens: 1}},
		{"out-of-vocab", Request{Tokens: []uint32{5, 1000}, MaxTokens: 1}},
		{"rank-below", Request{Tokens: toks(300, 4), MaxTokens: 1, DPRank: &three}},
		{"rank-above", Request{Tokens: toks(300, 4), MaxTokens: 1, DPRank: &nine}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := w.Generate(context.Background(), c.req); !errors.Is(err, ErrInvalidRequest) {
				t.Fatalf("err %v, want ErrInvalidRequest", err)
			}
		})
	}
}

func TestNewValidatesConfig(t *testing.T) {
	for _, c := range []Config{
		{BlockSize: -1},
		{NumBlocks: -4},
		{DPSize: -1},
		{Speedup: -2},
		{VocabSize: 10},
		{DecodeBatchSlowdown: -1},
		{ReplayEndpoint: "tcp://127.0.0.1:0"},
		{KVEventsEndpoint: "udp://x:1"},
		{KVEventsEndpoint: "tcp://127.0.0.1:65535", DPSize: 2},
		{KVEventsEndpoint: "tcp://127.0.0.1:0", KVEventsCollector: "tcp://127.0.0.1:5557"},
		{KVEventsCollector: "udp://127.0.0.1:5557"},
		{KVEventsCollector: "tcp://127.0.0.1"},
	} {
		if _, err := New(fast(c)); err == nil {
			t.Errorf("New accepted %+v", c)
		}
	}
}

func TestOffsetEndpoint(t *testing.T) {
	for _, c := range []struct {
		ep   string
		r    int
		want string
	}{
		{"tcp://*:5557", 0, "tcp://*:5557"},
		{"tcp://*:5557", 3, "tcp://*:5560"},
		{"tcp://127.0.0.1:0", 2, "tcp://127.0.0.1:0"},
		{"tcp://[::1]:7000", 1, "tcp://[::1]:7001"},
		{"ipc:///tmp/kv", 1, "ipc:///tmp/kv_dp1"},
		{"inproc://kv", 0, "inproc://kv"},
	} {
		got, err := OffsetEndpoint(c.ep, c.r)
		if err != nil || got != c.want {
			t.Errorf("OffsetEndpoint(%q, %d) = %q, %v; want %q", c.ep, c.r, got, err, c.want)
		}
	}
	for _, bad := range []string{"5557", "tcp://host", "tcp://host:x", "http://h:1"} {
		if _, err := OffsetEndpoint(bad, 1); err == nil {
			t.Errorf("OffsetEndpoint(%q) accepted", bad)
		}
	}
}

// TestEventStreamMatchesPool is the ground-truth test: a random workload over
// two data-parallel ranks with small pools (so blocks are evicted, and one
// prefix-cache reset in the middle), consumed by kvselect's real listeners
// into a real index. Once the listeners have caught up, every rank's indexed
// blocks are exactly the rank's cached blocks, engine hash and content hash
// alike.
func TestEventStreamMatchesPool(t *testing.T) {
	const bs = 4
	w := newWorker(t, Config{BlockSize: bs, NumBlocks: 48, DPSize: 2, DPStartRank: 2, MaxNumSeqs: 4,
		KVEventsEndpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", EventsTopic: "kv-events"})
	ix, err := index.New(index.Config{BlockSize: bs})
	if err != nil {
		t.Fatal(err)
	}
	l := kvlisten.New(context.Background(), kvlisten.Options{Logger: quiet(),
		ReconnectMin: 20 * time.Millisecond, ReconnectMax: 200 * time.Millisecond})
	t.Cleanup(l.Close)
	part := index.Partition{Model: "m", RoutingGroup: "g"}
	eps := w.Endpoints()
	if len(eps) != 2 || eps[0].DPRank != 2 || eps[1].DPRank != 3 {
		t.Fatalf("endpoints %+v", eps)
	}
	for _, e := range eps {
		if err := l.Attach(selection.RankAttachment{Partition: part, Worker: index.WorkerKey{WorkerID: 1, DPRank: uint32(e.DPRank)},
			BlockSize: bs, Index: ix, Endpoints: catalog.RankEndpoints{KVEvents: e.KVEvents, Replay: e.Replay}}); err != nil {
			t.Fatal(err)
		}
	}

	r := rand.New(rand.NewPCG(5, 6))
	prefixes := [][]uint32{toks(1000, 24), toks(2000, 13), toks(3000, 40), nil}
	workload := func(n int) {
		var wg sync.WaitGroup
		sem := make(chan struct{}, 6)
		for range n {
			prompt := append([]uint32(nil), prefixes[r.IntN(len(prefixes))]...)
			for range 1 + r.IntN(20) {
				prompt = append(prompt, uint32(300+r.IntN(50)))
			}
			req := Request{Tokens: prompt, MaxTokens: 1 + r.IntN(12)}
			if r.IntN(2) == 0 {
				rank := 2 + r.IntN(2)
				req.DPRank = &rank
			}
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				if _, err := w.Generate(context.Background(), req); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
	}
	workload(150)
	if err := w.ResetPrefixCache(); err != nil {
		t.Fatal(err)
	}
	workload(150)

	// Nudge each rank until its listener has applied its last batch: a
	// subscriber that connected after the last live batch would otherwise
	// never hear of it. Distinct one-block prompts add harmless blocks.
	nudge := 0
	for _, e := range eps {
		wk := index.WorkerKey{WorkerID: 1, DPRank: uint32(e.DPRank)}
		eventually(t, "listener caught up", func() bool {
			st, ok := l.Status(part, wk)
			next := w.Loads()[e.DPRank-2].NextEventSeq
			// LastSeq moves when a batch is queued for the index, Applied when
			// it has been applied: wait for both.
			if ok && st.Synced && st.LastSeq == next-1 && st.Applied == next {
				return true
			}
			nudge++
			rank := e.DPRank
			if _, err := w.Generate(context.Background(), Request{Tokens: toks(20000+nudge*bs, bs+1), MaxTokens: 1, DPRank: &rank}); err != nil {
				t.Fatal(err)
			}
			return false
		})
		if st, _ := l.Status(part, wk); st.Failed != 0 || st.DecodeErrors != 0 || st.Lost != 0 {
			t.Fatalf("rank %d listener status %+v", e.DPRank, st)
		}
	}

	// Compare the index with the pools.
	type blk struct{ ext, local uint64 }
	indexed := map[int]map[blk]bool{2: {}, 3: {}}
	for _, ev := range ix.Snapshot().Events {
		if ev.Event.Data.Stored == nil {
			continue
		}
		for _, b := range ev.Event.Data.Stored.Blocks {
			indexed[int(ev.Event.DPRank)][blk{uint64(b.BlockHash), uint64(b.TokensHash)}] = true
		}
	}
	for rank := 2; rank <= 3; rank++ {
		pool := w.CachedBlocks(rank)
		// The replay ring holds the rank's whole history: folded, it is the pool.
		replayed, batches := replayedBlocks(t, eps[rank-2].Replay, bs)
		if len(replayed) != len(pool) {
			t.Errorf("rank %d: replayed history (%d batches) leaves %d blocks, pool has %d", rank, batches, len(replayed), len(pool))
		}
		for _, b := range pool {
			if !replayed[b.Hash] {
				t.Errorf("rank %d: pool block %x missing from the replayed history", rank, b.Hash)
			}
		}
		want := map[blk]bool{}
		for _, b := range pool {
			local := kvhash.LocalBlockHashes(b.Tokens, "", "", kvhash.BlockOptions{BlockSize: bs})[0]
			want[blk{b.Hash, local}] = true
		}
		if len(want) != len(indexed[rank]) {
			t.Errorf("rank %d: pool has %d blocks, index %d", rank, len(want), len(indexed[rank]))
		}
		byHash := map[uint64]CachedBlock{}
		for _, b := range pool {
			byHash[b.Hash] = b
		}
		for b := range want {
			if !indexed[rank][b] {
				// Say whether the index holds the block's whole chain (a
				// snapshot problem) or not (an event problem).
				var chain []CachedBlock
				for c, ok := byHash[b.ext]; ok; c, ok = byHash[c.Parent] {
					chain = append([]CachedBlock{c}, chain...)
					if !c.HasParent {
						break
					}
				}
				var all []uint32
				for _, c := range chain {
					all = append(all, c.Tokens...)
				}
				locals := kvhash.LocalBlockHashes(all, "", "", kvhash.BlockOptions{BlockSize: bs})
				var held uint32
				for _, o := range ix.Match(locals, false, nil) {
					if o.Worker.DPRank == uint32(rank) {
						held = o.Device
					}
				}
				t.Errorf("rank %d: pool block %x (local %x, chain of %d) not in the snapshot; Match finds %d of the chain",
					rank, b.ext, b.local, len(chain), held)
			}
		}
		for b := range indexed[rank] {
			if !want[b] {
				t.Errorf("rank %d: indexed block %x is not in the pool", rank, b.ext)
			}
		}
	}
	for _, ld := range w.Loads() {
		if ld.EvictedBlocks == 0 {
			t.Errorf("rank %d evicted nothing: the workload did not exercise eviction", ld.DPRank)
		}
		if ld.Running != 0 || ld.Waiting != 0 || ld.UsedBlocks != 0 {
			t.Fatalf("loads at rest %+v", ld)
		}
	}
}

// gateClock blocks every Sleep until the test releases it, reporting each
// sleep as it starts.
type gateClock struct {
	entered chan time.Duration
	release chan struct{}
}

func (c *gateClock) Now() time.Time { return time.Unix(1700000000, 0) }
func (c *gateClock) Sleep(ctx context.Context, d time.Duration) error {
	c.entered <- d
	select {
	case <-c.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func TestPrefillSlots(t *testing.T) {
	for _, slots := range []int{0, 1} {
		t.Run(fmt.Sprintf("slots=%d", slots), func(t *testing.T) {
			clk := &gateClock{entered: make(chan time.Duration, 4), release: make(chan struct{})}
			w := newWorker(t, Config{Clock: clk, BlockSize: 4, PrefillPerToken: time.Millisecond, PrefillSlots: slots})
			errs := make(chan error, 2)
			for i := range 2 {
				go func() {
					_, err := w.Generate(context.Background(), Request{Tokens: toks(1000*(i+1), 8), MaxTokens: 1})
					errs <- err
				}()
			}
			<-clk.entered // one prefill runs
			if slots == 0 {
				select {
				case <-clk.entered: // the second runs beside it
				case <-time.After(10 * time.Second):
					t.Fatal("unlimited slots, yet the second prefill did not start")
				}
			} else {
				select {
				case <-clk.entered:
					t.Fatal("a second prefill started while the only slot was taken")
				case <-time.After(100 * time.Millisecond):
				}
				clk.release <- struct{}{} // end the first prefill: the second takes the slot
				<-clk.entered
			}
			close(clk.release)
			for range 2 {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// replayedBlocks fetches a rank's whole event history from its replay ring
// over a real DEALER and folds it into the set of engine hashes it leaves.
func replayedBlocks(t *testing.T, ep string, bs int) (map[uint64]bool, uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	d := zmq4.NewDealer(ctx)
	defer d.Close()
	if err := d.Dial(ep); err != nil {
		t.Fatal(err)
	}
	if err := d.Send(zmq4.NewMsgFrom([]byte{}, make([]byte, 8))); err != nil {
		t.Fatal(err)
	}
	dec, err := kvevents.NewDecoder(kvevents.Config{WorkerID: 1, BlockSize: bs})
	if err != nil {
		t.Fatal(err)
	}
	set := map[uint64]bool{}
	var n uint64
	for {
		msg, err := d.Recv()
		if err != nil {
			t.Fatal(err)
		}
		f := msg.Frames
		if len(f) != 3 || len(f[2]) == 0 {
			return set, n
		}
		if s := binary.BigEndian.Uint64(f[1]); s != n {
			t.Fatalf("replay seq %d, want %d", s, n)
		}
		n++
		evs, _, err := dec.Decode(f[2], nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			switch e.Kind {
			case index.EventStored:
				for _, b := range e.Blocks {
					set[b.Ext] = true
				}
			case index.EventRemoved:
				for _, h := range e.Hashes {
					delete(set, h)
				}
			case index.EventCleared:
				clear(set)
			}
		}
	}
}
