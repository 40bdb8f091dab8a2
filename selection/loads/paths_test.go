package loads

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection/index"
)

// TestPathTableMatchesMap drives one rank's path table with single-block
// paths whose keys crowd a few home slots, so probe runs wrap around the table
// end and backward-shift deletion moves entries, and checks every reference
// count and the held count against a Go map after every step.
func TestPathTableMatchesMap(t *testing.T) {
	for seed := range uint64(20) {
		rnd := rand.New(rand.NewPCG(seed, 7))
		r := newRank(index.WorkerKey{})
		want := map[uint64]int32{}
		// A handful of keys per home bucket of a 16-slot table, plus key 0.
		var universe []uint64
		for k := uint64(0); len(universe) < 40; k++ {
			if (k*fibonacciMult)>>60 >= 14 || k == 0 { // homes 14 and 15: runs wrap
				universe = append(universe, k)
			}
		}
		for step := range 2000 {
			k := universe[rnd.IntN(len(universe))]
			if rnd.IntN(2) == 0 || want[k] == 0 {
				r.acquire([]uint64{k})
				want[k]++
			} else {
				r.release([]uint64{k})
				if want[k]--; want[k] == 0 {
					delete(want, k)
				}
			}
			if len(r.held) != len(want) {
				t.Fatalf("seed %d step %d: %d held, want %d", seed, step, len(r.held), len(want))
			}
			tab := r.held[:cap(r.held)]
			for _, k := range universe {
				i := r.find(tab, k)
				if got := int32(0); i >= 0 {
					got = tab[i].refs
					if got != want[k] {
						t.Fatalf("seed %d step %d: key %d refs %d, want %d", seed, step, k, got, want[k])
					}
				} else if want[k] != 0 {
					t.Fatalf("seed %d step %d: key %d missing, want refs %d", seed, step, k, want[k])
				}
			}
		}
	}
}

// Path keys chain from a non-zero root, so client-supplied zero hashes still
// name distinct paths: [0] and [0,0] are two blocks, as the model counts them.
func TestZeroHashesAreDistinctPaths(t *testing.T) {
	tr := newTracker(t, DefaultConfig(4), w1)
	mustAdd(t, tr, t0, Booking{RequestID: "a", Worker: w1, TrackingHashes: []uint64{0, 0}})
	if got := load1(t, tr, w1).ActiveDecodeBlocks; got != 2 {
		t.Fatalf("[0,0] holds %d blocks, want 2", got)
	}
	mustAdd(t, tr, t0, Booking{RequestID: "b", Worker: w1, TrackingHashes: []uint64{0}})
	if got := load1(t, tr, w1).ActiveDecodeBlocks; got != 2 {
		t.Fatalf("[0,0] and [0] hold %d blocks, want 2", got)
	}
	if p, _ := tr.Project1(w1, []uint64{0, 0, 0}); p.AdditionalBlocks != 1 {
		t.Fatalf("[0,0,0] adds %d blocks, want 1", p.AdditionalBlocks)
	}
	if p, _ := tr.Project1(w1, []uint64{0, 1}); p.AdditionalBlocks != 1 {
		t.Fatalf("[0,1] adds %d blocks, want 1", p.AdditionalBlocks)
	}
}

// TestPathTablesDrain checks that freeing, expiring and dropping bookings
// leaves every rank's path table empty (every slot, not only the count), so
// no reference or weight outlives its bookings.
func TestPathTablesDrain(t *testing.T) {
	ranks := []index.WorkerKey{w1, w2, w3}
	tr := newTracker(t, DefaultConfig(4), ranks...)
	rnd := rand.New(rand.NewPCG(1, 2))
	for i := range 200 {
		h := make([]uint64, rnd.IntN(40))
		for j := range h {
			h[j] = uint64(rnd.IntN(4))
		}
		mustAdd(t, tr, t0.Add(secs(i)), Booking{RequestID: fmt.Sprint(i), Worker: ranks[i%3], TrackingHashes: h})
		if i%5 == 0 {
			if err := tr.AddOutputBlock(fmt.Sprint(i), frac(0.5)); err != nil {
				t.Fatal(err)
			}
		}
	}
	tr.SetWorkers(ranks[:2]) // drops w3's bookings
	tr.Expire(t0.Add(DefaultExpiry + secs(100)))
	for i := 100; i < 200; i++ {
		_ = tr.Free(fmt.Sprint(i))
	}
	if len(tr.reqs) != 0 {
		t.Fatalf("%d bookings left", len(tr.reqs))
	}
	for _, r := range tr.sorted {
		if len(r.held) != 0 || r.unit != 0 || r.fracN != 0 || r.fracSum != 0 {
			t.Fatalf("rank %v not drained: %d held, unit %d, frac %d/%v", r.key, len(r.held), r.unit, r.fracN, r.fracSum)
		}
		for i, s := range r.held[:cap(r.held)] {
			if s != (slot{}) {
				t.Fatalf("rank %v slot %d not empty: %+v", r.key, i, s)
			}
		}
	}
}

// A rank that drains and fills again reuses its table and the request record's
// key buffer: booking and freeing allocate nothing once warm.
func TestAddFreeDoesNotAllocateWhenWarm(t *testing.T) {
	tr := newTracker(t, DefaultConfig(16), w1, w2)
	bk := Booking{RequestID: "r", Worker: w1, TrackingHashes: benchHashes(128, 1), ISL: 2048, PrefillTokens: 2048, TrackPrefill: true}
	mustAdd(t, tr, t0, bk)
	if err := tr.Free("r"); err != nil {
		t.Fatal(err)
	}
	dst := make([]Projection, 0, 2)
	allocs := testing.AllocsPerRun(100, func() {
		if err := tr.Add(t0, bk); err != nil {
			t.Fatal(err)
		}
		dst = tr.Project(bk.TrackingHashes, dst)
		if err := tr.Free("r"); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per Add+Project+Free, want 0", allocs)
	}
}

func secs(s int) time.Duration { return time.Duration(s) * time.Second }
