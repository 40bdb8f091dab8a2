package kvevents

import (
	"encoding/binary"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/kvselect/kvselect/selection/index"
)

type genEvent struct {
	kind    index.EventKind
	hashes  []uint64
	parent  uint64
	hasPar  bool
	tokens  []uint32
	medium  string // "" = absent
	tier    index.Tier
	lora    string
	salt    string
	hashEnc int // 0 unsigned, 1 signed, 2 bin
}

var media = []struct {
	s string
	t index.Tier
}{{"", index.TierDevice}, {"GPU", index.TierDevice}, {"CPU", index.TierHostPinned},
	{"CPU_TIER2", index.TierDisk}, {"disk", index.TierDisk}, {"SHARED", index.TierExternal}}

func (g genEvent) encHash(h uint64) []byte {
	switch g.hashEnc {
	case 1:
		return I(int64(h))
	case 2:
		return Bin(binary.BigEndian.AppendUint64(nil, h))
	}
	return U(h)
}

func (g genEvent) encHashes() []byte {
	parts := make([][]byte, len(g.hashes))
	for i, h := range g.hashes {
		parts[i] = g.encHash(h)
	}
	return A(parts...)
}

// encode writes the event in the positional (msgspec array_like, SGLang slot-7
// metadata for the salt) or tagged-map shape.
func (g genEvent) encode(asMap bool, bs int) []byte {
	optStr := func(s string) []byte {
		if s == "" {
			return Nil()
		}
		return S(s)
	}
	parent := Nil()
	if g.hasPar {
		parent = g.encHash(g.parent)
	}
	switch g.kind {
	case index.EventCleared:
		if asMap {
			return M("type", S("AllBlocksCleared"))
		}
		return A(S("AllBlocksCleared"))
	case index.EventRemoved:
		if asMap {
			return M("type", S("BlockRemoved"), "block_hashes", g.encHashes(), "medium", optStr(g.medium))
		}
		return A(S("BlockRemoved"), g.encHashes(), optStr(g.medium), Nil())
	}
	if asMap {
		kv := []any{"type", S("BlockStored"), "block_hashes", g.encHashes(), "parent_block_hash", parent,
			"token_ids", Toks(g.tokens...), "block_size", U(uint64(bs)), "lora_id", Nil(),
			"medium", optStr(g.medium), "lora_name", optStr(g.lora), "group_idx", U(0),
			"kv_cache_spec_kind", S("full_attention")}
		if g.salt != "" {
			kv = append(kv, "cache_salt", S(g.salt))
		}
		return M(kv...)
	}
	slot7 := optStr(g.lora)
	if g.salt != "" { // SGLang carries the salt in slot 7 and has no lora_name there
		slot7 = M("cache_salt", S(g.salt), "session_id", S("s"))
	}
	return storedPos(g.encHashes(), parent, Toks(g.tokens...), uint64(bs), optStr(g.medium), slot7, Nil(), U(0),
		S("full_attention"), Nil())
}

func randEvent(r *rand.Rand, bs int) genEvent {
	m := media[r.IntN(len(media))]
	g := genEvent{medium: m.s, tier: m.t, hashEnc: r.IntN(3)}
	switch k := r.IntN(10); {
	case k == 0:
		g.kind = index.EventCleared
		g.medium, g.tier = "", index.TierDevice
	case k < 4:
		g.kind = index.EventRemoved
		for range r.IntN(5) {
			g.hashes = append(g.hashes, r.Uint64())
		}
	default:
		g.kind = index.EventStored
		n := 1 + r.IntN(4)
		for range n {
			g.hashes = append(g.hashes, r.Uint64())
		}
		for range n*bs + r.IntN(bs) { // a partial tail is ignored
			g.tokens = append(g.tokens, r.Uint32N(200000))
		}
		if r.IntN(2) == 0 {
			g.parent, g.hasPar = r.Uint64(), true
		}
		if r.IntN(3) == 0 {
			g.salt = []string{"tenant-a", "tenant-b"}[r.IntN(2)]
		} else if r.IntN(3) == 0 {
			g.lora = []string{"adapter-a", "adapter-b"}[r.IntN(2)]
		}
	}
	return g
}

func (g genEvent) want(w index.WorkerKey, id uint64, bs int) index.Event {
	e := index.Event{Worker: w, Tier: g.tier, ID: id, Kind: g.kind}
	switch g.kind {
	case index.EventRemoved:
		e.Hashes = append([]uint64{}, g.hashes...)
	case index.EventStored:
		e.Parent, e.HasParent = g.parent, g.hasPar
		loc := local(g.tokens, g.lora, g.salt, bs, false, nil)
		e.Blocks = blocks(g.hashes, loc)
	}
	return e
}

// TestRoundTripRandomBatches encodes random batches in both batch shapes and
// both event shapes with msgp's Append functions and checks the decoder returns
// exactly the events they were built from.
func TestRoundTripRandomBatches(t *testing.T) {
	const bs = 4
	r := rand.New(rand.NewPCG(1, 2))
	d := newDec(t, Config{WorkerID: wid, DPRank: 9, BlockSize: bs})
	var dst []index.Event
	for iter := range 500 {
		n := r.IntN(12)
		rank, hasRank := uint32(r.IntN(4)), r.IntN(3) > 0
		w := index.WorkerKey{WorkerID: wid, DPRank: 9}
		if hasRank {
			w.DPRank = rank
		}
		var evs [][]byte
		var want []index.Event
		for range n {
			g := randEvent(r, bs)
			evs = append(evs, g.encode(r.IntN(2) == 0, bs))
			want = append(want, g.want(w, d.NextID()+uint64(len(want)), bs))
		}
		rankEnc := Nil()
		if hasRank {
			rankEnc = U(uint64(rank))
		}
		var payload []byte
		switch r.IntN(3) {
		case 0:
			payload = A(F(ts), A(evs...), rankEnc)
		case 1:
			if hasRank {
				payload = M("ts", F(ts), "events", A(evs...), []string{"data_parallel_rank", "dp_rank", "attn_dp_rank"}[r.IntN(3)], rankEnc)
			} else {
				payload = M("ts", F(ts), "events", A(evs...))
			}
		default:
			if hasRank {
				payload = A(F(ts), A(evs...), rankEnc)
			} else {
				payload = A(F(ts), A(evs...))
			}
		}
		first := d.NextID()
		var st Stats
		var err error
		dst, st, err = d.Decode(payload, dst[:0])
		if err != nil {
			t.Fatalf("iter %d: %v", iter, err)
		}
		if st.Dropped() != 0 || st.Events != n {
			t.Fatalf("iter %d: stats %+v", iter, st)
		}
		checkInvariants(t, d, first, dst)
		if len(dst) != len(want) {
			t.Fatalf("iter %d: %d events, want %d", iter, len(dst), len(want))
		}
		for i := range want {
			got := dst[i]
			if len(got.Hashes) == 0 {
				got.Hashes = nil
			}
			if len(want[i].Hashes) == 0 {
				want[i].Hashes = nil
			}
			if !reflect.DeepEqual(got, want[i]) {
				t.Fatalf("iter %d event %d:\ngot  %+v\nwant %+v", iter, i, got, want[i])
			}
		}
	}
}
