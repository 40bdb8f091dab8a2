package selection

import (
	"cmp"
	"context"
	"slices"

	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/flow"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/partition"
	"github.com/kvselect/kvselect/selection/scheduler"
)

// Inspector is the read-only view of a Service (Service.Inspect): loads and
// their projections, overlap scores, the decision log and routing totals,
// the health, engine, flow control and disaggregation figures, the
// configuration in force and the index dump. Nothing it does changes what the
// service decides; what it takes, it takes as a decision would, for one copy.
type Inspector struct{ s *Service }

// Inspect returns the service's read-only view.
func (s *Service) Inspect() *Inspector { return &s.inspector }

// Loads reports every initialized partition's current load (GET /loads).
func (in *Inspector) Loads(model, group *string) []ModelLoad {
	parts := in.s.parts.All()
	slices.SortFunc(parts, func(a, b *partition.Partition) int {
		return cmp.Or(cmp.Compare(a.Key().Model, b.Key().Model), cmp.Compare(a.Key().RoutingGroup, b.Key().RoutingGroup))
	})
	out := []ModelLoad{}
	for _, p := range parts {
		if (model != nil && p.Key().Model != *model) || (group != nil && p.Key().RoutingGroup != *group) {
			continue
		}
		ml := ModelLoad{ModelName: p.Key().Model, RoutingGroup: p.Key().RoutingGroup, Loads: []PotentialLoad{}}
		for _, l := range p.Loads().Loads() {
			ml.Loads = append(ml.Loads, PotentialLoad{WorkerID: l.Worker.WorkerID, DPRank: l.Worker.DPRank,
				PotentialPrefillTokens: uint64(l.ActivePrefillTokens), PotentialDecodeBlocks: uint64(l.ActiveDecodeBlocks),
				ActiveRequests: uint64(l.ActiveRequests)})
		}
		ml.PendingCount, ml.PendingISLTokens = p.Queue().Pending()
		out = append(out, ml)
	}
	return out
}

// PotentialLoads projects every rank's load as if this prompt were added to it
// (POST /potential_loads): prefill grows by the uncached part when prefill is
// tracked, decode by the blocks not already active there.
func (in *Inspector) PotentialLoads(ctx context.Context, q *PromptQuery) ([]PotentialLoad, error) {
	rq, err := in.s.prepare(partitionOf(q.PartitionKey), q.RouterConfigOverride, &q.PromptRequest, forSelection, false)
	if err != nil {
		return nil, err
	}
	p, eff, pr := rq.part, rq.eff, rq.prompt
	overlaps := p.Match(pr.locals, pr.text, nil)
	ws := p.Workers()
	out := []PotentialLoad{}
	for _, pj := range p.Loads().Project(pr.tracking, nil) {
		if _, ok := ws.Rank(pj.Worker); !ok {
			continue
		}
		prefill := pj.ActivePrefillTokens
		if eff.TrackPrefillTokens {
			o := partition.OverlapOf(overlaps, pj.Worker)
			cached := scheduler.CachedTokens(o, p.BlockSize(), eff.HostCacheHitWeight, eff.DiskCacheHitWeight)
			prefill += scheduler.EffectivePrefillTokens(pr.isl, cached)
		}
		out = append(out, PotentialLoad{WorkerID: pj.Worker.WorkerID, DPRank: pj.Worker.DPRank,
			PotentialPrefillTokens: uint64(prefill), PotentialDecodeBlocks: uint64(pj.PotentialDecodeBlocks()),
			ActiveRequests: uint64(pj.ActiveRequests)})
	}
	return out, nil
}

// OverlapScores reports tiered overlap per (worker, rank), in blocks, from the
// public block hashes only (POST /overlap_scores).
func (in *Inspector) OverlapScores(ctx context.Context, q *PromptQuery) (*OverlapScoresResponse, error) {
	rq, err := in.s.prepare(partitionOf(q.PartitionKey), q.RouterConfigOverride, &q.PromptRequest, forSelection, false)
	if err != nil {
		return nil, err
	}
	p, eff, pr := rq.part, rq.eff, rq.prompt
	overlaps := p.Match(pr.locals, pr.text, nil)
	rows := map[index.WorkerKey]index.Overlap{}
	for _, w := range p.Workers().Ranks {
		rows[w] = index.Overlap{Worker: w}
	}
	for _, o := range overlaps {
		rows[o.Worker] = o
	}
	keys := make([]index.WorkerKey, 0, len(rows))
	for k := range rows {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, index.CompareWorkerKeys)
	resp := &OverlapScoresResponse{BlockSize: p.BlockSize(), NumBlocks: len(pr.locals), Workers: make([]OverlapScoreRow, 0, len(keys)),
		SharedCache: SharedCacheView{Ranges: []string{}}}
	for _, k := range keys {
		o := rows[k]
		c := o.Cumulative()
		resp.Workers = append(resp.Workers, OverlapScoreRow{
			WorkerID: k.WorkerID, DPRank: k.DPRank, DeviceBlocks: c.GPU, HostPinnedBlocks: c.CPU, DiskBlocks: c.Disk,
			HostPinnedExtensionBlocks: o.Host, DiskExtensionBlocks: o.Disk + o.External,
			RouterCreditBlocks: weightsOf(eff).CreditBlocks(o, 0),
		})
	}
	return resp, nil
}

// Endpoints lists the schedulable ranks of a partition with their workers'
// endpoints, sorted by (worker_id, dp_rank): what a front needs to translate a
// gateway's endpoint addresses (a subset hint, a served endpoint) into worker
// ids. It reads the partition's published snapshot and takes no lock.
func (in *Inspector) Endpoints(key PartitionKey) []RankEndpoint {
	p := in.s.parts.Get(partitionOf(key))
	if p == nil {
		return nil
	}
	ws := p.Workers()
	out := make([]RankEndpoint, 0, len(ws.Ranks))
	for _, w := range ws.Ranks {
		out = append(out, RankEndpoint{WorkerID: w.WorkerID, DPRank: w.DPRank, Endpoint: ws.ByID[w.WorkerID].EndpointOrEmpty()})
	}
	return out
}

// Dump snapshots every partition's primary index (GET /dump).
func (in *Inspector) Dump() index.Dump { return in.s.indexes.Dump() }

// RecentDecisions returns up to n of the latest decisions (all it keeps when
// n ≤ 0), newest first; nil when the log is off (Config.RecentDecisions < 0).
func (in *Inspector) RecentDecisions(n int) []DecisionRecord { return in.s.decisions.Latest(n) }

// RoutingStats returns every partition's routing-quality totals.
func (in *Inspector) RoutingStats() []PartitionRouting {
	parts := in.s.parts.All()
	out := make([]PartitionRouting, 0, len(parts))
	for _, p := range parts {
		out = append(out, p.Routing().Totals(p.Key().Model, p.Key().RoutingGroup))
	}
	return out
}

// DisaggStats are the disaggregated decisions made so far, by reason (every
// scheduler.DisaggReasons entry present). Requests to models that never had
// a prefill pool are not counted: nothing was decided for them.
func (in *Inspector) DisaggStats() map[string]uint64 {
	return in.s.disagg.Counts()
}

// EngineStats counts the scraped workers whose figures are fresh and those
// whose last good scrape is stale or missing (selection then relies on its
// bookings alone for them).
func (in *Inspector) EngineStats() (fresh, stale int) {
	s := in.s
	return s.engines.Stats(s.clock(), s.engineCfg.StaleAfter)
}

// HealthStats reports the health checks' totals (for metrics).
func (in *Inspector) HealthStats() HealthStats { return in.s.health.Stats(in.s.clock()) }

// WorkerHealth is the worker's health as GET /workers shows it; nil when
// nothing was reported against it since its last restoration.
func (in *Inspector) WorkerHealth(workerID uint64) *catalog.HealthView {
	v, _ := in.s.health.View(workerID, in.s.clock())
	return v
}

// FlowState snapshots every partition's waiting requests; empty with flow
// control off.
func (in *Inspector) FlowState() []PartitionFlow {
	s := in.s
	out := []PartitionFlow{}
	if s.flowCfg == nil {
		return out
	}
	now := s.clock()
	for _, p := range s.parts.All() {
		key := p.Key()
		out = append(out, PartitionFlow{ModelName: key.Model, RoutingGroup: key.RoutingGroup, State: p.Queue().FlowState(now)})
	}
	slices.SortFunc(out, func(a, b PartitionFlow) int {
		return cmp.Or(cmp.Compare(a.ModelName, b.ModelName), cmp.Compare(a.RoutingGroup, b.RoutingGroup))
	})
	return out
}

// FlowConfig is the flow control configuration, nil when it is off.
func (in *Inspector) FlowConfig() *flow.Config {
	if in.s.flowCfg == nil {
		return nil
	}
	c := *in.s.flowCfg
	return &c
}

// KVEventsCollector reports the KV events collector sockets; ok is false when
// none is bound.
func (in *Inspector) KVEventsCollector() (st CollectorStatus, ok bool) {
	if c, is := in.s.cat.listeners.(EventsCollector); is {
		return c.CollectorStatus()
	}
	return CollectorStatus{}, false
}
