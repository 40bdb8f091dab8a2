package scale

import (
	"math/rand/v2"
	"slices"

	"github.com/kvselect/kvselect/bench/mooncake"
	"github.com/kvselect/kvselect/mockworker/kvpublish"
)

// prompts is the workload every simulated engine and the selection requests
// draw from: inference-perf's shared_prefix shape (groups of prompts sharing a
// system prompt, each with its own question), plus one hot system prompt
// that every rank serves now and then — a chat product's common preamble —
// so that some lookups match the whole fleet, the index's worst case.
type prompts struct {
	blockSize       int
	groups          int
	system          [][]uint32 // per group, then the hot one last
	questionTokens  int
	questionsPerGrp int
}

// newPrompts builds the system prompts of groups groups (and the hot one);
// questions are derived on demand from (group, question) so that the
// workload costs no memory per prompt.
func newPrompts(groups, systemTokens, questionTokens, questionsPerGroup, blockSize int) *prompts {
	p := &prompts{blockSize: blockSize, groups: groups, questionTokens: questionTokens, questionsPerGrp: questionsPerGroup}
	for g := range groups + 1 {
		p.system = append(p.system, traceTokens(uint64(g)<<32, systemTokens))
	}
	return p
}

// hot is the group index of the hot system prompt.
func (p *prompts) hot() int { return p.groups }

// prompt is the token ids of question q of group g.
func (p *prompts) prompt(g, q int) []uint32 {
	sys := p.system[g]
	out := make([]uint32, 0, len(sys)+p.questionTokens)
	out = append(out, sys...)
	return append(out, traceTokens(1<<63|uint64(g)<<32|uint64(q), p.questionTokens)...)
}

// traceTokens is n token ids derived from a content id, as the kvbench
// harnesses turn Mooncake trace blocks into tokens.
func traceTokens(id uint64, n int) []uint32 {
	t := mooncake.Tokens([]uint64{id}, n)
	return t[:n]
}

// engine is one simulated engine rank: its GPU prefix cache, an LRU of full
// blocks of a fixed capacity, and the KV events it publishes, built as
// vLLM's block pool emits them (vllm/v1/core/block_pool.py): one
// BlockStored per request and step for the blocks that became full (the
// prompt's uncached blocks at prefill, then one block per BlockSize decoded
// tokens), and one BlockRemoved per cached block evicted to make room.
type engine struct {
	capacity  int
	blockSize int
	rng       *rand.Rand

	// The LRU: slot i holds block hash[i]; prev/next link slots, head is the
	// most recently used. Arrays rather than pointers so that a fleet of
	// simulated engines costs the garbage collector little.
	slot       map[uint64]int32
	hash       []uint64
	prev, next []int32
	head, tail int32
	free       []int32
}

func newEngine(capacity, blockSize int, seed uint64) *engine {
	return &engine{capacity: capacity, blockSize: blockSize, rng: rand.New(rand.NewPCG(seed, 0x5ca1e)),
		slot: make(map[uint64]int32, capacity), head: -1, tail: -1}
}

// chainHash is the engine's hash of a block: its parent's hash and its
// tokens, like vLLM's chained block hash (any collision-free chain will do:
// kvselect rehashes the tokens itself).
func chainHash(parent uint64, tokens []uint32) uint64 {
	h := mooncake.Mix64(parent ^ 0x9e3779b97f4a7c15)
	for _, t := range tokens {
		h = mooncake.Mix64(h ^ uint64(t))
	}
	return h | 1 // never 0, which means "no parent" below
}

func (e *engine) unlink(s int32) {
	p, n := e.prev[s], e.next[s]
	if p >= 0 {
		e.next[p] = n
	} else {
		e.head = n
	}
	if n >= 0 {
		e.prev[n] = p
	} else {
		e.tail = p
	}
}

func (e *engine) pushFront(s int32) {
	e.prev[s], e.next[s] = -1, e.head
	if e.head >= 0 {
		e.prev[e.head] = s
	}
	e.head = s
	if e.tail < 0 {
		e.tail = s
	}
}

// touch makes the cached block h the most recently used.
func (e *engine) touch(h uint64) bool {
	s, ok := e.slot[h]
	if !ok {
		return false
	}
	e.unlink(s)
	e.pushFront(s)
	return true
}

// insert caches h, evicting the least recently used block when full; the
// evicted block's BlockRemoved is appended to evs.
func (e *engine) insert(h uint64, evs []kvpublish.Event) []kvpublish.Event {
	if e.touch(h) {
		return evs
	}
	var s int32
	switch {
	case len(e.free) > 0:
		s, e.free = e.free[len(e.free)-1], e.free[:len(e.free)-1]
	case len(e.hash) < e.capacity:
		s = int32(len(e.hash))
		e.hash, e.prev, e.next = append(e.hash, 0), append(e.prev, -1), append(e.next, -1)
	default:
		s = e.tail
		e.unlink(s)
		old := e.hash[s]
		delete(e.slot, old)
		evs = append(evs, &kvpublish.BlockRemoved{BlockHashes: []uint64{old}, Medium: "GPU"})
	}
	e.hash[s] = h
	e.slot[h] = s
	e.pushFront(s)
	return evs
}

// evict drops h from the cache if it is there.
func (e *engine) evict(h uint64) bool {
	s, ok := e.slot[h]
	if !ok {
		return false
	}
	e.unlink(s)
	delete(e.slot, h)
	e.free = append(e.free, s)
	return true
}

// prefill runs a request's prompt through the cache: its cached prefix is
// reused (and refreshed), its other full blocks stored. It returns the
// events and the hash of the prompt's last full block, the parent of its
// output (0 for none).
func (e *engine) prefill(tokens []uint32) ([]kvpublish.Event, uint64) {
	bs := e.blockSize
	full := len(tokens) / bs
	hashes := make([]uint64, full)
	parent := uint64(0)
	for i := range full {
		parent = chainHash(parent, tokens[i*bs:(i+1)*bs])
		hashes[i] = parent
	}
	cached := 0
	for cached < full {
		if _, ok := e.slot[hashes[cached]]; !ok {
			break
		}
		cached++
	}
	// vLLM frees a request's blocks tail first, so the prefix is the last to
	// be evicted: refresh it back to front.
	for i := cached - 1; i >= 0; i-- {
		e.touch(hashes[i])
	}
	var evs []kvpublish.Event
	if cached < full {
		// A block past the first miss may still be cached, its parent
		// evicted: drop it first, so the chain is stored whole, once.
		for _, h := range hashes[cached+1:] {
			if e.evict(h) {
				evs = append(evs, &kvpublish.BlockRemoved{BlockHashes: []uint64{h}, Medium: "GPU"})
			}
		}
		st := &kvpublish.BlockStored{BlockHashes: slices.Clone(hashes[cached:]), TokenIDs: tokens[cached*bs : full*bs],
			BlockSize: bs, Medium: "GPU"}
		if cached > 0 {
			st.ParentBlockHash = &hashes[cached-1]
		}
		evs = append(evs, st)
		// Tail first, so that the chain's head is the most recently used.
		for i := full - 1; i >= cached; i-- {
			evs = e.insert(hashes[i], evs)
		}
	}
	if full == 0 {
		return evs, 0
	}
	return evs, hashes[full-1]
}

// decode stores one output block, just filled with generated tokens (fresh
// random ids, as generated text is), after parent (0: none). It returns
// the events and the block's hash. A parent evicted meanwhile leaves the
// block unchained, as vLLM stores it with a parent the index no longer
// knows: the chain is cut.
func (e *engine) decode(parent uint64) ([]kvpublish.Event, uint64) {
	out := make([]uint32, e.blockSize)
	for i := range out {
		out[i] = e.rng.Uint32N(32000)
	}
	// The running request's blocks are pinned in vLLM; refreshing the
	// parent is this LRU's approximation.
	if !e.touch(parent) {
		parent = 0
	}
	h := chainHash(parent, out)
	st := &kvpublish.BlockStored{BlockHashes: []uint64{h}, TokenIDs: out, BlockSize: e.blockSize, Medium: "GPU"}
	if parent != 0 {
		st.ParentBlockHash = new(parent)
	}
	return e.insert(h, []kvpublish.Event{st}), h
}

// serve runs a whole request at once, prefill then every output block, and
// returns each step's events: the populating runs' engines serve one
// request at a time.
func (e *engine) serve(tokens []uint32, outputTokens int) [][]kvpublish.Event {
	evs, last := e.prefill(tokens)
	steps := [][]kvpublish.Event{evs}
	for range outputTokens / e.blockSize {
		evs, last = e.decode(last)
		steps = append(steps, evs)
	}
	return steps
}

// cached is how many blocks the engine holds.
func (e *engine) cached() int { return len(e.slot) }
