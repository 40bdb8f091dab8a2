package loads

import "github.com/kvselect/kvselect/selection/index"

// Prompt blocks are identified by their tracking-hash path, not by the hash
// alone: Dynamo's newest BlockTracker is a compressed path trie
// (sequences/block_tracker.rs, compressed_path_arena.rs) and its read model a
// prompt-membership trie walked from the root (prompt_registry.rs). For
// server-computed chained hashes the two views coincide, since a sequence hash
// commits to its prefix; for client-supplied hashes that break the chain
// (api spec §2.2 trusts them as-is) the path view is what Dynamo counts, e.g.
// [1,2] and [3,2] are four blocks, not three.
//
// Layout: one partition-wide trie of paths (nodes in a slice, children in one
// map keyed by (parent, hash)), and per rank a map from trie node to a slot
// holding that rank's reference count and decay weight. A rank's held nodes are
// prefix-closed (a booking holds its whole path), so a prompt's prefix depth
// on a rank is a binary search over the prompt's trie path: O(log n) map
// probes per rank instead of a walk per rank.

const noNode = int32(-1)

type edge struct {
	parent int32
	hash   uint64
}

type node struct {
	hash    uint64
	parent  int32
	holders int32 // ranks holding this node; the node is freed at zero
}

type trie struct {
	nodes    []node
	free     []int32
	children map[edge]int32
}

func newTrie() trie { return trie{children: make(map[edge]int32)} }

// child returns the node for hash under parent, creating it (with no holders)
// if absent.
func (g *trie) child(parent int32, hash uint64) int32 {
	e := edge{parent, hash}
	if n, ok := g.children[e]; ok {
		return n
	}
	var n int32
	if k := len(g.free); k > 0 {
		n = g.free[k-1]
		g.free = g.free[:k-1]
		g.nodes[n] = node{hash: hash, parent: parent}
	} else {
		n = int32(len(g.nodes))
		g.nodes = append(g.nodes, node{hash: hash, parent: parent})
	}
	g.children[e] = n
	return n
}

// drop removes one holder of n and frees it when none is left. A node nobody
// holds has no children: every holder of a child also holds its parent.
func (g *trie) drop(n int32) {
	nd := &g.nodes[n]
	if nd.holders--; nd.holders > 0 {
		return
	}
	delete(g.children, edge{nd.parent, nd.hash})
	g.free = append(g.free, n)
}

// walk appends to path the nodes of the longest prefix of hashes present in
// the trie.
func (g *trie) walk(hashes []uint64, path []int32) []int32 {
	parent := noNode
	for _, h := range hashes {
		n, ok := g.children[edge{parent, h}]
		if !ok {
			break
		}
		path = append(path, n)
		parent = n
	}
	return path
}

// slot is one rank's hold on a trie node.
type slot struct {
	refs    int32 // live bookings on this rank whose prompt path passes here
	hasFrac bool
	frac    float64
}

// rank is one (worker, dp_rank)'s state. Block weights are kept as an exact
// count of unit-weight blocks plus a float sum of fractional ones, reset to
// zero when the last fractional block goes, so float drift never survives a
// drain.
type rank struct {
	key       index.WorkerKey
	held      map[int32]int32 // trie node -> slot index
	slots     []slot
	freeSlots []int32
	unit      int     // blocks at weight 1
	fracN     int     // blocks carrying a decay fraction
	fracSum   float64 // their weights
	prefill   int
	requests  int
}

func newRank(w index.WorkerKey) *rank {
	return &rank{key: w, held: make(map[int32]int32)}
}

func (r *rank) load() WorkerLoad {
	return WorkerLoad{
		Worker:              r.key,
		ActivePrefillTokens: r.prefill,
		ActiveDecodeBlocks:  roundHalfAway(float64(r.unit) + r.fracSum),
		ActiveRequests:      r.requests,
	}
}

// acquire adds one booking's prompt path and returns its last node.
func (r *rank) acquire(g *trie, hashes []uint64) int32 {
	parent := noNode
	for _, h := range hashes {
		n := g.child(parent, h)
		si, ok := r.held[n]
		if !ok {
			si = r.newSlot()
			r.held[n] = si
			g.nodes[n].holders++
			r.unit++ // a new block starts at weight 1, even under a fractional parent
		}
		r.slots[si].refs++
		parent = n
	}
	return parent
}

// release drops one booking's prompt path ending at tail.
func (r *rank) release(g *trie, tail int32) {
	for n := tail; n != noNode; {
		si := r.held[n]
		s := &r.slots[si]
		parent := g.nodes[n].parent
		if s.refs--; s.refs == 0 {
			if s.hasFrac {
				r.fracN--
				r.fracSum -= s.frac
			} else {
				r.unit--
			}
			delete(r.held, n)
			r.freeSlots = append(r.freeSlots, si)
			g.drop(n)
		}
		n = parent
	}
}

// setExclusiveFraction re-weights the suffix of the path ending at tail that
// only one booking holds. Reference counts never grow towards the tail, so the
// exclusive blocks are exactly a suffix.
func (r *rank) setExclusiveFraction(g *trie, tail int32, f float64) {
	for n := tail; n != noNode; n = g.nodes[n].parent {
		s := &r.slots[r.held[n]]
		if s.refs != 1 {
			return
		}
		if s.hasFrac {
			r.fracSum += f - s.frac
		} else {
			r.unit--
			r.fracN++
			r.fracSum += f
		}
		s.hasFrac, s.frac = true, f
	}
}

// settle clears float residue once no fractional block is left.
func (r *rank) settle() {
	if r.fracN == 0 {
		r.fracSum = 0
	}
}

// depth is how many leading nodes of path this rank holds.
func (r *rank) depth(path []int32) int {
	if len(r.held) == 0 {
		return 0
	}
	lo, hi := 0, len(path) // held on [0, lo), not held on [hi, len)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if _, ok := r.held[path[mid]]; ok {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

func (r *rank) newSlot() int32 {
	if k := len(r.freeSlots); k > 0 {
		si := r.freeSlots[k-1]
		r.freeSlots = r.freeSlots[:k-1]
		r.slots[si] = slot{}
		return si
	}
	r.slots = append(r.slots, slot{})
	return int32(len(r.slots) - 1)
}
