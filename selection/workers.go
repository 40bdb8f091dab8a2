package selection

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/kvselect/kvselect/selection/apierr"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/partition"
	"github.com/kvselect/kvselect/selection/readiness"
	"github.com/kvselect/kvselect/selection/reservation"
)

// Listeners is the seam the KV-event adapters plug into (engines/kvlisten: a
// ZMQ SUB per worker rank, with replay). The service reconciles the catalog
// against it rank by rank: a rank whose event and replay endpoints are
// unchanged keeps its listener, sequence watermark and indexed blocks; a
// changed rank is detached, its blocks purged, and attached afresh; a removed
// rank is detached and purged (the "Worker Restarts" rules of Dynamo's
// standalone selection service docs). Calls are serialized by the service's
// catalog lock; implementations must not call back into it.
type Listeners interface {
	// Attach starts consuming one rank's KV events into a.Index, with a fresh
	// sequence watermark.
	Attach(a RankAttachment) error
	// Detach stops the rank's listener. The service purges its blocks.
	Detach(p index.Partition, w index.WorkerKey)
}

// ListenerStatus is implemented by Listeners that can report a rank's state;
// Workers then shows it in each record's kv_events_status.
type ListenerStatus interface {
	RankEventsStatus(p index.Partition, w index.WorkerKey) (catalog.RankEventsStatus, bool)
}

// EventsCollector is implemented by Listeners that run collector sockets
// (engines dialing kvselect, --kv-events-bind); KVEventsCollector reports
// them.
type EventsCollector interface {
	CollectorStatus() (CollectorStatus, bool)
}

// CollectorStatus is what the KV events collector sockets have seen since they
// were bound (GET /kv_events/collector).
type CollectorStatus struct {
	Bound     []string          `json:"bound"`     // the addresses bound, ports resolved
	Received  uint64            `json:"received"`  // messages read from the sockets
	Delivered uint64            `json:"delivered"` // messages handed to at least one worker rank
	Unmatched map[string]uint64 `json:"unmatched"` // messages that reached no rank, by reason
	// Rejected counts peers disconnected for breaking the wire protocol, by
	// reason (oversized_frame, too_many_frames, bad_greeting, handshake_timeout, ...).
	Rejected map[string]uint64 `json:"rejected_connections"`
	// Recent lists the latest topics whose messages reached no rank, newest first.
	Recent []UnmatchedTopic `json:"recent_unmatched"`
}

// UnmatchedTopic is one topic whose messages reached no worker rank.
type UnmatchedTopic struct {
	Topic    string    `json:"topic"`
	Reason   string    `json:"reason"`
	DPRank   *uint32   `json:"dp_rank,omitempty"` // the batch's rank, for unknown_rank
	Count    uint64    `json:"count"`
	LastSeen time.Time `json:"last_seen"`
}

// RankAttachment is everything a listener needs for one worker rank: where its
// engine publishes, how to hash what it publishes, and the index to feed.
type RankAttachment struct {
	Partition index.Partition
	Worker    index.WorkerKey
	Endpoints catalog.RankEndpoints
	BlockSize uint32 // the partition's (frozen) block size
	Eagle     bool   // the partition's Eagle mode
	Index     *index.Index
	// Applied, when set, is told each batch of events once the index
	// applied it (the events are the listener's: read, not kept). The
	// service reads, in the blocks an engine stores, the first tokens of
	// the bookings it keeps to an estimated end (prefillseen.go).
	Applied func([]index.Event)
}

// attached is what the service attached for one schedulable worker.
type attached map[uint32]catalog.RankEndpoints

// UpsertWorker registers or fully replaces a worker record (POST /workers). The
// record is accepted even when it cannot be scheduled; its lifecycle and
// not_schedulable_reasons say why.
func (s *Service) UpsertWorker(ctx context.Context, rec catalog.Record) (*catalog.Record, error) {
	rec.ResolveRole(s.set.prefillGroup)
	if err := rec.Normalize(); err != nil {
		return nil, apierr.New(KindBadRequest, "%v", err)
	}
	rec.KVEventsStatus, rec.EngineMetrics, rec.Health = nil, nil, nil // output only
	return s.cat.upsert(rec.Clone())
}

// PatchWorker applies a partial update (PATCH /workers/{id}).
func (s *Service) PatchWorker(ctx context.Context, workerID uint64, p catalog.Patch) (*catalog.Record, error) {
	return s.cat.patch(workerID, p)
}

// DeleteWorker drains and removes a worker (DELETE /workers/{id}); it works
// during shutdown. Bookings on it are released as it leaves its partition's
// load tracker, and its engine figures and health state are forgotten.
func (s *Service) DeleteWorker(ctx context.Context, workerID uint64) (*catalog.Record, error) {
	return s.cat.remove(workerID, func(id uint64) {
		s.engines.Forget(id)
		s.health.Forget(id)
		s.latency.Forget(id)
	})
}

// Workers lists catalog records, optionally filtered by model and routing
// group, with their KV event listeners' status, engine figures and health.
func (s *Service) Workers(model, group *string) []*catalog.Record {
	out := s.cat.list(model, group)
	now := s.clock()
	for _, r := range out {
		r.EngineMetrics = s.engines.View(r, now, &s.engineCfg)
		var reason string
		if r.Health, reason = s.health.View(r.WorkerID, now); reason != "" {
			r.NotSchedulableReasons = append(r.NotSchedulableReasons, reason)
		}
	}
	catalog.Sort(out)
	return out
}

// workerCatalog is the worker catalog: the records by worker id, the KV event
// listeners attached for each schedulable worker's ranks, and the publishing
// of schedulable records to their partitions. catMu serializes its changes
// end to end; mu guards the records (see the lock order on Service).
type workerCatalog struct {
	set       *settings
	listeners Listeners
	parts     *partition.Set
	resv      *reservation.Table
	gate      *readiness.Gate
	clock     func() time.Time
	applied   func(index.Partition, []index.Event) // RankAttachment.Applied of a partition's ranks

	catMu         sync.Mutex          // serializes catalog changes
	attachedRanks map[uint64]attached // guarded by catMu

	mu      sync.RWMutex // guards records
	records map[uint64]*catalog.Record
}

// upsert stores a normalized record, unless the service is shutting down.
func (c *workerCatalog) upsert(rec *catalog.Record) (*catalog.Record, error) {
	c.catMu.Lock()
	defer c.catMu.Unlock()
	if err := c.gate.Admit(); err != nil {
		return nil, err
	}
	return c.apply(rec), nil
}

// patch applies a partial update to worker workerID's record.
func (c *workerCatalog) patch(workerID uint64, p catalog.Patch) (*catalog.Record, error) {
	c.catMu.Lock()
	defer c.catMu.Unlock()
	if err := c.gate.Admit(); err != nil {
		return nil, err
	}
	old, ok := c.record(workerID)
	if !ok {
		return nil, apierr.New(KindNotFound, "worker %d not found", workerID)
	}
	rec := p.Apply(old)
	if err := rec.Normalize(); err != nil {
		return nil, apierr.New(KindBadRequest, "%v", err)
	}
	return c.apply(rec), nil
}

// remove retires and forgets worker workerID, calling forget with its id
// before the catalog's next change.
func (c *workerCatalog) remove(workerID uint64, forget func(uint64)) (*catalog.Record, error) {
	c.catMu.Lock()
	defer c.catMu.Unlock()
	old, ok := c.record(workerID)
	if !ok {
		return nil, apierr.New(KindNotFound, "worker %d not found", workerID)
	}
	c.retire(old)
	c.mu.Lock()
	delete(c.records, workerID)
	c.mu.Unlock()
	forget(workerID)
	out := old.Clone()
	out.Lifecycle = catalog.Unschedulable
	out.NotSchedulableReasons = nil
	return out, nil
}

// list copies the records of model and group (nil: any) with their KV event
// listeners' status.
func (c *workerCatalog) list(model, group *string) []*catalog.Record {
	c.mu.RLock()
	out := make([]*catalog.Record, 0, len(c.records))
	for _, r := range c.records {
		if (model == nil || r.ModelName == *model) && (group == nil || r.RoutingGroup == *group) {
			out = append(out, r.Clone())
		}
	}
	c.mu.RUnlock()
	if ls, ok := c.listeners.(ListenerStatus); ok {
		for _, r := range out {
			p := partitionOfRecord(r)
			for _, rank := range r.Ranks() {
				st, ok := ls.RankEventsStatus(p, index.WorkerKey{WorkerID: r.WorkerID, DPRank: rank})
				if !ok {
					continue
				}
				if r.KVEventsStatus == nil {
					r.KVEventsStatus = make(map[uint32]catalog.RankEventsStatus)
				}
				r.KVEventsStatus[rank] = st
			}
		}
	}
	return out
}

func (c *workerCatalog) record(id uint64) (*catalog.Record, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	r, ok := c.records[id]
	return r, ok
}

// apply stores a normalized record under catMu, as Dynamo's
// core/workers.rs upsert does: it computes why the record cannot be scheduled
// (if so), retires the previous record when it leaves its partition or becomes
// incomplete, reconciles the listeners rank by rank, then publishes the
// schedulable record to its partition. It returns a copy of the stored
// record.
func (c *workerCatalog) apply(rec *catalog.Record) *catalog.Record {
	key := partitionOfRecord(rec)
	reasons := rec.Reasons(catalog.Checks{Queueing: c.set.queueing, ConsumesEvents: c.set.useKVEvents, Collector: c.set.collector, PrefillGroup: c.set.prefillGroup})
	var part *partition.Partition
	if len(reasons) == 0 {
		var err error
		if part, err = c.parts.Ensure(key, *rec.BlockSize, deref(rec.IsEagle, false)); err != nil {
			reasons = append(reasons, "reconciliation failed: "+err.Error())
		}
	}
	old, had := c.record(rec.WorkerID)
	oldSchedulable := had && old.Lifecycle == catalog.Schedulable
	samePartition := had && old.ModelName == rec.ModelName && old.RoutingGroup == rec.RoutingGroup
	if oldSchedulable && (!samePartition || len(reasons) > 0) {
		c.retire(old)
		oldSchedulable = false
	}
	if len(reasons) == 0 {
		var prev attached
		if oldSchedulable {
			prev = c.attachedRanks[rec.WorkerID]
		}
		if err := c.reconcileListeners(part, rec, prev); err != nil {
			reasons = append(reasons, "reconciliation failed: "+err.Error())
			if oldSchedulable {
				// The old ranks were torn down with the failed reconciliation.
				c.unpublish(old)
			}
		}
	}
	rec.NotSchedulableReasons = reasons
	rec.Lifecycle = catalog.Incomplete
	if len(reasons) == 0 {
		rec.Lifecycle = catalog.Schedulable
	}
	c.mu.Lock()
	c.records[rec.WorkerID] = rec
	c.mu.Unlock()
	if rec.Lifecycle == catalog.Schedulable {
		c.forgetDropped(part, part.Publish(rec))
	}
	return rec.Clone()
}

// reconcileListeners attaches the worker's ranks, keeping unchanged ones. On
// failure it rolls back the ranks it attached in this pass.
func (c *workerCatalog) reconcileListeners(p *partition.Partition, rec *catalog.Record, prev attached) error {
	if !c.set.useKVEvents {
		return nil
	}
	want := rec.KVEndpoints(c.set.collector)
	for _, rank := range slices.Sorted(maps.Keys(want)) {
		eps := want[rank]
		if eps.KVEvents != "" {
			if err := catalog.ValidateZMQEndpoint(eps.KVEvents); err != nil {
				return err
			}
		}
		if eps.Replay != "" {
			if err := catalog.ValidateZMQEndpoint(eps.Replay); err != nil {
				return err
			}
		}
	}
	next := make(attached, len(want))
	var fresh []uint32
	for rank, old := range prev {
		if eps, ok := want[rank]; ok && eps == old {
			next[rank] = old // unchanged: keeps listener, watermark and blocks
			continue
		}
		c.detachRank(p, rec.WorkerID, rank)
	}
	for _, rank := range slices.Sorted(maps.Keys(want)) {
		if _, kept := next[rank]; kept {
			continue
		}
		wk := index.WorkerKey{WorkerID: rec.WorkerID, DPRank: rank}
		if c.listeners != nil {
			a := RankAttachment{Partition: p.Key(), Worker: wk, Endpoints: want[rank], BlockSize: p.BlockSize(), Eagle: p.Eagle(), Index: p.Index()}
			if c.applied != nil {
				key := p.Key()
				a.Applied = func(evs []index.Event) { c.applied(key, evs) }
			}
			if err := c.listeners.Attach(a); err != nil {
				for _, r := range fresh {
					c.detachRank(p, rec.WorkerID, r)
				}
				for r := range next {
					c.detachRank(p, rec.WorkerID, r)
				}
				delete(c.attachedRanks, rec.WorkerID)
				return fmt.Errorf("attach dp_rank %d: %w", rank, err)
			}
		}
		next[rank] = want[rank]
		fresh = append(fresh, rank)
	}
	c.attachedRanks[rec.WorkerID] = next
	return nil
}

func (c *workerCatalog) detachRank(p *partition.Partition, workerID uint64, rank uint32) {
	wk := index.WorkerKey{WorkerID: workerID, DPRank: rank}
	if c.listeners != nil {
		c.listeners.Detach(p.Key(), wk)
	}
	p.Index().RemoveRank(wk)
}

// unpublish removes a worker from its partition's candidates; bookings on its
// ranks are released.
func (c *workerCatalog) unpublish(old *catalog.Record) {
	p := c.parts.Get(partitionOfRecord(old))
	if p == nil {
		return
	}
	c.forgetDropped(p, p.ReplaceWorkers(func(m map[uint64]*catalog.Record) { delete(m, old.WorkerID) }))
}

// forgetDropped releases the reservations of bookings a change of p's
// workers dropped, and wakes p's queue.
func (c *workerCatalog) forgetDropped(p *partition.Partition, dropped []string) {
	now := c.clock()
	for _, id := range dropped {
		c.resv.Release(id, now)
	}
	p.Wake()
}

// retire takes a schedulable worker out of its partition: draining (no new
// selections), listeners detached and blocks purged, bookings released.
func (c *workerCatalog) retire(old *catalog.Record) {
	key := partitionOfRecord(old)
	p := c.parts.Get(key)
	c.mu.Lock()
	if cur, ok := c.records[old.WorkerID]; ok && cur == old {
		draining := old.Clone()
		draining.Lifecycle = catalog.Draining
		c.records[old.WorkerID] = draining
	}
	c.mu.Unlock()
	if p == nil {
		return
	}
	c.unpublish(old)
	for rank := range c.attachedRanks[old.WorkerID] {
		c.detachRank(p, old.WorkerID, rank)
	}
	delete(c.attachedRanks, old.WorkerID)
	// Approximate entries and side-index predictions go with the worker too.
	p.Index().RemoveWorker(old.WorkerID)
}

// engineTargets lists the schedulable workers with an HTTP endpoint, in
// worker-id order.
func (c *workerCatalog) engineTargets() []EngineTarget {
	c.mu.RLock()
	out := make([]EngineTarget, 0, len(c.records))
	for _, r := range c.records {
		if r.Lifecycle != catalog.Schedulable {
			continue
		}
		u, ok := r.MetricsURL()
		if !ok {
			continue
		}
		t := EngineTarget{WorkerID: r.WorkerID, URL: u, Engine: r.EngineName(), Ranks: r.Ranks()}
		if h, ok := (&catalog.Record{Endpoint: r.Endpoint}).MetricsURL(); ok {
			t.HealthURL = h[:len(h)-len("/metrics")] + "/health"
		}
		out = append(out, t)
	}
	c.mu.RUnlock()
	slices.SortFunc(out, func(a, b EngineTarget) int { return cmp.Compare(a.WorkerID, b.WorkerID) })
	return out
}

// partitionOfRecord is the partition a worker record belongs to.
func partitionOfRecord(r *catalog.Record) index.Partition {
	return index.Partition{Model: r.ModelName, RoutingGroup: r.RoutingGroup}
}
