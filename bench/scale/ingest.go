package scale

import (
	"context"
	"math"
	"runtime"
	"time"

	"github.com/kvselect/kvselect/bench/eventq"
	"github.com/kvselect/kvselect/mockworker/kvpublish"
)

// IngestPoint is what one replica pays to index the KV events of Engines
// engine ranks, each serving RequestRate requests per second.
type IngestPoint struct {
	Engines     int     `json:"engines"`
	RequestRate float64 `json:"request_rate"` // per engine
	// Seconds of engine traffic: requests arrive for this long, and all
	// their events (their decode steps run past it) are in the stream.
	Seconds float64 `json:"seconds"`
	Batches int64   `json:"batches"`
	Events  int64   `json:"events"` // decoded events: BlockStored and BlockRemoved
	Stored  int64   `json:"stored_blocks"`
	Removed int64   `json:"removed_blocks"`
	Bytes   int64   `json:"bytes"`
	// EventsPerEngineSecond is the event rate of one engine at RequestRate.
	EventsPerEngineSecond  float64 `json:"events_per_engine_second"`
	BatchesPerEngineSecond float64 `json:"batches_per_engine_second"`
	// CPU is the CPU time of decoding and applying every batch, on one core.
	CPU time.Duration `json:"cpu_ns"`
	// CoresForEngines is the share of one core the Engines' events take at
	// RequestRate; CorePerEngine the share one engine's take.
	CoresForEngines float64 `json:"cores_for_engines"`
	CorePerEngine   float64 `json:"core_per_engine"`
	NsPerEvent      float64 `json:"ns_per_event"`
	NsPerBlock      float64 `json:"ns_per_block"`
	// SaturationEvents is the event rate that takes one whole core, and
	// SaturationEngines how many engines at RequestRate publish it.
	SaturationEvents  float64 `json:"saturation_events_per_second"`
	SaturationEngines float64 `json:"saturation_engines"`
	IndexedBlocks     int64   `json:"indexed_blocks"`
}

// batch is one encoded KVEventBatch of one rank, in the order a replica
// would receive it.
type batch struct {
	feed    *rankFeed
	payload []byte
}

// ingestPoint populates a fleet of engines ranks as the selection curve
// does, then has every engine serve c.IngestSeconds of requests at
// c.RequestRate, encodes what they publish as vLLM does — one batch per
// engine step (c.StepInterval) holding that step's events — and times
// decoding and applying all of it on one core, the engines' batches
// interleaved step by step.
func ingestPoint(ctx context.Context, c Config, engines int) (IngestPoint, error) {
	pt := IngestPoint{Engines: engines, RequestRate: c.RequestRate, Seconds: c.IngestSeconds}
	p := newPrompts(max(1, engines/c.RanksPerGroup), c.SystemTokens, c.QuestionTokens, c.QuestionsPerGroup, c.BlockSize)
	f, err := newFleet(ctx, engines, c.RanksPerWorker, c.BlockSize, c.CacheBlocks, c.Seed)
	if err != nil {
		return pt, err
	}
	var sp SelectionPoint
	engs, err := populate(f, c, p, &sp, true)
	if err != nil {
		return pt, err
	}

	step := c.StepInterval.Seconds()
	// steps[k] holds step k's batches, every engine's.
	var steps [][]batch
	for i, w := range f.ranks {
		e, feed := engs[i], f.l.feed(w)
		home := i / c.RanksPerGroup % p.groups
		// The engine's actions in step order: a request's prefill in the
		// step it arrives, then one token per step, so output block j fills
		// BlockSize steps after block j-1.
		type action struct {
			parent  *uint64 // the request's last block so far
			prefill []uint32
			left    int // output blocks still to fill
		}
		// The queue's clock counts engine steps (a Duration of n is step
		// n): the simulation's unit, not nanoseconds.
		var q eventq.Queue[*action]
		n := int(math.Round(c.RequestRate * c.IngestSeconds))
		phase := e.rng.Float64() / c.RequestRate
		for k := range n {
			g := home
			if e.rng.Float64() < c.HotShare {
				g = p.hot()
			}
			at := int((phase + float64(k)/c.RequestRate) / step)
			q.Push(time.Duration(at), &action{parent: new(uint64(0)), prefill: p.prompt(g, e.rng.IntN(p.questionsPerGrp)),
				left: c.OutputTokens / c.BlockSize})
		}
		var evs []kvpublish.Event
		flush := func(s int) {
			if len(evs) == 0 {
				return
			}
			for _, ev := range evs {
				pt.Stored += int64(storedBlocks(ev))
				if rm, ok := ev.(*kvpublish.BlockRemoved); ok {
					pt.Removed += int64(len(rm.BlockHashes))
				}
			}
			payload := kvpublish.AppendBatch(nil, float64(s)*step, evs, new(int(w.DPRank)))
			for len(steps) <= s {
				steps = append(steps, nil)
			}
			steps[s] = append(steps[s], batch{feed: feed, payload: payload})
			pt.Batches++
			pt.Bytes += int64(len(payload))
			evs = evs[:0]
		}
		cur := -1
		for q.Len() > 0 {
			at, _ := q.Next()
			a := q.Pop()
			if s := int(at); s != cur {
				flush(cur)
				cur = s
			}
			var more []kvpublish.Event
			if a.prefill != nil {
				more, *a.parent = e.prefill(a.prefill)
				a.prefill = nil
			} else {
				more, *a.parent = e.decode(*a.parent)
				a.left--
			}
			evs = append(evs, more...)
			if a.left > 0 {
				q.Push(at+time.Duration(c.BlockSize), a)
			}
		}
		flush(cur)
		pt.IndexedBlocks += int64(e.cached())
	}
	engs = nil
	runtime.GC()

	prev := runtime.GOMAXPROCS(1)
	cpu0 := cpuTime()
	for _, bs := range steps {
		for _, b := range bs {
			n, err := b.feed.ingest(b.payload)
			if err != nil {
				runtime.GOMAXPROCS(prev)
				return pt, err
			}
			pt.Events += int64(n)
		}
	}
	pt.CPU = cpuTime() - cpu0
	runtime.GOMAXPROCS(prev)

	engineSeconds := float64(engines) * c.IngestSeconds
	pt.EventsPerEngineSecond = float64(pt.Events) / engineSeconds
	pt.BatchesPerEngineSecond = float64(pt.Batches) / engineSeconds
	pt.CoresForEngines = pt.CPU.Seconds() / c.IngestSeconds
	pt.CorePerEngine = pt.CoresForEngines / float64(engines)
	if pt.Events > 0 && pt.CPU > 0 {
		pt.NsPerEvent = float64(pt.CPU.Nanoseconds()) / float64(pt.Events)
		pt.NsPerBlock = float64(pt.CPU.Nanoseconds()) / float64(pt.Stored+pt.Removed)
		pt.SaturationEvents = 1e9 / pt.NsPerEvent
		pt.SaturationEngines = pt.SaturationEvents / pt.EventsPerEngineSecond
	}
	runtime.KeepAlive(f)
	return pt, nil
}
