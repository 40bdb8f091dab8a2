package index

import "slices"

// An owner set is the set of (worker slot, tier) pairs that hold one tree node,
// encoded as slot<<2 | tier and kept sorted. Sets are interned: every node refers
// to its set by a uint32 id, and nodes with equal owners share one copy. Along a
// cached prompt most consecutive nodes have the same owners, so
//   - a node costs 4 bytes of ownership however many workers hold it,
//   - a lookup only re-examines its candidates when the set id changes, and
//   - a store or remove of a whole chain by one worker turns one set into another
//     once and replays that transition from a cache of recent transitions.
// Set 0 is the permanent empty set.

type ownerElem = uint32

func elemOf(slot uint32, t Tier) ownerElem { return slot<<2 | uint32(t) }
func elemSlot(e ownerElem) uint32          { return e >> 2 }
func elemTier(e ownerElem) Tier            { return Tier(e & 3) }

type ownerSet struct {
	elems []ownerElem
	// sum is Σ mix(e) over elems: the intern table's key. Being a sum, the
	// key of a set with one element added or removed is sum ± mix(e), found
	// without reading the set; with a key made of the elements' bytes, every
	// ownership change of a block that a thousand ranks hold built and
	// hashed a 4 KB string.
	sum  uint64
	next uint32 // next set with the same sum; 0 ends the chain
	refs uint32 // nodes using this set
	gen  uint32 // times the id was freed: transitions cached before are stale
}

type setTable struct {
	sets  []ownerSet
	bySum map[uint64]uint32 // first set of each sum's chain (set 0 is in none)
	free  []uint32
	live  int

	// Recent transitions: sets[from] with elem added or removed. A store or
	// remove of a chain replays one transition block after block, and the
	// single-block removals of one worker, interleaved with every other
	// worker's, replay the same few transitions of widely held sets.
	trans [transSlots]transition

	// singles[e] is the id {e} had when last looked up, checked before
	// use: a block that only one rank holds (every decoded block) starts
	// as {e}, and at a thousand ranks their transitions from the empty set
	// crowd the transition cache.
	singles []uint32
}

const transSlots = 1024

type transition struct {
	from, to       uint32
	fromGen, toGen uint32
	elem           ownerElem
	add            bool
	ok             bool
}

func transSlot(from uint32, e ownerElem, add bool) int {
	k := uint64(from)<<32 | uint64(e)
	if add {
		k = ^k
	}
	return int((k * 0x9e3779b97f4a7c15) >> (64 - 10))
}

// mix is a bijective 64-bit finaliser (splitmix64's), so that sums of
// different sets collide only by chance; chains resolve the collisions.
func mix(e ownerElem) uint64 {
	x := uint64(e) + 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

func newSetTable() setTable {
	return setTable{sets: []ownerSet{{refs: 1}}, bySum: map[uint64]uint32{}}
}

func (st *setTable) elems(id uint32) []ownerElem { return st.sets[id].elems }

func (st *setTable) acquire(id uint32) {
	if id != 0 {
		st.sets[id].refs++
	}
}

func (st *setTable) release(id uint32) {
	if id == 0 {
		return
	}
	s := &st.sets[id]
	s.refs--
	if s.refs > 0 {
		return
	}
	// Unlink id from its chain.
	if head := st.bySum[s.sum]; head == id {
		if s.next == 0 {
			delete(st.bySum, s.sum)
		} else {
			st.bySum[s.sum] = s.next
		}
	} else {
		p := head
		for st.sets[p].next != id {
			p = st.sets[p].next
		}
		st.sets[p].next = s.next
	}
	// The buffer stays for the set that reuses the id; the new generation
	// voids the transitions cached to and from the freed contents.
	*s = ownerSet{elems: s.elems[:0], gen: s.gen + 1}
	st.free = append(st.free, id)
	st.live--
}

// with returns the id of sets[id] ∪ {e} (adding) or sets[id] \ {e} (removing),
// without changing reference counts.
func (st *setTable) with(id uint32, e ownerElem, add bool) uint32 {
	from := &st.sets[id]
	if !add && len(from.elems) == 1 && from.sum == mix(e) {
		// The common eviction: a block's only owner lets go. mix being a
		// bijection, a one-element set's sum is mix(e) only for {e}; the
		// elements, elsewhere in memory, need not be read.
		return 0
	}
	if add && id == 0 && int(e) < len(st.singles) {
		// A one-element set with mix(e) as its sum is {e}, as above.
		if s := st.singles[e]; s != 0 && len(st.sets[s].elems) == 1 && st.sets[s].sum == mix(e) {
			return s
		}
	}
	tr := &st.trans[transSlot(id, e, add)]
	if tr.ok && tr.from == id && tr.elem == e && tr.add == add &&
		tr.fromGen == from.gen && tr.toGen == st.sets[tr.to].gen {
		return tr.to
	}
	cur := from.elems
	i, found := slices.BinarySearch(cur, e)
	if found == add {
		return id
	}
	sum := st.sets[id].sum
	if add {
		sum += mix(e)
	} else {
		sum -= mix(e)
	}
	to := st.find(sum, cur, i, e, add)
	if to == 0 {
		to = st.create(sum, cur, i, e, add)
	}
	*tr = transition{from: id, to: to, fromGen: st.sets[id].gen, toGen: st.sets[to].gen, elem: e, add: add, ok: true}
	if add && id == 0 {
		if int(e) >= len(st.singles) {
			st.singles = append(st.singles, make([]uint32, int(e)+1-len(st.singles))...)
		}
		st.singles[e] = to
	}
	return to
}

// find returns the set whose elements are cur with e inserted at i (add) or
// cur without its element i, or 0 if there is none.
func (st *setTable) find(sum uint64, cur []ownerElem, i int, e ownerElem, add bool) uint32 {
	for c := st.bySum[sum]; c != 0; c = st.sets[c].next {
		s := st.sets[c].elems
		if add {
			if len(s) == len(cur)+1 && s[i] == e && slices.Equal(s[:i], cur[:i]) && slices.Equal(s[i+1:], cur[i:]) {
				return c
			}
		} else if len(s) == len(cur)-1 && slices.Equal(s[:i], cur[:i]) && slices.Equal(s[i:], cur[i+1:]) {
			return c
		}
	}
	return 0
}

// create interns the set find did not find, with zero references, under
// the id intern would have given it: the last freed one, else a new one.
func (st *setTable) create(sum uint64, cur []ownerElem, i int, e ownerElem, add bool) uint32 {
	n := len(cur) + 1
	if !add {
		n = len(cur) - 1
	}
	var id uint32
	var buf []ownerElem
	if k := len(st.free); k > 0 {
		id = st.free[k-1]
		st.free = st.free[:k-1]
		// Reuse the freed set's buffer unless it would waste more than it
		// holds: a buffer once grown for a thousand owners is not kept for one.
		if b := st.sets[id].elems; cap(b) >= n && cap(b) <= 2*n+4 {
			buf = b[:0]
		}
	} else {
		id = uint32(len(st.sets))
		st.sets = append(st.sets, ownerSet{})
	}
	if buf == nil {
		buf = make([]ownerElem, 0, n)
	}
	buf = append(buf, cur[:i]...)
	if add {
		buf = append(buf, e)
		buf = append(buf, cur[i:]...)
	} else {
		buf = append(buf, cur[i+1:]...)
	}
	st.sets[id] = ownerSet{elems: buf, sum: sum, next: st.bySum[sum], gen: st.sets[id].gen}
	st.bySum[sum] = id
	st.live++
	return id
}
