package mooncake

import "fmt"

// Block is one KV block in a Stored event.
type Block struct {
	// Ext is the engine's own hash of the block (chained over the prefix and
	// seeded per worker), the id used by later Stored parents and Removed.
	Ext uint64
	// Local is the content hash of the block that a router computes from the
	// prompt; see LocalHash.
	Local uint64
}

// Event is a KV event published by an Engine: Stored or Removed.
type Event interface{ isEvent() }

// Stored reports blocks newly cached by an engine, in prefix order. Blocks[0]
// extends the cached block Parent (when HasParent), each later block extends
// the one before it.
type Stored struct {
	Parent    uint64
	HasParent bool
	Blocks    []Block
}

// Removed reports blocks evicted by an engine, by Ext hash. An engine only
// evicts blocks no cached block depends on, so every child of a removed
// block has been removed before it (or in the same event, earlier).
type Removed struct {
	Exts []uint64
}

func (Stored) isEvent()  {}
func (Removed) isEvent() {}

// BlockInfo describes one cached block, for comparing engines with indexes.
type BlockInfo struct {
	Local     uint64
	Parent    uint64 // Ext of the parent block, when HasParent
	HasParent bool
}

type engineBlock struct {
	ext, local, parent uint64
	hasParent          bool
	children           int32
	prev, next         *engineBlock // free (LRU) list links
	inList             bool
}

// Engine is a mock inference engine for one worker: a pool of Capacity
// blocks with prefix caching and LRU eviction, modeled on vLLM's block pool
// when every request completes before the next one arrives.
//
// For each request the engine pins the longest cached prefix of its blocks,
// evicts from the head of the free queue as many blocks as needed, caches
// the missing blocks, and, when the request completes, appends all of the
// request's blocks to the tail of the free queue deepest first (as vLLM
// frees a request's blocks in reverse order). With that order a block always
// sits after all of its cached children, so the head of the queue is the
// least recently used leaf: evictions never orphan a cached block.
//
// A request longer than Capacity blocks is truncated to its first Capacity
// blocks (a real engine would reject it).
type Engine struct {
	worker        int
	capacity      int
	batchRemovals bool
	seed          uint64
	blocks        map[uint64]*engineBlock
	head, tail    *engineBlock // head is evicted first
	path          []*engineBlock
}

// NewEngine returns an empty engine for worker with room for capacity
// blocks (at least 1). If batchRemovals is set, the blocks evicted for one
// request are reported in a single Removed event; otherwise each evicted
// block gets its own Removed event, as vLLM publishes them.
func NewEngine(worker, capacity int, batchRemovals bool) *Engine {
	return &Engine{
		worker:        worker,
		capacity:      max(capacity, 1),
		batchRemovals: batchRemovals,
		seed:          workerSeed(worker),
		blocks:        make(map[uint64]*engineBlock),
	}
}

// Worker returns the engine's worker id.
func (e *Engine) Worker() int { return e.worker }

// Capacity returns the size of the block pool.
func (e *Engine) Capacity() int { return e.capacity }

// Len returns the number of cached blocks.
func (e *Engine) Len() int { return len(e.blocks) }

// Cached reports whether the block with engine hash ext is cached.
func (e *Engine) Cached(ext uint64) bool { _, ok := e.blocks[ext]; return ok }

// Snapshot returns the cached blocks keyed by Ext hash.
func (e *Engine) Snapshot() map[uint64]BlockInfo {
	out := make(map[uint64]BlockInfo, len(e.blocks))
	for ext, b := range e.blocks {
		out[ext] = BlockInfo{Local: b.local, Parent: b.parent, HasParent: b.hasParent}
	}
	return out
}

// Process runs one request with the given hash ids through the engine and
// returns the events it publishes, in order: evictions first, then at most
// one Stored for the blocks that were not cached. A request whose blocks are
// all cached publishes nothing.
func (e *Engine) Process(ids []uint64) []Event {
	if len(ids) > e.capacity {
		ids = ids[:e.capacity]
	}
	path := e.path[:0]

	// Pin the cached prefix: take it off the free queue.
	prev, hasPrev := e.seed, false
	i := 0
	for ; i < len(ids); i++ {
		ext := chainExt(prev, LocalHash(ids[i]))
		b, ok := e.blocks[ext]
		if !ok {
			break
		}
		e.unlink(b)
		path = append(path, b)
		prev, hasPrev = ext, true
	}
	parent, hasParent := prev, hasPrev
	if !hasPrev {
		parent = 0
	}

	var events []Event
	need := len(ids) - i
	if over := len(e.blocks) + need - e.capacity; over > 0 {
		events = e.evict(over, events)
	}

	if need > 0 {
		st := Stored{Parent: parent, HasParent: hasParent, Blocks: make([]Block, 0, need)}
		var up *engineBlock
		if hasParent {
			up = path[len(path)-1]
		}
		for ; i < len(ids); i++ {
			local := LocalHash(ids[i])
			ext := chainExt(prev, local)
			b := &engineBlock{ext: ext, local: local, parent: prev, hasParent: hasPrev}
			if !hasPrev {
				b.parent = 0
			}
			if up != nil {
				up.children++
			}
			e.blocks[ext] = b
			path = append(path, b)
			st.Blocks = append(st.Blocks, Block{Ext: ext, Local: local})
			prev, hasPrev, up = ext, true, b
		}
		events = append(events, st)
	}

	// Complete the request: free its blocks deepest first.
	for j := len(path) - 1; j >= 0; j-- {
		e.pushTail(path[j])
	}
	clear(path)
	e.path = path[:0]
	return events
}

// evict removes n blocks from the head of the free queue.
func (e *Engine) evict(n int, events []Event) []Event {
	var batch []uint64
	if e.batchRemovals {
		batch = make([]uint64, 0, n)
	}
	for range n {
		b := e.head
		if b == nil {
			panic(fmt.Sprintf("mooncake: engine %d: nothing to evict (%d cached, capacity %d)", e.worker, len(e.blocks), e.capacity))
		}
		if b.children != 0 {
			panic(fmt.Sprintf("mooncake: engine %d: LRU head %#x has %d cached children", e.worker, b.ext, b.children))
		}
		e.unlink(b)
		delete(e.blocks, b.ext)
		if b.hasParent {
			if p := e.blocks[b.parent]; p != nil {
				p.children--
			}
		}
		if e.batchRemovals {
			batch = append(batch, b.ext)
		} else {
			events = append(events, Removed{Exts: []uint64{b.ext}})
		}
	}
	if e.batchRemovals && len(batch) > 0 {
		events = append(events, Removed{Exts: batch})
	}
	return events
}

func (e *Engine) unlink(b *engineBlock) {
	if !b.inList {
		return
	}
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		e.head = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else {
		e.tail = b.prev
	}
	b.prev, b.next, b.inList = nil, nil, false
}

func (e *Engine) pushTail(b *engineBlock) {
	b.prev, b.next, b.inList = e.tail, nil, true
	if e.tail != nil {
		e.tail.next = b
	} else {
		e.head = b
	}
	e.tail = b
}
