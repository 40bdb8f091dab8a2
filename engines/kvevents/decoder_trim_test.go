package kvevents

import (
	"slices"
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

// TestLongBatchesReuseTheirArenas: after Trim a long prompt's arenas (tokens,
// engine hashes, blocks), its block-hash scratch and its repeat-check set
// wait for the next long batch instead of being dropped for the collector,
// and a batch decoded into reused arenas gives exactly what a fresh decoder
// gives.
func TestLongBatchesReuseTheirArenas(t *testing.T) {
	const blocks = 2 * keepScratch
	long := func(first uint32) []byte {
		return batch(0, storedPos(Hs(seq64(uint64(first)+1, blocks)...), Nil(), Toks(seq(first, uint32(4*blocks))...), 4))
	}
	d, err := NewDecoder(Config{BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.Decode(long(0), nil); err != nil {
		t.Fatal(err)
	}
	tokens, set := &d.arena.tokens[:1][0], &d.sorted[:1][0]
	hashes, blks, locals := &d.arena.hashes[:1][0], &d.blocks[:1][0], &d.locals[:1][0]
	d.Trim()
	got, _, err := d.Decode(long(1_000_000), nil)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := NewDecoder(Config{BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	want, _, err := fresh.Decode(long(1_000_000), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || len(want) != 1 || !slices.Equal(got[0].Blocks, want[0].Blocks) {
		t.Fatalf("a long batch decoded into reused arenas differs from a fresh decoder's")
	}
	for _, c := range []struct {
		name string
		same bool
	}{
		{"token arena", &d.arena.tokens[:1][0] == tokens},
		{"repeat-check set", &d.sorted[:1][0] == set},
		{"hash arena", &d.arena.hashes[:1][0] == hashes},
		{"block arena", &d.blocks[:1][0] == blks},
		{"block-hash scratch", &d.locals[:1][0] == locals},
	} {
		if !c.same {
			t.Errorf("the second long batch did not reuse the first one's %s", c.name)
		}
	}
}
