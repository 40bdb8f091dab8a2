package mockworker

import (
	"encoding/binary"
	"slices"

	"github.com/zeebo/xxh3"

	"github.com/kvselect/kvselect/mockworker/kvpublish"
)

// engineHashSeed seeds the engine's own block hash. Any stable 64-bit chained
// hash will do: kvselect, like Dynamo, keys its index on a hash it computes
// from the event's token_ids and keeps the engine hash only as a handle for
// parent links and removals, never compared across workers. A seed other than
// Dynamo's 1337 keeps the two visibly apart in dumps.
const engineHashSeed = 0x6d6f636b // "mock"

// engineHash is the block's identity in this engine: xxh3 over the parent's
// hash and the block's tokens, so equal tokens at different positions of a
// prompt get different hashes, as vLLM's chained block hashes do.
func engineHash(buf []byte, parent uint64, hasParent bool, tokens []uint32) ([]byte, uint64) {
	buf = buf[:0]
	if hasParent {
		buf = binary.LittleEndian.AppendUint64(buf, parent)
	}
	for _, t := range tokens {
		buf = binary.LittleEndian.AppendUint32(buf, t)
	}
	return buf, xxh3.HashSeed(buf, engineHashSeed)
}

// cblock is a full block in the prefix cache. A block with ref > 0 is held by
// running sequences; with ref == 0 it sits in the LRU list, evictable.
type cblock struct {
	hash      uint64
	parent    uint64
	hasParent bool
	tokens    []uint32
	ref       int
	// LRU links, valid while ref == 0.
	prev, next *cblock
}

// pool is one rank's KV block pool: a fixed number of blocks, a prefix cache of
// full blocks keyed by engine hash, reference counts from running sequences
// and LRU eviction of the cached blocks no sequence holds. It does no I/O and
// has no clock: it records the KV events its changes imply in events, which
// the caller publishes (and clears) after every operation.
//
// Block accounting: every block is either cached (in blocks, held or in the
// LRU list), reserved by a running sequence but not yet full (reserved), or
// free. A sequence reserves at admission every block it will ever fill (its
// prompt and max output), so a running sequence never needs preemption; full
// blocks turn reserved blocks into cached ones.
type pool struct {
	capacity  int
	blockSize int
	medium    string

	blocks     map[uint64]*cblock
	head, tail *cblock // LRU list: head is evicted first
	lruLen     int
	reserved   int // blocks reserved by running sequences, not yet cached
	evictions  uint64

	events []kvpublish.Event // KV events since the caller last took them
	hbuf   []byte
}

func newPool(capacity, blockSize int) *pool {
	return &pool{capacity: capacity, blockSize: blockSize, medium: "GPU", blocks: make(map[uint64]*cblock)}
}

// free is the number of blocks neither cached nor reserved.
func (p *pool) free() int { return p.capacity - len(p.blocks) - p.reserved }

// used is the number of blocks running sequences hold, vLLM's notion of KV
// cache usage (evictable cached blocks count as free there).
func (p *pool) used() int { return len(p.blocks) - p.lruLen + p.reserved }

func (p *pool) lruRemove(b *cblock) {
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		p.head = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else {
		p.tail = b.prev
	}
	b.prev, b.next = nil, nil
	p.lruLen--
}

func (p *pool) lruPush(b *cblock) {
	b.prev, b.next = p.tail, nil
	if p.tail != nil {
		p.tail.next = b
	} else {
		p.head = b
	}
	p.tail = b
	p.lruLen++
}

func (p *pool) acquire(b *cblock) {
	if b.ref == 0 {
		p.lruRemove(b)
	}
	b.ref++
}

// seq is one running sequence's hold on the pool.
type seq struct {
	tokens   []uint32  // prompt and output so far
	blocks   []*cblock // its full blocks, in chain order
	reserved int       // blocks reserved and not yet full
}

// need is how many blocks a sequence of total tokens occupies.
func (p *pool) need(total int) int { return (total + p.blockSize - 1) / p.blockSize }

// match returns the prompt's leading cached blocks. Like vLLM, at least the
// last prompt token is always computed, so a prompt never hits in full: at
// most (len-1)/blockSize blocks.
func (p *pool) match(prompt []uint32) []*cblock {
	var hits []*cblock
	var parent uint64
	for i := range (len(prompt) - 1) / p.blockSize {
		var h uint64
		p.hbuf, h = engineHash(p.hbuf, parent, i > 0, prompt[i*p.blockSize:(i+1)*p.blockSize])
		b := p.blocks[h]
		if b == nil {
			break
		}
		hits = append(hits, b)
		parent = h
	}
	return hits
}

// admit starts a sequence for prompt that may generate up to maxOutput
// tokens, if the pool can hold it now: it takes the cached prefix, reserves
// the rest and evicts least recently used free blocks to make room. It
// returns the sequence and how many prompt tokens were cache hits, or ok
// false and no change when the blocks are not available yet.
func (p *pool) admit(prompt []uint32, maxOutput int) (s *seq, hitTokens int, ok bool) {
	hits := p.match(prompt)
	need := p.need(len(prompt)+maxOutput) - len(hits)
	idleHits := 0
	for _, b := range hits {
		if b.ref == 0 {
			idleHits++
		}
	}
	// Evictable: LRU blocks other than the ones this sequence is about to take.
	if need > p.free()+p.lruLen-idleHits {
		return nil, 0, false
	}
	for _, b := range hits {
		p.acquire(b)
	}
	p.reserved += need
	p.evict(-p.free())
	s = &seq{tokens: slices.Clip(prompt), blocks: hits, reserved: need}
	return s, len(hits) * p.blockSize, true
}

// evict removes n least recently used free blocks from the cache and records
// one BlockRemoved for them, in eviction order.
func (p *pool) evict(n int) {
	if n <= 0 {
		return
	}
	rm := &kvpublish.BlockRemoved{Medium: p.medium}
	for ; n > 0 && p.head != nil; n-- {
		b := p.head
		p.lruRemove(b)
		delete(p.blocks, b.hash)
		p.evictions++
		rm.BlockHashes = append(rm.BlockHashes, b.hash)
	}
	p.events = append(p.events, rm)
}

// fill caches the sequence's blocks that have become full, recording a
// BlockStored for each run of newly cached blocks. A block whose content
// another sequence cached meanwhile is shared instead (its reserved block is
// released), so one content is cached once.
func (p *pool) fill(s *seq) {
	bs := p.blockSize
	var st *kvpublish.BlockStored
	for len(s.blocks) < len(s.tokens)/bs {
		i := len(s.blocks)
		var parent uint64
		hasParent := i > 0
		if hasParent {
			parent = s.blocks[i-1].hash
		}
		toks := s.tokens[i*bs : (i+1)*bs]
		var h uint64
		p.hbuf, h = engineHash(p.hbuf, parent, hasParent, toks)
		s.reserved--
		p.reserved--
		if b := p.blocks[h]; b != nil {
			p.acquire(b)
			s.blocks = append(s.blocks, b)
			st = nil // the next new block starts a new event under this parent
			continue
		}
		b := &cblock{hash: h, parent: parent, hasParent: hasParent, tokens: slices.Clone(toks), ref: 1}
		p.blocks[h] = b
		s.blocks = append(s.blocks, b)
		if st == nil {
			st = &kvpublish.BlockStored{BlockSize: bs, Medium: p.medium}
			if hasParent {
				st.ParentBlockHash = &b.parent
			}
			p.events = append(p.events, st)
		}
		st.BlockHashes = append(st.BlockHashes, h)
		st.TokenIDs = append(st.TokenIDs, toks...)
	}
}

// append adds generated tokens to the sequence and caches the blocks they fill.
func (p *pool) append(s *seq, toks ...uint32) {
	s.tokens = append(s.tokens, toks...)
	p.fill(s)
}

// release ends a sequence: its reserved blocks return to the free pool and its
// cached blocks lose a reference. Blocks enter the LRU list last block first,
// as vLLM frees them, so a chain's tail is evicted before its prefix.
func (p *pool) release(s *seq) {
	p.reserved -= s.reserved
	s.reserved = 0
	for i := len(s.blocks) - 1; i >= 0; i-- {
		b := s.blocks[i]
		b.ref--
		if b.ref == 0 {
			p.lruPush(b)
		}
	}
	s.blocks = nil
}

// reset drops every cached block and records AllBlocksCleared. It fails (does
// nothing) while any sequence holds blocks, as vLLM's reset_prefix_cache does.
func (p *pool) reset() bool {
	if p.used() > 0 {
		return false
	}
	clear(p.blocks)
	p.head, p.tail, p.lruLen = nil, nil, 0
	p.events = append(p.events, &kvpublish.AllBlocksCleared{})
	return true
}

// takeEvents returns the recorded events and starts a new list.
func (p *pool) takeEvents() []kvpublish.Event {
	evs := p.events
	p.events = nil
	return evs
}
