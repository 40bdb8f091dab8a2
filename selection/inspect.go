package selection

import (
	"cmp"
	"context"
	"slices"

	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/kvhash"
	"github.com/kvselect/kvselect/selection/scheduler"
)

// Loads reports every initialized partition's current load (GET /loads).
func (s *Service) Loads(model, group *string) []ModelLoad {
	parts := s.partitions()
	slices.SortFunc(parts, func(a, b *partition) int {
		return cmp.Or(cmp.Compare(a.key.Model, b.key.Model), cmp.Compare(a.key.RoutingGroup, b.key.RoutingGroup))
	})
	out := []ModelLoad{}
	for _, p := range parts {
		if (model != nil && p.key.Model != *model) || (group != nil && p.key.RoutingGroup != *group) {
			continue
		}
		ml := ModelLoad{ModelName: p.key.Model, RoutingGroup: p.key.RoutingGroup, Loads: []PotentialLoad{}}
		for _, l := range p.loads.Loads() {
			ml.Loads = append(ml.Loads, PotentialLoad{WorkerID: l.Worker.WorkerID, DPRank: l.Worker.DPRank,
				PotentialPrefillTokens: uint64(l.ActivePrefillTokens), PotentialDecodeBlocks: uint64(l.ActiveDecodeBlocks),
				ActiveRequests: uint64(l.ActiveRequests)})
		}
		ml.PendingCount, ml.PendingISLTokens = p.pending()
		out = append(out, ml)
	}
	return out
}

// PotentialLoads projects every rank's load as if this prompt were added to it
// (POST /potential_loads): prefill grows by the uncached part when prefill is
// tracked, decode by the blocks not already active there.
func (s *Service) PotentialLoads(ctx context.Context, q *PromptQuery) ([]PotentialLoad, error) {
	rq, err := s.promptFor(partitionOf(q.PartitionKey), q.RouterConfigOverride, &q.PromptRequest, forSelection)
	if err != nil {
		return nil, err
	}
	p, eff, pr := rq.part, rq.eff, rq.prompt
	overlaps := p.match(pr)
	ws := p.workers.Load()
	out := []PotentialLoad{}
	for _, pj := range p.loads.Project(pr.tracking, nil) {
		if _, ok := ws.rank(pj.Worker); !ok {
			continue
		}
		prefill := pj.ActivePrefillTokens
		if eff.TrackPrefillTokens {
			o := overlapOf(overlaps, pj.Worker)
			cached := scheduler.CachedTokens(o, p.blockSize, eff.HostCacheHitWeight, eff.DiskCacheHitWeight)
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
	rq, err := s.promptFor(partitionOf(q.PartitionKey), q.RouterConfigOverride, &q.PromptRequest, forSelection)
	if err != nil {
		return nil, err
	}
	p, eff, pr := rq.part, rq.eff, rq.prompt
	overlaps := p.match(pr)
	rows := map[index.WorkerKey]index.Overlap{}
	for _, w := range p.workers.Load().ranks {
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
	resp := &OverlapScoresResponse{BlockSize: p.blockSize, NumBlocks: len(pr.locals), Workers: make([]OverlapScoreRow, 0, len(keys)),
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

// kvHint builds the KV transfer hint of a booking (Dynamo's
// lib/kv-router/src/kv_hints.rs): when another worker of the same hint role
// holds a strictly longer root-aligned device prefix and serves hints for its
// rank, tell the chosen worker to fetch that prefix.
func (s *Service) kvHint(d *decision, selectionID string) *KVHint {
	if !s.set.useKVEvents || d.part.ix.Config().PredictedTTL > 0 || !d.booked {
		return nil
	}
	role := deref(d.rec.RouterHintWorkerType, "")
	if role == "" {
		return nil
	}
	ws := d.part.workers.Load()
	own := overlapOf(d.overlaps, d.worker).Device
	var best index.Overlap
	var bestEP string
	for _, o := range d.overlaps {
		if o.Worker == d.worker || o.Device <= own {
			continue
		}
		src, ok := ws.rank(o.Worker)
		if !ok || deref(src.RouterHintWorkerType, "") != role || deref(src.KVEventSourceMode, "") == catalog.StateAgentV2 {
			continue
		}
		ep := src.RouterHintSourceControlEndpoints[o.Worker.DPRank]
		if ep == "" {
			continue
		}
		if o.Device > best.Device || (o.Device == best.Device && (o.Worker.WorkerID < best.Worker.WorkerID ||
			(o.Worker.WorkerID == best.Worker.WorkerID && o.Worker.DPRank < best.Worker.DPRank))) {
			best, bestEP = o, ep
		}
	}
	if bestEP == "" || best.Device == 0 {
		return nil
	}
	// Entry i is request block i: the public sequence hash of the prefix.
	hashes := kvhash.SequenceHashes(d.prompt.locals[:best.Device])
	return &KVHint{ProtocolVersion: "0.1", MessageID: selectionID, Actions: []KVHintAction{{
		ActionID: "a1", ActionType: "kv.fetch", ActionVersion: "1.0",
		Payload: KVHintPayload{BlockHashes: hashes, SourceControlEndpoint: bestEP},
	}}}
}
