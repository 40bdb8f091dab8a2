package index

import (
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"testing"
)

// refSetTable is the owner-set table as it was before sets were keyed by the
// sum of their mixed elements: interned by the elements' bytes in a string
// map. The sum-keyed table must hand out the same ids for the same sequence
// of operations.
type refSetTable struct {
	sets  []refSet
	byKey map[string]uint32
	free  []uint32
}

type refSet struct {
	elems []ownerElem
	key   string
	refs  uint32
}

func newRefSetTable() *refSetTable {
	return &refSetTable{sets: []refSet{{refs: 1}}, byKey: map[string]uint32{"": 0}}
}

func (st *refSetTable) acquire(id uint32) {
	if id != 0 {
		st.sets[id].refs++
	}
}

func (st *refSetTable) release(id uint32) {
	if id == 0 {
		return
	}
	s := &st.sets[id]
	if s.refs--; s.refs > 0 {
		return
	}
	delete(st.byKey, s.key)
	*s = refSet{}
	st.free = append(st.free, id)
}

func (st *refSetTable) with(id uint32, e ownerElem, add bool) uint32 {
	cur := st.sets[id].elems
	i, found := slices.BinarySearch(cur, e)
	if found == add {
		return id
	}
	next := slices.Clone(cur[:i])
	if add {
		next = append(append(next, e), cur[i:]...)
	} else {
		next = append(next, cur[i+1:]...)
	}
	var b []byte
	for _, e := range next {
		b = binary.LittleEndian.AppendUint32(b, e)
	}
	if id, ok := st.byKey[string(b)]; ok {
		return id
	}
	s := refSet{elems: next, key: string(b)}
	var to uint32
	if n := len(st.free); n > 0 {
		to = st.free[n-1]
		st.free = st.free[:n-1]
		st.sets[to] = s
	} else {
		to = uint32(len(st.sets))
		st.sets = append(st.sets, s)
	}
	st.byKey[s.key] = to
	return to
}

// TestSetTableMatchesStringInterning drives the table and the string-keyed
// reference with the same random ownership changes of a population of nodes
// and checks that every change yields the same set id, that ids are reused
// alike, and that the table stays canonical (one set per content, sums and
// chains consistent, reference counts equal to the nodes using each set).
func TestSetTableMatchesStringInterning(t *testing.T) {
	for seed := range uint64(6) {
		r := rand.New(rand.NewPCG(seed, 77))
		got, ref := newSetTable(), newRefSetTable()
		nodes := make([]uint32, 0, 512)
		// Few distinct elements make sets recur and collide in chains;
		// many make large sets.
		universe := []uint32{4, 40, 3000}[seed%3]
		for step := range 20000 {
			switch op := r.IntN(20); {
			case op == 0 || len(nodes) == 0:
				nodes = append(nodes, 0)
			case op == 1:
				i := r.IntN(len(nodes))
				got.release(nodes[i])
				ref.release(nodes[i])
				nodes[i] = nodes[len(nodes)-1]
				nodes = nodes[:len(nodes)-1]
			default:
				// Runs along chains: the same change on several nodes of a set.
				i := r.IntN(len(nodes))
				e := ownerElem(r.Uint32N(universe))
				add := r.IntN(2) == 0
				if !add && len(got.elems(nodes[i])) > 0 && r.IntN(2) == 0 {
					el := got.elems(nodes[i])
					e = el[r.IntN(len(el))]
				}
				for k := range 1 + r.IntN(4) {
					j := (i + k) % len(nodes)
					from := nodes[j]
					a, b := got.with(from, e, add), ref.with(from, e, add)
					if a != b {
						t.Fatalf("seed %d step %d: with(%d, %d, %v) = %d, reference %d", seed, step, from, e, add, a, b)
					}
					if a != from {
						got.acquire(a)
						got.release(from)
						ref.acquire(b)
						ref.release(from)
						nodes[j] = a
					}
				}
			}
			if step%500 == 0 {
				checkSetTable(t, &got, nodes)
			}
		}
		checkSetTable(t, &got, nodes)
	}
}

func checkSetTable(t *testing.T, st *setTable, nodes []uint32) {
	t.Helper()
	uses := map[uint32]uint32{}
	for _, id := range nodes {
		uses[id]++
	}
	free := map[uint32]bool{}
	for _, id := range st.free {
		free[id] = true
	}
	seen := map[string]uint32{}
	live := 0
	for id := 1; id < len(st.sets); id++ {
		s := &st.sets[id]
		if free[uint32(id)] {
			if s.refs != 0 || len(s.elems) != 0 || uses[uint32(id)] != 0 {
				t.Fatalf("free set %d in use: %+v", id, s)
			}
			continue
		}
		live++
		if s.refs != uses[uint32(id)] {
			t.Fatalf("set %d: %d refs, %d nodes", id, s.refs, uses[uint32(id)])
		}
		var sum uint64
		for i, e := range s.elems {
			if i > 0 && s.elems[i-1] >= e {
				t.Fatalf("set %d not sorted: %v", id, s.elems)
			}
			sum += mix(e)
		}
		if sum != s.sum || len(s.elems) == 0 {
			t.Fatalf("set %d: sum %x, want %x (%d elems)", id, s.sum, sum, len(s.elems))
		}
		var kb []byte
		for _, e := range s.elems {
			kb = binary.LittleEndian.AppendUint32(kb, e)
		}
		k := string(kb)
		if other, dup := seen[k]; dup {
			t.Fatalf("sets %d and %d have the same elements", other, id)
		}
		seen[k] = uint32(id)
		found := false
		for c := st.bySum[s.sum]; c != 0; c = st.sets[c].next {
			found = found || c == uint32(id)
		}
		if !found {
			t.Fatalf("set %d is not in its chain", id)
		}
	}
	if live != st.live {
		t.Fatalf("%d live sets, counted %d", live, st.live)
	}
}

// TestSlotCacheFollowsRankRemoval: the remembered slot of the last worker
// never outlives the rank: after RemoveRank, its slot goes to another
// worker, and the removed worker's events find nothing of it.
func TestSlotCacheFollowsRankRemoval(t *testing.T) {
	tr := NewTree()
	a, b := WorkerKey{WorkerID: 1}, WorkerKey{WorkerID: 2}
	store := func(w WorkerKey, ext uint64) {
		t.Helper()
		if err := tr.Apply(&Event{Worker: w, Kind: EventStored, Blocks: []Block{{Ext: ext, Local: 7}}}); err != nil {
			t.Fatal(err)
		}
	}
	store(a, 10)
	tr.RemoveRank(a)
	store(b, 20) // takes a's freed slot
	if err := tr.Apply(&Event{Worker: a, Kind: EventRemoved, Hashes: []uint64{20}}); err == nil {
		t.Fatal("a removed b's block through a stale slot")
	}
	got := tr.Match([]uint64{7}, false, nil)
	if len(got) != 1 || got[0].Worker != b || got[0].Device != 1 {
		t.Fatalf("after removing a: %+v", got)
	}
}
