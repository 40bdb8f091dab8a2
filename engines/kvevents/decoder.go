// Package kvevents decodes the KV cache events that vLLM, SGLang and (through its
// vLLM-compatible publisher) TensorRT-LLM publish on ZMQ, and normalises them into
// the index's events (index.Event), as Dynamo's lib/kv-router/src/zmq_wire does
// (types.rs, deserialize.rs, convert.rs at commit 4fb5a208). The engine side of
// the wire is vLLM's vllm/distributed/kv_events.py.
//
// The package is pure decoding: no sockets, goroutines or clocks. A listener
// splits each ZMQ message with ParseMessage, checks the sequence number for gaps
// itself (and replays a gap from the engine's replay endpoint before applying
// what follows, since a worker's events only make sense in order), and feeds
// the payload to the Decoder of that publisher, one per (worker, registered dp
// rank). The Decoder keeps the little state normalisation needs: the next event
// id, the kv_cache_spec_kind learned per (dp_rank, group_idx), the cache
// namespace of stored blocks (so children inherit it), and scratch buffers, so
// that decoding a batch allocates nothing in steady state; the decoders one
// goroutine serves can share those buffers (Config.Scratch).
//
// Both shapes msgspec has shipped are accepted, per event: positional arrays
// (tag in slot 0; SGLang, vLLM before PR #42892) and tagged maps (first key
// "type"; vLLM v0.26+), as are array batches of length 2 or 3 and map batches.
// Engine block hashes are recomputed into LocalBlockHashes with kvhash under the
// LoRA / cache-namespace salt and the blocks' multimodal hashes.
package kvevents

import (
	"errors"
	"fmt"

	"github.com/tinylib/msgp/msgp"

	"github.com/kvselect/kvselect/internal/sizepool"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/kvhash"
)

// DefaultMaxNamespaceEntries bounds the per-block cache-namespace memory of a
// Decoder when Config.MaxNamespaceEntries is zero.
const DefaultMaxNamespaceEntries = 1 << 20

// Config describes the publisher a Decoder reads.
type Config struct {
	// WorkerID is the worker the events belong to.
	WorkerID uint64
	// DPRank is the data-parallel rank the publisher's socket was registered for;
	// a batch that carries its own rank overrides it, as in Dynamo.
	DPRank uint32
	// BlockSize is the worker's registered kv_block_size in tokens. Stored blocks
	// of any other size are not indexed: their local hashes would not match
	// the router's, which hashes prompts in blocks of this size.
	BlockSize int
	// Eagle makes flat token_ids be hashed in Eagle windows (BlockSize+1 tokens,
	// advancing by BlockSize), for engines that run Eagle speculative decoding but
	// publish flat tokens. Bigram token_ids always select Eagle windows.
	Eagle bool
	// MaxNamespaceEntries bounds how many stored blocks' cache namespaces the
	// decoder remembers for inheritance by child blocks; 0 means
	// DefaultMaxNamespaceEntries. Beyond it, new blocks are not remembered
	// (counted in Stats.NamespaceOverflow) and their children hash without salt,
	// which can only cost cache hits, never route wrongly.
	MaxNamespaceEntries int
	// Scratch, if not nil, is shared with other decoders that are never
	// used at the same time as this one; nil gives the decoder its own.
	// The events a Decode returns are then valid until the next Decode of
	// any of them.
	Scratch *Scratch
}

// Stats counts what one Decode call did with the events of a batch, so that
// listeners can export metrics. Every event is counted exactly once in Events and
// at most once in a drop counter; Emitted counts the events appended to dst.
type Stats struct {
	Events  int // raw events in the batch
	Emitted int // events appended to dst (Stored + Removed + Cleared + Duplicate)
	Stored  int
	Removed int
	Cleared int

	Ignored    int // "Ignored" tag
	UnknownTag int // any other tag: skipped, not an error (Dynamo skips them too)
	Malformed  int // events whose fields have the wrong msgpack types; skipped

	UnknownMedium int // medium not in the tier table: dropped, fail closed as in Dynamo
	NonLocal      int // locality REMOTE or unknown: dropped (Dynamo #10457)
	NonMainGroup  int // kv_cache_spec_kind (given or learned) not a main attention group
	UnknownGroup  int // non-zero group_idx with no kind and none learned yet

	// Duplicate: a Stored repeating an engine hash (parent included). Emitted as
	// an empty Removed, a no-op that still consumes an event id (Dynamo's
	// convert.rs).
	Duplicate int
	// BlockSizeMismatch: a Stored whose block_size differs from Config.BlockSize;
	// no block is indexed, the event is dropped.
	BlockSizeMismatch int
	// ShortTokens: a Stored with fewer complete token blocks than block hashes;
	// only the leading complete blocks are indexed. TruncatedBlocks counts the
	// blocks left out.
	ShortTokens     int
	TruncatedBlocks int
	// EmptyStored: a Stored left with no complete block; dropped.
	EmptyStored int

	// NamespaceAmbiguous: a Stored whose parent's cache namespace is ambiguous
	// or disagrees with the event's own; dropped, as Dynamo drops an
	// ambiguous namespace.
	NamespaceAmbiguous int
	// NamespaceConflict: a block hash seen again under another namespace; it is
	// marked ambiguous and its future children are dropped.
	NamespaceConflict int
	// NamespaceOverflow: blocks whose namespace was not remembered because of
	// Config.MaxNamespaceEntries.
	NamespaceOverflow int
}

// Add accumulates o into s.
func (s *Stats) Add(o Stats) {
	s.Events += o.Events
	s.Emitted += o.Emitted
	s.Stored += o.Stored
	s.Removed += o.Removed
	s.Cleared += o.Cleared
	s.Ignored += o.Ignored
	s.UnknownTag += o.UnknownTag
	s.Malformed += o.Malformed
	s.UnknownMedium += o.UnknownMedium
	s.NonLocal += o.NonLocal
	s.NonMainGroup += o.NonMainGroup
	s.UnknownGroup += o.UnknownGroup
	s.Duplicate += o.Duplicate
	s.BlockSizeMismatch += o.BlockSizeMismatch
	s.ShortTokens += o.ShortTokens
	s.TruncatedBlocks += o.TruncatedBlocks
	s.EmptyStored += o.EmptyStored
	s.NamespaceAmbiguous += o.NamespaceAmbiguous
	s.NamespaceConflict += o.NamespaceConflict
	s.NamespaceOverflow += o.NamespaceOverflow
}

// Dropped is the number of events that produced nothing.
func (s Stats) Dropped() int { return s.Events - s.Emitted }

type groupKey struct {
	rank  uint32
	group uint32
}

// nsEntry is the cache namespace a stored block was indexed under. tiers has one
// bit per index.Tier holding the block, so that a removal from one tier keeps the
// entry while another tier still holds the block.
type nsEntry struct {
	id        uint32 // index into Decoder.nsNames; never 0
	tiers     uint8
	ambiguous bool
}

// Decoder decodes the batches of one publisher (one worker rank). It is not safe
// for concurrent use; a listener owns one per socket.
type Decoder struct {
	// What every batch reads comes first, to share cache lines: a
	// decoder's next batch comes after a thousand other publishers'.

	// The buffers a batch is decoded into: the decoder's own, or shared
	// with the other decoders of one goroutine (Config.Scratch).
	*scratch
	cfg    Config
	nextID uint64
	// ns stays nil until a block is stored under a namespace: the length
	// of a nil map is read without touching the map.
	ns map[uint64]nsEntry

	// kind learned per (dp_rank, group_idx): true = main attention group.
	groups map[groupKey]bool

	nsIDs   map[string]uint32
	nsNames [][]byte // nsNames[0] is unused so that id 0 means "none"

	saltOK  bool
	saltL   string
	saltN   string
	saltVal uint64
}

// Scratch holds the buffers Decode parses and normalises a batch into.
// Decoders that never decode at the same time (the publishers one writer
// goroutine serves) can share one through Config.Scratch: their batches then
// reuse one set of buffers that stays in the CPU caches, where a buffer per
// publisher was cold again by the time its next batch came, a thousand other
// publishers' batches later. The zero Scratch is ready to use.
type Scratch struct{ s scratch }

type scratch struct {
	hasher kvhash.Hasher
	// raws holds the batch's events, each parsed once, straight from the
	// payload, their hashes and tokens in arena.
	// They are all parsed before any is applied: a batch that turns out
	// malformed at its end then leaves the decoder as it was, and the array
	// batch's dp rank, which follows the events, is known before they are
	// normalised.
	raws  []rawEvent
	arena parseArena

	// Arenas the returned events point into; reset at every Decode: blocks,
	// and for removals the parse arena's hashes.
	blocks []index.Block

	// Per-event scratch.
	locals []uint64
	mmFlat []uint64
	mmEnds []int
	mm     [][]uint64
	sorted []uint64 // hasDuplicate's set of a long chain's hashes
	// bigSets, bigLocals and bigBlocks keep the buffers above over
	// keepScratch between the batches that need them, as bigTokens does
	// token arenas.
	bigSets   sizepool.Pool[uint64]
	bigLocals sizepool.Pool[uint64]
	bigBlocks sizepool.Pool[index.Block]
}

// NewDecoder returns a decoder for one publisher.
func NewDecoder(cfg Config) (*Decoder, error) {
	if cfg.BlockSize <= 0 {
		return nil, fmt.Errorf("kvevents: block size must be positive, got %d", cfg.BlockSize)
	}
	if cfg.MaxNamespaceEntries < 0 {
		return nil, fmt.Errorf("kvevents: negative MaxNamespaceEntries %d", cfg.MaxNamespaceEntries)
	}
	if cfg.MaxNamespaceEntries == 0 {
		cfg.MaxNamespaceEntries = DefaultMaxNamespaceEntries
	}
	sc := cfg.Scratch
	if sc == nil {
		sc = new(Scratch)
	}
	return &Decoder{
		scratch: &sc.s,
		cfg:     cfg,
		groups:  make(map[groupKey]bool),
		nsIDs:   make(map[string]uint32),
		nsNames: [][]byte{nil},
	}, nil
}

// NextID is the id the next emitted event will get.
func (d *Decoder) NextID() uint64 { return d.nextID }

// Decode decodes one msgpack batch and appends its normalised events to dst.
//
// The returned events' Blocks and Hashes point into buffers the Decoder reuses:
// they are valid until the next Decode call (of any decoder sharing its
// Config.Scratch). A caller that keeps them longer
// copies them. With dst of enough capacity, decoding allocates nothing once the
// buffers have grown to the batch size.
//
// An error (wrapping ErrBatch) means the envelope or the msgpack structure is
// invalid; then dst is returned unchanged and the decoder state is untouched.
// Problems inside one event never fail the batch: the event is skipped and
// counted in Stats.
func (d *Decoder) Decode(payload []byte, dst []index.Event) ([]index.Event, Stats, error) {
	var st Stats
	rank, err := d.envelope(payload)
	if err != nil {
		return dst, st, err
	}
	d.blocks = d.blocks[:0]
	for i := range d.raws {
		st.Events++
		before := len(dst)
		dst = d.event(&d.raws[i], rank, dst, &st)
		st.Emitted += len(dst) - before
	}
	return dst, st, nil
}

// keepScratch bounds, in elements, the scratch a decoder keeps between
// batches (Trim): enough for a 1M-token prompt's blocks would hold tens of
// MiB per engine after the prompt is long gone.
const keepScratch = 1 << 14

// keepRaws bounds the parsed events a decoder keeps between batches: a
// rawEvent is ~300 bytes, so this is ~150 KB, while an engine step's batch
// holds a few dozen events.
const keepRaws = 512

// Trim drops the scratch buffers and arenas that grew beyond keepScratch
// elements decoding a large batch, so that memory returns once long
// prompts stop coming; ordinary batches keep theirs. Call it once the
// events of the last Decode are no longer read: they point into the
// arenas it may drop. With a shared Config.Scratch it trims that.
func (d *Decoder) Trim() { d.scratch.trim() }

func (s *scratch) trim() {
	s.blocks = keptTrim(&s.bigBlocks, s.blocks)
	s.locals = keptTrim(&s.bigLocals, s.locals)
	if cap(s.mmFlat) > keepScratch {
		s.mmFlat, s.mmEnds, s.mm = nil, nil, nil
	}
	s.arena.tokens = keptTrim(&s.arena.bigTokens, s.arena.tokens)
	s.arena.hashes = keptTrim(&s.arena.bigHashes, s.arena.hashes)
	if cap(s.raws) > keepRaws {
		s.raws = nil
	}
	s.sorted = keptTrim(&s.bigSets, s.sorted)
}

// keptGrow returns s with room for need elements: s itself while it has the
// room or need is small, else a buffer of pool's, sized at once rather than
// by append's doublings (each a new allocation, faulted in page by page),
// holding s's elements. The old buffer is not given back: a batch's earlier
// events may point into it.
func keptGrow[T any](pool *sizepool.Pool[T], s []T, need int) []T {
	if need <= cap(s) || need <= keepScratch {
		return s
	}
	return append(pool.Get(need), s...)
}

// keptTrim hands a buffer over keepScratch to pool, for the next batch that
// needs one, and returns nil; a smaller one stays.
func keptTrim[T any](pool *sizepool.Pool[T], s []T) []T {
	if cap(s) <= keepScratch {
		return s
	}
	pool.Put(s)
	return nil
}

// envelope reads the batch wrapper: the array [ts, events] or
// [ts, events, dp_rank|nil] that msgspec array_like writes, or the map
// {ts, events, data_parallel_rank} that a non-array_like EventBatch would write
// (aliases dp_rank, attn_dp_rank). Dynamo's types.rs takes only the 3-array; the
// others cost nothing to accept: the earliest vLLM and older SGLang batches had
// two fields, and one revision of vLLM's kv_events.py declares EventBatch
// without array_like. It parses the events into d.raws and returns the rank
// they belong to. Reading the whole batch before touching any state is what
// makes a failed Decode leave the decoder as it was.
func (d *Decoder) envelope(p []byte) (rank uint32, err error) {
	rank = d.cfg.DPRank
	haveEvents := false
	switch msgp.NextType(p) {
	case msgp.ArrayType:
		sz, b, err := msgp.ReadArrayHeaderBytes(p)
		if err != nil {
			return 0, batchErr("batch header", err)
		}
		if sz != 2 && sz != 3 {
			return 0, fmt.Errorf("%w: batch array of length %d, want 2 or 3", ErrBatch, sz)
		}
		if b, err = skipTS(b); err != nil {
			return 0, err
		}
		haveEvents = true
		if b, err = d.parseEvents(b); err != nil {
			return 0, err
		}
		if sz == 3 {
			if rank, b, err = readRank(b, rank); err != nil {
				return 0, err
			}
		}
		if len(b) != 0 {
			return 0, fmt.Errorf("%w: %d trailing bytes after the batch", ErrBatch, len(b))
		}
	case msgp.MapType:
		sz, b, err := msgp.ReadMapHeaderBytes(p)
		if err != nil {
			return 0, batchErr("batch header", err)
		}
		for range sz {
			var key []byte
			if key, b, err = msgp.ReadMapKeyZC(b); err != nil {
				return 0, batchErr("batch key", err)
			}
			switch string(key) {
			case "ts":
				b, err = skipTS(b)
			case "events":
				haveEvents = true
				b, err = d.parseEvents(b)
			case "data_parallel_rank", "dp_rank", "attn_dp_rank":
				rank, b, err = readRank(b, rank)
			default:
				if b, err = msgp.Skip(b); err != nil {
					err = batchErr("batch field", err)
				}
			}
			if err != nil {
				return 0, err
			}
		}
		if len(b) != 0 {
			return 0, fmt.Errorf("%w: %d trailing bytes after the batch", ErrBatch, len(b))
		}
	default:
		return 0, fmt.Errorf("%w: batch is neither an array nor a map", ErrBatch)
	}
	if !haveEvents {
		return 0, fmt.Errorf("%w: batch without events", ErrBatch)
	}
	return rank, nil
}

// parseEvents reads the events array into d.raws, each event in one pass:
// parse reads it and returns what follows it. An event parse rejects (wrong
// field types, unknown tag) is still stepped over with msgp.Skip, which
// fails the batch exactly where the msgpack itself is broken, as a bounds
// walk before parsing would.
func (d *Decoder) parseEvents(b []byte) ([]byte, error) {
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return b, batchErr("events", err)
	}
	if int(n) > len(b) {
		return b, batchErr("events", msgp.ErrShortBytes)
	}
	d.raws = d.raws[:0]
	d.arena.hashes, d.arena.tokens = d.arena.hashes[:0], d.arena.tokens[:0]
	for range n {
		// parse clears the event; growing raws need not clear it too.
		if len(d.raws) < cap(d.raws) {
			d.raws = d.raws[:len(d.raws)+1]
		} else {
			d.raws = append(d.raws, rawEvent{})
		}
		r := &d.raws[len(d.raws)-1]
		r.arena = &d.arena
		start := b
		r.tag, b, r.err = parse(start, r)
		if r.err == nil && len(start)-len(b) < skipDepthBytes {
			continue
		}
		// Skip counts nesting from the event, as it did before the single
		// pass; parse's own Skips of nested fields start one level lower, so
		// an event long enough to nest skipDepthBytes deep is also walked
		// whole, to fail where it failed before.
		o, err := msgp.Skip(start)
		if err != nil {
			return o, batchErr("event", err)
		}
		b = o
	}
	return b, nil
}

// skipDepthBytes is msgp's nesting limit for Skip (recursionLimit in
// msgp/defs.go); every level takes at least one byte, so a shorter event
// cannot reach it (TestSkipDepthLimit checks the limit).
const skipDepthBytes = 100000

func batchErr(what string, err error) error {
	return fmt.Errorf("%w: %s: %w", ErrBatch, what, err)
}

// skipTS skips the batch timestamp, which must be a number (msgspec writes a
// float64; ints are tolerated). The router does not use it.
func skipTS(b []byte) ([]byte, error) {
	switch msgp.NextType(b) {
	case msgp.Float64Type, msgp.Float32Type, msgp.IntType, msgp.UintType:
		o, err := msgp.Skip(b)
		if err != nil {
			return b, batchErr("ts", err)
		}
		return o, nil
	}
	return b, fmt.Errorf("%w: ts is not a number", ErrBatch)
}

// readRank reads the batch dp rank: nil keeps def, an int in [0, 2^32) replaces
// it (Dynamo: the batch value wins over the registered rank).
func readRank(b []byte, def uint32) (uint32, []byte, error) {
	v, ok, o, err := readOptUint32(b)
	if err != nil {
		return def, b, batchErr("dp rank", err)
	}
	if !ok {
		return def, o, nil
	}
	return v, o, nil
}

// event normalises one raw event and appends what it yields to dst.
func (d *Decoder) event(r *rawEvent, rank uint32, dst []index.Event, st *Stats) []index.Event {
	tag, err := r.tag, r.err
	switch {
	case errors.Is(err, errUnknownTag):
		st.UnknownTag++
		return dst
	case err != nil:
		st.Malformed++
		return dst
	case tag == tagIgnoredKind:
		st.Ignored++
		return dst
	}
	if r.hasGroup && r.hasKind {
		k := groupKey{rank, r.group}
		main := isMainKind(r.kind)
		if old, ok := d.groups[k]; !ok || old != main {
			d.groups[k] = main
		}
	}
	if tag != tagClearedKind {
		if ok, unknown := d.mainGroup(r, rank); !ok {
			if unknown {
				st.UnknownGroup++
			} else {
				st.NonMainGroup++
			}
			return dst
		}
	}
	// Dynamo convert.rs: REMOTE and unrecognised localities fail closed; absent or
	// LOCAL keeps the event worker-local.
	if r.hasLocality && string(r.locality) != string(localityLoc) {
		st.NonLocal++
		return dst
	}
	tier, ok := mediumTier(r.medium)
	if !ok {
		st.UnknownMedium++
		return dst
	}
	w := index.WorkerKey{WorkerID: d.cfg.WorkerID, DPRank: rank}
	switch tag {
	case tagClearedKind:
		// Cleared carries no medium in Dynamo (device tier); it drops the worker's
		// state, so namespaces remembered for its blocks go too.
		clear(d.ns)
		st.Cleared++
		return append(dst, index.Event{Worker: w, Tier: tier, ID: d.id(), Kind: index.EventCleared})
	case tagRemovedKind:
		if len(d.ns) > 0 {
			for _, h := range r.hashes {
				d.forget(h, tier)
			}
		}
		st.Removed++
		return append(dst, index.Event{Worker: w, Tier: tier, ID: d.id(), Kind: index.EventRemoved,
			Hashes: r.hashes})
	}
	return d.stored(r, w, tier, dst, st)
}

// mainGroup applies Dynamo's cache-group filter (zmq_wire filter.rs): an explicit
// kv_cache_spec_kind decides; otherwise group 0 or no group is the main group,
// and a non-zero group uses the kind learned for (rank, group), unknown ones
// being dropped.
func (d *Decoder) mainGroup(r *rawEvent, rank uint32) (ok, unknown bool) {
	if r.hasKind {
		return isMainKind(r.kind), false
	}
	if !r.hasGroup || r.group == 0 {
		return true, false
	}
	main, known := d.groups[groupKey{rank, r.group}]
	if !known {
		return false, true
	}
	return main, false
}

func (d *Decoder) id() uint64 {
	id := d.nextID
	d.nextID++
	return id
}

// mediumTier maps medium to a tier without allocating for the spellings engines
// actually send; anything else goes through index.TierFromMedium
// (case-insensitive, fail closed). An empty medium is absent (vLLM omits it for
// device events; Dynamo normalize_medium).
func mediumTier(m []byte) (index.Tier, bool) {
	switch string(m) {
	case "", "GPU":
		return index.TierDevice, true
	case "CPU", "CPU_TIER1":
		return index.TierHostPinned, true
	case "CPU_TIER2":
		return index.TierDisk, true
	}
	return index.TierFromMedium(string(m))
}

// stored converts a BlockStored into index events, with Dynamo's conversion
// rules (convert.rs).
func (d *Decoder) stored(r *rawEvent, w index.WorkerKey, tier index.Tier, dst []index.Event, st *Stats) []index.Event {
	if d.hasDuplicate(r) {
		// Dynamo returns an empty Removed rather than Cleared: a no-op in the index
		// that keeps the event ids gap-free.
		st.Duplicate++
		return append(dst, index.Event{Worker: w, Tier: tier, ID: d.id(), Kind: index.EventRemoved})
	}
	bs := d.cfg.BlockSize
	if r.blockSize != uint64(bs) {
		// Dynamo create_stored_blocks breaks at the first block whose size differs;
		// one event has one block_size, so nothing of it is indexed.
		st.BlockSizeMismatch++
		return dst
	}
	opts := kvhash.BlockOptions{BlockSize: bs, Eagle: r.bigram || d.cfg.Eagle}
	n := min(len(r.hashes), opts.NumBlocks(len(r.tokens)))
	if n < len(r.hashes) {
		st.ShortTokens++
		st.TruncatedBlocks += len(r.hashes) - n
	}
	if n == 0 {
		st.EmptyStored++
		return dst
	}

	ns, ok := d.namespace(r, st)
	if !ok {
		st.NamespaceAmbiguous++
		return dst
	}
	if r.mmInfos != nil {
		d.mmFromInfos(r.mmInfos, n)
	} else if r.extraKeys != nil {
		d.mmFromExtraKeys(r.extraKeys, r.lora, n)
	} else {
		d.mm = d.mm[:0]
	}
	opts.MM = d.mm
	window := n * bs
	if opts.Eagle {
		window++
	}
	d.locals = d.hasher.AppendBlockHashes(keptGrow(&d.bigLocals, d.locals[:0], n), r.tokens[:window], d.salt(r.lora, ns), opts)

	start := len(d.blocks)
	d.blocks = keptGrow(&d.bigBlocks, d.blocks, start+n)
	for i := range n {
		d.blocks = append(d.blocks, index.Block{Ext: r.hashes[i], Local: d.locals[i]})
	}
	blocks := d.blocks[start:len(d.blocks):len(d.blocks)]
	if len(ns) > 0 {
		d.remember(blocks, ns, tier, st)
	}
	st.Stored++
	return append(dst, index.Event{Worker: w, Tier: tier, ID: d.id(), Kind: index.EventStored,
		Parent: r.parent, HasParent: r.hasParent, Blocks: blocks})
}

// hasDuplicate reports whether an engine hash repeats inside the event, parent
// included (Dynamo convert.rs, "self-referencing block").
func (d *Decoder) hasDuplicate(r *rawEvent) bool {
	h := r.hashes
	d.sorted = keptGrow(&d.bigSets, d.sorted[:0], index.RepeatsScratch(len(h)))
	return index.RepeatsExt(len(h), r.parent, r.hasParent, func(i int) uint64 { return h[i] }, &d.sorted)
}

// namespace resolves the cache namespace of a Stored event: its own (map
// cache_salt, SGLang metadata, or the dynamo-cache-salt: extra key), else the one
// its parent block was stored under. ok is false when the parent's is ambiguous
// or differs from the event's own.
func (d *Decoder) namespace(r *rawEvent, st *Stats) (ns []byte, ok bool) {
	own := r.salt
	if len(own) == 0 && r.extraKeys != nil {
		own = d.saltFromExtraKeys(r.extraKeys, r.lora)
	}
	if !r.hasParent || len(d.ns) == 0 {
		return own, true
	}
	e, found := d.ns[r.parent]
	if !found {
		return own, true
	}
	if e.ambiguous {
		return nil, false
	}
	inherited := d.nsNames[e.id]
	if len(own) == 0 {
		return inherited, true
	}
	return own, string(own) == string(inherited)
}

// remember records the namespace of freshly stored blocks for their children.
func (d *Decoder) remember(blocks []index.Block, ns []byte, tier index.Tier, st *Stats) {
	id, ok := d.nsIDs[string(ns)]
	if !ok {
		if len(d.nsNames) > d.cfg.MaxNamespaceEntries {
			st.NamespaceOverflow += len(blocks)
			return
		}
		id = uint32(len(d.nsNames))
		name := string(ns)
		d.nsNames = append(d.nsNames, []byte(name))
		d.nsIDs[name] = id
	}
	bit := uint8(1) << tier
	if d.ns == nil {
		d.ns = make(map[uint64]nsEntry)
	}
	for _, b := range blocks {
		e, found := d.ns[b.Ext]
		switch {
		case found:
			if e.id != id && !e.ambiguous {
				e.ambiguous = true
				st.NamespaceConflict++
			}
			e.tiers |= bit
			d.ns[b.Ext] = e
		case len(d.ns) < d.cfg.MaxNamespaceEntries:
			d.ns[b.Ext] = nsEntry{id: id, tiers: bit}
		default:
			st.NamespaceOverflow++
		}
	}
}

func (d *Decoder) forget(h uint64, tier index.Tier) {
	e, found := d.ns[h]
	if !found {
		return
	}
	e.tiers &^= uint8(1) << tier
	if e.tiers == 0 {
		delete(d.ns, h)
		return
	}
	d.ns[h] = e
}

// salt caches kvhash.Salt for the last (lora, namespace) pair: requests of one
// adapter or tenant come in runs, and the cache keeps the hot path free of the
// string conversions Salt needs.
func (d *Decoder) salt(lora, ns []byte) uint64 {
	if len(lora) == 0 && len(ns) == 0 {
		return kvhash.Seed
	}
	if d.saltOK && string(lora) == d.saltL && string(ns) == d.saltN {
		return d.saltVal
	}
	d.saltL, d.saltN = string(lora), string(ns)
	d.saltVal = kvhash.Salt(d.saltL, d.saltN)
	d.saltOK = true
	return d.saltVal
}
