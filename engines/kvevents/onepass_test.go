package kvevents

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/kvselect/kvselect/selection/index"
)

// refDecode is Decode as it was before events were parsed in one pass: the
// envelope first walks every event with msgp.Skip to find its bounds, then
// each event is parsed within them. It is the reference the one-pass decoder
// must match byte for byte: same events, stats, errors and decoder state.
// It also reports (bad) an event that parse accepted without consuming it
// whole.
func refDecode(d *Decoder, payload []byte, dst []index.Event) (_ []index.Event, _ Stats, bad string, _ error) {
	var st Stats
	evs, bounds, rank, err := refEnvelope(d.cfg.DPRank, payload)
	if err != nil {
		return dst, st, "", err
	}
	d.blocks = d.blocks[:0]
	d.arena.hashes, d.arena.tokens = d.arena.hashes[:0], d.arena.tokens[:0]
	r := rawEvent{arena: &d.arena}
	start := 0
	for i, end := range bounds {
		ev := evs[start:end]
		start = end
		st.Events++
		var rest []byte
		r.tag, rest, r.err = parse(ev, &r)
		if r.err == nil && len(rest) != 0 && bad == "" {
			bad = fmt.Sprintf("event %d: parse left %d of its bytes", i, len(rest))
		}
		before := len(dst)
		dst = d.event(&r, rank, dst, &st)
		st.Emitted += len(dst) - before
	}
	return dst, st, bad, nil
}

func refEnvelope(rank uint32, p []byte) (events []byte, bounds []int, _ uint32, err error) {
	var evs []byte
	haveEvents := false
	split := func(b []byte) ([]byte, error) {
		evs, haveEvents = b, true
		n, b, err := msgp.ReadArrayHeaderBytes(b)
		if err != nil {
			return b, batchErr("events", err)
		}
		if int(n) > len(b) {
			return b, batchErr("events", msgp.ErrShortBytes)
		}
		base := len(b)
		for range n {
			if b, err = msgp.Skip(b); err != nil {
				return b, batchErr("event", err)
			}
			bounds = append(bounds, base-len(b))
		}
		return b, nil
	}
	switch msgp.NextType(p) {
	case msgp.ArrayType:
		sz, b, err := msgp.ReadArrayHeaderBytes(p)
		if err != nil {
			return nil, nil, 0, batchErr("batch header", err)
		}
		if sz != 2 && sz != 3 {
			return nil, nil, 0, fmt.Errorf("%w: batch array of length %d, want 2 or 3", ErrBatch, sz)
		}
		if b, err = skipTS(b); err != nil {
			return nil, nil, 0, err
		}
		if b, err = split(b); err != nil {
			return nil, nil, 0, err
		}
		if sz == 3 {
			if rank, b, err = readRank(b, rank); err != nil {
				return nil, nil, 0, err
			}
		}
		if len(b) != 0 {
			return nil, nil, 0, fmt.Errorf("%w: %d trailing bytes after the batch", ErrBatch, len(b))
		}
	case msgp.MapType:
		sz, b, err := msgp.ReadMapHeaderBytes(p)
		if err != nil {
			return nil, nil, 0, batchErr("batch header", err)
		}
		for range sz {
			var key []byte
			if key, b, err = msgp.ReadMapKeyZC(b); err != nil {
				return nil, nil, 0, batchErr("batch key", err)
			}
			switch string(key) {
			case "ts":
				b, err = skipTS(b)
			case "events":
				bounds = bounds[:0]
				b, err = split(b)
			case "data_parallel_rank", "dp_rank", "attn_dp_rank":
				rank, b, err = readRank(b, rank)
			default:
				if b, err = msgp.Skip(b); err != nil {
					err = batchErr("batch field", err)
				}
			}
			if err != nil {
				return nil, nil, 0, err
			}
		}
		if len(b) != 0 {
			return nil, nil, 0, fmt.Errorf("%w: %d trailing bytes after the batch", ErrBatch, len(b))
		}
	default:
		return nil, nil, 0, fmt.Errorf("%w: batch is neither an array nor a map", ErrBatch)
	}
	if !haveEvents {
		return nil, nil, 0, fmt.Errorf("%w: batch without events", ErrBatch)
	}
	_, evs, _ = msgp.ReadArrayHeaderBytes(evs)
	return evs, bounds, rank, nil
}

// warmBatch gives a decoder a remembered namespace and learned groups, so
// that the paths reading them are exercised.
var warmBatch = batch(0,
	storedPos(Hs(3), Nil(), Toks(1, 2), 2, Nil(), M("cache_salt", S("t"))),
	storedPos(Hs(4), Nil(), Toks(1, 3), 2, Nil(), Nil(), Nil(), U(1), S("sliding_window"), Nil(), Nil()))

// followBatch reads the state a batch may have left (namespaces, learned
// groups, event ids) through a second decode.
var followBatch = batch(0,
	storedPos(Hs(5), U(3), Toks(5, 6), 2),
	storedPos(Hs(6), Nil(), Toks(5, 7), 2, Nil(), Nil(), Nil(), U(1)),
	A(S("BlockRemoved"), Hs(3, 4)))

// diffDecode decodes payload with the one-pass decoder and the reference and
// reports the first difference.
func diffDecode(payload []byte) error {
	dec := func() *Decoder {
		d, err := NewDecoder(Config{WorkerID: wid, DPRank: 7, BlockSize: 2})
		if err != nil {
			panic(err)
		}
		if _, _, err := d.Decode(warmBatch, nil); err != nil {
			panic(err)
		}
		return d
	}
	a, b := dec(), dec()
	sentinel := index.Event{ID: 1 << 62}
	gotA, stA, errA := a.Decode(payload, []index.Event{sentinel})
	gotB, stB, bad, errB := refDecode(b, payload, []index.Event{sentinel})
	if bad != "" {
		return errors.New(bad)
	}
	if (errA == nil) != (errB == nil) || errA != nil && (errA.Error() != errB.Error() || !errors.Is(errA, ErrBatch)) {
		return fmt.Errorf("errors: one pass %v, reference %v", errA, errB)
	}
	if stA != stB {
		return fmt.Errorf("stats: one pass %+v, reference %+v", stA, stB)
	}
	if !reflect.DeepEqual(normal(gotA), normal(gotB)) {
		return fmt.Errorf("events:\none pass  %+v\nreference %+v", gotA, gotB)
	}
	fa, sa, ea := a.Decode(followBatch, nil)
	fb, sb, _, eb := refDecode(b, followBatch, nil)
	if ea != nil || eb != nil || sa != sb || !reflect.DeepEqual(normal(fa), normal(fb)) || a.NextID() != b.NextID() {
		return fmt.Errorf("state after the batch differs: %+v %v / %+v %v", sa, ea, sb, eb)
	}
	return nil
}

// normal copies events out of the decoders' arenas, with empty and nil
// slices alike.
func normal(evs []index.Event) []index.Event {
	out := slices.Clone(evs)
	for i := range out {
		out[i].Blocks = slices.Clip(append([]index.Block(nil), out[i].Blocks...))
		out[i].Hashes = slices.Clip(append([]uint64(nil), out[i].Hashes...))
	}
	return out
}

// onePassCorpus is the golden vectors, the fuzz seeds and random batches in
// every envelope and event shape, with positional events carrying slots past
// the known ones, plus truncated and corrupted copies of them all.
func onePassCorpus() [][]byte {
	wrap := func(ev string) []byte { return cat(mustHex("93 cb41d954fc40200000 91"), mustHex(ev), Nil()) }
	c := [][]byte{
		mustHex(vecA), mustHex(vecB), mustHex(vecC), wrap(vecDCleared), wrap(vecDRemoved),
		batch(1, storedPos(Hs(11, 12), Nil(), A(A(U(10), U(11)), A(U(11), U(12)), A(U(12), U(13))), 2)),
		batch(0, storedPos(Hs(11), U(3), Toks(10, 11), 2, S("CPU"), M("cache_salt", S("t"))),
			storedPos(Hs(12), U(11), Toks(1, 2), 2, Nil(), Nil(), A(A(S(hex64(1)), A(S("x"), U(0)))))),
		M("ts", F(ts), "events", A(M("type", S("BlockRemoved"), "block_hashes", Hs(1), "locality", S("LOCAL"))), "dp_rank", U(2)),
		// Slots past the ones the decoder reads, on every tag.
		batch(0, A(S("AllBlocksCleared"), S("x"), A(U(1), M("k", Nil())))),
		batch(0, A(S("Ignored"), U(1), U(2)), A(S("BlockRemoved"), Hs(9), Nil(), Nil(), Nil(), Nil(), Nil(), Nil(), A(U(1)), M("a", U(2)))),
		batch(0, storedPos(Hs(13), U(3), Toks(1, 2), 2, Nil(), Nil(), Nil(), U(0), S("full_attention"), Nil(), S("LOCAL"), S("x"), A(U(1)), U(9))),
		batch(0, A(S("Unknown"), A(U(1)), M("x", A())), A(S("BlockRemoved"), Hs(3))),
		// Malformed events followed by good ones.
		batch(0, A(S("BlockStored"), S("not hashes"), Nil(), Toks(1, 2), U(2)), A(S("BlockRemoved"), Hs(3))),
		batch(0, M("type", U(1), "block_hashes", Hs(1)), U(3), A(), M(), A(S("BlockRemoved"), Hs(3))),
		M("ts", F(ts), "events", A(A(S("BlockRemoved"), Hs(3))), "events", A(A(S("BlockRemoved"), Hs(4), S("CPU")))),
	}
	r := rand.New(rand.NewPCG(11, 12))
	for range 300 {
		var evs [][]byte
		for range r.IntN(8) {
			g := randEvent(r, 2)
			ev := g.encode(r.IntN(2) == 0, 2)
			if r.IntN(4) == 0 && msgp.NextType(ev) == msgp.ArrayType {
				// Append slots: the array header grows by up to 3 fixarray counts.
				n, body, _ := msgp.ReadArrayHeaderBytes(ev)
				extra := 1 + r.IntN(3)
				more := [][]byte{body}
				for range extra {
					more = append(more, []any{U(r.Uint64()), S("s"), A(U(1), Nil()), M("k", A())}[r.IntN(4)].([]byte))
				}
				ev = cat(msgp.AppendArrayHeader(nil, n+uint32(extra)), cat(more...))
			}
			evs = append(evs, ev)
		}
		switch r.IntN(3) {
		case 0:
			c = append(c, batch(r.IntN(3)-1, evs...))
		case 1:
			c = append(c, M("ts", F(ts), "events", A(evs...), "dp_rank", U(uint64(r.IntN(3)))))
		default:
			c = append(c, A(F(ts), A(evs...)))
		}
	}
	n := len(c)
	for i := range n {
		p := c[i]
		if len(p) > 1 {
			c = append(c, p[:r.IntN(len(p))])
			q := slices.Clone(p)
			for range 1 + r.IntN(3) {
				q[r.IntN(len(q))] = byte(r.Uint32())
			}
			c = append(c, q)
		}
	}
	return c
}

// TestOnePassMatchesBoundsWalk: decoding each event in one pass gives what
// walking the batch for event bounds and then parsing each event gave.
func TestOnePassMatchesBoundsWalk(t *testing.T) {
	for i, p := range onePassCorpus() {
		if err := diffDecode(p); err != nil {
			t.Fatalf("payload %d (% x): %v", i, p, err)
		}
	}
}

// TestSkipDepthLimit pins msgp's nesting limit, which parseEvents relies on:
// events shorter than skipDepthBytes never reach it.
func TestSkipDepthLimit(t *testing.T) {
	nested := func(depth int) []byte {
		b := make([]byte, depth, depth+1)
		for i := range b {
			b[i] = 0x91 // fixarray of one element
		}
		return append(b, 0xc0)
	}
	if _, err := msgp.Skip(nested(skipDepthBytes - 1)); err != nil {
		t.Fatalf("depth %d: %v", skipDepthBytes-1, err)
	}
	if _, err := msgp.Skip(nested(skipDepthBytes)); !errors.Is(err, msgp.ErrRecursion) {
		t.Fatalf("depth %d: %v, want ErrRecursion", skipDepthBytes, err)
	}
	// An event whose extra_keys nest one level short of the limit on their own
	// reach it from the event: the batch fails, as when it was walked whole
	// for bounds first.
	deep := storedPos(Hs(13), Nil(), Toks(1, 2), 2, Nil(), Nil(), nested(skipDepthBytes-1))
	for _, p := range [][]byte{batch(0, deep), batch(0, A(S("BlockStored"), Nil(), nested(skipDepthBytes-1)))} {
		if err := diffDecode(p); err != nil {
			t.Fatal(err)
		}
		d := newDec(t, Config{BlockSize: 2})
		if _, _, err := d.Decode(p, nil); !errors.Is(err, msgp.ErrRecursion) || !errors.Is(err, ErrBatch) {
			t.Fatalf("deep event: %v, want ErrBatch wrapping ErrRecursion", err)
		}
	}
}

// FuzzDecodeOnePass: on any payload the one-pass decoder and the bounds walk
// agree.
func FuzzDecodeOnePass(f *testing.F) {
	for i, p := range onePassCorpus() {
		if i%7 == 0 {
			f.Add(p)
		}
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		if err := diffDecode(payload); err != nil {
			t.Fatal(err)
		}
	})
}

// TestReadTokenRunMatchesReadUint32: the unrolled token loop reads what
// msgp.ReadUint32Bytes reads, in every encoding and at every truncation, and
// fails where it fails.
func TestReadTokenRunMatchesReadUint32(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 9))
	enc := []func() []byte{
		func() []byte { return U(uint64(r.IntN(128))) },
		func() []byte { return []byte{0xcc, byte(r.Uint32())} },
		func() []byte { return []byte{0xcd, byte(r.Uint32()), byte(r.Uint32())} },
		func() []byte { return msgp.AppendUint32([]byte{}, r.Uint32()) },
		func() []byte { return I(int64(r.IntN(1 << 20))) },
		func() []byte { return I(-1 - int64(r.IntN(100))) },
		func() []byte { return U(1<<32 + uint64(r.IntN(10))) },
		func() []byte { return S("x") },
		func() []byte { return Nil() },
	}
	for range 3000 {
		var b []byte
		n := 1 + r.IntN(6)
		for range n {
			b = append(b, enc[r.IntN(len(enc))]()...)
		}
		b = b[:len(b)-r.IntN(min(3, len(b)))]
		want := make([]uint32, 0, n)
		rest, wantErr := b, error(nil)
		for range n {
			var v uint32
			if v, rest, wantErr = msgp.ReadUint32Bytes(rest); wantErr != nil {
				break
			}
			want = append(want, v)
		}
		got := make([]uint32, n)
		gotRest, err := readTokenRun(b, got)
		if (err == nil) != (wantErr == nil) || err == nil && (!slices.Equal(got, want) || len(gotRest) != len(rest)) {
			t.Fatalf("% x: got %v %v, want %v %v", b, got, err, want, wantErr)
		}
	}
}
