package index

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"slices"
	"testing"
	"time"

	"github.com/zeebo/xxh3"
)

// corpus builds an index shaped like chat traffic: families of conversations that
// share a system-prompt prefix, each conversation cached on one of `workers`
// workers together with its family prefix. It returns the index and the stored
// prompts (local hashes), so lookups can hit real, deep prefixes.
func corpus(tb testing.TB, entries, workers, promptBlocks, prefixBlocks int) (*Index, [][]uint64) {
	tb.Helper()
	ix, err := New(Config{BlockSize: 16})
	if err != nil {
		tb.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	const perFamily = 8
	prompts := make([][]uint64, 0, entries/promptBlocks)
	blocks := make([]Block, promptBlocks)
	for n := 0; n < entries; n += promptBlocks {
		conv := len(prompts)
		family := conv / perFamily
		local := make([]uint64, promptBlocks)
		for i := range local {
			if i < prefixBlocks {
				local[i] = xxh3.HashSeed([]byte{byte(i), byte(i >> 8)}, uint64(family)+1)
			} else {
				local[i] = xxh3.HashSeed([]byte{byte(i), byte(i >> 8)}, uint64(conv)<<20|7)
			}
		}
		wk := WorkerKey{WorkerID: uint64(rng.IntN(workers))}
		for i := range blocks {
			// Engine hashes: per worker, chained over the content.
			blocks[i] = Block{Ext: xxh3.HashSeed([]byte{byte(i), byte(i >> 8)}, local[i]^wk.WorkerID*0x9e3779b97f4a7c15), Local: local[i]}
		}
		if err := ix.Apply(&Event{Worker: wk, Kind: EventStored, Blocks: blocks}); err != nil {
			tb.Fatal(err)
		}
		prompts = append(prompts, local)
	}
	return ix, prompts
}

func percentile(sorted []time.Duration, p float64) float64 {
	return float64(sorted[int(float64(len(sorted)-1)*p)].Nanoseconds())
}

// BenchmarkMatch128Blocks1MIndex: find_matches for a 128-block prompt against an
// index of 1M (block, worker) entries over 64 workers (target: ≤ 2 µs median,
// ≤ 10 µs p99; docs/benchmarks.md has the measured numbers). Reports the
// latency distribution of single lookups measured one by one.
func BenchmarkMatch128Blocks1MIndex(b *testing.B) {
	benchMatch(b, 1<<20, 64, 128, 32)
}

// BenchmarkMatch128Blocks1MIndex1024Workers is the same with 1,024 workers.
func BenchmarkMatch128Blocks1MIndex1024Workers(b *testing.B) {
	benchMatch(b, 1<<20, 1024, 128, 32)
}

func benchMatch(b *testing.B, entries, workers, promptBlocks, prefix int) {
	ix, prompts := corpus(b, entries, workers, promptBlocks, prefix)
	rng := rand.New(rand.NewPCG(3, 4))
	order := rng.Perm(len(prompts))
	dst := make([]Overlap, 0, workers)
	lat := make([]time.Duration, 0, 1<<20)
	b.ReportAllocs()
	b.ResetTimer()
	matched := 0
	for i := 0; b.Loop(); i++ {
		q := prompts[order[i%len(order)]]
		t0 := time.Now()
		dst = ix.Match(q, false, dst[:0])
		if len(lat) < cap(lat) {
			lat = append(lat, time.Since(t0))
		}
		matched += len(dst)
	}
	b.StopTimer()
	if matched == 0 {
		b.Fatal("no lookup matched")
	}
	slices.Sort(lat)
	b.ReportMetric(percentile(lat, 0.50), "p50-ns")
	b.ReportMetric(percentile(lat, 0.99), "p99-ns")
	b.ReportMetric(float64(matched)/float64(b.N), "workers/lookup")
}

// BenchmarkApplyStoreRemove measures event application on one core: each op
// stores a 16-block chain for one of 64 workers under a cached 32-block prefix
// and removes it again (leaf-first, as engines evict). Reports block ops/s.
func BenchmarkApplyStoreRemove(b *testing.B) {
	ix, _ := corpus(b, 1<<20, 64, 128, 32)
	const chainLen = 16
	type job struct {
		store, remove Event
	}
	jobs := make([]job, 4096)
	for j := range jobs {
		wk := WorkerKey{WorkerID: uint64(j % 64)}
		parentLocal := []uint64{xxh3.HashSeed([]byte{0, 0}, 1)}
		// A root-level parent block each worker holds.
		pev := Event{Worker: wk, Kind: EventStored, Blocks: []Block{{Ext: 1<<63 | wk.WorkerID, Local: parentLocal[0]}}}
		if err := ix.Apply(&pev); err != nil {
			b.Fatal(err)
		}
		blocks := make([]Block, chainLen)
		hashes := make([]uint64, chainLen)
		for i := range blocks {
			l := xxh3.HashSeed([]byte{byte(i), byte(j), byte(j >> 8)}, 99)
			blocks[i] = Block{Ext: l ^ wk.WorkerID, Local: l}
			hashes[chainLen-1-i] = blocks[i].Ext
		}
		jobs[j] = job{
			store:  Event{Worker: wk, Kind: EventStored, Parent: pev.Blocks[0].Ext, HasParent: true, Blocks: blocks},
			remove: Event{Worker: wk, Kind: EventRemoved, Hashes: hashes},
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		jb := &jobs[i%len(jobs)]
		if err := ix.Apply(&jb.store); err != nil {
			b.Fatal(err)
		}
		if err := ix.Apply(&jb.remove); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(2*chainLen*b.N)/b.Elapsed().Seconds(), "block-ops/s")
}

// BenchmarkMemory10MEntries builds an index of 10M (block, worker) entries and
// reports the live heap per entry and the time of a forced full GC. Run it with
// -benchtime=1x (make bench does).
func BenchmarkMemory10MEntries(b *testing.B) {
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		ix, _ := corpus(b, 10_000_000, 64, 128, 32)
		runtime.GC()
		runtime.ReadMemStats(&after)
		entries := ix.Stats().Entries
		t0 := time.Now()
		runtime.GC()
		gc := time.Since(t0)
		var gcStats debug.GCStats
		debug.ReadGCStats(&gcStats)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(entries), "heap-B/entry")
		b.ReportMetric(float64(entries), "entries")
		b.ReportMetric(float64(ix.Stats().Nodes), "nodes")
		b.ReportMetric(float64(gc.Microseconds())/1000, "forced-gc-ms")
		if len(gcStats.Pause) > 0 {
			b.ReportMetric(float64(gcStats.Pause[0].Microseconds())/1000, "last-stw-pause-ms")
		}
		runtime.KeepAlive(ix)
	}
}

// BenchmarkMatchLongPrompt walks the index for a long prompt (6,250 blocks
// of 16 tokens at 100k tokens, 62,500 at 1M) whose first 95 % is cached on
// one of 16 workers and whose question is not, next to four other such
// system prompts on other workers: the walk a long-context selection makes.
func BenchmarkMatchLongPrompt(b *testing.B) {
	for _, blocks := range []int{6_250, 62_500} {
		b.Run(fmt.Sprintf("blocks=%d", blocks), func(b *testing.B) {
			ix, err := New(Config{BlockSize: 16})
			if err != nil {
				b.Fatal(err)
			}
			var prompt []uint64
			for g := range 5 {
				local := make([]uint64, blocks)
				ev := Event{Worker: WorkerKey{WorkerID: uint64(g)}, Kind: EventStored, Blocks: make([]Block, blocks*95/100)}
				for i := range local {
					local[i] = xxh3.HashSeed([]byte{byte(i), byte(i >> 8), byte(i >> 16)}, uint64(g)+1)
					if i < len(ev.Blocks) {
						ev.Blocks[i] = Block{Ext: local[i] ^ 0x5555, Local: local[i]}
					} else {
						local[i] ^= 0xabcdef // the question: not cached
					}
				}
				if err := ix.Apply(&ev); err != nil {
					b.Fatal(err)
				}
				prompt = local
			}
			var dst []Overlap
			b.ReportAllocs()
			for b.Loop() {
				dst = ix.Match(prompt, false, dst[:0])
			}
			if len(dst) != 1 || int(dst[0].Device) != blocks*95/100 {
				b.Fatalf("overlaps %+v", dst)
			}
		})
	}
}

// BenchmarkApplySharedChainEviction measures what an ownership change costs
// on blocks that many workers hold, as a system prompt cached fleet-wide is:
// 512 workers hold one 64-block chain, and each op has one of them evict a
// block of it (a single-block Removed, as vLLM evicts) and store it again
// (a single-block Stored), each turning a 512-owner set into another.
// Reports block ops/s.
func BenchmarkApplySharedChainEviction(b *testing.B) {
	const workers, chain = 512, 64
	ix, err := New(Config{BlockSize: 16})
	if err != nil {
		b.Fatal(err)
	}
	local := make([]uint64, chain)
	for i := range local {
		local[i] = xxh3.HashSeed([]byte{byte(i)}, 5)
	}
	ext := func(w, i int) uint64 { return uint64(w)<<32 | uint64(i) + 1 }
	for w := range workers {
		blocks := make([]Block, chain)
		for i := range blocks {
			blocks[i] = Block{Ext: ext(w, i), Local: local[i]}
		}
		if err := ix.Apply(&Event{Worker: WorkerKey{WorkerID: uint64(w)}, Kind: EventStored, Blocks: blocks}); err != nil {
			b.Fatal(err)
		}
	}
	type job struct{ remove, store Event }
	jobs := make([]job, 4096)
	rng := rand.New(rand.NewPCG(3, 4))
	for j := range jobs {
		// Evict and re-store the leaf of a worker's chain, so that its
		// parent stays held.
		w := rng.IntN(workers)
		wk := WorkerKey{WorkerID: uint64(w)}
		jobs[j] = job{
			remove: Event{Worker: wk, Kind: EventRemoved, Hashes: []uint64{ext(w, chain-1)}},
			store: Event{Worker: wk, Kind: EventStored, Parent: ext(w, chain-2), HasParent: true,
				Blocks: []Block{{Ext: ext(w, chain-1), Local: local[chain-1]}}},
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		jb := &jobs[i%len(jobs)]
		if failed, err := ix.ApplyBatch([]Event{jb.remove, jb.store}); failed != 0 {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(2*b.N)/b.Elapsed().Seconds(), "block-ops/s")
}

// BenchmarkMatchFleetWidePrefix looks up a 128-block prompt whose prefix
// every rank of a large fleet holds, each to its own depth (a product's
// common system prompt): a row per rank, rows leaving the walk at every
// depth, to be put in key order.
func BenchmarkMatchFleetWidePrefix(b *testing.B) {
	for _, ranks := range []int{4096, 16384} {
		b.Run(fmt.Sprintf("ranks=%d", ranks), func(b *testing.B) {
			tr := NewTree()
			locals := make([]uint64, 128)
			for i := range locals {
				locals[i] = uint64(i + 1)
			}
			perm := rand.New(rand.NewPCG(1, 2)).Perm(ranks) // slots not in key order
			for _, r := range perm {
				w := WorkerKey{WorkerID: uint64(r / 8), DPRank: uint32(r % 8)}
				n := 64 + r%64
				blocks := make([]Block, n)
				for i := range blocks {
					blocks[i] = Block{Ext: uint64(i+1) * 7, Local: locals[i]}
				}
				if err := tr.Apply(&Event{Worker: w, Kind: EventStored, Blocks: blocks}); err != nil {
					b.Fatal(err)
				}
			}
			dst := make([]Overlap, 0, ranks)
			b.ReportAllocs()
			for b.Loop() {
				dst = tr.Match(locals, false, dst[:0])
			}
			if len(dst) != ranks {
				b.Fatalf("%d rows, want %d", len(dst), ranks)
			}
		})
	}
}

// fleetStep is one engine step of an engine whose cache holds fleetRequests
// requests of fleetBlocks blocks: step k stores block k%fleetBlocks of
// request k/fleetBlocks (chained to the block before it) and removes, last
// block first, one block of the request fleetRequests before it.
const (
	fleetBlocks   = 16
	fleetRequests = 64
)

func fleetHash(w, req, blk int, salt uint64) uint64 {
	return xxh3.HashSeed([]byte{byte(blk), byte(req), byte(req >> 8), byte(req >> 16), byte(req >> 24)}, uint64(w)<<8|salt)
}

func fleetStep(evs []Event, blocks []Block, hashes []uint64, w, k int) []Event {
	wk := WorkerKey{WorkerID: uint64(w / 8), DPRank: uint32(w % 8)}
	req, blk := k/fleetBlocks, k%fleetBlocks
	blocks[0] = Block{Ext: fleetHash(w, req, blk, 1), Local: fleetHash(w, req, blk, 2)}
	st := Event{Worker: wk, Kind: EventStored, Blocks: blocks[:1]}
	if blk > 0 {
		st.Parent, st.HasParent = fleetHash(w, req, blk-1, 1), true
	}
	evs = append(evs, st)
	if old := req - fleetRequests; old >= 0 {
		hashes[0] = fleetHash(w, old, fleetBlocks-1-blk, 1)
		evs = append(evs, Event{Worker: wk, Kind: EventRemoved, Hashes: hashes[:1]})
	}
	return evs
}

// BenchmarkApplyBatch1024Engines applies engine steps of 1,024 engine ranks
// in turn, each holding 1,024 blocks, through ApplyBatch, as a writer lane
// does at the fleet size docs/scale.md's ingest measures: each batch stores
// one decoded block and evicts one, and finds the engine's table and nodes
// evicted from the CPU caches by the other engines' batches. Reports ns per
// event.
func BenchmarkApplyBatch1024Engines(b *testing.B) {
	const engines = 1024
	ix, err := New(Config{BlockSize: 16})
	if err != nil {
		b.Fatal(err)
	}
	var evs []Event
	blocks, hashes := make([]Block, 1), make([]uint64, 1)
	k := 0
	step := func() int {
		n := 0
		for w := range engines {
			evs = fleetStep(evs[:0], blocks, hashes, w, k)
			if failed, first := ix.ApplyBatch(evs); failed > 0 {
				b.Fatal(first)
			}
			n += len(evs)
		}
		k++
		return n
	}
	for range (fleetRequests + 4) * fleetBlocks {
		step()
	}
	b.ResetTimer()
	events := 0
	for b.Loop() {
		events += step()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(events), "ns/event")
}
