package mooncake

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// namer names engine hashes by their chain of hash ids ("1.2.3").
type namer map[uint64]string

func (n namer) learn(worker int, ids []uint64) {
	for i, ext := range ChainExts(worker, ids) {
		parts := make([]string, i+1)
		for j := range parts {
			parts[j] = fmt.Sprint(ids[j])
		}
		n[ext] = strings.Join(parts, ".")
	}
}

func (n namer) name(ext uint64) string {
	if s, ok := n[ext]; ok {
		return s
	}
	return fmt.Sprintf("?%#x", ext)
}

// describe renders events as "S <parent> <id>..." and "R <chain>...".
func (n namer) describe(events []Event) []string {
	var out []string
	for _, ev := range events {
		switch ev := ev.(type) {
		case Stored:
			s := "S -"
			if ev.HasParent {
				s = "S " + n.name(ev.Parent)
			}
			for _, b := range ev.Blocks {
				name := n.name(b.Ext)
				s += " " + name[strings.LastIndex(name, ".")+1:]
			}
			out = append(out, s)
		case Removed:
			s := "R"
			for _, ext := range ev.Exts {
				s += " " + n.name(ext)
			}
			out = append(out, s)
		}
	}
	return out
}

func TestEngineEvents(t *testing.T) {
	type req struct {
		ids  []uint64
		want []string
	}
	tests := []struct {
		name     string
		capacity int
		batch    bool
		reqs     []req
	}{
		{
			name: "prefix reuse and leaf-first LRU", capacity: 4,
			reqs: []req{
				{[]uint64{1, 2, 3}, []string{"S - 1 2 3"}},
				{[]uint64{1, 2, 3}, nil}, // full hit: no events
				{[]uint64{1, 2, 4}, []string{"S 1.2 4"}},
				// free queue, head first: 3, 4, 2, 1
				{[]uint64{5, 6}, []string{"R 1.2.3", "R 1.2.4", "S - 5 6"}},
				// queue: 2, 1, 6, 5; pin 1, 2; evict 6
				{[]uint64{1, 2, 7}, []string{"R 5.6", "S 1.2 7"}},
				// queue: 5, 7, 2, 1; 5 is a leaf again
				{[]uint64{8}, []string{"R 5", "S - 8"}},
			},
		},
		{
			name: "batched removals", capacity: 4, batch: true,
			reqs: []req{
				{[]uint64{1, 2, 3}, []string{"S - 1 2 3"}},
				{[]uint64{4, 5, 6}, []string{"R 1.2.3 1.2", "S - 4 5 6"}},
				// queue: 1, 6, 5, 4
				{[]uint64{4, 7}, []string{"R 1", "S 4 7"}},
				// queue: 6, 5, 7, 4
				{[]uint64{9, 9}, []string{"R 4.5.6 4.5", "S - 9 9"}},
			},
		},
		{
			name: "same id under different prefixes are different blocks", capacity: 8,
			reqs: []req{
				{[]uint64{1, 2}, []string{"S - 1 2"}},
				{[]uint64{3, 2}, []string{"S - 3 2"}},
				{[]uint64{2}, []string{"S - 2"}},
				{[]uint64{1, 2, 2}, []string{"S 1.2 2"}},
			},
		},
		{
			name: "request longer than the pool is truncated", capacity: 3,
			reqs: []req{
				{[]uint64{1, 2, 3, 4, 5}, []string{"S - 1 2 3"}},
				{[]uint64{1, 2, 3, 4, 5}, nil},
				{[]uint64{1, 9, 9, 9}, []string{"R 1.2.3", "R 1.2", "S 1 9 9"}},
			},
		},
		{
			name: "capacity one", capacity: 1,
			reqs: []req{
				{[]uint64{1}, []string{"S - 1"}},
				{[]uint64{2, 3}, []string{"R 1", "S - 2"}},
			},
		},
		{name: "empty request", capacity: 2, reqs: []req{{nil, nil}, {[]uint64{}, nil}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			const worker = 3
			e := NewEngine(worker, tc.capacity, tc.batch)
			ref := NewMapTarget()
			names := namer{}
			for i, r := range tc.reqs {
				names.learn(worker, r.ids)
				events := e.Process(r.ids)
				if got := names.describe(events); !reflect.DeepEqual(got, r.want) {
					t.Fatalf("request %d %v: events %q, want %q", i, r.ids, got, r.want)
				}
				for _, ev := range events {
					Apply(ref, worker, ev)
				}
				if e.Len() > e.Capacity() {
					t.Fatalf("request %d: %d blocks cached, capacity %d", i, e.Len(), e.Capacity())
				}
				if len(ref.Errs) > 0 {
					t.Fatalf("request %d: inconsistent events: %v", i, ref.Errs)
				}
				if !maps.Equal(e.Snapshot(), ref.Snapshot(worker)) {
					t.Fatalf("request %d: engine and index disagree", i)
				}
			}
		})
	}
}

func TestEngineHashes(t *testing.T) {
	ids := []uint64{7, 8, 9}
	e0, e1 := NewEngine(0, 16, false), NewEngine(1, 16, false)
	s0 := e0.Process(ids)[0].(Stored)
	s1 := e1.Process(ids)[0].(Stored)
	for i := range ids {
		if s0.Blocks[i].Local != LocalHash(ids[i]) || s1.Blocks[i].Local != LocalHash(ids[i]) {
			t.Errorf("block %d: local hash is not LocalHash(id)", i)
		}
		if s0.Blocks[i].Ext == s1.Blocks[i].Ext {
			t.Errorf("block %d: workers 0 and 1 share ext hash %#x", i, s0.Blocks[i].Ext)
		}
	}
	if !reflect.DeepEqual(ChainExts(0, ids), []uint64{s0.Blocks[0].Ext, s0.Blocks[1].Ext, s0.Blocks[2].Ext}) {
		t.Error("ChainExts disagrees with the engine")
	}
	// The ext hash depends on the chain, not only on the id.
	if ChainExts(0, []uint64{1, 9})[1] == ChainExts(0, []uint64{2, 9})[1] {
		t.Error("ext hash ignores the prefix")
	}
	// Deterministic.
	if first, again := LocalHash(3), LocalHash(3); !reflect.DeepEqual(ChainExts(5, ids), ChainExts(5, ids)) || first != again {
		t.Error("hashes are not deterministic")
	}
}

// TestEngineRandom drives engines with random requests over a small tree of
// prefixes and checks, after every request, that the events keep a
// reference index equal to the engine and within capacity.
func TestEngineRandom(t *testing.T) {
	tests := []struct {
		capacity int
		batch    bool
		fanout   uint64
	}{
		{capacity: 4, fanout: 2},
		{capacity: 7, fanout: 3, batch: true},
		{capacity: 16, fanout: 3},
		{capacity: 40, fanout: 4, batch: true},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("cap%d_fanout%d_batch%v", tc.capacity, tc.fanout, tc.batch), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(tc.capacity), tc.fanout))
			e := NewEngine(0, tc.capacity, tc.batch)
			ref := NewMapTarget()
			evictions := 0
			for i := range 3000 {
				n := 1 + rng.IntN(12)
				ids := make([]uint64, n)
				for j := range ids {
					ids[j] = rng.Uint64N(tc.fanout) // small alphabet: lots of sharing
				}
				hitBefore := ref.Overlap(0, LocalHashes(ids))
				events := e.Process(ids)
				stored := 0
				for k, ev := range events {
					switch ev := ev.(type) {
					case Stored:
						if k != len(events)-1 {
							t.Fatalf("request %d: Stored is not the last event", i)
						}
						stored = len(ev.Blocks)
					case Removed:
						evictions += len(ev.Exts)
					}
					Apply(ref, 0, ev)
				}
				if want := min(n, tc.capacity) - hitBefore; stored != want {
					t.Fatalf("request %d: stored %d blocks, want %d (prefix hit %d of %d)", i, stored, want, hitBefore, n)
				}
				if len(ref.Errs) > 0 {
					t.Fatalf("request %d: %v", i, ref.Errs)
				}
				if e.Len() > tc.capacity {
					t.Fatalf("request %d: %d blocks cached, capacity %d", i, e.Len(), tc.capacity)
				}
				if !maps.Equal(e.Snapshot(), ref.Snapshot(0)) {
					t.Fatalf("request %d: engine and index disagree", i)
				}
			}
			if evictions == 0 {
				t.Error("no evictions: the test does not exercise LRU")
			}
		})
	}
}
