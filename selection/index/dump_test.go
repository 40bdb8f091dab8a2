package index

import (
	"cmp"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

type dumpTuple struct {
	worker     WorkerKey
	tier       string
	parent     uint64
	hasParent  bool
	ext, local uint64
}

// canonical flattens a dump into sorted block-level tuples, so dumps of equal
// trees compare equal whatever their event grouping and order.
func canonical(evs []RouterEvent) []dumpTuple {
	var out []dumpTuple
	for _, re := range evs {
		s := re.Event.Data.Stored
		if s == nil {
			continue
		}
		parent, has := uint64(0), s.ParentHash != nil
		if has {
			parent = uint64(*s.ParentHash)
		}
		for _, b := range s.Blocks {
			out = append(out, dumpTuple{WorkerKey{re.WorkerID, re.Event.DPRank}, re.StorageTier, parent, has, uint64(b.BlockHash), uint64(b.TokensHash)})
			parent, has = uint64(b.BlockHash), true
		}
	}
	slices.SortFunc(out, func(a, b dumpTuple) int {
		return cmp.Or(cmp.Compare(a.worker.WorkerID, b.worker.WorkerID), cmp.Compare(a.worker.DPRank, b.worker.DPRank),
			cmp.Compare(a.tier, b.tier), cmp.Compare(a.ext, b.ext), cmp.Compare(a.local, b.local), cmp.Compare(a.parent, b.parent))
	})
	return out
}

func dumpEqual(a, b []RouterEvent) bool { return slices.Equal(canonical(a), canonical(b)) }

func TestSnapshotChainsAreOneEventAndReplay(t *testing.T) {
	tr := NewTree()
	mustApply(t, tr, stored(w(1), 0, 1, 2, 3, 4, 5, 6), stored(w(2), 0, 1, 2, 3), stored(w(2), 3, 7, 8))
	evs := tr.appendSnapshot(nil)
	blocks := 0
	seen := map[[3]uint64]bool{}
	for i, re := range evs {
		if re.Event.EventID != uint64(i) {
			t.Fatalf("event ids must count from 0: event %d has %d", i, re.Event.EventID)
		}
		s := re.Event.Data.Stored
		if s == nil {
			t.Fatal("snapshots hold only stored events")
		}
		if s.ParentHash != nil && !seen[[3]uint64{re.WorkerID, uint64(re.Event.DPRank), uint64(*s.ParentHash)}] {
			t.Fatal("a child appeared before its worker's parent")
		}
		for _, b := range s.Blocks {
			seen[[3]uint64{re.WorkerID, uint64(re.Event.DPRank), uint64(b.BlockHash)}] = true
			blocks++
		}
	}
	if len(evs) != 2 || blocks != 11 {
		t.Fatalf("got %d events with %d blocks, want 2 chains holding 11 blocks", len(evs), blocks)
	}
	ix, _ := New(Config{BlockSize: 16})
	if n, err := ix.Replay(time.Unix(0, 0), evs); n != 0 {
		t.Fatalf("replay failed %d events: %v", n, err)
	}
	if !dumpEqual(ix.Snapshot().Events, evs) {
		t.Fatal("replayed index dumps differently")
	}
	eq(t, scores(ix.primary, false, 1, 2, 3, 7, 8), map[WorkerKey]uint32{w(1): 3, w(2): 5})
}

func TestEmptySnapshotHasEventsArray(t *testing.T) {
	ix, _ := New(Config{BlockSize: 4})
	b, _ := json.Marshal(ix.Snapshot())
	if string(b) != `{"block_size":4,"events":[]}` {
		t.Fatalf("empty snapshot = %s", b)
	}
}

func TestSnapshotLeavesOutUnreachableBlocks(t *testing.T) {
	tr := NewTree()
	mustApply(t, tr, stored(w(1), 0, 1, 2, 3), removed(w(1), 2), stored(w(2), 0, 1, 2))
	got := canonical(tr.appendSnapshot(nil))
	want := canonical([]RouterEvent{
		{WorkerID: 1, StorageTier: "device", Event: KvCacheEvent{Data: EventData{Stored: &StoredData{Blocks: []StoredBlock{{BlockHash: 100, TokensHash: 1}}}}}},
		{WorkerID: 2, StorageTier: "device", Event: KvCacheEvent{Data: EventData{Stored: &StoredData{Blocks: []StoredBlock{{BlockHash: 100, TokensHash: 1}, {BlockHash: 200, TokensHash: 2}}}}}},
	})
	if !slices.Equal(got, want) {
		t.Fatalf("snapshot = %+v, want %+v", got, want)
	}
}

func TestSnapshotTiersAndJSONRoundTrip(t *testing.T) {
	ix, _ := New(Config{BlockSize: 4})
	for _, ev := range []*Event{
		stored(WorkerKey{3, 1}, 0, 1, 2),
		onTier(stored(WorkerKey{3, 1}, 2, 3), TierHostPinned),
		onTier(stored(WorkerKey{3, 1}, 0, 1), TierDisk),
		{Worker: w(9), Kind: EventStored, Blocks: []Block{{Ext: 1<<64 - 5, Local: 1<<63 + 1}}},
	} {
		if err := ix.Apply(ev); err != nil {
			t.Fatal(err)
		}
	}
	d := Dump{PartitionKey("model", "group:a"): ix.Snapshot()}
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	for _, frag := range []string{`"model:group:a":{"block_size":4,"events":[`, `"storage_tier":"host_pinned"`, `"storage_tier":"disk"`,
		`"block_hash":18446744073709551611`, `"parent_hash":null`, `"start_position":null`, `"mm_extra_info":null`, `"dp_rank":1`} {
		if !strings.Contains(string(b), frag) {
			t.Errorf("dump JSON lacks %s:\n%s", frag, b)
		}
	}
	back, err := DecodeDump(b)
	if err != nil {
		t.Fatal(err)
	}
	model, group, err := SplitPartitionKey("model:group:a")
	if err != nil || model != "model" || group != "group:a" {
		t.Fatalf("split = %q %q %v", model, group, err)
	}
	ix2, _ := New(Config{BlockSize: 4})
	if n, err := ix2.Replay(time.Unix(0, 0), back["model:group:a"].Events); n != 0 {
		t.Fatal(err)
	}
	if !dumpEqual(ix2.Snapshot().Events, d["model:group:a"].Events) {
		t.Fatal("JSON round trip changed the snapshot")
	}
}

func TestDecodeDumpDynamoShapes(t *testing.T) {
	// Hand-written in Dynamo's serde shapes: signed hashes, removed/cleared
	// variants, unknown fields ignored.
	body := `{"m:default":{"block_size":16,"events":[
	 {"worker_id":1,"storage_tier":"device","event":{"event_id":0,"dp_rank":0,"data":{"stored":{"parent_hash":null,"start_position":null,"blocks":[{"block_hash":-1,"tokens_hash":5,"mm_extra_info":null},{"block_hash":7,"tokens_hash":6,"mm_extra_info":{"mm_objects":[]}}]}}}},
	 {"worker_id":1,"storage_tier":"device","event":{"event_id":1,"dp_rank":0,"data":{"removed":{"block_hashes":[7]}}},"extra":true},
	 {"worker_id":2,"storage_tier":"device","event":{"event_id":2,"dp_rank":0,"data":"cleared"}}]}}`
	d, err := DecodeDump([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	ix, _ := New(Config{BlockSize: 16})
	if n, err := ix.Replay(time.Unix(0, 0), d["m:default"].Events); n != 0 {
		t.Fatal(err)
	}
	got := ix.Match([]uint64{5, 6}, false, nil)
	if len(got) != 1 || got[0].Device != 1 {
		t.Fatalf("match = %+v, want worker 1 with 1 block", got)
	}
	ev, _ := d["m:default"].Events[0].ToEvent()
	if ev.Blocks[0].Ext != 1<<64-1 {
		t.Fatalf("signed hash -1 decoded as %d", ev.Blocks[0].Ext)
	}
}

func TestDecodeDumpRejects(t *testing.T) {
	for name, body := range map[string]string{
		"not json":        `{`,
		"no colon":        `{"model":{"block_size":1,"events":[]}}`,
		"zero block size": `{"m:g":{"block_size":0,"events":[]}}`,
		"bad tier":        `{"m:g":{"block_size":1,"events":[{"worker_id":1,"storage_tier":"gpu","event":{"event_id":0,"dp_rank":0,"data":"cleared"}}]}}`,
		"two variants":    `{"m:g":{"block_size":1,"events":[{"worker_id":1,"storage_tier":"device","event":{"event_id":0,"dp_rank":0,"data":{"stored":{"blocks":[]},"removed":{"block_hashes":[]}}}}]}}`,
		"no data":         `{"m:g":{"block_size":1,"events":[{"worker_id":1,"storage_tier":"device","event":{"event_id":0,"dp_rank":0}}]}}`,
		"hash overflow":   `{"m:g":{"block_size":1,"events":[{"worker_id":1,"storage_tier":"device","event":{"event_id":0,"dp_rank":0,"data":{"removed":{"block_hashes":[18446744073709551616]}}}}]}}`,
		"float hash":      `{"m:g":{"block_size":1,"events":[{"worker_id":1,"storage_tier":"device","event":{"event_id":0,"dp_rank":0,"data":{"removed":{"block_hashes":[1.5]}}}}]}}`,
	} {
		if _, err := DecodeDump([]byte(body)); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
}

func TestReplayReportsFailures(t *testing.T) {
	ix, _ := New(Config{BlockSize: 16})
	ph := Hash(42)
	evs := []RouterEvent{
		{WorkerID: 1, StorageTier: "device", Event: KvCacheEvent{Data: EventData{Stored: &StoredData{ParentHash: &ph, Blocks: []StoredBlock{{BlockHash: 1, TokensHash: 1}}}}}},
		{WorkerID: 1, StorageTier: "device", Event: KvCacheEvent{Data: EventData{Stored: &StoredData{Blocks: []StoredBlock{{BlockHash: 2, TokensHash: 2}}}}}},
	}
	n, err := ix.Replay(time.Unix(0, 0), evs)
	if n != 1 || !errors.Is(err, ErrParentNotFound) {
		t.Fatalf("failed = %d, err = %v; want 1 ParentNotFound", n, err)
	}
	if got := ix.Match([]uint64{2}, false, nil); len(got) != 1 {
		t.Fatal("the good event must still apply")
	}
}

// FuzzDecodeDump feeds arbitrary bytes to the /dump loader and replays whatever
// it accepts: neither may panic, and an accepted dump must replay and re-dump.
func FuzzDecodeDump(f *testing.F) {
	tr := NewTree()
	_ = tr.Apply(stored(w(1), 0, 1, 2, 3))
	_ = tr.Apply(onTier(stored(w(2), 0, 1), TierDisk))
	seed, _ := json.Marshal(Dump{"m:g": {BlockSize: 16, Events: tr.appendSnapshot(nil)}})
	f.Add(seed)
	f.Add([]byte(`{"m:g":{"block_size":1,"events":[{"worker_id":1,"storage_tier":"device","event":{"event_id":0,"dp_rank":0,"data":"cleared"}}]}}`))
	f.Add([]byte(`{"a:b":{"block_size":2,"events":[{"worker_id":3,"event":{"event_id":1,"dp_rank":2,"data":{"removed":{"block_hashes":[-3,4]}}}}]}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := DecodeDump(b)
		if err != nil {
			return
		}
		for _, p := range d {
			ix, err := New(Config{BlockSize: p.BlockSize})
			if err != nil {
				t.Fatal(err)
			}
			ix.Replay(time.Unix(0, 0), p.Events)
			snap := ix.Snapshot()
			if _, err := json.Marshal(snap); err != nil {
				t.Fatal(err)
			}
			ix2, _ := New(Config{BlockSize: p.BlockSize})
			if n, err := ix2.Replay(time.Unix(0, 0), snap.Events); n != 0 {
				t.Fatalf("a snapshot must replay cleanly: %v", err)
			}
		}
	})
}
