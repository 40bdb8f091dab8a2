package kvevents

import (
	"testing"

	"github.com/kvselect/kvselect/selection/index"
)

// TestTrimDropsOnlyLargeScratch: after a batch far beyond keepScratch the
// decoder gives its buffers back; after an ordinary one it keeps them, and
// decoding works the same either way.
func TestTrimDropsOnlyLargeScratch(t *testing.T) {
	d, err := NewDecoder(Config{BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	decode := func(blocks int) []index.Event {
		t.Helper()
		evs, _, err := d.Decode(storedBatch(t, blocks), nil)
		if err != nil || len(evs) != 1 || len(evs[0].Blocks) != blocks {
			t.Fatalf("decoding %d blocks: %v, %+v", blocks, err, evs)
		}
		return evs
	}
	decode(8)
	d.Trim()
	if cap(d.blocks) == 0 || cap(d.arena.tokens) == 0 {
		t.Fatal("an ordinary batch's scratch was dropped")
	}
	big := 2 * keepScratch
	decode(big)
	if cap(d.blocks) < big || cap(d.arena.tokens) < 4*big {
		t.Fatalf("scratch %d blocks, %d tokens after a %d-block batch", cap(d.blocks), cap(d.arena.tokens), big)
	}
	d.Trim()
	if cap(d.blocks) != 0 || cap(d.arena.tokens) != 0 || cap(d.arena.hashes) != 0 || cap(d.sorted) != 0 {
		t.Fatalf("kept %d blocks, %d tokens, %d hashes, %d sorted after Trim", cap(d.blocks), cap(d.arena.tokens), cap(d.arena.hashes), cap(d.sorted))
	}
	decode(8)
	decode(big)

	// A batch of many events: its parsed events are given back too.
	var evs [][]byte
	for i := range 2 * keepRaws {
		evs = append(evs, A(S("BlockRemoved"), Hs(uint64(i+1))))
	}
	if _, _, err := d.Decode(batch(0, evs...), nil); err != nil || cap(d.raws) < 2*keepRaws {
		t.Fatalf("decoding %d removals: %v, %d parsed events kept", 2*keepRaws, err, cap(d.raws))
	}
	d.Trim()
	if cap(d.raws) != 0 {
		t.Fatalf("kept %d parsed events after Trim", cap(d.raws))
	}
}

// storedBatch is one batch of one BlockStored of n chained 4-token blocks.
func storedBatch(t *testing.T, n int) []byte {
	t.Helper()
	return batch(0, storedPos(Hs(seq64(1, n)...), Nil(), Toks(seq(0, uint32(4*n))...), 4))
}
