package kvlisten

import (
	"context"
	"testing"
	"time"

	"github.com/kvselect/kvselect/mockworker/kvpublish"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

// Tests against kvpublish, the project's vLLM-format publisher (the mock
// worker's), through real loopback sockets.

func (w *workload) publishEvents(i int) []kvpublish.Event {
	var out []kvpublish.Event
	for _, ev := range w.batches[i] {
		switch ev.Kind {
		case "BlockStored":
			st := &kvpublish.BlockStored{BlockHashes: ev.Hashes, ParentBlockHash: ev.Parent, TokenIDs: ev.Tokens,
				BlockSize: blockSize, Medium: ev.Medium}
			if ev.Lora != "" {
				l := ev.Lora
				st.LoraName = &l
			}
			out = append(out, st)
		case "BlockRemoved":
			out = append(out, &kvpublish.BlockRemoved{BlockHashes: ev.Hashes, Medium: ev.Medium})
		default:
			out = append(out, kvpublish.AllBlocksCleared{})
		}
	}
	return out
}

func newPublisher(t *testing.T, opts kvpublish.Options) *kvpublish.Publisher {
	t.Helper()
	if opts.Endpoint == "" {
		opts.Endpoint = "tcp://127.0.0.1:0"
	}
	opts.Logger = quietLogger()
	p, err := kvpublish.New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// heartbeat publishes empty batches until the returned stop is called, so that
// a subscriber notices trailing gaps (vLLM itself is silent when idle).
func heartbeat(p *kvpublish.Publisher, rank int) (stop func()) {
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		tk := time.NewTicker(10 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-done:
				return
			case <-tk.C:
				p.Publish(&rank)
			}
		}
	}()
	return func() { close(done); <-exited }
}

// TestLanesDroppedBatchesGroundTruth: six engines with random workloads, a
// sixth of each one's batches withheld from the live stream, feed one index
// through two writer lanes. After replay the index equals every engine's
// ground truth: per-rank order survived the lanes and nothing was lost.
func TestLanesDroppedBatchesGroundTruth(t *testing.T) {
	ix := newIndex(t)
	l := New(context.Background(), Options{Logger: quietLogger(), Lanes: 2,
		ReconnectMin: 20 * time.Millisecond, ReconnectMax: 200 * time.Millisecond})
	t.Cleanup(l.Close)
	const engines = 6
	type run struct {
		w   *workload
		wk  index.WorkerKey
		pub *kvpublish.Publisher
	}
	runs := make([]run, engines)
	for i := range runs {
		w := newWorkload(uint64(500+i), 250, 1.0/6)
		shape := kvpublish.ShapeMap
		if i%2 == 1 {
			shape = kvpublish.ShapePositional
		}
		pub := newPublisher(t, kvpublish.Options{ReplayEndpoint: "tcp://127.0.0.1:0", Shape: shape,
			ReplayTopicFrame: i%3 == 0, DropLive: func(seq uint64) bool { return seq < uint64(len(w.drop)) && w.drop[seq] }})
		wk := index.WorkerKey{WorkerID: uint64(60 + i/2), DPRank: uint32(i % 2)}
		if err := l.Attach(attachment(ix, wk, pub.Endpoint(), pub.ReplayEndpoint())); err != nil {
			t.Fatal(err)
		}
		runs[i] = run{w, wk, pub}
	}
	for _, r := range runs {
		eventually(t, "connected", func() bool { return status(t, l, r.wk).Connected })
	}
	for i := range runs[0].w.batches {
		for _, r := range runs {
			rank := int(r.wk.DPRank)
			if _, err := r.pub.Publish(&rank, r.w.publishEvents(i)...); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, r := range runs {
		stop := heartbeat(r.pub, int(r.wk.DPRank))
		// The index can equal the ground truth before the last withheld
		// batch is replayed (when its events change nothing the later ones
		// keep) and a batch's count is taken after the index applied it, so
		// wait for both.
		withheld := uint64(countTrue(r.w.drop))
		deadline := time.Now().Add(6 * waitFor) // six engines' worth of replays on a shared machine
		for {
			err := r.w.check(ix, r.wk)
			st := status(t, l, r.wk)
			if err == nil && st.Replayed >= withheld {
				break
			}
			if time.Now().After(deadline) {
				stop()
				t.Fatalf("engine %v: index check %v, replayed %d of %d withheld\nstatus %+v\npublisher next %d stats %+v",
					r.wk, err, st.Replayed, withheld, st, r.pub.NextSeq(), r.pub.Stats())
			}
			time.Sleep(5 * time.Millisecond)
		}
		stop()
		if st := status(t, l, r.wk); st.Lost != 0 || st.DecodeErrors != 0 || st.Failed != 0 {
			t.Fatalf("engine %v: %+v", r.wk, st)
		}
	}
}

// A publisher that restarts at the same address starts its sequence over
// with an empty cache (an engine container that crashed and came back with
// the same pod address). The listener recognizes it by the first batch of its
// new session falling below the watermark, drops the earlier incarnation's
// blocks and catches up on the new stream from its start: the index holds
// exactly what the restarted engine holds, with no re-registration.
// (Dynamo's standalone selection service asks for DELETE then POST of the
// worker instead, under "Worker Restarts"; that still works, see below.)
func TestPublisherRestartSameAddress(t *testing.T) {
	l := newListeners(t)
	svc, err := selection.New(selection.Config{Router: routerconfig.Default(), Listeners: l})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a := newPublisher(t, kvpublish.Options{ReplayEndpoint: "tcp://127.0.0.1:0"})
	pubEP, replayEP := a.Endpoint(), a.ReplayEndpoint()
	endpoint, bs, rank0 := "http://worker:8000", uint32(blockSize), uint32(0)
	rec := catalog.Record{WorkerID: 21, ModelName: "m", Endpoint: &endpoint, BlockSize: &bs,
		KVEventsEndpoint: &pubEP, ReplayEndpoint: &replayEP, DataParallelStartRank: &rank0}
	if _, err := svc.UpsertWorker(ctx, rec); err != nil {
		t.Fatal(err)
	}
	p := index.Partition{Model: "m", RoutingGroup: catalog.DefaultPartitionName}
	wk := index.WorkerKey{WorkerID: 21}
	ix := attachedIndex(t, l, p, wk)
	before := newChain(0, 100, 8)
	for _, b := range before.batches {
		a.PublishRaw(b)
	}
	// A long-running engine: its watermark is far above where a restarted
	// one starts counting, whatever the reconnection takes.
	r0 := 0
	for range 1000 {
		a.Publish(&r0)
	}
	stopA := heartbeat(a, 0)
	eventually(t, "first engine's blocks", func() bool {
		st, _ := l.Status(p, wk)
		return device(ix, wk, before.locals) == 8 && st.LastSeq >= 1007
	})
	stopA()
	a.Close()

	// Same endpoints, sequence from 0 again, different blocks: published
	// before the listener reconnects, so only the replay brings them.
	b := newPublisher(t, kvpublish.Options{Endpoint: pubEP, ReplayEndpoint: replayEP})
	after := newChain(0, 900, 3)
	for _, batch := range after.batches {
		b.PublishRaw(batch)
	}
	stopB := heartbeat(b, 0)
	defer stopB()
	eventually(t, "the restarted engine's blocks", func() bool { return device(ix, wk, after.locals) == 3 })
	if got := device(ix, wk, before.locals); got != 0 {
		t.Fatalf("blocks of the engine before the restart survived it: %d of 8", got)
	}
	if st, _ := l.Status(p, wk); st.Restarts != 1 || st.Lost != 0 {
		t.Fatalf("status %+v, want one restart and nothing lost", st)
	}

	// Dynamo's documented procedure still gives the same index.
	if _, err := svc.DeleteWorker(ctx, 21); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.UpsertWorker(ctx, rec); err != nil {
		t.Fatal(err)
	}
	ix = attachedIndex(t, l, p, wk)
	eventually(t, "the restarted engine's blocks after re-registration", func() bool { return device(ix, wk, after.locals) == 3 })
	if got := device(ix, wk, before.locals); got != 0 {
		t.Fatalf("blocks of the engine before the restart came back: %d", got)
	}
}

// attachedIndex is the partition index the service handed the rank's
// listener.
func attachedIndex(t *testing.T, l *Listeners, p index.Partition, w index.WorkerKey) *index.Index {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.ranks[rankKey{p, w}]
	if r == nil {
		t.Fatalf("rank %v of %v not attached", w, p)
	}
	return r.a.Index
}
