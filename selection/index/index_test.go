package index

import (
	"cmp"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cfg      Config
		ok       bool
		warnings int
	}{
		{"events default", Config{BlockSize: 16}, true, 0},
		{"zero block size", Config{}, false, 0},
		{"approximate ttl", Config{BlockSize: 16, Approximate: true, CachePolicy: PolicyTTL}, true, 0},
		{"lru rejected with events", Config{BlockSize: 16, CachePolicy: PolicyLRU}, false, 0},
		{"lru falls back without events", Config{BlockSize: 16, Approximate: true, CachePolicy: PolicyLRU}, true, 1},
		{"unknown policy", Config{BlockSize: 16, CachePolicy: "fifo"}, false, 0},
		{"predicted ttl needs events", Config{BlockSize: 16, Approximate: true, PredictedTTL: time.Second}, false, 0},
		{"predicted ttl with events", Config{BlockSize: 16, PredictedTTL: time.Second}, true, 0},
		{"negative ttl", Config{BlockSize: 16, TTL: -1}, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			warn, err := tc.cfg.Validate()
			if tc.ok != (err == nil) || len(warn) != tc.warnings {
				t.Fatalf("warnings %v, err %v; want ok=%v and %d warnings", warn, err, tc.ok, tc.warnings)
			}
			if err != nil && !errors.Is(err, ErrConfig) {
				t.Fatalf("%v does not wrap ErrConfig", err)
			}
			if _, err := New(tc.cfg); tc.ok != (err == nil) {
				t.Fatalf("New: err = %v", err)
			}
		})
	}
}

func TestApproximateModeRecordsAndExpires(t *testing.T) {
	ix, err := New(Config{BlockSize: 16, Approximate: true, TTL: 120 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1000, 0)
	locals, seqs := []uint64{1, 2, 3}, []uint64{101, 102, 103}
	if ok, err := ix.RecordRouting(t0, w(1), locals, seqs); !ok || err != nil {
		t.Fatalf("record: %v %v", ok, err)
	}
	if ok, _ := ix.RecordRouting(t0.Add(60*time.Second), w(2), locals[:2], seqs[:2]); !ok {
		t.Fatal("second record not taken")
	}
	eq(t, scores(ix.primary, false, 1, 2, 3), map[WorkerKey]uint32{w(1): 3, w(2): 2})
	if n := ix.Expire(t0.Add(119 * time.Second)); n != 0 {
		t.Fatalf("expired %d blocks before the TTL", n)
	}
	// Refreshing worker 1's first block keeps it; the other two expire.
	ix.RecordRouting(t0.Add(100*time.Second), w(1), locals[:1], seqs[:1])
	if n := ix.Expire(t0.Add(120 * time.Second)); n != 2 {
		t.Fatalf("expired %d blocks at the TTL, want 2", n)
	}
	eq(t, scores(ix.primary, false, 1, 2, 3), map[WorkerKey]uint32{w(1): 1, w(2): 2})
	if n := ix.Expire(t0.Add(300 * time.Second)); n != 3 {
		t.Fatalf("expired %d, want 3", n)
	}
	if s := ix.Stats(); s.Nodes != 0 {
		t.Fatalf("index not empty after expiry: %+v", s)
	}
}

func TestEventModeDoesNotRecordRouting(t *testing.T) {
	ix, _ := New(Config{BlockSize: 16})
	if ok, _ := ix.RecordRouting(time.Unix(0, 0), w(1), []uint64{1}, []uint64{2}); ok {
		t.Fatal("an event-driven index without a predicted TTL must not record routing decisions")
	}
	if ix.Expire(time.Unix(1e9, 0)) != 0 {
		t.Fatal("nothing to expire")
	}
}

func TestPredictedTTLSideIndexMergesByMax(t *testing.T) {
	ix, _ := New(Config{BlockSize: 16, PredictedTTL: 5 * time.Second})
	t0 := time.Unix(50, 0)
	if err := ix.Apply(stored(w(1), 0, 1, 2)); err != nil {
		t.Fatal(err)
	}
	// Booked on worker 1 (already holds 2) and worker 2 (holds nothing yet).
	ix.RecordRouting(t0, w(1), []uint64{1, 2, 3, 4}, []uint64{11, 12, 13, 14})
	ix.RecordRouting(t0, w(2), []uint64{1, 2, 3}, []uint64{11, 12, 13})
	got := map[WorkerKey]uint32{}
	for _, o := range ix.Match([]uint64{1, 2, 3, 4}, false, nil) {
		got[o.Worker] = o.Device
	}
	eq(t, got, map[WorkerKey]uint32{w(1): 4, w(2): 3})
	// The side index is never dumped, and expires on its own.
	if evs := ix.Snapshot().Events; len(evs) != 1 {
		t.Fatalf("snapshot has %d events, want only the primary's one", len(evs))
	}
	ix.Expire(t0.Add(5 * time.Second))
	got = map[WorkerKey]uint32{}
	for _, o := range ix.Match([]uint64{1, 2, 3, 4}, false, nil) {
		got[o.Worker] = o.Device
	}
	eq(t, got, map[WorkerKey]uint32{w(1): 2})
	// Removing a worker clears both trees.
	ix.RecordRouting(t0, w(1), []uint64{1, 2, 3}, []uint64{11, 12, 13})
	ix.RemoveWorker(1)
	if got := ix.Match([]uint64{1, 2, 3}, false, nil); len(got) != 0 {
		t.Fatalf("after RemoveWorker: %v", got)
	}
}

func TestApproximateReplayGetsTTL(t *testing.T) {
	src, _ := New(Config{BlockSize: 16, Approximate: true})
	t0 := time.Unix(10, 0)
	src.RecordRouting(t0, w(1), []uint64{1, 2}, []uint64{5, 6})
	dst, _ := New(Config{BlockSize: 16, Approximate: true})
	if n, err := dst.Replay(t0, src.Snapshot().Events); n != 0 {
		t.Fatal(err)
	}
	if len(dst.Match([]uint64{1, 2}, false, nil)) != 1 {
		t.Fatal("replayed prediction missing")
	}
	if n := dst.Expire(t0.Add(DefaultTTL)); n != 2 {
		t.Fatalf("replayed predictions expired %d blocks, want 2", n)
	}
}

func TestBatchAndRankRemoval(t *testing.T) {
	ix, _ := New(Config{BlockSize: 16})
	r0, r1 := WorkerKey{1, 0}, WorkerKey{1, 1}
	failed, first := ix.ApplyBatch([]Event{*stored(r0, 0, 1, 2), *stored(r1, 0, 1), *stored(r1, 77, 3)})
	if failed != 1 || !errors.Is(first, ErrParentNotFound) {
		t.Fatalf("failed %d, first %v", failed, first)
	}
	ix.RemoveRank(r0)
	got := ix.Match([]uint64{1, 2}, false, nil)
	if len(got) != 1 || got[0].Worker != r1 {
		t.Fatalf("after RemoveRank: %v", got)
	}
}

// TestConcurrentReadersAndWriters runs lookups while events are applied; run it
// with -race. Every lookup must see a consistent tree: a worker's score never
// exceeds the longest chain it ever stored.
func TestConcurrentReadersAndWriters(t *testing.T) {
	ix, _ := New(Config{BlockSize: 16, PredictedTTL: time.Second})
	q := seqLocals(1, 65)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var dst []Overlap
			for {
				select {
				case <-stop:
					return
				default:
				}
				dst = ix.Match(q, r == 0, dst[:0])
				for _, o := range dst {
					if o.Device > 64 {
						t.Errorf("score %d beyond the stored chain", o.Device)
						return
					}
				}
			}
		}()
	}
	for i := range 300 {
		wk := w(uint64(i % 8))
		_ = ix.Apply(stored(wk, 0, q...))
		ix.RecordRouting(time.Unix(int64(i), 0), wk, q[:8], q[:8])
		_ = ix.Apply(removed(wk, q[32:]...))
		ix.Expire(time.Unix(int64(i), 0))
		if i%50 == 0 {
			ix.Snapshot()
			ix.RemoveWorker(uint64(i % 8))
		}
	}
	close(stop)
	wg.Wait()
}

// TestTTLTrackerMatchesAModel: recordings of whole chains at once, refreshed
// and re-recorded in random order across compactions, expire exactly when a
// per-hash model of their last deadline says.
func TestTTLTrackerMatchesAModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	tt := newTTLTracker(10 * time.Second)
	model := map[ttlKey]int64{}
	now := time.Unix(1000, 0)
	for step := range 3000 {
		now = now.Add(time.Duration(rng.IntN(900)) * time.Millisecond)
		wk := WorkerKey{WorkerID: uint64(rng.IntN(3))}
		exts := make([]uint64, 1+rng.IntN(300))
		base := uint64(rng.IntN(50)) * 1000
		for i := range exts {
			exts[i] = base + uint64(i)
		}
		tt.touch(now, wk, exts)
		for _, e := range exts {
			model[ttlKey{wk, e}] = now.Add(10 * time.Second).UnixNano()
		}
		if step%7 == 0 {
			var got []ttlKey
			tt.expired(now, func(k ttlKey) { got = append(got, k) })
			var want []ttlKey
			for k, d := range model {
				if d <= now.UnixNano() {
					want = append(want, k)
					delete(model, k)
				}
			}
			sortKeys := func(ks []ttlKey) {
				slices.SortFunc(ks, func(a, b ttlKey) int {
					return cmp.Or(CompareWorkerKeys(a.worker, b.worker), cmp.Compare(a.ext, b.ext))
				})
			}
			sortKeys(got)
			sortKeys(want)
			if !slices.Equal(got, want) {
				t.Fatalf("step %d: expired %d hashes, model %d", step, len(got), len(want))
			}
		}
		if tt.live != len(model) {
			t.Fatalf("step %d: %d live, model %d", step, tt.live, len(model))
		}
	}
}

// TestTTLTrackerStopsClock: a clock that does not move records every chain
// at one deadline again and again; the heap stays bounded by the live set.
func TestTTLTrackerStopsClock(t *testing.T) {
	tt := newTTLTracker(time.Second)
	exts := make([]uint64, 500)
	for i := range exts {
		exts[i] = uint64(i)
	}
	now := time.Unix(1000, 0)
	for range 200 {
		tt.touch(now, WorkerKey{WorkerID: 1}, exts)
	}
	if tt.queued > 2*tt.live+1024 {
		t.Fatalf("%d hashes queued for %d live", tt.queued, tt.live)
	}
	if n := tt.expired(now.Add(time.Second), func(ttlKey) {}); n != len(exts) {
		t.Fatalf("%d expired, want %d", n, len(exts))
	}
}
