// Package replicas measures what replica sync buys: two kvselect replicas
// (in-process selection.Services) select concurrently for prompts that share
// one hot prefix, cached on one of the workers, and book load there. Without
// sync each replica sees only its own bookings and both pile onto the cached
// worker; with sync (real ZMQ PUB/SUB on loopback, replicas/mesh)
// each sees the other's load and spreads earlier.
//
// The ground truth is a third replica that subscribes to both and books
// nothing: its /loads is the fleet's real load by the same accounting the
// replicas use. It is sampled on a fixed period; the figures are the
// time-averaged max/mean and coefficient of variation of per-worker load.
// The run is wall-clock driven (holding times, sampling), so its figures are
// measurements, never assertions.
package replicas

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvselect/kvselect/replicas/mesh"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

// Config is one experiment.
type Config struct {
	Workers      int           // 8
	BlockSize    uint32        // 16
	PrefixBlocks int           // the hot prefix every prompt shares (32 blocks)
	SuffixBlocks int           // each prompt's own tail (8 blocks)
	Clients      int           // closed-loop clients per replica (8)
	Duration     time.Duration // measured time (3 s), after a 300 ms warm-up
	Prefill      time.Duration // mean time from booking to prefill complete (2 ms)
	Decode       time.Duration // mean time from prefill complete to free (8 ms)
	SampleEvery  time.Duration // ground-truth sampling period (2 ms)
	Sync         bool          // connect the two replicas to each other
	// Single sends both replicas' clients through one replica: the reference a
	// perfectly synchronized pair could reach.
	Single bool
	Seed   uint64
}

// Defaults fills the zero fields.
func (c Config) Defaults() Config {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defD := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.Workers, 8)
	def(&c.PrefixBlocks, 32)
	def(&c.SuffixBlocks, 8)
	def(&c.Clients, 8)
	defD(&c.Duration, 3*time.Second)
	defD(&c.Prefill, 2*time.Millisecond)
	defD(&c.Decode, 8*time.Millisecond)
	defD(&c.SampleEvery, 2*time.Millisecond)
	if c.BlockSize == 0 {
		c.BlockSize = 16
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	return c
}

// Result is one run's figures.
type Result struct {
	Sync     bool    `json:"sync"`
	Single   bool    `json:"single"`
	Bookings int64   `json:"bookings"`
	HotShare float64 `json:"hot_share"` // fraction of bookings on the worker holding the prefix
	Samples  int     `json:"samples"`
	// Per-worker active requests: time-averaged max/mean and coefficient of
	// variation across workers, and the largest value any worker reached.
	RequestsMaxOverMean float64 `json:"requests_max_over_mean"`
	RequestsCV          float64 `json:"requests_cv"`
	PeakRequests        uint64  `json:"peak_requests"`
	// Per-worker load in the scheduler's unit, blocks: active prefill tokens
	// divided by the block size plus active decode blocks.
	LoadMaxOverMean float64 `json:"load_max_over_mean"`
	LoadCV          float64 `json:"load_cv"`
	// Mirrored events the replicas applied (0 without sync).
	Mirrored uint64 `json:"mirrored"`
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

const hotWorker = 1

type node struct {
	svc  *selection.Service
	mesh *mesh.Mesh
}

func newNode(ctx context.Context, cfg Config, seed uint64, dump index.Dump) (*node, error) {
	rc := routerconfig.Default() // KV-event index, as in production: bookings do not teach it
	svc, err := selection.New(selection.Config{Router: rc, Rand: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))})
	if err != nil {
		return nil, err
	}
	for id := 1; id <= cfg.Workers; id++ {
		ep, kv, bs := fmt.Sprintf("http://10.0.0.%d:8000", id), fmt.Sprintf("tcp://10.0.0.%d:5557", id), cfg.BlockSize
		if _, err := svc.UpsertWorker(ctx, catalog.Record{WorkerID: uint64(id), ModelName: "model", Endpoint: &ep,
			KVEventsEndpoint: &kv, BlockSize: &bs}); err != nil {
			return nil, err
		}
	}
	for _, r := range svc.Replica().Restore(dump) {
		if r.Err != nil || r.Failed > 0 {
			return nil, fmt.Errorf("seed the hot prefix: %+v", r)
		}
	}
	m, err := mesh.Start(ctx, svc.Replica(), mesh.Options{Bind: "tcp://127.0.0.1:0", Logger: quiet, ReconnectMax: 200 * time.Millisecond})
	if err != nil {
		return nil, err
	}
	return &node{svc: svc, mesh: m}, nil
}

func (n *node) endpoint() string { return "tcp://" + n.mesh.Addr().String() }

// hotDump is the index snapshot every replica starts from: the hot worker
// holds the prefix (local block hashes 1..PrefixBlocks), as the KV events of a
// long shared system prompt would have left it.
func hotDump(cfg Config) index.Dump {
	sd := &index.StoredData{}
	for i := range cfg.PrefixBlocks {
		sd.Blocks = append(sd.Blocks, index.StoredBlock{BlockHash: index.Hash(1000 + i), TokensHash: index.Hash(prefixHash(i))})
	}
	return index.Dump{index.PartitionKey("model", "default"): {BlockSize: cfg.BlockSize, Events: []index.RouterEvent{{
		WorkerID: hotWorker, StorageTier: "device",
		Event: index.KvCacheEvent{Data: index.EventData{Stored: sd}},
	}}}}
}

func prefixHash(i int) uint64 { return uint64(i) + 1 }

// request builds a prompt from precomputed hashes: the shared prefix, then a
// unique suffix. Tracking (sequence) hashes are shared for the prefix, so the
// prefix's decode blocks de-duplicate on a worker, as Dynamo's do.
func request(cfg Config, id string, rnd *rand.Rand) *selection.SelectRequest {
	n := cfg.PrefixBlocks + cfg.SuffixBlocks
	blocks, seqs := make([]int64, n), make([]int64, n)
	for i := range n {
		if i < cfg.PrefixBlocks {
			blocks[i], seqs[i] = int64(prefixHash(i)), int64(1<<40+i)
		} else {
			blocks[i], seqs[i] = int64(rnd.Uint64()>>1), int64(rnd.Uint64()>>1)
		}
	}
	isl := uint64(n) * uint64(cfg.BlockSize)
	return &selection.SelectRequest{PartitionKey: selection.PartitionKey{ModelName: "model"}, SelectionID: &id,
		PromptRequest: selection.PromptRequest{BlockHashes: blocks, SequenceHashes: seqs, ISLTokens: &isl}}
}

// Run runs one experiment.
func Run(ctx context.Context, cfg Config) (Result, error) {
	cfg = cfg.Defaults()
	nodes, err := startNodes(ctx, cfg)
	if err != nil {
		return Result{}, err
	}
	defer closeNodes(nodes)
	a, b, truth := nodes[0], nodes[1], nodes[2]
	if err := link(ctx, cfg.Sync, a, b, truth); err != nil {
		return Result{}, err
	}

	res := Result{Sync: cfg.Sync, Single: cfg.Single}
	runCtx, stop := context.WithCancel(ctx)
	cl := &clients{stop: stop}
	for ri, r := range []*node{a, b} {
		if cfg.Single {
			r = a
		}
		for c := range cfg.Clients {
			rnd := rand.New(rand.NewPCG(cfg.Seed, uint64(ri*1000+c)))
			cl.wg.Go(func() { cl.run(runCtx, cfg, r, ri, c, rnd) })
		}
	}
	b0, h0, sums := cl.measure(runCtx, cfg, truth, &res)
	stop()
	cl.wg.Wait()
	if cl.firstErr != nil {
		return res, cl.firstErr
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	res.Bookings = cl.bookings.Load() - b0
	if res.Bookings > 0 {
		res.HotShare = float64(cl.hot.Load()-h0) / float64(res.Bookings)
	}
	if n := float64(res.Samples); n > 0 {
		res.RequestsMaxOverMean, res.RequestsCV = sums.reqMM/n, sums.reqCV/n
		res.LoadMaxOverMean, res.LoadCV = sums.loadMM/n, sums.loadCV/n
	}
	for _, n := range []*node{a, b} {
		res.Mirrored += n.mesh.Stats().Bookings["applied"]
	}
	return res, nil
}

// startNodes starts the two measured replicas and the ground-truth one, all
// seeded with the hot prefix.
func startNodes(ctx context.Context, cfg Config) ([]*node, error) {
	dump := hotDump(cfg)
	var nodes []*node
	for i := range 3 {
		n, err := newNode(ctx, cfg, cfg.Seed*31+uint64(i), dump)
		if err != nil {
			closeNodes(nodes)
			return nil, err
		}
		nodes = append(nodes, n)
	}
	return nodes, nil
}

func closeNodes(nodes []*node) {
	for _, n := range nodes {
		_ = n.mesh.Close()
	}
}

// link subscribes truth to both replicas and, with sync, each replica to
// the other, and waits until every link carries events.
func link(ctx context.Context, sync bool, a, b, truth *node) error {
	links := [][2]*node{{truth, a}, {truth, b}}
	if sync {
		links = append(links, [2]*node{a, b}, [2]*node{b, a})
	}
	for _, l := range links {
		if _, err := l[0].mesh.Register(l[1].endpoint()); err != nil {
			return err
		}
	}
	for _, l := range links {
		if err := carries(ctx, l[1], l[0]); err != nil {
			return err
		}
	}
	return nil
}

// clients is the closed-loop clients' shared state: what they booked and
// the first error, which stops them all.
type clients struct {
	bookings, hot atomic.Int64 // bookings, and those on the hot worker
	wg            sync.WaitGroup
	errOnce       sync.Once
	firstErr      error
	stop          context.CancelFunc
}

func (cl *clients) fail(err error) {
	cl.errOnce.Do(func() { cl.firstErr = err; cl.stop() })
}

// run is client c of replica ri (node r), in a closed loop: book, hold
// through prefill and decode, free, again, until ctx ends.
func (cl *clients) run(ctx context.Context, cfg Config, r *node, ri, c int, rnd *rand.Rand) {
	for n := 0; ctx.Err() == nil; n++ {
		id := fmt.Sprintf("r%d-c%d-%d", ri, c, n)
		resp, err := r.svc.SelectAndReserve(ctx, request(cfg, id, rnd))
		if err != nil {
			if ctx.Err() == nil {
				cl.fail(fmt.Errorf("select_and_reserve: %w", err))
			}
			return
		}
		cl.bookings.Add(1)
		if resp.WorkerID == hotWorker {
			cl.hot.Add(1)
		}
		sleep(ctx, jitter(rnd, cfg.Prefill))
		_ = r.svc.PrefillComplete(ctx, id)
		sleep(ctx, jitter(rnd, cfg.Decode))
		_ = r.svc.Free(ctx, id)
	}
}

// spreadSums adds up the samples' spread figures, for their time averages.
type spreadSums struct {
	reqMM, reqCV, loadMM, loadCV float64
}

// measure waits out a 300 ms warm-up, then samples truth's loads every
// cfg.SampleEvery for cfg.Duration (or until ctx ends) into res and the
// returned sums. b0 and h0 are the bookings counts when the measured window
// opened.
func (cl *clients) measure(ctx context.Context, cfg Config, truth *node, res *Result) (b0, h0 int64, sums spreadSums) {
	sampler := time.NewTicker(cfg.SampleEvery)
	defer sampler.Stop()
	warm := time.After(300 * time.Millisecond)
	var end <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return b0, h0, sums
		case <-warm:
			end = time.After(cfg.Duration)
			b0, h0 = cl.bookings.Load(), cl.hot.Load()
		case <-end:
			return b0, h0, sums
		case <-sampler.C:
			if end != nil {
				sample(cfg, truth, res, &sums)
			}
		}
	}
}

// sample reads truth's per-worker loads once and adds their spread to sums.
func sample(cfg Config, truth *node, res *Result, sums *spreadSums) {
	reqs, load := make([]float64, cfg.Workers), make([]float64, cfg.Workers)
	for _, l := range truth.svc.Inspect().Loads(nil, nil)[0].Loads {
		i := int(l.WorkerID) - 1
		reqs[i] = float64(l.ActiveRequests)
		load[i] = float64(l.PotentialPrefillTokens)/float64(cfg.BlockSize) + float64(l.PotentialDecodeBlocks)
		res.PeakRequests = max(res.PeakRequests, l.ActiveRequests)
	}
	if mm, cv, ok := spread(reqs); ok {
		sums.reqMM, sums.reqCV = sums.reqMM+mm, sums.reqCV+cv
		mm, cv, _ = spread(load)
		sums.loadMM, sums.loadCV = sums.loadMM+mm, sums.loadCV+cv
		res.Samples++
	}
}

// spread returns max/mean and the coefficient of variation (population
// standard deviation over mean); ok is false for an idle fleet.
func spread(xs []float64) (maxOverMean, cv float64, ok bool) {
	var sum, mx float64
	for _, x := range xs {
		sum += x
		mx = max(mx, x)
	}
	mean := sum / float64(len(xs))
	if mean == 0 {
		return 0, 0, false
	}
	var ss float64
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	return mx / mean, math.Sqrt(ss/float64(len(xs))) / mean, true
}

// jitter draws uniformly from [d/2, 3d/2).
func jitter(rnd *rand.Rand, d time.Duration) time.Duration {
	return d/2 + time.Duration(rnd.Int64N(int64(d)))
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

var probeSeq atomic.Int64

// carries waits until a booking made on from shows on to (ZMQ subscriptions
// reach the publisher asynchronously; events sent earlier are lost), then
// frees the probe.
func carries(ctx context.Context, from, to *node) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		id := fmt.Sprint("probe-", probeSeq.Add(1))
		isl := uint64(4)
		if _, err := from.svc.Reserve(ctx, &selection.ReservationRequest{PartitionKey: selection.PartitionKey{ModelName: "model"},
			SelectionID: &id, WorkerID: new(uint64(2)), PromptRequest: selection.PromptRequest{SequenceHashes: []int64{1}, ISLTokens: &isl}}); err != nil {
			return err
		}
		seen := false
		for wait := time.Now().Add(300 * time.Millisecond); !seen && time.Now().Before(wait); time.Sleep(5 * time.Millisecond) {
			seen = busy(to)
		}
		if err := from.svc.Free(ctx, id); err != nil {
			return err
		}
		for wait := time.Now().Add(5 * time.Second); busy(to) && time.Now().Before(wait); {
			time.Sleep(5 * time.Millisecond)
		}
		if seen {
			return nil
		}
	}
	return fmt.Errorf("replica mesh not carrying events within 30s")
}

func busy(n *node) bool {
	for _, l := range n.svc.Inspect().Loads(nil, nil)[0].Loads {
		if l.ActiveRequests > 0 {
			return true
		}
	}
	return false
}
