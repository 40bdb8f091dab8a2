package kvpublish

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kvselect/kvselect/engines/kvlisten"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/kvhash"
)

// TestKVListenRecoversDroppedBatches drives kvselect's real listener: batches
// dropped live are fetched from the replay ring and the index ends up holding
// exactly the published chain.
func TestKVListenRecoversDroppedBatches(t *testing.T) {
	const bs = 4
	var drop sync.Map
	p := newPub(t, Options{ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv-events",
		DropLive: func(s uint64) bool { _, ok := drop.Load(s); return ok }})
	ix, err := index.New(index.Config{BlockSize: bs})
	if err != nil {
		t.Fatal(err)
	}
	l := kvlisten.New(context.Background(), kvlisten.Options{Logger: quiet(),
		ReconnectMin: 20 * time.Millisecond, ReconnectMax: 200 * time.Millisecond})
	t.Cleanup(l.Close)
	part := index.Partition{Model: "m", RoutingGroup: "g"}
	w := index.WorkerKey{WorkerID: 3, DPRank: 0}
	if err := l.Attach(selection.RankAttachment{Partition: part, Worker: w, BlockSize: bs, Index: ix,
		Endpoints: catalog.RankEndpoints{KVEvents: p.Endpoint(), Replay: p.ReplayEndpoint()}}); err != nil {
		t.Fatal(err)
	}
	rank := 0
	heartbeat := func() {
		if _, err := p.Publish(&rank); err != nil {
			t.Fatal(err)
		}
	}
	synced := func() bool {
		st, ok := l.Status(part, w)
		return ok && st.Synced && st.LastSeq == p.NextSeq()-1
	}
	// Publish until the subscription is live; check before publishing again,
	// or the listener is always one batch behind.
	eventually(t, "listener synced", func() bool {
		if synced() {
			return true
		}
		heartbeat()
		return false
	})

	// A 12-block chain in 4 batches; the 2nd and 3rd never go out live.
	toks := tokens(100, 12*bs)
	next := p.NextSeq()
	drop.Store(next+1, true)
	drop.Store(next+2, true)
	var parent *uint64
	for b := range 4 {
		ev := &BlockStored{BlockSize: bs, Medium: "GPU", ParentBlockHash: parent,
			TokenIDs: toks[b*3*bs : (b+1)*3*bs]}
		for i := range 3 {
			ev.BlockHashes = append(ev.BlockHashes, 1<<63+uint64(b*3+i))
		}
		parent = ptr(ev.BlockHashes[2])
		if _, err := p.Publish(&rank, ev); err != nil {
			t.Fatal(err)
		}
	}
	locals := kvhash.LocalBlockHashes(toks, "", "", kvhash.BlockOptions{BlockSize: bs})
	held := func() uint32 {
		for _, o := range ix.Match(locals, false, nil) {
			if o.Worker == w {
				return o.Device
			}
		}
		return 0
	}
	eventually(t, "12 blocks indexed", func() bool { return held() == 12 })
	// Evict the last 3 blocks: the index follows.
	if _, err := p.Publish(&rank, &BlockRemoved{BlockHashes: []uint64{1<<63 + 9, 1<<63 + 10, 1<<63 + 11}, Medium: "GPU"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "9 blocks after removal", func() bool { return held() == 9 })
	st, _ := l.Status(part, w)
	if st.Gaps < 1 || st.Replayed < 2 || st.Lost != 0 || st.DecodeErrors != 0 || st.Failed != 0 {
		t.Fatalf("listener status %+v", st)
	}
}
