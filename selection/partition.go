package selection

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvselect/kvselect/selection/affinity"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/decisionlog"
	"github.com/kvselect/kvselect/selection/flow"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/loads"
	"github.com/kvselect/kvselect/selection/routerconfig"
	"github.com/kvselect/kvselect/selection/scheduler"
	"github.com/kvselect/kvselect/selection/textindex"
)

// settings are the router settings the service consults on every call, resolved
// once at build time.
type settings struct {
	useKVEvents bool
	collector   bool // a KV events collector socket feeds ranks without endpoints
	queueing    bool
	indexConfig index.Config
	affinityTTL time.Duration // 0 = session affinity off
	affinity    routerconfig.SessionAffinityMode
	// prefillGroup is the routing group of every model's prefill pool.
	prefillGroup string
}

func settingsFrom(c routerconfig.Config) (settings, error) {
	s := settings{
		useKVEvents: c.UseKVEvents,
		queueing:    c.QueueingEnabled(),
		indexConfig: index.Config{
			Approximate:  !c.UseKVEvents,
			TTL:          c.RouterTTL,
			PredictedTTL: c.PredictedTTL.Or(0),
			CachePolicy:  string(c.ApproximateCachePolicy),
		},
		affinityTTL: c.SessionAffinityTTL.Or(0),
		affinity:    c.SessionAffinityMode,
	}
	probe := s.indexConfig
	probe.BlockSize = 1
	if _, err := probe.Validate(); err != nil {
		return s, err
	}
	return s, nil
}

// partition is the per-(model, routing group) state: its index, load tracker,
// session table and the schedulable workers selection sees.
type partition struct {
	key       index.Partition
	blockSize uint32
	isEagle   bool
	ix        *index.Index
	loads     *loads.Tracker
	affinity  *affinity.Table // nil when session affinity is off
	// text is the approximate index of text prompts, apart from ix
	// (textprompt.go); built on first use.
	text textindex.Index

	// workers is an immutable snapshot of the schedulable workers, replaced on
	// every catalog change, so selection never takes the catalog lock.
	workers atomic.Pointer[workerSet]

	// schedMu makes select-and-book atomic within the partition, as Dynamo's
	// per-partition scheduler task is: two bookings never decide on the same
	// load snapshot. It comes after the service's catMu and mu and before
	// queueMu (the lock order on Service).
	schedMu sync.Mutex
	rnd     *rand.Rand            // tie-breaks and softmax draws; guarded by schedMu
	scratch scheduler.Scratch     // the picker's working set; guarded by schedMu
	projBuf []loads.Projection    // guarded by schedMu
	candBuf []scheduler.Candidate // guarded by schedMu

	// queue parks selections while every worker is busy (queueing enabled).
	// queueMu may be taken under schedMu, never the other way round.
	queueMu sync.Mutex
	queue   *scheduler.Queue[*waiter]
	flow    *flow.Controller // with flow control, in place of queue
	changed chan struct{}    // closed and replaced whenever load may have dropped

	// routing counts decisions and their matched prefixes (atomics).
	routing decisionlog.Counters
}

type workerSet struct {
	byID  map[uint64]*catalog.Record
	ranks []index.WorkerKey // sorted (worker_id, dp_rank)
}

func (ws *workerSet) rank(w index.WorkerKey) (*catalog.Record, bool) {
	if ws == nil {
		return nil, false
	}
	r, ok := ws.byID[w.WorkerID]
	if !ok || !r.HasRank(w.DPRank) {
		return nil, false
	}
	return r, true
}

func (s *Service) newPartition(key index.Partition, blockSize uint32, eagle bool) (*partition, error) {
	ix, err := s.indexes.Ensure(key, blockSize)
	if err != nil {
		return nil, err
	}
	lt, err := loads.New(loads.Config{
		BlockSize:         blockSize,
		TrackActiveBlocks: s.router.TrackActiveBlocks,
		TrackOutputBlocks: s.router.TrackOutputBlocks,
		Expiry:            s.router.ActiveRequestExpiry,
	})
	if err != nil {
		return nil, fmt.Errorf("partition %s: %w", displayKey(key), err)
	}
	qp, err := scheduler.ParseQueuePolicy(string(s.router.QueuePolicy))
	if err != nil {
		return nil, err
	}
	p := &partition{key: key, blockSize: blockSize, isEagle: eagle, ix: ix, loads: lt, changed: make(chan struct{}), rnd: s.rnd.Child(),
		queue: scheduler.NewQueue[*waiter](qp, s.clock())}
	if s.flowCfg != nil {
		p.flow = flow.New(*s.flowCfg)
	}
	if s.set.affinityTTL > 0 {
		mode := affinity.Hard
		if s.set.affinity == routerconfig.AffinitySoft {
			mode = affinity.Soft
		}
		t, err := affinity.NewTable(affinity.Config{TTL: s.set.affinityTTL, Mode: mode, WriterID: s.rnd.ReplicaID()}, s.clock())
		if err != nil {
			return nil, fmt.Errorf("partition %s: %w", displayKey(key), err)
		}
		p.affinity = t
	}
	p.workers.Store(&workerSet{byID: map[uint64]*catalog.Record{}})
	return p, nil
}

// publish makes rec a selection candidate in p.
func (s *Service) publish(p *partition, rec *catalog.Record) {
	s.replaceWorkers(p, func(m map[uint64]*catalog.Record) { m[rec.WorkerID] = rec.Clone() })
	if n := rec.TotalKVBlocks; n != nil {
		for _, rank := range rec.Ranks() {
			p.ix.Reserve(index.WorkerKey{WorkerID: rec.WorkerID, DPRank: rank}, index.TierDevice, int(min(*n, 1<<24)))
		}
	}
}

// unpublish removes a worker from its partition's candidates; bookings on its
// ranks are released.
func (s *Service) unpublish(old *catalog.Record) {
	p := s.partition(index.Partition{Model: old.ModelName, RoutingGroup: old.RoutingGroup})
	if p == nil {
		return
	}
	s.replaceWorkers(p, func(m map[uint64]*catalog.Record) { delete(m, old.WorkerID) })
}

func (s *Service) replaceWorkers(p *partition, edit func(map[uint64]*catalog.Record)) {
	cur := p.workers.Load()
	next := &workerSet{byID: make(map[uint64]*catalog.Record, len(cur.byID)+1)}
	for id, r := range cur.byID {
		next.byID[id] = r
	}
	edit(next.byID)
	for _, r := range next.byID {
		for _, rank := range r.Ranks() {
			next.ranks = append(next.ranks, index.WorkerKey{WorkerID: r.WorkerID, DPRank: rank})
		}
	}
	slices.SortFunc(next.ranks, index.CompareWorkerKeys)
	p.schedMu.Lock()
	p.workers.Store(next)
	dropped := p.loads.SetWorkers(next.ranks)
	p.schedMu.Unlock()
	// A rank that left the partition takes its indexed blocks along, whatever fed
	// them (KV events or recorded routing decisions).
	for _, w := range cur.ranks {
		if _, ok := slices.BinarySearchFunc(next.ranks, w, index.CompareWorkerKeys); !ok {
			p.ix.RemoveRank(w)
			p.text.RemoveRank(w)
		}
	}
	now := s.clock()
	for _, id := range dropped {
		s.dropReservation(id, now)
	}
	p.wake()
}

// match looks the prompt's block hashes up in the partition's index and
// returns the rows sorted by (worker_id, dp_rank), so overlapOf can find a rank
// by binary search: joining them with a thousand ranks by scanning would cost
// more than the selection itself.
func (p *partition) match(pr prompt) []index.Overlap {
	if len(pr.locals) == 0 {
		return nil
	}
	ix := p.ix
	if pr.text {
		ix = p.textIndex()
	}
	rows := ix.Match(pr.locals, false, nil)
	slices.SortFunc(rows, func(a, b index.Overlap) int { return index.CompareWorkerKeys(a.Worker, b.Worker) })
	return rows
}

// overlapOf returns w's row of overlaps (sorted by match), or a zero row.
func overlapOf(overlaps []index.Overlap, w index.WorkerKey) index.Overlap {
	i, ok := slices.BinarySearchFunc(overlaps, w, func(o index.Overlap, w index.WorkerKey) int {
		return index.CompareWorkerKeys(o.Worker, w)
	})
	if !ok {
		return index.Overlap{}
	}
	return overlaps[i]
}

// wake tells queued selections that load or workers changed.
func (p *partition) wake() {
	p.queueMu.Lock()
	close(p.changed)
	p.changed = make(chan struct{})
	p.queueMu.Unlock()
}
