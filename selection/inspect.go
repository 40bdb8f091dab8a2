package selection

import (
	"cmp"
	"context"
	"slices"

	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/partition"
	"github.com/kvselect/kvselect/selection/scheduler"
)

// Loads reports every initialized partition's current load (GET /loads).
func (s *Service) Loads(model, group *string) []ModelLoad {
	parts := s.parts.All()
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
func (s *Service) PotentialLoads(ctx context.Context, q *PromptQuery) ([]PotentialLoad, error) {
	rq, err := s.prepare(partitionOf(q.PartitionKey), q.RouterConfigOverride, &q.PromptRequest, forSelection)
	if err != nil {
		return nil, err
	}
	p, eff, pr := rq.part, rq.eff, rq.prompt
	overlaps := p.Match(pr.locals, pr.text)
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
func (s *Service) OverlapScores(ctx context.Context, q *PromptQuery) (*OverlapScoresResponse, error) {
	rq, err := s.prepare(partitionOf(q.PartitionKey), q.RouterConfigOverride, &q.PromptRequest, forSelection)
	if err != nil {
		return nil, err
	}
	p, eff, pr := rq.part, rq.eff, rq.prompt
	overlaps := p.Match(pr.locals, pr.text)
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
