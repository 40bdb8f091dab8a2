package mockworker

import (
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/kvselect/kvselect/mockworker/kvpublish"
)

// checkPool verifies the pool's accounting invariants.
func checkPool(t *testing.T, p *pool) {
	t.Helper()
	if p.free() < 0 || p.reserved < 0 {
		t.Fatalf("free %d reserved %d", p.free(), p.reserved)
	}
	n := 0
	for b := p.head; b != nil; b = b.next {
		n++
		if b.ref != 0 {
			t.Fatalf("block %x in LRU with ref %d", b.hash, b.ref)
		}
		if p.blocks[b.hash] != b {
			t.Fatalf("LRU block %x not cached", b.hash)
		}
	}
	if n != p.lruLen {
		t.Fatalf("LRU list has %d blocks, lruLen %d", n, p.lruLen)
	}
	idle := 0
	for _, b := range p.blocks {
		if b.ref < 0 {
			t.Fatalf("block %x ref %d", b.hash, b.ref)
		}
		if b.ref == 0 {
			idle++
		}
		if b.hasParent && p.blocks[b.parent] == nil {
			t.Fatalf("block %x cached without its parent %x", b.hash, b.parent)
		}
	}
	if idle != p.lruLen {
		t.Fatalf("%d idle blocks, %d in LRU", idle, p.lruLen)
	}
}

// run admits a prompt, generates out tokens and releases the sequence.
func run(t *testing.T, p *pool, prompt []uint32, out ...uint32) (hit int) {
	t.Helper()
	s, hit, ok := p.admit(prompt, len(out))
	if !ok {
		t.Fatalf("prompt %v not admitted", prompt)
	}
	p.fill(s)
	p.append(s, out...)
	checkPool(t, p)
	p.release(s)
	checkPool(t, p)
	return hit
}

func hashes(blocks ...[]uint32) []uint64 {
	var out []uint64
	var parent uint64
	for i, b := range blocks {
		_, h := engineHash(nil, parent, i > 0, b)
		out = append(out, h)
		parent = h
	}
	return out
}

func TestPoolEvictsLeastRecentlyUsedTailFirst(t *testing.T) {
	a := hashes([]uint32{1, 2}, []uint32{3, 4})
	b := hashes([]uint32{5, 6}, []uint32{7, 8})
	cases := []struct {
		name    string
		touchA  bool
		evicted []uint64
	}{
		// A was released first, its tail before its head.
		{"oldest-first", false, []uint64{a[1], a[0]}},
		// A hit again after B: B is now the least recently used.
		{"touched-moves-to-back", true, []uint64{b[1], b[0]}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// Room for A and B plus one free block.
			p := newPool(5, 2)
			run(t, p, []uint32{1, 2, 3, 4})
			run(t, p, []uint32{5, 6, 7, 8})
			if c.touchA {
				if hit := run(t, p, []uint32{1, 2, 3, 4, 9}); hit != 4 {
					t.Fatalf("hit %d tokens, want 4", hit)
				}
			}
			p.takeEvents()
			run(t, p, []uint32{10, 11, 12, 13, 14, 15}) // 3 blocks: evicts 2
			evs := p.takeEvents()
			rm, ok := evs[0].(*kvpublish.BlockRemoved)
			if !ok || !reflect.DeepEqual(rm.BlockHashes, c.evicted) {
				t.Fatalf("first event %+v, want BlockRemoved %x", evs[0], c.evicted)
			}
		})
	}
}

func TestPoolNeverHitsTheWholePrompt(t *testing.T) {
	p := newPool(8, 2)
	run(t, p, []uint32{1, 2, 3, 4})
	for _, c := range []struct {
		prompt []uint32
		hit    int
	}{
		{[]uint32{1, 2, 3, 4}, 2},       // the last token is always computed
		{[]uint32{1, 2, 3, 4, 5}, 4},    // both blocks
		{[]uint32{1, 2, 9, 9, 9}, 2},    // diverges in block 2
		{[]uint32{9, 2, 3, 4, 5}, 0},    // diverges in block 1
		{[]uint32{3, 4, 1, 2, 5, 6}, 0}, // same blocks, other order: chained hashes differ
	} {
		if got := run(t, p, c.prompt); got != c.hit {
			t.Fatalf("prompt %v hit %d tokens, want %d", c.prompt, got, c.hit)
		}
	}
}

func TestPoolStoredEventsChainAndDedupe(t *testing.T) {
	p := newPool(16, 2)
	s1, _, _ := p.admit([]uint32{1, 2, 3, 4, 5}, 3)
	p.fill(s1)
	h := hashes([]uint32{1, 2}, []uint32{3, 4}, []uint32{5, 6}, []uint32{7, 8})
	want := []kvpublish.Event{&kvpublish.BlockStored{BlockHashes: h[:2], TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, Medium: "GPU"}}
	if evs := p.takeEvents(); !reflect.DeepEqual(evs, want) {
		t.Fatalf("prefill events %+v", evs)
	}
	// A second sequence with the first four tokens runs concurrently; it hits
	// the first block only (the last prompt token is always computed)…
	s2, hit, _ := p.admit([]uint32{1, 2, 3, 4}, 3)
	if hit != 2 {
		t.Fatalf("hit %d", hit)
	}
	p.fill(s2) // …and finds block 2 already cached: shared, no event.
	if evs := p.takeEvents(); len(evs) != 0 {
		t.Fatalf("dedupe published %+v", evs)
	}
	if p.blocks[h[1]].ref != 2 {
		t.Fatalf("block 2 ref %d, want 2", p.blocks[h[1]].ref)
	}
	p.append(s1, 6, 7, 8)
	want = []kvpublish.Event{
		&kvpublish.BlockStored{BlockHashes: h[2:4], ParentBlockHash: &h[1], TokenIDs: []uint32{5, 6, 7, 8}, BlockSize: 2, Medium: "GPU"},
	}
	if evs := p.takeEvents(); !reflect.DeepEqual(evs, want) {
		t.Fatalf("decode events %+v", evs)
	}
	checkPool(t, p)
	p.release(s1)
	p.release(s2)
	checkPool(t, p)
	if p.reserved != 0 || p.used() != 0 {
		t.Fatalf("after release: reserved %d used %d", p.reserved, p.used())
	}
}

func TestPoolAdmissionWaitsForBlocks(t *testing.T) {
	p := newPool(4, 2)
	s, _, ok := p.admit([]uint32{1, 2, 3}, 3) // 6 tokens: 3 blocks
	if !ok {
		t.Fatal("first admit failed")
	}
	before := *p
	if _, _, ok := p.admit([]uint32{7, 8, 9}, 0); ok { // 2 blocks, 1 free
		t.Fatal("admitted beyond capacity")
	}
	if p.reserved != before.reserved || len(p.blocks) != len(before.blocks) || len(p.events) != len(before.events) {
		t.Fatal("a refused admission changed the pool")
	}
	p.fill(s)
	p.release(s)
	if _, _, ok := p.admit([]uint32{7, 8, 9}, 0); !ok {
		t.Fatal("not admitted after release")
	}
	checkPool(t, p)
}

func TestPoolReset(t *testing.T) {
	p := newPool(8, 2)
	s, _, _ := p.admit([]uint32{1, 2, 3}, 1)
	p.fill(s)
	if p.reset() {
		t.Fatal("reset while a sequence holds blocks")
	}
	p.release(s)
	p.takeEvents()
	if !p.reset() || len(p.blocks) != 0 {
		t.Fatal("reset failed")
	}
	if evs := p.takeEvents(); len(evs) != 1 || !reflect.DeepEqual(evs[0], &kvpublish.AllBlocksCleared{}) {
		t.Fatalf("events %+v", evs)
	}
	checkPool(t, p)
}

// TestPoolRandomWorkload runs interleaved sequences and replays the events
// into a set: it must equal the cache, and the invariants must hold.
func TestPoolRandomWorkload(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	p := newPool(40, 4)
	view := map[uint64]bool{}
	apply := func() {
		for _, e := range p.takeEvents() {
			switch ev := e.(type) {
			case *kvpublish.BlockStored:
				if ev.ParentBlockHash != nil && !view[*ev.ParentBlockHash] {
					t.Fatalf("stored under unknown parent %x", *ev.ParentBlockHash)
				}
				for _, h := range ev.BlockHashes {
					if view[h] {
						t.Fatalf("stored twice: %x", h)
					}
					view[h] = true
				}
			case *kvpublish.BlockRemoved:
				for _, h := range ev.BlockHashes {
					if !view[h] {
						t.Fatalf("removed unknown %x", h)
					}
					delete(view, h)
				}
			case *kvpublish.AllBlocksCleared:
				clear(view)
			}
		}
	}
	prefixes := [][]uint32{{1, 2, 3, 4, 5, 6, 7, 8}, {9, 9, 9, 9}, {}}
	var live []*seq
	for range 3000 {
		switch k := r.IntN(10); {
		case k < 4 || len(live) == 0:
			pre := prefixes[r.IntN(len(prefixes))]
			prompt := append(append([]uint32(nil), pre...), make([]uint32, 1+r.IntN(12))...)
			for i := len(pre); i < len(prompt); i++ {
				prompt[i] = uint32(r.IntN(6))
			}
			if s, _, ok := p.admit(prompt, r.IntN(6)); ok {
				p.fill(s)
				live = append(live, s)
			}
		case k < 7:
			s := live[r.IntN(len(live))]
			if s.reserved > 0 {
				p.append(s, uint32(r.IntN(6)))
			}
		case k < 9:
			i := r.IntN(len(live))
			p.release(live[i])
			live = append(live[:i], live[i+1:]...)
		default:
			p.reset()
		}
		apply()
		checkPool(t, p)
		if len(view) != len(p.blocks) {
			t.Fatalf("event view has %d blocks, pool %d", len(view), len(p.blocks))
		}
		for h := range p.blocks {
			if !view[h] {
				t.Fatalf("pool block %x missing from the event view", h)
			}
		}
	}
}
