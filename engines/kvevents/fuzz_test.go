package kvevents

import (
	"errors"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/kvselect/kvselect/selection/index"
)

// FuzzDecode: any payload either fails with ErrBatch leaving dst and the decoder
// untouched, or yields events that keep Decode's promises (ids consecutive from
// NextID, one worker, stored events with at least one block, each with a
// LocalBlockHash, no repeated engine hash, removed/cleared without blocks), and
// decoding is deterministic.
func FuzzDecode(f *testing.F) {
	wrap := func(ev string) []byte { return cat(mustHex("93 cb41d954fc40200000 91"), mustHex(ev), Nil()) }
	for _, s := range [][]byte{
		mustHex(vecA), mustHex(vecB), mustHex(vecC), wrap(vecDCleared), wrap(vecDRemoved),
		batch(1, storedPos(Hs(11, 12), Nil(), A(A(U(10), U(11)), A(U(11), U(12)), A(U(12), U(13))), 2)),
		batch(0, storedPos(Hs(11), U(3), Toks(10, 11), 2, S("CPU"), M("cache_salt", S("t"))),
			storedPos(Hs(12), U(11), Toks(1, 2), 2, Nil(), Nil(), A(A(S(hex64(1)), A(S("x"), U(0)))))),
		M("ts", F(ts), "events", A(M("type", S("BlockRemoved"), "block_hashes", Hs(1), "locality", S("LOCAL"))), "dp_rank", U(2)),
	} {
		f.Add(s)
	}
	r := rand.New(rand.NewPCG(3, 4))
	for range 8 {
		g := randEvent(r, 2)
		f.Add(batch(r.IntN(3)-1, g.encode(r.IntN(2) == 0, 2), randEvent(r, 2).encode(true, 2)))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		d := newDec(t, Config{WorkerID: wid, BlockSize: 2})
		// Warm the state so namespace and group paths are reachable.
		if _, _, err := d.Decode(batch(0, storedPos(Hs(3), Nil(), Toks(1, 2), 2, Nil(), M("cache_salt", S("t")))), nil); err != nil {
			t.Fatal(err)
		}
		first := d.NextID()
		sentinel := []index.Event{{ID: 1 << 62}}
		got, st, err := d.Decode(payload, sentinel)
		if err != nil {
			if !errors.Is(err, ErrBatch) || len(got) != 1 || got[0].ID != 1<<62 || d.NextID() != first || st != (Stats{}) {
				t.Fatalf("error %v did not leave state untouched", err)
			}
			return
		}
		got = got[1:]
		checkInvariants(t, d, first, got)
		for _, e := range got {
			for _, b := range e.Blocks {
				if b.Local == 0 {
					t.Fatalf("block without LocalBlockHash: %+v", e)
				}
			}
		}
		if st.Emitted != len(got) || st.Events < st.Emitted {
			t.Fatalf("stats %+v for %d events", st, len(got))
		}
		d2 := newDec(t, Config{WorkerID: wid, BlockSize: 2})
		_, _, _ = d2.Decode(batch(0, storedPos(Hs(3), Nil(), Toks(1, 2), 2, Nil(), M("cache_salt", S("t")))), nil)
		again, _, err := d2.Decode(payload, nil)
		if err != nil || !reflect.DeepEqual(again, got) && !(len(again) == 0 && len(got) == 0) {
			t.Fatalf("non-deterministic decode: %v", err)
		}
	})
}
