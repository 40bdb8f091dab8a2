package selection

import (
	"cmp"
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/kvselect/kvselect/selection/admission"
	"github.com/kvselect/kvselect/selection/affinity"
	"github.com/kvselect/kvselect/selection/bookingend"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/decisionlog"
	"github.com/kvselect/kvselect/selection/engine"
	"github.com/kvselect/kvselect/selection/flow"
	"github.com/kvselect/kvselect/selection/health"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/kvhash"
	"github.com/kvselect/kvselect/selection/latency"
	"github.com/kvselect/kvselect/selection/loads"
	"github.com/kvselect/kvselect/selection/partition"
	"github.com/kvselect/kvselect/selection/pending"
	"github.com/kvselect/kvselect/selection/randsrc"
	"github.com/kvselect/kvselect/selection/readiness"
	"github.com/kvselect/kvselect/selection/reservation"
	"github.com/kvselect/kvselect/selection/routerconfig"
	"github.com/kvselect/kvselect/selection/scheduler"
)

// Config assembles everything a Service needs. Every field but Router has a
// useful zero value.
type Config struct {
	// Router is the router configuration (the DYN_ROUTER_* knobs);
	// routerconfig.Default() is Dynamo's. New validates it.
	Router routerconfig.Config
	// Tracking selects the tracking-hash algorithm (--router-tracking-*).
	Tracking kvhash.TrackingConfig
	// SelectionCache bounds the pending-selection cache (--selection-cache-*).
	SelectionCache pending.Config
	// Clock returns the current time; time.Now when nil.
	Clock func() time.Time
	// Rand drives tie-breaking, softmax sampling, generated ids and random
	// tracking hashes; seeded from crypto/rand when nil. Use a seeded source in
	// tests for reproducible choices.
	Rand *rand.Rand
	// Listeners receives per-rank attach/detach calls when KV events are on; nil
	// means no adapter is connected (endpoints are still validated).
	Listeners Listeners
	// EventsCollector says the Listeners also run a collector socket that
	// engines dial (--kv-events-bind): a worker registered without a KV event
	// endpoint is then schedulable, its ranks attached with an empty
	// RankEndpoints.KVEvents and recognised by their topic.
	EventsCollector bool
	// Policy replaces the default selection policy (Dynamo's cost,
	// scheduler.DefaultPolicy) when set; SetPolicy replaces it at run time.
	// New refuses a policy SetPolicy would refuse.
	Policy *scheduler.Policy
	// PickerPolicy, when set, is the policy of the requests of the ext_proc
	// picker front (SelectRequest.FromPicker) instead of Policy: a default
	// per front, Dynamo's cost for the REST API's Dynamo callers and the
	// latency-predicting policy for the gateway.
	PickerPolicy *scheduler.Policy
	// Latency tunes the online latency model's fit (package latency); the
	// zero value takes its defaults.
	Latency latency.Config
	// OnLatency, when set, hears of every latency observation and every
	// request shed for its objectives (for metrics); called with no service
	// lock held.
	OnLatency func(LatencyEvent)
	// Engine configures how engine metrics (ReportEngineMetrics) and health
	// outcomes (ReportOutcome) enter selection; DefaultEngineConfig when nil.
	Engine *EngineConfig
	// PrefillRoutingGroup is the routing group of a model's prefill workers
	// (--prefill-routing-group); DefaultPrefillRoutingGroup when empty. A
	// worker registered with role "prefill" and no routing group joins it,
	// and a disaggregated request (SelectRequest.Disaggregated) chooses its
	// prefill worker there.
	PrefillRoutingGroup string
	// OnPrefillPool, when set, is told each time a model's prefill pool
	// changes between usable and not for disaggregated requests (the last
	// prefill worker left, every one is ejected or overloaded, or one is back),
	// with the reason; called with no service lock held. The server logs it.
	OnPrefillPool func(model string, usable bool, reason string)
	// Flow turns flow control on (package admission): while every worker of a
	// partition is busy its waiting requests are ordered by priority band,
	// tenant fairness and arrival, within Flow's limits, instead of by the
	// router queue policy. It needs queueing (router_queue_threshold); nil
	// is off.
	Flow *flow.Config
	// OnFlow, when set, hears of every request that meets flow control
	// leaving it (dispatched, expired, shed, rejected, abandoned), with no
	// service lock held. The server counts them.
	OnFlow func(FlowEvent)
	// RecentDecisions is how many of the latest decisions the decision log
	// keeps for the status page (Inspector.RecentDecisions):
	// DefaultRecentDecisions when zero, none when negative.
	RecentDecisions int
	// BookingEnd tunes the estimated end of bookings whose end nobody will
	// report (EndByEstimate, package bookingend); the zero value takes its
	// defaults.
	BookingEnd bookingend.Config
	// OnBookingEnd, when set, hears of every estimated end set, every
	// booking ended by its estimate and every traced booking whose end was
	// seen (with the estimate it would have had), for metrics; called with
	// no service lock held.
	OnBookingEnd func(BookingEndEvent)
	// KeepsEstimatedEnds says a front may keep bookings to an estimated
	// end (EndByEstimate): every booking of a prompt hashed from its token
	// ids then watches its engine's KV events for its first token
	// (prefillseen.go). Off, EndByEstimate works on the estimate alone, and
	// bookings pay nothing for a watch nobody reads.
	KeepsEstimatedEnds bool
}

// Service is the embedded selection service. It is safe for concurrent use.
//
// Lock order. A goroutine holding one of these locks takes only locks further
// down the list, and never two of one level at once (two partitions'
// scheduling locks, say):
//
//  1. the catalog's catMu (workerCatalog, workers.go) serializes catalog
//     changes (UpsertWorker, PatchWorker, DeleteWorker) end to end,
//     Listeners.Attach and Detach included, so a listener implementation's
//     own locks come after it.
//  2. the catalog's mu guards its records; the partition set's lock
//     (partition.Set) guards the partition map. The two are never held
//     together. Set.Ensure builds
//     a partition under the set's lock (index.Partitions' lock, the replica
//     id's once, the random source's lock); Shutdown wakes every partition
//     under its read lock (the queues' locks).
//  3. the replica id's sync.Once (randsrc.Source.ReplicaID) draws the id
//     under the random source's lock.
//  4. a partition's scheduling lock (partition.Sched) makes select-and-book
//     atomic: under it choose's decide projects and books (loads.Tracker),
//     runs the policy (whose own state, if any, is a leaf) and asks the
//     queue whether it may proceed (admission.Queue's lock);
//     Partition.ReplaceWorkers swaps the worker set and the tracker's ranks
//     under it.
//  5. a partition's queue lock (admission.Queue) guards its waiting
//     selections and wake channel.
//  6. leaves, which call into nothing that locks: the reservation table's
//     (reservation.Table), the readiness conditions' (readiness.Gate), the
//     random source's (randsrc.Source), loads.Tracker's, index.Index's,
//     index.Partitions', affinity.Table's, pending.Cache's, kvhash.Tracker's,
//     the text index's build lock (textindex.Index), the engine table's
//     (engine.Table), the health table's (health.Table), the decision log's
//     and the disaggregation counts' (decisionlog), the latency model's
//     (latency.Model).
//     Two leaves are never held together.
//
// Hence: a session lease is released (affinity.Table) only after the
// reservation table let go of the row; frees, prefill completions and output
// blocks reach loads.Tracker without the scheduling lock (they only lower or
// grow one booking, which no decision needs to see atomically with its own
// booking); the replica observer, the flow and prefill-pool callbacks and the
// listeners' RankEventsStatus are called with no service lock held. The
// injected clock is read under the scheduling lock too, so it must not call
// into the service.
type Service struct {
	set     settings
	router  routerconfig.Config
	clock   func() time.Time
	prompts normalizer // request prompts to hashes (prepare.go)
	pending *pending.Cache
	indexes *index.Partitions
	rows    overlapRows // recycled overlap rows of decisions (choose.go)

	// policy is the selection policy in force, replaced whole by SetPolicy. A
	// request loads it once (prepare) and uses that value throughout.
	policy atomic.Pointer[scheduler.Policy]
	// pickerPolicy is the picker front's own policy (Config.PickerPolicy),
	// nil when it runs policy.
	pickerPolicy atomic.Pointer[scheduler.Policy]

	// prepared counts the prompts prepare has begun on (Prepared).
	prepared atomic.Uint64

	// rnd is the one random source: partitions' streams, generated ids,
	// the replica id.
	rnd *randsrc.Source

	// decisions keeps the latest decisions; nil when off.
	decisions *decisionlog.Log
	disagg    decisionlog.Disagg // disaggregated decisions and prefill pool usability (Config.OnPrefillPool)

	cat workerCatalog // the worker records and their listeners (workers.go)

	parts *partition.Set    // one per (model, routing group)
	resv  reservation.Table // selection ids across every partition
	gate  readiness.Gate    // shutdown, startup recovery, external conditions

	repl Replica // the replica planes' side (replica.go)

	engineCfg engine.Config
	engines   engine.Table    // engine metrics per worker
	health    health.Table    // ejection state per worker
	judge     partition.Judge // the two above and the busy thresholds, for candidates

	inspector Inspector // the read-only view Inspect returns

	flowCfg *flow.Config    // nil: flow control off
	onFlow  func(FlowEvent) // Config.OnFlow, or a no-op

	latency   *latency.Model     // fitted TTFT and ITL per worker (latency.go)
	onLatency func(LatencyEvent) // Config.OnLatency, or a no-op

	ends         *bookingend.Estimator // estimated ends (bookingend.go)
	onBookingEnd func(BookingEndEvent) // Config.OnBookingEnd, or a no-op
	// endsWake and endsArmed let a server's ends loop (EndsChanged,
	// MaintainEnds) sleep until the next estimated instant: endsArmed is
	// the Unix nanoseconds it sleeps until (0: unknown), and a new end due
	// before that signals endsWake.
	endsWake  chan struct{}
	endsArmed atomic.Int64
	// watchFirstTokens is Config.KeepsEstimatedEnds.
	watchFirstTokens bool
}

// New validates cfg and returns the service.
func New(cfg Config) (*Service, error) {
	if err := cfg.Router.Validate(); err != nil {
		return nil, fmt.Errorf("router config: %w", err)
	}
	rnd := cfg.Rand
	if rnd == nil {
		rnd = rand.New(rand.NewChaCha8(randomSeed()))
	}
	src := randsrc.New(rnd)
	tracker, err := kvhash.NewTracker(cfg.Tracking, src.Child())
	if err != nil {
		return nil, err
	}
	set, err := settingsFrom(cfg.Router)
	if err != nil {
		return nil, err
	}
	set.collector = cfg.EventsCollector
	set.prefillGroup = cmp.Or(cfg.PrefillRoutingGroup, DefaultPrefillRoutingGroup)
	pc, err := pending.New(cfg.SelectionCache)
	if err != nil {
		return nil, fmt.Errorf("selection cache: %w", err)
	}
	ixs, err := index.NewPartitions(set.indexConfig)
	if err != nil {
		return nil, err
	}
	policy := scheduler.DefaultPolicy()
	if cfg.Policy != nil {
		policy = *cfg.Policy
	}
	if err := validPolicy(&policy, cfg.Router); err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	if pp := cfg.PickerPolicy; pp != nil {
		if err := validPolicy(pp, cfg.Router); err != nil {
			return nil, fmt.Errorf("picker policy: %w", err)
		}
	}
	clock := cfg.Clock
	if clock == nil {
		clock = time.Now
	}
	engineCfg := engine.DefaultConfig()
	if cfg.Engine != nil {
		engineCfg = *cfg.Engine
	}
	if err := engineCfg.Validate(); err != nil {
		return nil, fmt.Errorf("engine config: %w", err)
	}
	flowCfg, err := flowConfig(cfg.Flow, set.queueing)
	if err != nil {
		return nil, err
	}
	ends, err := bookingend.New(cfg.BookingEnd)
	if err != nil {
		return nil, err
	}
	s := &Service{
		ends: ends, onBookingEnd: cfg.OnBookingEnd, endsWake: make(chan struct{}, 1),
		watchFirstTokens: cfg.KeepsEstimatedEnds,
		flowCfg:          flowCfg, onFlow: cfg.OnFlow,
		disagg:    decisionlog.Disagg{OnPool: cfg.OnPrefillPool},
		engineCfg: engineCfg,
		set:       set, router: cfg.Router, clock: clock,
		prompts: normalizer{tracker: tracker, textTTL: cfg.Router.RouterTTL},
		pending: pc, indexes: ixs, rnd: src,
		decisions: decisionlog.New(cfg.RecentDecisions),
		latency:   latency.NewModel(cfg.Latency), onLatency: cfg.OnLatency,
	}
	if s.onLatency == nil {
		s.onLatency = func(LatencyEvent) {}
	}
	if s.onBookingEnd == nil {
		s.onBookingEnd = func(BookingEndEvent) {}
	}
	s.parts = partition.NewSet((&partitionFactory{indexes: ixs, router: &s.router, set: &s.set, flow: flowCfg, rnd: src, clock: clock}).build)
	s.judge = partition.Judge{Health: &s.health, Engines: &s.engines, Engine: &s.engineCfg, Router: &s.router, Clock: clock}
	s.cat = workerCatalog{set: &s.set, listeners: cfg.Listeners, parts: s.parts, resv: &s.resv, gate: &s.gate, clock: clock, applied: s.storedSeen,
		attachedRanks: make(map[uint64]attached), records: make(map[uint64]*catalog.Record)}
	if s.onFlow == nil {
		s.onFlow = func(FlowEvent) {}
	}
	s.inspector = Inspector{s}
	s.repl = Replica{parts: s.parts, resv: &s.resv, indexes: ixs, gate: &s.gate, rnd: src, clock: clock}
	s.policy.Store(clonePolicy(policy))
	if pp := cfg.PickerPolicy; pp != nil {
		s.pickerPolicy.Store(clonePolicy(*pp))
	}
	return s, nil
}

// flowConfig validates the flow control configuration, nil for off, and
// fills in its defaults.
func flowConfig(c *flow.Config, queueing bool) (*flow.Config, error) {
	if c == nil {
		return nil, nil
	}
	if !queueing {
		return nil, errors.New("flow control orders the requests that wait while every worker is busy: it needs queueing on (DYN_ROUTER_QUEUE_THRESHOLD, router_queue_threshold)")
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("flow control: %w", err)
	}
	out := c.WithDefaults()
	return &out, nil
}

func randomSeed() (seed [32]byte) {
	_, _ = crand.Read(seed[:]) // never fails on supported platforms
	return seed
}

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

// partitionFactory makes a service's partitions from its settings.
type partitionFactory struct {
	indexes *index.Partitions
	router  *routerconfig.Config
	set     *settings
	flow    *flow.Config
	rnd     *randsrc.Source
	clock   func() time.Time
}

func (f *partitionFactory) build(key index.Partition, blockSize uint32, eagle bool) (*partition.Partition, error) {
	ix, err := f.indexes.Ensure(key, blockSize)
	if err != nil {
		return nil, err
	}
	lt, err := loads.New(loads.Config{
		BlockSize:         blockSize,
		TrackActiveBlocks: f.router.TrackActiveBlocks,
		TrackOutputBlocks: f.router.TrackOutputBlocks,
		Expiry:            f.router.ActiveRequestExpiry,
	})
	if err != nil {
		return nil, fmt.Errorf("partition %s: %w", partition.Name(key), err)
	}
	qp, err := scheduler.ParseQueuePolicy(string(f.router.QueuePolicy))
	if err != nil {
		return nil, err
	}
	parts := partition.Parts{Key: key, BlockSize: blockSize, Eagle: eagle, Index: ix, Loads: lt, Rand: f.rnd.Child()}
	parts.Queue = admission.New(key, partition.Name(key), qp, f.flow, f.clock())
	if f.set.affinityTTL > 0 {
		mode := affinity.Hard
		if f.set.affinity == routerconfig.AffinitySoft {
			mode = affinity.Soft
		}
		t, err := affinity.NewTable(affinity.Config{TTL: f.set.affinityTTL, Mode: mode, WriterID: f.rnd.ReplicaID()}, f.clock())
		if err != nil {
			return nil, fmt.Errorf("partition %s: %w", partition.Name(key), err)
		}
		parts.Affinity = t
	}
	return partition.New(parts), nil
}

// Health is process liveness (GET /health).
func (s *Service) Health() bool { return true }

// Shutdown makes mutating and selection calls fail with 503 from now on; DELETE
// /workers keeps working and queued selections are released with an error.
func (s *Service) Shutdown() {
	s.gate.ShutDown()
	s.parts.WakeAll()
}

// Prepared counts the prompts the service has begun to select, score or book
// for since it started, failed ones included: the host's measure of whether
// requests are coming (its idle memory release waits for an interval
// without any).
func (s *Service) Prepared() uint64 { return s.prepared.Load() }

// Maintain runs periodic upkeep at the current time: reclaims bookings older
// than the active-request expiry (without publishing frees), sweeps reservation
// rows whose booking vanished, reaps idle session bindings, expires
// approximate-index entries, takes requests past the flow control TTL out of
// their queue, wakes every queued selection to re-check, and completes and
// frees the bookings whose estimated first token and end have come
// (EndByEstimate). The host calls
// it every few seconds (with flow control, at least every tenth of the TTL).
func (s *Service) Maintain(ctx context.Context) {
	now := s.clock()
	for _, p := range s.parts.All() {
		for _, id := range p.Loads().Expire(now) {
			s.resv.Release(id, now)
		}
		if a := p.Affinity(); a != nil {
			a.Reap(now)
		}
		// Released leases and reaped bindings go to the replica peers.
		s.repl.flushBindings(p)
		p.Index().Expire(now)
		p.Text().Expire(now)
		p.Queue().Expire(now)
		p.Wake()
	}
	s.endDue(ctx, now)
	s.resv.ForgetStores(now.Add(-storesRecent))
}
