package kvevents

import (
	"bytes"
	"fmt"
	"reflect"
	"testing"
)

// parseGeneral is parse without the one-block removal path.
func parseGeneral(ev []byte, r *rawEvent) (tagKind, []byte, error) {
	r.reset()
	return parseShape(ev, r)
}

// sameAsGeneral reports how parseRemovedOne's reading of ev differs from
// the general one's; a payload it declines must be left untouched.
func sameAsGeneral(ev []byte) (read bool, _ error) {
	fast := rawEvent{arena: &parseArena{hashes: []uint64{42}}}
	fast.reset()
	rest, ok := parseRemovedOne(ev, &fast)
	if !ok {
		if !reflect.DeepEqual(fast, rawEvent{arena: fast.arena}) || len(fast.arena.hashes) != 1 {
			return false, fmt.Errorf("declined, but changed the event to %+v, the arena to %v", fast, fast.arena.hashes)
		}
		return false, nil
	}
	gen := rawEvent{arena: &parseArena{hashes: []uint64{42}}}
	tag, grest, err := parseGeneral(ev, &gen)
	if err != nil || tag != tagRemovedKind {
		return true, fmt.Errorf("read as a removal, parse gives tag %d, error %v", tag, err)
	}
	if !bytes.Equal(rest, grest) || len(rest) != len(grest) {
		return true, fmt.Errorf("rest % x, parse's % x", rest, grest)
	}
	if !reflect.DeepEqual(fast.arena.hashes, gen.arena.hashes) {
		return true, fmt.Errorf("arena %v, parse's %v", fast.arena.hashes, gen.arena.hashes)
	}
	fast.arena, gen.arena = nil, nil
	if !reflect.DeepEqual(fast, gen) {
		return true, fmt.Errorf("event\n%+v\nparse's\n%+v", fast, gen)
	}
	return true, nil
}

// TestParseRemovedOneMatchesParse: every one-block removal the short path
// reads, it reads as parse's general path does, and it declines, untouched,
// every other event, whatever the hash's and the medium's encoding, the
// fields around them and where the bytes end.
func TestParseRemovedOneMatchesParse(t *testing.T) {
	hashes := [][]byte{U(0), U(7), U(1 << 40), U(1<<64 - 1), I(-1), I(-1 << 40), Bin([]byte{1, 2, 3}), S("abcdefghij"), Nil(), A(), F(1.5)}
	media := [][]byte{S("GPU"), S("CPU_TIER1"), S(""), Nil(), U(1), A()}
	type shape struct {
		name string
		ev   func(h, m []byte) []byte
	}
	shapes := []shape{
		{"map", func(h, m []byte) []byte { return M("type", S("BlockRemoved"), "block_hashes", A(h), "medium", m) }},
		{"map without medium", func(h, m []byte) []byte { return M("type", S("BlockRemoved"), "block_hashes", A(h)) }},
		{"map, medium first", func(h, m []byte) []byte { return M("medium", m, "type", S("BlockRemoved"), "block_hashes", A(h)) }},
		{"map, another key", func(h, m []byte) []byte { return M("type", S("BlockRemoved"), "block_hashes", A(h), "locality", m) }},
		{"map, four fields", func(h, m []byte) []byte {
			return M("type", S("BlockRemoved"), "block_hashes", A(h), "medium", m, "locality", S("REMOTE"))
		}},
		{"map, two hashes", func(h, m []byte) []byte { return M("type", S("BlockRemoved"), "block_hashes", A(h, h), "medium", m) }},
		{"map, BlockStored", func(h, m []byte) []byte { return M("type", S("BlockStored"), "block_hashes", A(h), "medium", m) }},
		{"positional", func(h, m []byte) []byte { return A(S("BlockRemoved"), A(h), m) }},
		{"positional without medium", func(h, m []byte) []byte { return A(S("BlockRemoved"), A(h)) }},
		{"positional with a tail", func(h, m []byte) []byte { return A(S("BlockRemoved"), A(h), m, Nil(), U(0)) }},
		{"positional, no hashes", func(h, m []byte) []byte { return A(S("BlockRemoved"), A(), m) }},
	}
	read := 0
	for _, sh := range shapes {
		t.Run(sh.name, func(t *testing.T) {
			for _, h := range hashes {
				for _, m := range media {
					ev := sh.ev(h, m)
					// Followed by another event, and cut anywhere.
					full := cat(ev, A(S("BlockRemoved"), A(U(1))))
					for n := 0; n <= len(full); n++ {
						ok, err := sameAsGeneral(full[:n])
						if err != nil {
							t.Fatalf("% x: %v", full[:n], err)
						}
						if ok {
							read++
						}
					}
				}
			}
		})
	}
	if read < 4*7*4 { // four shapes, seven hash encodings, four media
		t.Fatalf("the short path read only %d events", read)
	}
}

func FuzzParseRemovedOne(f *testing.F) {
	f.Add(M("type", S("BlockRemoved"), "block_hashes", A(U(1<<63)), "medium", S("GPU")))
	f.Add(A(S("BlockRemoved"), A(I(-5)), Nil()))
	f.Add(M("type", S("BlockRemoved"), "block_hashes", A(Bin([]byte{9}))))
	f.Add(A(S("BlockRemoved"), A(S("x"))))
	f.Fuzz(func(t *testing.T, ev []byte) {
		if _, err := sameAsGeneral(ev); err != nil {
			t.Fatalf("% x: %v", ev, err)
		}
	})
}
