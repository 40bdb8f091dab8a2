package soak

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvselect/kvselect/engines/kvlisten"
	"github.com/kvselect/kvselect/internal/peerproc"
	"github.com/kvselect/kvselect/mockworker"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/index"
)

// TestLossyKVStreamKeepsIndexTrue is the soak's index-truth invariant for one
// engine, in process and in seconds: a mock worker under load publishes its
// KV events through the lossy proxy (drops, duplicates, reorders) and its
// replay endpoint through the TCP proxy (sometimes down), kvselect's listener
// indexes what arrives, and once the faults stop the index must hold exactly
// the blocks the worker caches. A loss the listener knows of (a replay that
// failed) is repaired as the soak repairs it, by attaching the rank again.
func TestLossyKVStreamKeepsIndexTrue(t *testing.T) {
	if testing.Short() {
		t.Skip("a few seconds of load per seed")
	}
	for seed := range uint64(4) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runLossyStream(t, seed) })
	}
}

func runLossyStream(t *testing.T, seed uint64) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	const blockSize = 4
	kvPort, err := peerproc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	replayPort, err := peerproc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cfg := mockworker.Config{
		WorkerID: 7, BlockSize: blockSize, NumBlocks: 48, MaxNumSeqs: 6,
		PrefillPerToken: 20 * time.Microsecond, DecodePerToken: time.Millisecond,
		KVEventsEndpoint: fmt.Sprintf("tcp://127.0.0.1:%d", kvPort),
		ReplayEndpoint:   fmt.Sprintf("tcp://127.0.0.1:%d", replayPort),
		ReplayRing:       100000,
		Logger:           slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	// The worker under test; restart replaces it with a fresh one (an empty
	// cache, a sequence from 0) on the same ports, as a restarted engine.
	var wmu sync.RWMutex
	var w *mockworker.Worker
	start := func() {
		nw, err := mockworker.New(cfg)
		if err == nil {
			err = nw.Start(ctx)
		}
		for i := 0; err != nil && i < 50; i++ { // the old sockets' ports may take a moment to free
			time.Sleep(20 * time.Millisecond)
			if nw, err = mockworker.New(cfg); err == nil {
				err = nw.Start(ctx)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		wmu.Lock()
		w = nw
		wmu.Unlock()
	}
	current := func() *mockworker.Worker {
		wmu.RLock()
		defer wmu.RUnlock()
		return w
	}
	start()
	t.Cleanup(func() { current().Close() })
	kv, err := newKVProxy(fmt.Sprintf("tcp://127.0.0.1:%d", kvPort), false, seed)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kv.close)
	rp, err := newTCPProxy(fmt.Sprintf("127.0.0.1:%d", replayPort))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rp.close)

	ix, err := index.New(index.Config{BlockSize: blockSize})
	if err != nil {
		t.Fatal(err)
	}
	l := kvlisten.New(ctx, kvlisten.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		ReconnectMin: 20 * time.Millisecond, ReconnectMax: 200 * time.Millisecond,
		ReplayTimeout: 500 * time.Millisecond, DialTimeout: 500 * time.Millisecond})
	t.Cleanup(l.Close)
	part := index.Partition{Model: "m", RoutingGroup: "g"}
	wk := index.WorkerKey{WorkerID: 7}
	attach := func() {
		if err := l.Attach(selection.RankAttachment{Partition: part, Worker: wk, BlockSize: blockSize, Index: ix,
			Endpoints: catalog.RankEndpoints{KVEvents: kv.pubEndpoint(), Replay: rp.endpoint()}}); err != nil {
			t.Fatal(err)
		}
	}
	// detach is what the service does when a worker leaves the catalog.
	detach := func() {
		l.Detach(part, wk)
		ix.RemoveRank(wk)
	}
	attach()

	// Load: prompts over a few shared documents, so that blocks are shared,
	// evicted (48 blocks hold a handful of prompts) and stored again.
	rng := rand.New(rand.NewPCG(seed, 0x6c6f7373))
	docs := make([][]uint32, 10)
	for i := range docs {
		for range 3 * blockSize {
			docs[i] = append(docs[i], uint32(rng.IntN(30000)+1))
		}
	}
	var mu sync.Mutex // guards rng
	prompt := func() ([]uint32, int) {
		mu.Lock()
		defer mu.Unlock()
		p := slices.Clone(docs[rng.IntN(len(docs))])
		for range rng.IntN(3*blockSize) + 1 {
			p = append(p, uint32(rng.IntN(30000)+1))
		}
		return p, rng.IntN(2*blockSize) + 1
	}
	load, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for load.Err() == nil {
				toks, out := prompt()
				current().Generate(load, mockworker.Request{Tokens: toks, MaxTokens: out})
			}
		})
	}

	// Faults: the proxy's mode and the replay endpoint change every 100–400
	// ms; now and then the worker restarts, with the rank left attached (a
	// crash) or detached first and attached again (a drain).
	modes := []proxyMode{passAll, dropSome, duplicate, reorder}
	faults := rand.New(rand.NewPCG(seed, 0x6661756c74)) // the load's rng is the load goroutines'
	end := time.Now().Add(4 * time.Second)
	for time.Now().Before(end) {
		kv.setMode(modes[faults.IntN(len(modes))])
		rp.setDown(faults.IntN(4) == 0)
		switch faults.IntN(8) {
		case 0:
			current().Close()
			start()
		case 1:
			detach()
			current().Close()
			start()
			attach()
		}
		time.Sleep(time.Duration(100+faults.IntN(300)) * time.Millisecond)
	}
	kv.setMode(passAll)
	rp.setDown(false)
	stopLoad()
	wg.Wait()

	// A rank that knows it lost something leaves the catalog and comes back,
	// as the soak's driver makes it do; then a nudge (one more request)
	// until the index agrees, or thirty seconds (it takes well under one;
	// the race detector and a busy machine slow it down).
	deadline := time.Now().Add(30 * time.Second)
	for round := 0; ; round++ {
		st, _ := l.Status(part, wk)
		if st.Lost > 0 {
			detach()
			attach()
		}
		missing, extra := compareWithPool(current(), ix)
		if len(missing)+len(extra) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("index disagrees with the worker's cache: %d missing %x, %d extra %x; listener %+v; worker %+v; proxy forwarded %d, dropped %d, duplicated %d, reordered %d",
				len(missing), missing, len(extra), extra, st, current().Loads(),
				kv.forwarded.Load(), kv.dropped.Load(), kv.duplicated.Load(), kv.reordered.Load())
		}
		toks := make([]uint32, blockSize+1)
		for i := range toks {
			toks[i] = uint32(31000 + round*7 + i) // inside the mock's 32,000-token vocabulary
		}
		if _, err := current().Generate(ctx, mockworker.Request{Tokens: toks, MaxTokens: 1}); err != nil {
			t.Fatalf("nudge: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// compareWithPool returns the blocks worker w caches that ix does not hold
// (missing) and the ones ix holds that w does not (extra).
func compareWithPool(w *mockworker.Worker, ix *index.Index) (missing, extra []uint64) {
	indexed := map[int]map[uint64]bool{}
	indexedBlocks(ix.Snapshot(), indexed)
	var pool []uint64
	for _, b := range w.CachedBlocks(0) {
		pool = append(pool, b.Hash)
	}
	return diffBlocks(pool, indexed[int(w.Config().WorkerID)])
}
