package scale

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"time"

	"github.com/kvselect/kvselect/selection"
)

// SelectionPoint is the selection curve at one fleet size.
type SelectionPoint struct {
	Ranks   int `json:"ranks"`
	Workers int `json:"workers"`
	// IndexedBlocks is the (rank, block) pairs the index holds: what the
	// simulated engines cache.
	IndexedBlocks int64 `json:"indexed_blocks"`
	// PopulateEvents and PopulateBatches went through the decoder into the
	// index to build it.
	PopulateEvents  int64         `json:"populate_events"`
	PopulateBatches int64         `json:"populate_batches"`
	PopulateTime    time.Duration `json:"populate_ns"`
	// Requests timed, after Warmup untimed ones.
	Requests int `json:"requests"`
	// Latency of one SelectAndReserve (hashing the prompt's tokens, the
	// index lookup, the load projection, the cost of every rank, the pick
	// and the booking), wall clock on one core.
	P50 time.Duration `json:"p50_ns"`
	P90 time.Duration `json:"p90_ns"`
	P99 time.Duration `json:"p99_ns"`
	Max time.Duration `json:"max_ns"`
	// CPUPerRequest is the process's CPU time per request over the timed
	// requests with GOMAXPROCS=1: the selection, its prefill completion and
	// its free, garbage collection included.
	CPUPerRequest time.Duration `json:"cpu_per_request_ns"`
	// HitShare is the chosen ranks' cached share of the prompts' blocks.
	HitShare float64 `json:"hit_share"`
	// Memory (runtime.MemStats.HeapAlloc after a GC): the registered fleet
	// before any block (catalog, partition, loads, a decoder per rank),
	// what populating the index added to the index, and what it left in the
	// ranks' decoders (the batch buffers each keeps for the next batch, as a
	// listener's does). The harness's own per-rank buffers are left out.
	FleetHeapBytes   uint64  `json:"fleet_heap_bytes"`
	IndexHeapBytes   uint64  `json:"index_heap_bytes"`
	DecoderHeapBytes uint64  `json:"decoder_heap_bytes"`
	BytesPerRank     float64 `json:"bytes_per_rank"`         // fleet heap / ranks
	BytesPerBlock    float64 `json:"bytes_per_block"`        // index heap / indexed blocks
	DecoderPerRank   float64 `json:"decoder_bytes_per_rank"` // decoder heap / ranks
}

// heapAfterGC is the live heap once garbage is collected.
func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// populate runs every rank's simulated engine until its cache is full and it
// has evicted for a while, feeding each batch through the rank's decoder
// into the index. Rank i serves its home group (i / RanksPerGroup), the hot
// prompt with probability HotShare.
// With keep it returns the engines, to go on serving.
func populate(f *fleet, c Config, p *prompts, pt *SelectionPoint, keep bool) ([]*engine, error) {
	start := time.Now()
	var kept []*engine
	for i, w := range f.ranks {
		feed := f.l.feed(w)
		e := newEngine(c.CacheBlocks, c.BlockSize, c.Seed+uint64(i))
		home := i / c.RanksPerGroup % p.groups
		served := 0
		ts := 0.0
		for served < c.CacheBlocks*3/2 {
			g := home
			if e.rng.Float64() < c.HotShare {
				g = p.hot()
			}
			for _, step := range e.serve(p.prompt(g, e.rng.IntN(p.questionsPerGrp)), c.OutputTokens) {
				if len(step) == 0 {
					continue
				}
				ts += 0.02
				n, err := feed.ingest(feed.encode(ts, int(w.DPRank), step))
				if err != nil {
					return nil, fmt.Errorf("populate rank %v: %w", w, err)
				}
				pt.PopulateEvents += int64(n)
				pt.PopulateBatches++
				for _, ev := range step {
					served += storedBlocks(ev)
				}
			}
		}
		pt.IndexedBlocks += int64(e.cached())
		if keep {
			kept = append(kept, e)
		}
	}
	pt.PopulateTime = time.Since(start)
	return kept, nil
}

// selectionPoint builds a fleet of ranks ranks, populates its index and
// times c.Requests selections on one core.
func selectionPoint(ctx context.Context, c Config, ranks int) (SelectionPoint, error) {
	pt := SelectionPoint{Ranks: ranks, Workers: (ranks + c.RanksPerWorker - 1) / c.RanksPerWorker}
	p := newPrompts(max(1, ranks/c.RanksPerGroup), c.SystemTokens, c.QuestionTokens, c.QuestionsPerGroup, c.BlockSize)
	base := heapAfterGC()
	f, err := newFleet(ctx, ranks, c.RanksPerWorker, c.BlockSize, c.CacheBlocks, c.Seed)
	if err != nil {
		return pt, err
	}
	fleetHeap := heapAfterGC()
	if _, err := populate(f, c, p, &pt, false); err != nil {
		return pt, err
	}
	f.l.dropScratch()
	all := heapAfterGC()
	if err := f.l.resetDecoders(); err != nil {
		return pt, err
	}
	indexed := heapAfterGC()
	pt.FleetHeapBytes, pt.IndexHeapBytes = fleetHeap-min(base, fleetHeap), indexed-min(fleetHeap, indexed)
	pt.DecoderHeapBytes = all - min(indexed, all)
	pt.BytesPerRank = float64(pt.FleetHeapBytes) / float64(ranks)
	pt.DecoderPerRank = float64(pt.DecoderHeapBytes) / float64(ranks)
	if pt.IndexedBlocks > 0 {
		pt.BytesPerBlock = float64(pt.IndexHeapBytes) / float64(pt.IndexedBlocks)
	}

	// The requests, drawn like the engines' traffic: the hot prompt or a
	// question of a random group, as token ids.
	rng := rand.New(rand.NewPCG(c.Seed, 0x5e1ec7))
	n := c.Warmup + c.Requests
	reqs := make([][]uint32, n)
	for i := range reqs {
		g := rng.IntN(p.groups)
		if rng.Float64() < c.HotShare {
			g = p.hot()
		}
		reqs[i] = p.prompt(g, rng.IntN(p.questionsPerGrp))
	}
	lat, hit, cpu, err := timeSelections(ctx, f.svc, reqs, c.Warmup, c.InFlight)
	if err != nil {
		return pt, err
	}
	slices.Sort(lat)
	pt.Requests = len(lat)
	pt.P50, pt.P90, pt.P99, pt.Max = quantile(lat, 0.5), quantile(lat, 0.9), quantile(lat, 0.99), lat[len(lat)-1]
	pt.CPUPerRequest = cpu / time.Duration(len(lat))
	pt.HitShare = hit
	runtime.KeepAlive(f)
	return pt, nil
}

// timeSelections runs the requests on one core (GOMAXPROCS=1), keeping
// inFlight bookings open: each selection completes the prefill of the one
// made inFlight/2 requests before and frees the one made inFlight before,
// so the loads tracker holds a steady population. It returns the timed
// selections' latencies, the chosen ranks' hit share and the CPU time of
// the timed part.
func timeSelections(ctx context.Context, svc *selection.Service, reqs [][]uint32, warmup, inFlight int) ([]time.Duration, float64, time.Duration, error) {
	prev := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(prev)
	ids := make([]string, len(reqs))
	for i := range ids {
		ids[i] = fmt.Sprintf("scale-%d", i)
	}
	lat := make([]time.Duration, 0, len(reqs)-warmup)
	var hitTokens, promptTokens uint64
	var cpu0 time.Duration
	for i, t := range reqs {
		if i == warmup {
			cpu0 = cpuTime()
		}
		req := &selection.SelectRequest{PartitionKey: selection.PartitionKey{ModelName: model}, SelectionID: &ids[i],
			PromptRequest: selection.PromptRequest{TokenIDs: t}}
		t0 := time.Now()
		resp, err := svc.SelectAndReserve(ctx, req)
		d := time.Since(t0)
		if err != nil {
			return nil, 0, 0, fmt.Errorf("select_and_reserve: %w", err)
		}
		if i >= warmup {
			lat = append(lat, d)
			hitTokens += resp.Overlap.GPU // in tokens, as Dynamo reports it
			promptTokens += uint64(len(t))
		}
		if j := i - inFlight/2; j >= 0 {
			if err := svc.PrefillComplete(ctx, ids[j]); err != nil {
				return nil, 0, 0, fmt.Errorf("prefill_complete: %w", err)
			}
		}
		if j := i - inFlight; j >= 0 {
			if err := svc.Free(ctx, ids[j]); err != nil {
				return nil, 0, 0, fmt.Errorf("free: %w", err)
			}
		}
	}
	cpu := cpuTime() - cpu0
	for j := max(0, len(reqs)-inFlight); j < len(reqs); j++ {
		if err := svc.Free(ctx, ids[j]); err != nil {
			return nil, 0, 0, fmt.Errorf("free: %w", err)
		}
	}
	hit := 0.0
	if promptTokens > 0 {
		hit = float64(hitTokens) / float64(promptTokens)
	}
	return lat, hit, cpu, nil
}

// quantile of sorted durations (nearest rank).
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
