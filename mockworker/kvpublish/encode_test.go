package kvpublish

import (
	"bytes"
	"encoding/hex"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/kvselect/kvselect/engines/kvevents"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/kvhash"
)

const (
	goldenTS = 1700000000.5
	h1       = 0xdb4f0a1a9f8e7d6c // ≥ 2^63: msgspec writes 0xcf
	h2       = 0x0123456789abcdef
)

func ptr[T any](v T) *T { return &v }

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func tokens(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

// TestGoldenBytes pins the encoding to msgspec's bytes, the same vectors the
// decoder's TestMsgspecHexVectors (engines/kvevents) reads. The map singletons
// (d) AllBlocksCleared and BlockRemoved on CPU are reproduced exactly; the
// full batches are (a) the vLLM v0.26+ tagged-map batch and (b) the legacy
// positional batch without the optional fields this package leaves at None
// (extra_keys, group_idx, kv_cache_spec_kind), which msgspec omits in the map
// shape and writes as nil in the positional shape.
func TestGoldenBytes(t *testing.T) {
	rank0 := ptr(0)
	stored := &BlockStored{BlockHashes: []uint64{h1, h2}, TokenIDs: tokens(1, 8), BlockSize: 4, Medium: "GPU"}
	cases := []struct {
		name string
		got  []byte
		want string
	}{
		{"d/cleared-map", appendEvent(nil, ShapeMap, AllBlocksCleared{}),
			"81 a4 74797065 b0 416c6c426c6f636b73436c6561726564"},
		{"d/removed-cpu-map", appendEvent(nil, ShapeMap, BlockRemoved{BlockHashes: []uint64{h2}, Medium: "CPU"}),
			"83 a4 74797065 ac 426c6f636b52656d6f766564 ac 626c6f636b5f686173686573 91 cf 0123456789abcdef a6 6d656469756d a3 435055"},
		{"a/stored-map-batch", AppendBatch(nil, goldenTS, []Event{stored}, rank0), `
			93 cb41d954fc40200000 91
			88 a4 74797065 ab 426c6f636b53746f726564
			   ac 626c6f636b5f686173686573 92 cf db4f0a1a9f8e7d6c cf 0123456789abcdef
			   b1 706172656e745f626c6f636b5f68617368 c0
			   a9 746f6b656e5f696473 98 0102030405060708
			   aa 626c6f636b5f73697a65 04
			   a7 6c6f72615f6964 c0
			   a6 6d656469756d a3 475055
			   a9 6c6f72615f6e616d65 c0
			00`},
		{"b/positional-batch", AppendBatchShape(nil, ShapePositional, goldenTS,
			[]Event{stored, BlockRemoved{BlockHashes: []uint64{h2}, Medium: "GPU"}, AllBlocksCleared{}}, rank0), `
			93 cb41d954fc40200000 93
			9c ab 426c6f636b53746f726564 92 cf db4f0a1a9f8e7d6c cf 0123456789abcdef c0
			   98 0102030405060708 04 c0 a3 475055 c0 c0 c0 c0 c0
			94 ac 426c6f636b52656d6f766564 91 cf 0123456789abcdef a3 475055 c0
			91 b0 416c6c426c6f636b73436c6561726564
			00`},
		{"nil-rank-empty-batch", AppendBatch(nil, goldenTS, nil, nil), "93 cb41d954fc40200000 90 c0"},
		// Smallest int forms, as msgspec picks them: fixint, 0xcc, 0xcd, 0xce;
		// a negative lora_id as a negative fixint; a 40-byte name as str8.
		{"int-widths", appendEvent(nil, ShapePositional, &BlockStored{
			BlockHashes: []uint64{5, 200, 70000}, ParentBlockHash: ptr(uint64(1) << 32),
			TokenIDs: []uint32{127, 128, 65535, 65536}, BlockSize: 300, LoraID: ptr(-1),
			LoraName: ptr(strings.Repeat("x", 40))}), `
			9c ab 426c6f636b53746f726564 93 05 ccc8 ce00011170 cf0000000100000000
			94 7f cc80 cdffff ce00010000 cd012c ff c0 d928` + strings.Repeat("78", 40) + `c0 c0 c0 c0`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if want := unhex(t, c.want); !bytes.Equal(c.got, want) {
				t.Fatalf("bytes differ\ngot  %x\nwant %x", c.got, want)
			}
		})
	}
}

func TestAppendBatchAppends(t *testing.T) {
	prefix := []byte("keep")
	out := AppendBatch(append([]byte(nil), prefix...), 1, []Event{AllBlocksCleared{}}, nil)
	if !bytes.HasPrefix(out, prefix) || !bytes.Equal(out[4:], AppendBatch(nil, 1, []Event{AllBlocksCleared{}}, nil)) {
		t.Fatalf("AppendBatch did not append: %x", out)
	}
}

// want is the index event kvevents must produce for e.
func want(e Event, w index.WorkerKey, id uint64) index.Event {
	tier := func(m string) index.Tier {
		switch m {
		case "CPU":
			return index.TierHostPinned
		case "CPU_TIER2":
			return index.TierDisk
		}
		return index.TierDevice
	}
	switch ev := e.(type) {
	case *BlockStored:
		lora := ""
		if ev.LoraName != nil {
			lora = *ev.LoraName
		}
		locals := kvhash.LocalBlockHashes(ev.TokenIDs, lora, "", kvhash.BlockOptions{BlockSize: ev.BlockSize})
		out := index.Event{Worker: w, Tier: tier(ev.Medium), ID: id, Kind: index.EventStored}
		if ev.ParentBlockHash != nil {
			out.Parent, out.HasParent = *ev.ParentBlockHash, true
		}
		for i, h := range ev.BlockHashes {
			out.Blocks = append(out.Blocks, index.Block{Ext: h, Local: locals[i]})
		}
		return out
	case *BlockRemoved:
		return index.Event{Worker: w, Tier: tier(ev.Medium), ID: id, Kind: index.EventRemoved,
			Hashes: append([]uint64(nil), ev.BlockHashes...)}
	}
	return index.Event{Worker: w, ID: id, Kind: index.EventCleared}
}

func decodeAll(t *testing.T, d *kvevents.Decoder, payload []byte) []index.Event {
	t.Helper()
	evs, st, err := d.Decode(payload, nil)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	if st.Dropped() != 0 {
		t.Fatalf("decoder dropped events: %+v", st)
	}
	for i := range evs {
		if len(evs[i].Hashes) == 0 {
			evs[i].Hashes = nil
		}
	}
	return evs
}

// TestRoundTripThroughKVEvents encodes every event kind and option in both
// shapes and checks kvselect's own decoder returns exactly those events.
func TestRoundTripThroughKVEvents(t *testing.T) {
	const bs = 4
	big := []uint64{1<<63 + 5, ^uint64(0), h1}
	events := []struct {
		name string
		ev   Event
	}{
		{"stored-root", &BlockStored{BlockHashes: []uint64{1, 2}, TokenIDs: tokens(0, 8), BlockSize: bs, Medium: "GPU"}},
		{"stored-parent", &BlockStored{BlockHashes: []uint64{3}, ParentBlockHash: ptr(uint64(2)), TokenIDs: tokens(8, 4), BlockSize: bs, Medium: "GPU"}},
		{"stored-big-hashes", &BlockStored{BlockHashes: big, ParentBlockHash: ptr(uint64(1<<63 + 1)), TokenIDs: tokens(70000, 12), BlockSize: bs}},
		{"stored-lora", &BlockStored{BlockHashes: []uint64{9}, TokenIDs: tokens(0, 4), BlockSize: bs, LoraID: ptr(3), LoraName: ptr("adapter-a"), Medium: "GPU"}},
		{"stored-cpu", &BlockStored{BlockHashes: []uint64{10}, TokenIDs: tokens(4, 4), BlockSize: bs, Medium: "CPU"}},
		{"stored-disk", &BlockStored{BlockHashes: []uint64{11}, TokenIDs: tokens(4, 4), BlockSize: bs, Medium: "CPU_TIER2"}},
		{"stored-no-medium", &BlockStored{BlockHashes: []uint64{12}, TokenIDs: tokens(4, 4), BlockSize: bs}},
		{"removed", &BlockRemoved{BlockHashes: []uint64{1, 1<<64 - 2}, Medium: "GPU"}},
		{"removed-cpu", &BlockRemoved{BlockHashes: []uint64{10}, Medium: "CPU"}},
		{"removed-no-medium", &BlockRemoved{BlockHashes: []uint64{12}}},
		{"cleared", &AllBlocksCleared{}},
	}
	for _, shape := range []Shape{ShapeMap, ShapePositional} {
		for _, rank := range []*int{nil, ptr(2)} {
			for _, c := range events {
				name := shape.String() + "/" + c.name
				if rank == nil {
					name += "/rank-nil"
				}
				t.Run(name, func(t *testing.T) {
					d, err := kvevents.NewDecoder(kvevents.Config{WorkerID: 7, DPRank: 5, BlockSize: bs})
					if err != nil {
						t.Fatal(err)
					}
					w := index.WorkerKey{WorkerID: 7, DPRank: 5}
					if rank != nil {
						w.DPRank = uint32(*rank)
					}
					got := decodeAll(t, d, AppendBatchShape(nil, shape, goldenTS, []Event{c.ev}, rank))
					if exp := []index.Event{want(c.ev, w, 0)}; !reflect.DeepEqual(got, exp) {
						t.Fatalf("\ngot  %+v\nwant %+v", got, exp)
					}
				})
			}
		}
	}
}

// TestRoundTripRandomBatches: random multi-event batches, values passed both
// by value and by pointer, decode to what was encoded.
func TestRoundTripRandomBatches(t *testing.T) {
	const bs = 16
	r := rand.New(rand.NewPCG(8, 1))
	media := []string{"", "GPU", "CPU"}
	for iter := range 300 {
		d, err := kvevents.NewDecoder(kvevents.Config{WorkerID: 1, BlockSize: bs})
		if err != nil {
			t.Fatal(err)
		}
		var evs []Event
		var exp []index.Event
		w := index.WorkerKey{WorkerID: 1, DPRank: uint32(iter % 3)}
		for i := range r.IntN(20) {
			var e Event
			switch k := r.IntN(10); {
			case k == 0:
				e = &AllBlocksCleared{}
			case k < 4:
				rm := &BlockRemoved{Medium: media[r.IntN(3)]}
				for range 1 + r.IntN(70) {
					rm.BlockHashes = append(rm.BlockHashes, r.Uint64())
				}
				e = rm
			default:
				n := 1 + r.IntN(70)
				st := &BlockStored{BlockSize: bs, Medium: media[r.IntN(3)]}
				for range n {
					st.BlockHashes = append(st.BlockHashes, r.Uint64())
				}
				for range n * bs {
					st.TokenIDs = append(st.TokenIDs, r.Uint32N(1<<20))
				}
				if r.IntN(2) == 0 {
					st.ParentBlockHash = ptr(r.Uint64())
				}
				if r.IntN(4) == 0 {
					st.LoraName = ptr("lora-" + string(rune('a'+r.IntN(3))))
				}
				e = st
			}
			exp = append(exp, want(e, w, uint64(i)))
			if r.IntN(2) == 0 { // the by-value forms encode the same
				switch v := e.(type) {
				case *BlockStored:
					e = *v
				case *BlockRemoved:
					e = *v
				case *AllBlocksCleared:
					e = *v
				}
			}
			evs = append(evs, e)
		}
		rank := int(w.DPRank)
		shape := Shape(r.IntN(2))
		got := decodeAll(t, d, AppendBatchShape(nil, shape, float64(iter), evs, &rank))
		if len(got) == 0 && len(exp) == 0 {
			continue
		}
		if !reflect.DeepEqual(got, exp) {
			t.Fatalf("iter %d (%v): decoded events differ\ngot  %+v\nwant %+v", iter, shape, got, exp)
		}
	}
}

func BenchmarkAppendBatch64Blocks(b *testing.B) {
	const bs, n = 16, 64
	ev := &BlockStored{BlockSize: bs, Medium: "GPU", ParentBlockHash: ptr(uint64(1 << 63))}
	for i := range n {
		ev.BlockHashes = append(ev.BlockHashes, uint64(i)*0x9e3779b97f4a7c15)
	}
	ev.TokenIDs = tokens(30000, n*bs)
	rank := 0
	events := []Event{ev}
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendBatch(buf[:0], goldenTS, events, &rank)
	}
	b.SetBytes(int64(len(buf)))
	b.ReportMetric(float64(b.N)*n/b.Elapsed().Seconds(), "blocks/s")
}
