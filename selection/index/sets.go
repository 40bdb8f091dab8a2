package index

import (
	"encoding/binary"
	"slices"
)

// An owner set is the set of (worker slot, tier) pairs that hold one tree node,
// encoded as slot<<2 | tier and kept sorted. Sets are interned: every node refers
// to its set by a uint32 id, and nodes with equal owners share one copy. Along a
// cached prompt most consecutive nodes have the same owners, so
//   - a node costs 4 bytes of ownership however many workers hold it,
//   - a lookup only re-examines its candidates when the set id changes, and
//   - a store or remove of a whole chain by one worker turns one set into another
//     once and replays that transition from a one-entry memo.
// Set 0 is the permanent empty set.

type ownerElem = uint32

func elemOf(slot uint32, t Tier) ownerElem { return slot<<2 | uint32(t) }
func elemSlot(e ownerElem) uint32          { return e >> 2 }
func elemTier(e ownerElem) Tier            { return Tier(e & 3) }

type ownerSet struct {
	elems []ownerElem
	key   string // elems as little-endian bytes: the intern table's key
	refs  uint32 // nodes using this set
}

type setTable struct {
	sets  []ownerSet
	byKey map[string]uint32
	free  []uint32

	scratch []ownerElem
	keyBuf  []byte

	// One-entry transition memo: sets[from] with elem added (add) or removed.
	memoOK   bool
	memoFrom uint32
	memoElem ownerElem
	memoAdd  bool
	memoTo   uint32
}

func newSetTable() setTable {
	return setTable{sets: []ownerSet{{refs: 1}}, byKey: map[string]uint32{"": 0}}
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
	delete(st.byKey, s.key)
	*s = ownerSet{}
	st.free = append(st.free, id)
	// The freed id may be reused for other contents.
	st.memoOK = false
}

// with returns the id of sets[id] ∪ {e} (adding) or sets[id] \ {e} (removing),
// without changing reference counts.
func (st *setTable) with(id uint32, e ownerElem, add bool) uint32 {
	if st.memoOK && st.memoFrom == id && st.memoElem == e && st.memoAdd == add {
		return st.memoTo
	}
	cur := st.sets[id].elems
	if !add && len(cur) == 1 && cur[0] == e {
		return 0 // the common eviction: a block's only owner lets go
	}
	i, found := slices.BinarySearch(cur, e)
	if found == add {
		return id
	}
	next := append(st.scratch[:0], cur[:i]...)
	if add {
		next = append(next, e)
		next = append(next, cur[i:]...)
	} else {
		next = append(next, cur[i+1:]...)
	}
	st.scratch = next
	to := st.intern(next)
	st.memoOK, st.memoFrom, st.memoElem, st.memoAdd, st.memoTo = true, id, e, add, to
	return to
}

// intern returns the id of the set with exactly elems (sorted), creating it with
// zero references if needed.
func (st *setTable) intern(elems []ownerElem) uint32 {
	b := st.keyBuf[:0]
	for _, e := range elems {
		b = binary.LittleEndian.AppendUint32(b, e)
	}
	st.keyBuf = b
	if id, ok := st.byKey[string(b)]; ok { // no allocation for the lookup
		return id
	}
	s := ownerSet{elems: slices.Clone(elems), key: string(b)}
	var id uint32
	if n := len(st.free); n > 0 {
		id = st.free[n-1]
		st.free = st.free[:n-1]
		st.sets[id] = s
	} else {
		id = uint32(len(st.sets))
		st.sets = append(st.sets, s)
	}
	st.byKey[s.key] = id
	return id
}

func (st *setTable) live() int { return len(st.byKey) - 1 }
