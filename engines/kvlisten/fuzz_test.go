package kvlisten

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/kvselect/kvselect/engines/kvevents"
	"github.com/kvselect/kvselect/selection/index"
)

// FuzzLiveMessage drives a rank's whole receive path (multipart frame check,
// sequence cursor, batch decode on the writer lane, index apply) with
// arbitrary frames, as if they came off the SUB socket. Whatever arrives, the
// listener must not panic, must count a malformed message instead of applying
// it, and must keep the index consistent with what it accepted.
func FuzzLiveMessage(f *testing.F) {
	c := newChain(0, 10, 2)
	f.Add(uint8(3), []byte("kv-events"), be64(0), c.batches[0])
	f.Add(uint8(3), []byte{}, be64(1), c.batches[1])
	f.Add(uint8(3), []byte("t"), []byte{1, 2, 3}, c.batches[0])
	f.Add(uint8(2), []byte("t"), be64(5), heartbeatBatch(0))
	f.Add(uint8(4), []byte("t"), be64(0), []byte{0x93, 0xc0})
	f.Add(uint8(3), []byte("t"), be64(7), []byte{0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, nframes uint8, topic, seq, payload []byte) {
		l := New(context.Background(), Options{Logger: quietLogger()})
		defer l.Close()
		ix := newIndex(t)
		w := index.WorkerKey{WorkerID: 1}
		dec, err := kvevents.NewDecoder(kvevents.Config{WorkerID: 1, BlockSize: blockSize, Scratch: &l.laneBufs[0].scratch})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		r := &rank{l: l, a: attachment(ix, w, "tcp://127.0.0.1:1", ""), ctx: ctx, cancel: cancel,
			done: make(chan struct{}), lane: l.lanes[0], dec: dec, buf: &l.laneBufs[0], log: quietLogger()}
		frames := [][]byte{topic, seq, payload, payload}[:min(int(nframes)%5, 4)]
		// The same message twice: the second is stale or, if the first was
		// malformed, malformed again.
		r.live(frames)
		r.live(frames)
		wellFormed := len(frames) == 3 && len(seq) == 8
		b := make(chan struct{})
		r.lane <- job{barrier: b}
		<-b
		st := r.st
		if !wellFormed {
			if st.DecodeErrors != 2 || st.Synced || st.Applied != 0 {
				t.Fatalf("malformed message not counted and dropped: %+v", st)
			}
			return
		}
		if !st.Synced || st.LastSeq != binary.BigEndian.Uint64(seq) || st.Stale != 1 {
			t.Fatalf("cursor after a good message: %+v", st)
		}
		if st.Applied+st.DecodeErrors != 1 {
			t.Fatalf("one batch accepted, %d applied and %d undecodable", st.Applied, st.DecodeErrors)
		}
		if st.Applied == 0 && len(ix.Match(c.locals, false, nil)) > 0 {
			t.Fatal("an undecodable batch changed the index")
		}
	})
}
