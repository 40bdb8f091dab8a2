package routesim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/kvselect/kvselect/bench/mooncake"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/kvhash"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

// simModel is the partition the simulated fleet registers under.
const simModel = "sim"

// Service is a policy backed by an in-process selection.Service: kvselect's
// own pick, with its index and load accounting, on the simulation's clock.
//
// With KV events (NewKVAware) the engines' stored and evicted blocks go
// straight into the partition's index through an in-process Listeners
// adapter: the same index.ApplyBatch the ZMQ listeners call, without the
// sockets. Without (NewApproximate) the service runs Dynamo's approximate
// mode: no events, every routing decision teaches the index (with TTL), as a
// gateway that cannot see the engines would.
type Service struct {
	name   string
	svc    *selection.Service
	w      *World
	start  time.Time
	sink   *eventSink
	evs    []index.Event
	nextID uint64
}

// NewKVAware is kvselect with KV events from the simulated engines and
// Dynamo's default router configuration (rc nil) or rc.
func NewKVAware(ctx context.Context, w *World, rc *routerconfig.Config) (*Service, error) {
	c := routerconfig.Default()
	if rc != nil {
		c = *rc
	}
	c.UseKVEvents = true
	return newService(ctx, "kvselect", w, c)
}

// NewApproximate is kvselect without KV events: the index learns from its own
// routing decisions (router_ttl_secs), like GIE's approximate prefix scorer.
func NewApproximate(ctx context.Context, w *World, rc *routerconfig.Config) (*Service, error) {
	c := routerconfig.Default()
	if rc != nil {
		c = *rc
	}
	c.UseKVEvents = false
	return newService(ctx, "kvselect-approx", w, c)
}

func newService(ctx context.Context, name string, w *World, rc routerconfig.Config) (*Service, error) {
	p := &Service{name: name, w: w, start: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	cfg := selection.Config{Router: rc,
		Clock: func() time.Time { return p.start.Add(w.Now()) },
		Rand:  rand.New(rand.NewPCG(w.cfg.Seed, 0x5e1ec7))}
	if rc.UseKVEvents {
		p.sink = &eventSink{ranks: map[index.WorkerKey]*index.Index{}}
		cfg.Listeners = p.sink
	}
	svc, err := selection.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("routesim: %s: %w", name, err)
	}
	p.svc = svc
	bs, blocks := uint32(TraceBlockTokens), uint64(w.cfg.Capacity)
	for i := range w.Workers() {
		ep := fmt.Sprintf("http://worker-%d:8000", i)
		rec := catalog.Record{WorkerID: uint64(i), ModelName: simModel, Endpoint: &ep, BlockSize: &bs, TotalKVBlocks: &blocks}
		if rc.UseKVEvents {
			kv := fmt.Sprintf("tcp://worker-%d:5557", i)
			rec.KVEventsEndpoint = &kv
		}
		got, err := svc.UpsertWorker(ctx, rec)
		if err != nil {
			return nil, fmt.Errorf("routesim: register worker %d: %w", i, err)
		}
		if got.Lifecycle != catalog.Schedulable {
			return nil, fmt.Errorf("routesim: worker %d not schedulable: %v", i, got.NotSchedulableReasons)
		}
	}
	return p, nil
}

func (p *Service) Name() string { return p.name }

// Pick is select_and_reserve with the trace's block hashes, sequence hashes and
// lengths, booked under the request's id.
func (p *Service) Pick(ctx context.Context, r *Request) (int, error) {
	isl := uint64(r.Trace.InputLength)
	out := uint32(min(r.Trace.OutputLength, 1<<31))
	locals := make([]int64, len(r.Locals))
	for i, h := range r.Locals {
		locals[i] = int64(h)
	}
	seq := kvhash.SequenceHashes(r.Locals)
	seqs := make([]int64, len(seq))
	for i, h := range seq {
		seqs[i] = int64(h)
	}
	id := r.ID
	resp, err := p.svc.SelectAndReserve(ctx, &selection.SelectRequest{
		PartitionKey:         selection.PartitionKey{ModelName: simModel},
		PromptRequest:        selection.PromptRequest{BlockHashes: locals, SequenceHashes: seqs, ISLTokens: &isl},
		SelectionID:          &id,
		ExpectedOutputTokens: &out,
	})
	if err != nil {
		return 0, err
	}
	return int(resp.WorkerID), nil
}

// Admitted applies the engine's events to the index, as the worker's KV event
// listener would (only with KV events on).
func (p *Service) Admitted(_ context.Context, _ *Request, worker int, events []mooncake.Event) {
	if p.sink == nil {
		return
	}
	ix := p.sink.index(index.WorkerKey{WorkerID: uint64(worker)})
	if ix == nil {
		return
	}
	wk := index.WorkerKey{WorkerID: uint64(worker)}
	evs := p.evs[:0]
	for _, e := range events {
		p.nextID++
		switch e := e.(type) {
		case mooncake.Stored:
			blocks := make([]index.Block, len(e.Blocks))
			for i, b := range e.Blocks {
				blocks[i] = index.Block{Ext: b.Ext, Local: b.Local}
			}
			evs = append(evs, index.Event{Worker: wk, ID: p.nextID, Kind: index.EventStored,
				Parent: e.Parent, HasParent: e.HasParent, Blocks: blocks})
		case mooncake.Removed:
			evs = append(evs, index.Event{Worker: wk, ID: p.nextID, Kind: index.EventRemoved, Hashes: e.Exts})
		}
	}
	ix.ApplyBatch(evs)
	clear(evs)
	p.evs = evs[:0]
}

func (p *Service) FirstToken(ctx context.Context, r *Request) { _ = p.svc.PrefillComplete(ctx, r.ID) }
func (p *Service) Done(ctx context.Context, r *Request)       { _ = p.svc.Free(ctx, r.ID) }

// Loads exposes the service's active-load view (for tests: everything freed
// at the end of a run).
func (p *Service) Loads() []selection.ModelLoad { return p.svc.Loads(nil, nil) }

// eventSink is the in-process Listeners adapter: it remembers which index
// each rank feeds.
type eventSink struct {
	mu    sync.Mutex
	ranks map[index.WorkerKey]*index.Index
}

func (s *eventSink) Attach(a selection.RankAttachment) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ranks[a.Worker] = a.Index
	return nil
}

func (s *eventSink) Detach(_ index.Partition, w index.WorkerKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.ranks, w)
}

func (s *eventSink) index(w index.WorkerKey) *index.Index {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ranks[w]
}
