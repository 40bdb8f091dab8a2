package kvevents

import (
	"math/rand/v2"
	"testing"

	"github.com/kvselect/kvselect/selection/index"
)

// benchBatch is a batch of 16 BlockStored events × 16 blocks × 16 tokens, each
// chained to the previous one, in the positional or tagged-map shape.
func benchBatch(asMap bool) []byte {
	const events, nBlocks, bs = 16, 16, 16
	r := rand.New(rand.NewPCG(5, 6))
	var evs [][]byte
	parent := uint64(0)
	for range events {
		g := genEvent{kind: index.EventStored, medium: "GPU", parent: parent, hasPar: parent != 0}
		for range nBlocks {
			g.hashes = append(g.hashes, r.Uint64())
		}
		for range nBlocks * bs {
			g.tokens = append(g.tokens, r.Uint32N(150000))
		}
		parent = g.hashes[len(g.hashes)-1]
		evs = append(evs, g.encode(asMap, bs))
	}
	return A(F(ts), A(evs...), U(0))
}

func benchmarkDecode(b *testing.B, asMap bool) {
	decodeEvents(b, benchBatch(asMap))
	b.ReportMetric(float64(b.N*16*16)/b.Elapsed().Seconds(), "blocks/s")
}

func BenchmarkDecode16Stored16Blocks16TokensPositional(b *testing.B) { benchmarkDecode(b, false) }
func BenchmarkDecode16Stored16Blocks16TokensMap(b *testing.B)        { benchmarkDecode(b, true) }

func TestDecodeSteadyStateAllocatesNothing(t *testing.T) {
	for i, payload := range [][]byte{benchBatch(false), benchBatch(true), mixedBatch()} {
		d := newDec(t, Config{WorkerID: 1, BlockSize: 16})
		dst := make([]index.Event, 0, 16)
		dst, _, _ = d.Decode(payload, dst) // grow the arenas
		allocs := testing.AllocsPerRun(20, func() {
			dst, _, _ = d.Decode(payload, dst[:0])
		})
		if allocs != 0 {
			t.Errorf("batch %d: %.1f allocs per batch, want 0", i, allocs)
		}
	}
}

// mixedBatch is one engine step's batch as the fleet-scale ingest sees it
// (docs/scale.md): one prefill BlockStored of 33 blocks, three decode
// BlockStored of one block, and twelve single-block BlockRemoved (vLLM
// evicts one block per event), 16-token blocks, as tagged maps.
func mixedBatch() []byte {
	const bs = 16
	r := rand.New(rand.NewPCG(7, 8))
	var evs [][]byte
	stored := func(n int, parent uint64) uint64 {
		g := genEvent{kind: index.EventStored, medium: "GPU", parent: parent, hasPar: parent != 0}
		for range n {
			g.hashes = append(g.hashes, r.Uint64())
		}
		for range n * bs {
			g.tokens = append(g.tokens, r.Uint32N(150000))
		}
		evs = append(evs, g.encode(true, bs))
		return g.hashes[n-1]
	}
	last := stored(33, r.Uint64())
	for range 3 {
		last = stored(1, last)
	}
	for range 12 {
		evs = append(evs, genEvent{kind: index.EventRemoved, medium: "GPU", hashes: []uint64{r.Uint64()}}.encode(true, bs))
	}
	return A(F(ts), A(evs...), U(0))
}

// BenchmarkDecodeMixedStep decodes mixedBatch: ns/event is the decoding
// share of the fleet-scale ingest's cost per event.
func BenchmarkDecodeMixedStep(b *testing.B) { decodeEvents(b, mixedBatch()) }

// decodeEvents decodes payload, a batch of 16 events, b.N times and
// reports the time per event.
func decodeEvents(b *testing.B, payload []byte) {
	d := newDec(b, Config{WorkerID: 1, BlockSize: 16})
	dst := make([]index.Event, 0, 16)
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	for b.Loop() {
		var err error
		dst, _, err = d.Decode(payload, dst[:0])
		if err != nil || len(dst) != 16 {
			b.Fatal(err, len(dst))
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*16), "ns/event")
}
