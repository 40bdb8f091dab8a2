package kvevents

import (
	"encoding/hex"
	"strings"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/kvhash"
)

// A tiny msgpack builder over msgp's Append functions, following msgspec's
// encoding rules (smallest ints, float64 ts, fixstr/str8, fixarray/fixmap).

func cat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func A(elems ...[]byte) []byte {
	return cat(append([][]byte{msgp.AppendArrayHeader(nil, uint32(len(elems)))}, elems...)...)
}

// M builds a map from alternating key strings and encoded values.
func M(kv ...any) []byte {
	out := msgp.AppendMapHeader(nil, uint32(len(kv)/2))
	for i := 0; i < len(kv); i += 2 {
		out = msgp.AppendString(out, kv[i].(string))
		out = append(out, kv[i+1].([]byte)...)
	}
	return out
}

func S(s string) []byte   { return msgp.AppendString(nil, s) }
func U(u uint64) []byte   { return msgp.AppendUint64(nil, u) }
func I(i int64) []byte    { return msgp.AppendInt64(nil, i) }
func F(f float64) []byte  { return msgp.AppendFloat64(nil, f) }
func Bin(b []byte) []byte { return msgp.AppendBytes(nil, b) }
func Nil() []byte         { return msgp.AppendNil(nil) }
func Bool(v bool) []byte  { return msgp.AppendBool(nil, v) }
func Raw(h string) []byte { return mustHex(h) }
func Hs(hs ...uint64) []byte {
	out := msgp.AppendArrayHeader(nil, uint32(len(hs)))
	for _, h := range hs {
		out = msgp.AppendUint64(out, h)
	}
	return out
}
func SignedHs(hs ...uint64) []byte {
	out := msgp.AppendArrayHeader(nil, uint32(len(hs)))
	for _, h := range hs {
		out = msgp.AppendInt64(out, int64(h))
	}
	return out
}
func Toks(ts ...uint32) []byte {
	out := msgp.AppendArrayHeader(nil, uint32(len(ts)))
	for _, t := range ts {
		out = msgp.AppendUint32(out, t)
	}
	return out
}
func seq(from, n uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = from + uint32(i)
	}
	return out
}

const ts = 1700000000.5

// batch wraps events in the 3-array envelope with dp rank (nil when rank < 0).
func batch(rank int, events ...[]byte) []byte {
	r := Nil()
	if rank >= 0 {
		r = U(uint64(rank))
	}
	return A(F(ts), A(events...), r)
}

// stored is a legacy positional BlockStored with the v0.9 required slots plus
// medium; extra slots are appended verbatim.
func storedPos(hashes, parent, tokens []byte, bs uint64, more ...[]byte) []byte {
	return A(append([][]byte{S("BlockStored"), hashes, parent, tokens, U(bs), Nil()}, more...)...)
}

func mustHex(s string) []byte {
	s = strings.Join(strings.Fields(s), "")
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

func newDec(t testing.TB, cfg Config) *Decoder {
	t.Helper()
	d, err := NewDecoder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func local(tokens []uint32, lora, ns string, bs int, eagle bool, mm [][]uint64) []uint64 {
	return kvhash.LocalBlockHashes(tokens, lora, ns, kvhash.BlockOptions{BlockSize: bs, Eagle: eagle, MM: mm})
}

func blocks(ext []uint64, loc []uint64) []index.Block {
	out := make([]index.Block, len(ext))
	for i := range ext {
		out[i] = index.Block{Ext: ext[i], Local: loc[i]}
	}
	return out
}

// checkInvariants are the promises Decode makes about every event it emits.
func checkInvariants(t testing.TB, d *Decoder, firstID uint64, evs []index.Event) {
	t.Helper()
	for i, e := range evs {
		if e.Worker.WorkerID != d.cfg.WorkerID {
			t.Fatalf("event %d: worker %v", i, e.Worker)
		}
		if e.ID != firstID+uint64(i) {
			t.Fatalf("event %d: id %d, want %d", i, e.ID, firstID+uint64(i))
		}
		if e.Tier > index.TierExternal {
			t.Fatalf("event %d: tier %v", i, e.Tier)
		}
		switch e.Kind {
		case index.EventStored:
			if len(e.Blocks) == 0 || len(e.Hashes) != 0 {
				t.Fatalf("event %d: stored with %d blocks, %d hashes", i, len(e.Blocks), len(e.Hashes))
			}
			seen := map[uint64]bool{}
			if e.HasParent {
				seen[e.Parent] = true
			}
			for _, b := range e.Blocks {
				if seen[b.Ext] {
					t.Fatalf("event %d: duplicate engine hash %x", i, b.Ext)
				}
				seen[b.Ext] = true
			}
		case index.EventRemoved:
			if len(e.Blocks) != 0 {
				t.Fatalf("event %d: removed with blocks", i)
			}
		case index.EventCleared:
			if len(e.Blocks) != 0 || len(e.Hashes) != 0 {
				t.Fatalf("event %d: cleared with payload", i)
			}
		default:
			t.Fatalf("event %d: kind %v", i, e.Kind)
		}
	}
}
