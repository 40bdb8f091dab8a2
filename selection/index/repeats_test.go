package index

import (
	"math/rand/v2"
	"testing"
)

// repeatsNaive is RepeatsExt by comparing every pair, as validChain did.
func repeatsNaive(hs []uint64, parent uint64, hasParent bool) bool {
	for i, x := range hs {
		if hasParent && x == parent {
			return true
		}
		for _, y := range hs[:i] {
			if x == y {
				return true
			}
		}
	}
	return false
}

func TestRepeatsExt(t *testing.T) {
	tests := []struct {
		name      string
		hs        []uint64
		parent    uint64
		hasParent bool
		want      bool
	}{
		{"empty", nil, 0, false, false},
		{"empty with parent", nil, 7, true, false},
		{"one", []uint64{1}, 0, false, false},
		{"one equal to parent", []uint64{1}, 1, true, true},
		{"parent 0 absent", []uint64{0, 1}, 0, false, false},
		{"parent 0 present", []uint64{0, 1}, 0, true, true},
		{"adjacent repeat", []uint64{1, 2, 2}, 0, false, true},
		{"distant repeat", []uint64{5, 1, 2, 3, 4, 5}, 9, true, true},
		{"distinct", []uint64{1, 2, 3, 4, 5}, 9, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var scratch []uint64
			got := RepeatsExt(len(tt.hs), tt.parent, tt.hasParent, func(i int) uint64 { return tt.hs[i] }, &scratch)
			if got != tt.want {
				t.Fatalf("RepeatsExt = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestRepeatsExtMatchesPairwise: the filter and the sort find exactly the
// repeats comparing every pair finds, for chains on both sides of the
// filter's limit, of random and of small sequential hashes (whose bits
// collide in the filter most).
func TestRepeatsExtMatchesPairwise(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var scratch []uint64
	for range 5000 {
		n := r.IntN(2 * repeatsFilterMax)
		if r.IntN(50) == 0 {
			n = 1000 + r.IntN(10000) // long prompts' chains
		}
		hs := make([]uint64, n)
		seqBase := r.Uint64N(1 << 20)
		for i := range hs {
			if r.IntN(2) == 0 {
				hs[i] = seqBase + uint64(i)
			} else {
				hs[i] = r.Uint64()
			}
		}
		parent, hasParent := r.Uint64(), r.IntN(2) == 0
		switch r.IntN(4) {
		case 0:
			if n > 1 {
				hs[r.IntN(n)] = hs[r.IntN(n)]
			}
		case 1:
			if n > 0 {
				parent = hs[r.IntN(n)]
			}
		case 2:
			// A hash of 0, once or twice (the long chains' set marks an
			// empty slot with 0).
			if n > 0 {
				hs[r.IntN(n)] = 0
				if r.IntN(2) == 0 {
					hs[r.IntN(n)] = 0
				}
			}
			if r.IntN(4) == 0 {
				parent = 0
			}
		}
		want := repeatsNaive(hs, parent, hasParent)
		var sc *[]uint64
		if r.IntN(2) == 0 {
			sc = &scratch
		}
		if got := RepeatsExt(n, parent, hasParent, func(i int) uint64 { return hs[i] }, sc); got != want {
			t.Fatalf("n=%d parent=%d/%v: RepeatsExt = %v, pairwise %v", n, parent, hasParent, got, want)
		}
	}
	if cap(scratch) == 0 {
		t.Fatal("long chains did not keep their copy in the scratch")
	}
}

func BenchmarkRepeatsExt33(b *testing.B) {
	hs := make([]uint64, 33)
	for i := range hs {
		hs[i] = rand.Uint64()
	}
	for b.Loop() {
		if RepeatsExt(len(hs), 1, true, func(i int) uint64 { return hs[i] }, nil) {
			b.Fatal("repeat")
		}
	}
}

// BenchmarkRepeatsExtLongPrompt checks a 1M-token prompt's chain of 62,500
// blocks, with the scratch a decoder keeps.
func BenchmarkRepeatsExtLongPrompt(b *testing.B) {
	hs := make([]uint64, 62_500)
	for i := range hs {
		hs[i] = rand.Uint64()
	}
	var scratch []uint64
	for b.Loop() {
		if RepeatsExt(len(hs), 1, true, func(i int) uint64 { return hs[i] }, &scratch) {
			b.Fatal("repeat")
		}
	}
}
