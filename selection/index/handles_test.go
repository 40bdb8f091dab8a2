package index

import (
	"math/rand/v2"
	"testing"
)

// TestHandleMapAgreesWithGoMap drives random puts and deletes, with keys drawn
// from a small range (long probe runs, zero included) and from the full range.
func TestHandleMapAgreesWithGoMap(t *testing.T) {
	for _, keyRange := range []uint64{0, 64, 5000} {
		rng := rand.New(rand.NewPCG(keyRange, 9))
		var m handleMap
		ref := map[uint64]uint32{}
		key := func() uint64 {
			if keyRange == 0 {
				return rng.Uint64()
			}
			return rng.Uint64N(keyRange)
		}
		for step := range 200_000 {
			k := key()
			switch rng.IntN(3) {
			case 0, 1:
				v := uint32(1 + rng.IntN(1000))
				old, existed := m.put(k, v)
				rold, rexisted := ref[k]
				if existed != rexisted || old != rold {
					t.Fatalf("range %d step %d: put(%d) = %d,%v; want %d,%v", keyRange, step, k, old, existed, rold, rexisted)
				}
				ref[k] = v
			case 2:
				old, existed := m.del(k)
				rold, rexisted := ref[k]
				if existed != rexisted || old != rold {
					t.Fatalf("range %d step %d: del(%d) = %d,%v; want %d,%v", keyRange, step, k, old, existed, rold, rexisted)
				}
				delete(ref, k)
			}
			if m.len() != len(ref) {
				t.Fatalf("len %d, want %d", m.len(), len(ref))
			}
			if step%997 == 0 {
				for rk, rv := range ref {
					if v, ok := m.get(rk); !ok || v != rv {
						t.Fatalf("get(%d) = %d,%v; want %d", rk, v, ok, rv)
					}
				}
				n := 0
				m.all(func(k uint64, v uint32) {
					if ref[k] != v {
						t.Fatalf("all yields %d=%d, want %d", k, v, ref[k])
					}
					n++
				})
				if n != len(ref) {
					t.Fatalf("all yielded %d entries, want %d", n, len(ref))
				}
			}
		}
	}
}

func TestHandleMapReserve(t *testing.T) {
	var m handleMap
	m.reserve(1000)
	slots := len(m.keys)
	if slots < 1000*4/3 {
		t.Fatalf("reserve(1000) gave %d slots", slots)
	}
	for i := range uint64(1000) {
		m.put(i*7919, uint32(i+1))
	}
	if len(m.keys) != slots {
		t.Fatalf("table grew from %d to %d slots after reserving", slots, len(m.keys))
	}
	m.reserve(10) // never shrinks
	if len(m.keys) != slots || m.len() != 1000 {
		t.Fatal("reserve shrank the table")
	}
	if v, ok := m.get(999 * 7919); !ok || v != 1000 {
		t.Fatal("lost an entry")
	}
}
