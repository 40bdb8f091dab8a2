package loads

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvselect/kvselect/selection/index"
)

func benchRanks(n int) []index.WorkerKey {
	ws := make([]index.WorkerKey, n)
	for i := range ws {
		ws[i] = index.WorkerKey{WorkerID: uint64(i / 8), DPRank: uint32(i % 8)}
	}
	return ws
}

func benchHashes(n int, seed uint64) []uint64 {
	rnd := rand.New(rand.NewPCG(seed, 1))
	h := make([]uint64, n)
	for i := range h {
		h[i] = rnd.Uint64()
	}
	return h
}

// BenchmarkAddFree128Blocks64Ranks books and frees a 128-block prompt on one
// of 64 ranks, each already holding two unrelated bookings.
func BenchmarkAddFree128Blocks64Ranks(b *testing.B) {
	ranks := benchRanks(64)
	tr := newTracker(b, DefaultConfig(16), ranks...)
	for i, w := range ranks {
		for j := range 2 {
			mustAdd(b, tr, t0, Booking{RequestID: string(rune('a'+j)) + w.String(), Worker: w, TrackingHashes: benchHashes(128, uint64(i*2+j+100))})
		}
	}
	bk := Booking{RequestID: "bench", Worker: ranks[37], TrackingHashes: benchHashes(128, 1), ISL: 2048, PrefillTokens: 2048, TrackPrefill: true}
	b.ReportAllocs()
	for b.Loop() {
		if err := tr.Add(t0, bk); err != nil {
			b.Fatal(err)
		}
		if err := tr.Free("bench"); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*128), "ns/block")
}

// BenchmarkProject64Ranks128Blocks projects a 128-block prompt onto 64 ranks
// holding prefixes of it of every depth from 0 to 126.
func BenchmarkProject64Ranks128Blocks(b *testing.B) {
	ranks := benchRanks(64)
	tr := newTracker(b, DefaultConfig(16), ranks...)
	prompt := benchHashes(128, 1)
	for i, w := range ranks {
		mustAdd(b, tr, t0, Booking{RequestID: "p" + w.String(), Worker: w, TrackingHashes: prompt[:2*i]})
		mustAdd(b, tr, t0, Booking{RequestID: "x" + w.String(), Worker: w, TrackingHashes: benchHashes(128, uint64(i+100))})
	}
	dst := make([]Projection, 0, len(ranks))
	b.ReportAllocs()
	for b.Loop() {
		dst = tr.Project(prompt, dst)
	}
	if dst[63].AdditionalBlocks != 128-126 {
		b.Fatalf("rank 63 additional = %d", dst[63].AdditionalBlocks)
	}
}

// BenchmarkAddFreeLongPrompt books and frees a long prompt (6,250 blocks at
// 100k tokens, 62,500 at 1M) on a rank where another booking already holds
// its first 95 % (the shared system prompt), after projecting it onto 16
// ranks, as a selection does under the scheduling lock.
func BenchmarkAddFreeLongPrompt(b *testing.B) {
	for _, blocks := range []int{6_250, 62_500} {
		b.Run(fmt.Sprintf("blocks=%d", blocks), func(b *testing.B) {
			ranks := benchRanks(16)
			tr := newTracker(b, DefaultConfig(16), ranks...)
			prompt := benchHashes(blocks, 1)
			other := append(prompt[:blocks*95/100:blocks*95/100], benchHashes(blocks-blocks*95/100, 2)...)
			mustAdd(b, tr, t0, Booking{RequestID: "other", Worker: ranks[3], TrackingHashes: other})
			var proj []Projection
			b.ReportAllocs()
			for b.Loop() {
				proj = tr.Project(prompt, proj)
				mustAdd(b, tr, t0, Booking{RequestID: "x", Worker: ranks[3], TrackingHashes: prompt})
				if err := tr.Free("x"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
