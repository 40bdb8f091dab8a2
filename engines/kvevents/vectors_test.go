package kvevents

import (
	"encoding/binary"
	"errors"
	"reflect"
	"testing"

	"github.com/zeebo/xxh3"

	"github.com/kvselect/kvselect/selection/index"
)

// Batches as msgspec encodes them, byte for byte (smallest int encoding, ts as
// float64 1700000000.5, fixstr/str8, fixarray/fixmap; h1 ≥ 2^63 needs 0xcf):
// (a) a vLLM v0.26+ batch whose one BlockStored is a tagged map, 202 bytes;
// (b) a legacy positional batch with Stored, Removed and Cleared, 128 bytes;
// (c) an SGLang positional batch with signed hashes, page size 2 and
// attn_dp_rank 1, 48 bytes; (d) the map-form singletons AllBlocksCleared
// (23 bytes) and BlockRemoved on CPU (53 bytes). kvpublish's encoder test pins
// the same bytes from the engine side.
const (
	h1 = 0xdb4f0a1a9f8e7d6c
	h2 = 0x0123456789abcdef

	vecA = `93 cb41d954fc40200000 91 8b
		a4 74797065 ab 426c6f636b53746f726564
		ac 626c6f636b5f686173686573 92 cf db4f0a1a9f8e7d6c cf 0123456789abcdef
		b1 706172656e745f626c6f636b5f68617368 c0
		a9 746f6b656e5f696473 98 01 02 03 04 05 06 07 08
		aa 626c6f636b5f73697a65 04
		a7 6c6f72615f6964 c0
		a6 6d656469756d a3 475055
		a9 6c6f72615f6e616d65 c0
		aa 65787472615f6b657973 92 c0 c0
		a9 67726f75705f696478 00
		b2 6b765f63616368655f737065635f6b696e64 ae 66756c6c5f617474656e74696f6e
		00`
	vecB = `93 cb41d954fc40200000 93
		9c ab 426c6f636b53746f726564 92 cf db4f0a1a9f8e7d6c cf 0123456789abcdef c0
		   98 01 02 03 04 05 06 07 08 04 c0 a3 475055 c0 92 c0 c0 00 ae 66756c6c5f617474656e74696f6e c0
		94 ac 426c6f636b52656d6f766564 91 cf 0123456789abcdef a3 475055 00
		91 b0 416c6c426c6f636b73436c6561726564
		00`
	vecC = `93 cb41d954fc40200000 91
		97 ab 426c6f636b53746f726564 92 d3 a000000000000000 fb c0 94 01 02 03 04 02 c0 a3 475055
		01`
	vecDCleared = `81 a4 74797065 b0 416c6c426c6f636b73436c6561726564`
	vecDRemoved = `83 a4 74797065 ac 426c6f636b52656d6f766564 ac 626c6f636b5f686173686573 91 cf 0123456789abcdef
		a6 6d656469756d a3 435055`
)

// byHand is xxh3_64(LE32 tokens, seed), computed without kvhash.
func byHand(seed uint64, toks ...uint32) uint64 {
	var b []byte
	for _, t := range toks {
		b = binary.LittleEndian.AppendUint32(b, t)
	}
	return xxh3.HashSeed(b, seed)
}

func TestMsgspecHexVectors(t *testing.T) {
	const w = 7
	l12 := local(seq(1, 8), "", "", 4, false, nil)
	// By hand: the first block of (a)/(b) is xxh3(LE32 1,2,3,4, seed 1337).
	if l12[0] != byHand(1337, 1, 2, 3, 4) || l12[1] != byHand(1337, 5, 6, 7, 8) {
		t.Fatal("kvhash disagrees with a hand-computed xxh3 of the block")
	}
	dev0 := index.WorkerKey{WorkerID: w, DPRank: 0}
	storedA := index.Event{Worker: dev0, Kind: index.EventStored, Blocks: blocks([]uint64{h1, h2}, l12)}
	wrap := func(ev string) []byte { return cat(mustHex("93 cb41d954fc40200000 91"), mustHex(ev), Nil()) }

	tests := []struct {
		name string
		hex  []byte
		size int
		bs   int
		want []index.Event
	}{
		{"a_vllm_tagged_map", mustHex(vecA), 202, 4, []index.Event{storedA}},
		{"b_legacy_positional", mustHex(vecB), 128, 4, []index.Event{
			storedA,
			{Worker: dev0, ID: 1, Kind: index.EventRemoved, Hashes: []uint64{h2}},
			{Worker: dev0, ID: 2, Kind: index.EventCleared},
		}},
		{"c_sglang_signed_rank1", mustHex(vecC), 48, 2, []index.Event{{
			Worker: index.WorkerKey{WorkerID: w, DPRank: 1}, Kind: index.EventStored,
			Blocks: blocks([]uint64{0xa000000000000000, 0xfffffffffffffffb},
				[]uint64{byHand(1337, 1, 2), byHand(1337, 3, 4)}),
		}}},
		{"d_map_cleared", wrap(vecDCleared), 0, 4, []index.Event{{Worker: dev0, Kind: index.EventCleared}}},
		{"d_map_removed_cpu", wrap(vecDRemoved), 0, 4, []index.Event{
			{Worker: dev0, Tier: index.TierHostPinned, Kind: index.EventRemoved, Hashes: []uint64{h2}}}},
	}
	if n := len(mustHex(vecDCleared)); n != 23 {
		t.Errorf("(d) cleared is %d bytes, want 23", n)
	}
	if n := len(mustHex(vecDRemoved)); n != 53 {
		t.Errorf("(d) removed is %d bytes, want 53", n)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.size != 0 && len(tc.hex) != tc.size {
				t.Errorf("vector is %d bytes, want %d", len(tc.hex), tc.size)
			}
			d := newDec(t, Config{WorkerID: w, BlockSize: tc.bs})
			// The full ZMQ message: empty topic, seq 0, payload.
			topic, sq, payload, err := ParseMessage([][]byte{nil, make([]byte, 8), tc.hex})
			if err != nil || len(topic) != 0 || sq != 0 {
				t.Fatalf("ParseMessage: %q %d %v", topic, sq, err)
			}
			got, st, err := d.Decode(payload, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want)
			}
			if st.Events != len(tc.want) || st.Emitted != len(tc.want) || st.Dropped() != 0 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// kvhash's public-mode golden vectors (TestPublicVectors) through the decoder:
// tokens 0..7, bs 4, with and without LoRA / cache namespace, and Eagle windows
// from bigrams.
func TestDecodedLocalHashesMatchKvhashVectors(t *testing.T) {
	toks := seq(0, 8)
	tests := []struct {
		name string
		ev   []byte
		want []uint64
	}{
		{"no_salt", M("type", S("BlockStored"), "block_hashes", Hs(1, 2), "parent_block_hash", Nil(),
			"token_ids", Toks(toks...), "block_size", U(4)),
			[]uint64{9143094415614847814, 12124091508212882195}},
		{"lora", M("type", S("BlockStored"), "block_hashes", Hs(1, 2), "token_ids", Toks(toks...),
			"block_size", U(4), "lora_name", S("adapter-a")),
			[]uint64{6665157333201000639, 11721812545976571723}},
		{"namespace", M("type", S("BlockStored"), "block_hashes", Hs(1, 2), "token_ids", Toks(toks...),
			"block_size", U(4), "cache_salt", S("tenant-a")),
			[]uint64{17009624042690211646, 10000672136415158886}},
		{"lora_and_namespace_extra_key", storedPos(Hs(1, 2), Nil(), Toks(toks...), 4, S("GPU"), S("adapter-a"),
			A(A(S("adapter-a"), S("dynamo-cache-salt:tenant-a")), Nil())),
			[]uint64{8269515957840517240, 11937877779520612889}},
		{"eagle_bigrams", storedPos(Hs(1, 2), Nil(),
			A(A(U(0), U(1)), A(U(1), U(2)), A(U(2), U(3)), A(U(3), U(4)), A(U(4), U(5)), A(U(5), U(6)),
				A(U(6), U(7)), A(U(7), U(8))), 4),
			[]uint64{14562210786876287112, 15916330181359808192}},
		{"mm_hash_42_pair", storedPos(Hs(1, 2), Nil(), Toks(toks...), 4, S("GPU"), Nil(),
			A(A(S(hex64(42))), Nil())),
			[]uint64{18280081842874931122, 12124091508212882195}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := newDec(t, Config{BlockSize: 4})
			got, _, err := d.Decode(batch(0, tc.ev), nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || len(got[0].Blocks) != 2 {
				t.Fatalf("got %+v", got)
			}
			for i, b := range got[0].Blocks {
				if b.Local != tc.want[i] {
					t.Errorf("block %d: local %d, want %d", i, b.Local, tc.want[i])
				}
			}
		})
	}
}

// hex64 is a 64-hex-char digest whose first 16 chars encode v.
func hex64(v uint64) string {
	const digits = "0123456789abcdef"
	b := make([]byte, 64)
	for i := range b {
		b[i] = 'f'
	}
	for i := 15; i >= 0; i-- {
		b[i] = digits[v&15]
		v >>= 4
	}
	return string(b)
}

func TestParseMessage(t *testing.T) {
	seq7 := []byte{0, 0, 0, 0, 0, 0, 0, 7}
	tests := []struct {
		name   string
		frames [][]byte
		ok     bool
	}{
		{"three_frames", [][]byte{[]byte("kv-events"), seq7, {0x90}}, true},
		{"two_frames", [][]byte{seq7, {0x90}}, false},
		{"four_frames_replay_shape", [][]byte{nil, nil, seq7, {0x90}}, false},
		{"short_seq", [][]byte{nil, seq7[:7], {0x90}}, false},
		{"long_seq", [][]byte{nil, append(seq7, 0), {0x90}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			topic, s, p, err := ParseMessage(tc.frames)
			if tc.ok {
				if err != nil || string(topic) != "kv-events" || s != 7 || len(p) != 1 {
					t.Fatalf("%q %d %v %v", topic, s, p, err)
				}
				return
			}
			if !errors.Is(err, ErrFrames) {
				t.Fatalf("err %v, want ErrFrames", err)
			}
		})
	}
}
