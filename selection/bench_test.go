package selection

import (
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/kvhash"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

// benchService registers workers (event-driven index, block size 16) and caches
// a share of a pool of 128-block prompts on them, as KV events would.
func benchService(b *testing.B, workers int) (*Service, [][]uint32) {
	b.Helper()
	return benchServiceDP(b, workers, 1)
}

// benchServiceDP is benchService with workers of dp data-parallel ranks
// each: ranks = workers × dp, prompts cached on rank 0 of each worker.
func benchServiceDP(b *testing.B, workers, dp int) (*Service, [][]uint32) {
	b.Helper()
	rc := routerconfig.Default()
	s, err := New(Config{Router: rc, Clock: time.Now, Rand: rand.New(rand.NewPCG(7, 8))})
	if err != nil {
		b.Fatal(err)
	}
	for id := range uint64(workers) {
		r := catalog.Record{WorkerID: id, ModelName: "m", Endpoint: ptr(fmt.Sprintf("http://w%d:8000", id)),
			BlockSize: ptr(uint32(16)), KVEventsEndpoint: ptr(fmt.Sprintf("tcp://127.0.0.1:%d", 20000+id)),
			TotalKVBlocks: ptr(uint64(16384))}
		if dp > 1 {
			eps := make(map[uint32]string, dp)
			for r := range uint32(dp) {
				eps[r] = fmt.Sprintf("tcp://10.%d.%d.%d:%d", id>>16&255, id>>8&255, id&255, 5557+r)
			}
			r.KVEventsEndpoint, r.KVEventsEndpoints, r.DataParallelSize = nil, eps, ptr(uint32(dp))
		}
		if rec, err := s.UpsertWorker(bg, r); err != nil || rec.Lifecycle != catalog.Schedulable {
			b.Fatalf("upsert: %+v %v", rec, err)
		}
	}
	rng := rand.New(rand.NewPCG(1, 1))
	prompts := make([][]uint32, 256)
	for i := range prompts {
		t := make([]uint32, 128*16)
		for j := range t {
			if j < 32*16 {
				t[j] = uint32(i%16*100000 + j) // 16 shared 32-block system prompts
			} else {
				t[j] = rng.Uint32()
			}
		}
		prompts[i] = t
	}
	p := s.parts.Get(index.Partition{Model: "m", RoutingGroup: "default"})
	for i, t := range prompts {
		if i%2 == 1 {
			continue
		}
		locals := kvhash.LocalBlockHashes(t, "", "", kvhash.BlockOptions{BlockSize: 16})
		ev := indexStored(uint64(i%workers), locals)
		if err := p.Index().Apply(&ev); err != nil {
			b.Fatal(err)
		}
	}
	return s, prompts
}

// BenchmarkSelectAndReserveFree: one select_and_reserve of a 128-block prompt
// (2,048 tokens: hashing, index lookup, load projection, cost, pick, booking)
// and its free, in process, over 64 workers.
func BenchmarkSelectAndReserveFree(b *testing.B) {
	s, prompts := benchService(b, 64)
	reqs := make([]*SelectRequest, len(prompts))
	for i, t := range prompts {
		reqs[i] = &SelectRequest{PartitionKey: PartitionKey{ModelName: "m"}, PromptRequest: PromptRequest{TokenIDs: t}}
	}
	benchPairs(b, s, reqs)
}

// BenchmarkSelectAndReserveFreeHashes is the same pair with precomputed block
// and sequence hashes (the ext_proc header path), so no token hashing.
func BenchmarkSelectAndReserveFreeHashes(b *testing.B) {
	s, prompts := benchService(b, 64)
	reqs := make([]*SelectRequest, len(prompts))
	for i, t := range prompts {
		locals := kvhash.LocalBlockHashes(t, "", "", kvhash.BlockOptions{BlockSize: 16})
		isl := uint64(len(t))
		reqs[i] = &SelectRequest{PartitionKey: PartitionKey{ModelName: "m"}, PromptRequest: PromptRequest{
			BlockHashes: toI64(locals), SequenceHashes: toI64(kvhash.SequenceHashes(locals)), ISLTokens: &isl}}
	}
	benchPairs(b, s, reqs)
}

// benchPairs times one SelectAndReserve and its Free per iteration, cycling
// through reqs.
func benchPairs(b *testing.B, s *Service, reqs []*SelectRequest) {
	ids := make([]string, len(reqs))
	for i := range ids {
		ids[i] = fmt.Sprintf("bench-%d", i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		k := i % len(reqs)
		reqs[k].SelectionID = &ids[k]
		if _, err := s.SelectAndReserve(bg, reqs[k]); err != nil {
			b.Fatal(err)
		}
		if err := s.Free(bg, ids[k]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSelectAndReserveFreeParallel measures throughput with parallel
// callers (run with -cpu 2: GOMAXPROCS=2) as the worker count grows. Each caller
// keeps a few bookings in flight.
func BenchmarkSelectAndReserveFreeParallel(b *testing.B) {
	for _, workers := range []int{8, 64, 256, 1024} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			s, prompts := benchService(b, workers)
			var next atomic.Uint64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					n := next.Add(1)
					id := fmt.Sprintf("p-%d", n)
					req := &SelectRequest{PartitionKey: PartitionKey{ModelName: "m"}, SelectionID: &id,
						PromptRequest: PromptRequest{TokenIDs: prompts[n%uint64(len(prompts))]}}
					if _, err := s.SelectAndReserve(bg, req); err != nil {
						b.Error(err)
						return
					}
					if err := s.Free(bg, id); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
		})
	}
}

// BenchmarkSelectAndReserveFreeLargeFleet is BenchmarkSelectAndReserveFree
// on fleets past BenchmarkSelectAndReserveFreeParallel's: 4,096 and 16,384
// ranks as workers of 8 data-parallel ranks (registering them one rank per
// worker costs minutes: every catalog change copies the partition's
// snapshot). Run it with -cpu 1 for the one-core figure; kvbench scale
// measures the same call with an index populated through KV events.
func BenchmarkSelectAndReserveFreeLargeFleet(b *testing.B) {
	for _, ranks := range []int{4096, 16384} {
		b.Run(fmt.Sprintf("ranks=%d", ranks), func(b *testing.B) {
			s, prompts := benchServiceDP(b, ranks/8, 8)
			reqs := make([]*SelectRequest, len(prompts))
			for i, t := range prompts {
				reqs[i] = &SelectRequest{PartitionKey: PartitionKey{ModelName: "m"}, PromptRequest: PromptRequest{TokenIDs: t}}
			}
			benchPairs(b, s, reqs)
		})
	}
}

// BenchmarkSelectAndReserveFreeDisaggregated is BenchmarkSelectAndReserveFree
// for a disaggregated model: 64 decode workers plus 16 prefill workers, every
// request prefilled remotely (conditional disaggregation off), so each pair
// is a decode peek, the prefill selection and booking, the pinned decode
// booking and the free of both.
func BenchmarkSelectAndReserveFreeDisaggregated(b *testing.B) {
	s, prompts := benchService(b, 64)
	for id := range uint64(16) {
		r := catalog.Record{WorkerID: 1000 + id, ModelName: "m", Role: ptr(catalog.RolePrefill), Endpoint: ptr(fmt.Sprintf("http://p%d:8000", id)),
			BlockSize: ptr(uint32(16)), KVEventsEndpoint: ptr(fmt.Sprintf("tcp://127.0.0.1:%d", 21000+id))}
		if rec, err := s.UpsertWorker(bg, r); err != nil || rec.Lifecycle != catalog.Schedulable {
			b.Fatalf("upsert: %+v %v", rec, err)
		}
	}
	reqs := make([]*SelectRequest, len(prompts))
	for i, t := range prompts {
		reqs[i] = &SelectRequest{PartitionKey: PartitionKey{ModelName: "m"}, PromptRequest: PromptRequest{TokenIDs: t}, Disaggregated: true}
	}
	benchPairs(b, s, reqs)
	if st := s.Inspect().DisaggStats(); st["conditional_disagg_disabled"] == 0 {
		b.Fatalf("no remote prefill: %v", st)
	}
}

// BenchmarkSelectAndReserveFreeLong is BenchmarkSelectAndReserveFree at long
// context: a prompt of 100k or 1M tokens (a 95 % system prompt cached on one
// of 16 workers, as KV events report it, and a question nobody holds) hashed,
// looked up, projected, booked and freed in process — the core's share of a
// long-context pick.
func BenchmarkSelectAndReserveFreeLong(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("tokens=%d", n), func(b *testing.B) {
			s, err := New(Config{Router: routerconfig.Default(), Clock: time.Now, Rand: rand.New(rand.NewPCG(7, 8))})
			if err != nil {
				b.Fatal(err)
			}
			for id := range uint64(16) {
				r := catalog.Record{WorkerID: id, ModelName: "m", Endpoint: ptr(fmt.Sprintf("http://w%d:8000", id)),
					BlockSize: ptr(uint32(16)), KVEventsEndpoint: ptr(fmt.Sprintf("tcp://127.0.0.1:%d", 20000+id))}
				if _, err := s.UpsertWorker(bg, r); err != nil {
					b.Fatal(err)
				}
			}
			rng := rand.New(rand.NewPCG(1, 1))
			tokens := make([]uint32, n)
			for i := range tokens {
				tokens[i] = rng.Uint32N(128_000)
			}
			system := n * 95 / 100
			p := s.parts.Get(index.Partition{Model: "m", RoutingGroup: "default"})
			ev := indexStored(3, kvhash.LocalBlockHashes(tokens[:system], "", "", kvhash.BlockOptions{BlockSize: 16}))
			if err := p.Index().Apply(&ev); err != nil {
				b.Fatal(err)
			}
			benchPairs(b, s, []*SelectRequest{{PartitionKey: PartitionKey{ModelName: "m"}, PromptRequest: PromptRequest{TokenIDs: tokens}}})
		})
	}
}
