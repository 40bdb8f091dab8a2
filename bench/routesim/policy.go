package routesim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/kvselect/kvselect/bench/mooncake"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/kvhash"
	"github.com/kvselect/kvselect/selection/routerconfig"
	"github.com/kvselect/kvselect/selection/scheduler"
)

// simModel is the partition the simulated fleet registers under.
const simModel = "sim"

// ApproxPolicy is kv-cost run without KV events: the index learns from the
// service's own routing decisions (router_ttl_secs), as a gateway that cannot
// see the engines would, and as GIE's approximate prefix scorer does.
const ApproxPolicy = "kv-cost-approx"

// Policies are the policies a comparison runs unless told otherwise, in
// table order: the picker's default (predicted-latency), Dynamo's cost with
// and without KV events, then the baselines.
func Policies() []string {
	return []string{scheduler.PredictedLatencyPolicyName, scheduler.DefaultPolicyName, ApproxPolicy, "round-robin", "random", "least-loaded", "longest-prefix"}
}

// Known reports whether NewPolicy can run name: a policy registered with
// the scheduler, or ApproxPolicy.
func Known(name string) bool {
	return name == ApproxPolicy || slices.Contains(scheduler.Names(), name)
}

// Service is a policy run the way kvselect runs it: an in-process
// selection.Service on the simulation's clock whose selection policy is one
// of the registered ones, picking with select_and_reserve and following
// every request's prefill completion and free, so load-aware policies see
// the loads it booked (not the simulator's true queues).
//
// With KV events (every policy but ApproxPolicy) the engines' stored and
// evicted blocks go straight into the partition's index through an
// in-process Listeners adapter: the same index.ApplyBatch the ZMQ listeners
// call, without the sockets, so cache-aware policies see the exact caches.
type Service struct {
	name   string
	svc    *selection.Service
	w      *World
	start  time.Time
	sink   *eventSink
	evs    []index.Event
	nextID uint64
}

// NewPolicy runs the policy name over w: a policy registered with the
// scheduler, built with scheduler.New(name, nil) and fed the engines' KV
// events, or ApproxPolicy. The service has Dynamo's default router
// configuration and draws its random choices from w's seed.
func NewPolicy(ctx context.Context, w *World, name string) (*Service, error) {
	rc := routerconfig.Default()
	rc.UseKVEvents = name != ApproxPolicy
	registered := name
	if name == ApproxPolicy {
		registered = scheduler.DefaultPolicyName
	}
	pol, err := scheduler.New(registered, nil)
	if err != nil {
		return nil, fmt.Errorf("routesim: %w", err)
	}
	return newService(ctx, name, w, rc, pol)
}

func newService(ctx context.Context, name string, w *World, rc routerconfig.Config, pol scheduler.Policy) (*Service, error) {
	p := &Service{name: name, w: w, start: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	cfg := selection.Config{Router: rc, Policy: &pol,
		Clock:  func() time.Time { return p.start.Add(w.Now()) },
		Rand:   rand.New(rand.NewPCG(w.cfg.Seed, 0x5e1ec7)),
		Engine: w.cfg.Engine}
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
	locals, seqs := kvhash.WireHashes(r.Locals)
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

// ReportEngine is one scrape of worker's engine, as engines/metrics reports
// it: an engine without rank labels, so the figures sit under AllRanks,
// taken at the current virtual time.
func (p *Service) ReportEngine(worker int, st EngineState) {
	p.svc.ReportEngineMetrics(uint64(worker), selection.EngineSnapshot{
		At: p.start.Add(p.w.Now()),
		Ranks: map[uint32]selection.EngineRank{selection.AllRanks: {
			Waiting: float64(st.Waiting), Running: float64(st.Running), KVUsage: st.KVUsage, HasKVUsage: true}},
	})
}

// Workers is the service's GET /workers view (engine metrics and health
// included), for tests.
func (p *Service) Workers() []*catalog.Record { return p.svc.Workers(nil, nil) }

func (p *Service) FirstToken(ctx context.Context, r *Request) { _ = p.svc.PrefillComplete(ctx, r.ID) }
func (p *Service) Done(ctx context.Context, r *Request)       { _ = p.svc.Free(ctx, r.ID) }

// Loads exposes the service's active-load view (for tests: everything freed
// at the end of a run).
func (p *Service) Loads() []selection.ModelLoad { return p.svc.Inspect().Loads(nil, nil) }

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
