package scale

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"

	"github.com/kvselect/kvselect/engines/kvevents"
	"github.com/kvselect/kvselect/mockworker/kvpublish"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

const model = "model"

// inproc stands where engines/kvlisten stands in the server: the service
// attaches every rank to it, and it keeps, per rank, the decoder a listener
// would own and the index the rank feeds. What a listener does with a batch
// it has read from its socket — kvevents' Decode, then Index.ApplyBatch — is
// what ingest does here, byte for byte; the sockets, the sequence cursor and
// the writer lanes' channels are left out. Batches are ingested one at a
// time, as by one writer lane, so the ranks share the lane's buffers.
type inproc struct {
	mu    sync.Mutex
	ranks map[index.WorkerKey]*rankFeed
	lane  *laneBuffers
}

// laneBuffers are what a writer lane's ranks share: the decoders' scratch
// and the decoded events.
type laneBuffers struct {
	scratch kvevents.Scratch
	evs     []index.Event
}

// rankFeed is one attached rank.
type rankFeed struct {
	dec  *kvevents.Decoder
	cfg  kvevents.Config
	ix   *index.Index
	lane *laneBuffers
	buf  []byte
}

func (l *inproc) Attach(a selection.RankAttachment) error {
	cfg := kvevents.Config{WorkerID: a.Worker.WorkerID, DPRank: a.Worker.DPRank,
		BlockSize: int(a.BlockSize), Eagle: a.Eagle, Scratch: &l.lane.scratch}
	dec, err := kvevents.NewDecoder(cfg)
	if err != nil {
		return fmt.Errorf("attach %v: %w", a.Worker, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ranks[a.Worker] = &rankFeed{dec: dec, cfg: cfg, ix: a.Index, lane: l.lane}
	return nil
}

// dropScratch lets go of the harness's own per-rank buffers, which a
// listener does not have, before memory is measured.
func (l *inproc) dropScratch() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, rf := range l.ranks {
		rf.buf = nil
	}
}

// resetDecoders gives every rank a fresh decoder, letting go of what the
// old one kept between batches: the heap before and after is its size.
func (l *inproc) resetDecoders() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for w, rf := range l.ranks {
		dec, err := kvevents.NewDecoder(rf.cfg)
		if err != nil {
			return fmt.Errorf("reset decoder of %v: %w", w, err)
		}
		rf.dec = dec
	}
	return nil
}

func (l *inproc) Detach(_ index.Partition, w index.WorkerKey) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.ranks, w)
}

func (l *inproc) feed(w index.WorkerKey) *rankFeed {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ranks[w]
}

// ingest decodes one encoded KVEventBatch and applies it to the rank's index,
// as a writer lane does, and returns the events applied.
func (f *rankFeed) ingest(payload []byte) (int, error) {
	evs, _, err := f.dec.Decode(payload, f.lane.evs[:0])
	if err != nil {
		return 0, fmt.Errorf("decode kv events: %w", err)
	}
	failed, first := f.ix.ApplyBatch(evs)
	n := len(evs)
	clear(evs) // they point into the decoder's buffers
	f.lane.evs = evs[:0]
	if failed > 0 {
		return n, fmt.Errorf("index rejected %d events: %w", failed, first)
	}
	return n, nil
}

// encode builds the vLLM KVEventBatch of evs (kvpublish writes the bytes
// vLLM's msgspec encoder writes) into the feed's reusable buffer.
func (f *rankFeed) encode(ts float64, rank int, evs []kvpublish.Event) []byte {
	f.buf = kvpublish.AppendBatch(f.buf[:0], ts, evs, &rank)
	return f.buf
}

// fleet is one selection.Service with its ranks registered and attached.
type fleet struct {
	svc   *selection.Service
	ranks []index.WorkerKey
	l     *inproc
}

// newFleet registers ranks ranks as workers of perWorker data-parallel ranks
// each (block size bs, cacheBlocks blocks of KV cache per rank, each rank
// with its own KV events endpoint) on a service with the default router
// configuration: KV events drive the index.
func newFleet(ctx context.Context, ranks, perWorker, bs, cacheBlocks int, seed uint64) (*fleet, error) {
	l := &inproc{ranks: map[index.WorkerKey]*rankFeed{}, lane: new(laneBuffers)}
	svc, err := selection.New(selection.Config{Router: routerconfig.Default(), Listeners: l,
		Rand: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))})
	if err != nil {
		return nil, fmt.Errorf("new service: %w", err)
	}
	f := &fleet{svc: svc, l: l}
	workers := (ranks + perWorker - 1) / perWorker
	for w := range workers {
		dp := min(perWorker, ranks-w*perWorker)
		id := uint64(w + 1)
		ip := fmt.Sprintf("10.%d.%d.%d", id>>16&255, id>>8&255, id&255)
		eps := make(map[uint32]string, dp)
		for r := range dp {
			eps[uint32(r)] = fmt.Sprintf("tcp://%s:%d", ip, 5557+r)
			f.ranks = append(f.ranks, index.WorkerKey{WorkerID: id, DPRank: uint32(r)})
		}
		rec := catalog.Record{WorkerID: id, ModelName: model, Endpoint: new("http://" + ip + ":8000"),
			KVEventsEndpoints: eps, BlockSize: new(uint32(bs)), DataParallelSize: new(uint32(dp)),
			TotalKVBlocks: new(uint64(cacheBlocks))}
		got, err := svc.UpsertWorker(ctx, rec)
		if err != nil {
			return nil, fmt.Errorf("register worker %d: %w", id, err)
		}
		if got.Lifecycle != catalog.Schedulable {
			return nil, fmt.Errorf("worker %d not schedulable: %v", id, got.NotSchedulableReasons)
		}
	}
	for _, w := range f.ranks {
		if l.feed(w) == nil {
			return nil, fmt.Errorf("rank %v was not attached", w)
		}
	}
	return f, nil
}
