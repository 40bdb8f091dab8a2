package index

import (
	"errors"
	"slices"
	"testing"
)

// Dynamo's index tests derive the engine hash from the local hash (ext = local ×
// 100, worker-independent); these helpers do the same.
func chain(locals ...uint64) []Block {
	b := make([]Block, len(locals))
	for i, l := range locals {
		b[i] = Block{Ext: l * 100, Local: l}
	}
	return b
}

func w(id uint64) WorkerKey { return WorkerKey{WorkerID: id} }

func stored(wk WorkerKey, parent uint64, locals ...uint64) *Event {
	ev := &Event{Worker: wk, Kind: EventStored, Blocks: chain(locals...)}
	if parent != 0 {
		ev.Parent, ev.HasParent = parent*100, true
	}
	return ev
}

func removed(wk WorkerKey, locals ...uint64) *Event {
	h := make([]uint64, len(locals))
	for i, l := range locals {
		h[i] = l * 100
	}
	return &Event{Worker: wk, Kind: EventRemoved, Hashes: h}
}

func onTier(ev *Event, t Tier) *Event { ev.Tier = t; return ev }

// scores returns worker → device blocks, like Dynamo's OverlapScores.scores.
func scores(t *Tree, early bool, locals ...uint64) map[WorkerKey]uint32 {
	out := map[WorkerKey]uint32{}
	for _, o := range t.Match(locals, early, nil) {
		out[o.Worker] = o.Device
	}
	return out
}

func mustApply(t *testing.T, tr *Tree, evs ...*Event) {
	t.Helper()
	for _, ev := range evs {
		if err := tr.Apply(ev); err != nil {
			t.Fatalf("apply %v: %v", ev.Kind, err)
		}
	}
}

func eq(t *testing.T, got, want map[WorkerKey]uint32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("scores = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("scores = %v, want %v", got, want)
		}
	}
}

func TestFindMatchesDivergingWorkers(t *testing.T) {
	tr := NewTree()
	mustApply(t, tr, stored(w(1), 0, 1, 2, 3), stored(w(2), 0, 1, 4, 5))
	eq(t, scores(tr, false, 1, 2, 3), map[WorkerKey]uint32{w(1): 3, w(2): 1})
	eq(t, scores(tr, false, 1, 4, 5, 6), map[WorkerKey]uint32{w(1): 1, w(2): 3})
	eq(t, scores(tr, false, 9), map[WorkerKey]uint32{})
	eq(t, scores(tr, false), map[WorkerKey]uint32{})
}

func TestStoreWithParentExtendsChain(t *testing.T) {
	tr := NewTree()
	mustApply(t, tr, stored(w(1), 0, 1, 2), stored(w(1), 2, 3, 4))
	eq(t, scores(tr, false, 1, 2, 3, 4, 5), map[WorkerKey]uint32{w(1): 4})
	if got := tr.Held(w(1), TierDevice); got != 4 {
		t.Fatalf("tree size = %d, want 4", got)
	}
}

func TestParentNotFoundDropsWholeEvent(t *testing.T) {
	tr := NewTree()
	for _, ev := range []*Event{stored(w(1), 7, 1, 2), stored(w(2), 0, 1)} {
		_ = tr.Apply(ev)
	}
	if err := tr.Apply(stored(w(2), 9, 5)); !errors.Is(err, ErrParentNotFound) {
		t.Fatalf("err = %v, want ErrParentNotFound", err)
	}
	// Worker 1's parent is held by worker 2 only: still not found for worker 1.
	if err := tr.Apply(stored(w(1), 1, 2)); !errors.Is(err, ErrParentNotFound) {
		t.Fatalf("err = %v, want ErrParentNotFound", err)
	}
	eq(t, scores(tr, false, 1, 2), map[WorkerKey]uint32{w(2): 1})
}

func TestInvalidBlockSequence(t *testing.T) {
	tr := NewTree()
	mustApply(t, tr, stored(w(0), 0, 1))
	for name, ev := range map[string]*Event{
		"block equals parent": stored(w(0), 1, 1, 2),
		"repeated block":      stored(w(0), 0, 5, 6, 5),
		"long repeated block": {Worker: w(0), Kind: EventStored, Blocks: append(chain(seqLocals(100, 200)...), chain(150)...)},
		"long block = parent": {Worker: w(0), Kind: EventStored, Parent: 100, HasParent: true, Blocks: append(chain(seqLocals(100, 200)...), chain(1)...)},
	} {
		if err := tr.Apply(ev); !errors.Is(err, ErrInvalidBlockSequence) {
			t.Errorf("%s: err = %v, want ErrInvalidBlockSequence", name, err)
		}
	}
	eq(t, scores(tr, false, 1, 2), map[WorkerKey]uint32{w(0): 1})
	eq(t, scores(tr, false, 5), map[WorkerKey]uint32{})
}

func seqLocals(from, to uint64) []uint64 {
	var out []uint64
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

func TestDPRanksAreSeparateCandidates(t *testing.T) {
	tr := NewTree()
	r0, r1 := WorkerKey{5, 0}, WorkerKey{5, 1}
	mustApply(t, tr, stored(r0, 0, 1, 2, 3), stored(r1, 0, 1, 2))
	eq(t, scores(tr, false, 1, 2, 3), map[WorkerKey]uint32{r0: 3, r1: 2})
	// Clearing rank 1 leaves rank 0 alone.
	mustApply(t, tr, &Event{Worker: r1, Kind: EventCleared})
	eq(t, scores(tr, false, 1, 2, 3), map[WorkerKey]uint32{r0: 3})
	// A parent held by another rank of the same worker is not this rank's parent.
	if err := tr.Apply(stored(r1, 3, 4)); !errors.Is(err, ErrParentNotFound) {
		t.Fatalf("err = %v, want ErrParentNotFound", err)
	}
}

func TestEarlyExitStopsAtSingleCandidate(t *testing.T) {
	tr := NewTree()
	mustApply(t, tr, stored(w(1), 0, 1, 2, 3, 4), stored(w(2), 0, 1, 2))
	eq(t, scores(tr, false, 1, 2, 3, 4), map[WorkerKey]uint32{w(1): 4, w(2): 2})
	// w2 drops out at block 3; w1 is then alone, so the walk stops there.
	eq(t, scores(tr, true, 1, 2, 3, 4), map[WorkerKey]uint32{w(1): 3, w(2): 2})
	// A single owner from the first block stops right away.
	mustApply(t, tr, stored(w(3), 0, 9, 8, 7))
	eq(t, scores(tr, true, 9, 8, 7), map[WorkerKey]uint32{w(3): 1})
}

func TestRemoveIsPerBlockAndNotCascading(t *testing.T) {
	tr := NewTree()
	mustApply(t, tr, stored(w(1), 0, 1, 2, 3), stored(w(2), 0, 1, 2, 3))
	mustApply(t, tr, removed(w(1), 3))
	eq(t, scores(tr, false, 1, 2, 3), map[WorkerKey]uint32{w(1): 2, w(2): 3})
	// Removing a middle block cuts the worker's prefix there; its descendant
	// handle survives and can still be removed without error.
	mustApply(t, tr, removed(w(2), 2))
	eq(t, scores(tr, false, 1, 2, 3), map[WorkerKey]uint32{w(1): 2, w(2): 1})
	mustApply(t, tr, removed(w(2), 3))
	if err := tr.Apply(removed(w(2), 3)); !errors.Is(err, ErrBlockNotFound) {
		t.Fatalf("second remove: err = %v, want ErrBlockNotFound", err)
	}
}

func TestBatchedRemovalDuplicatesAndMissing(t *testing.T) {
	build := func() *Tree {
		tr := NewTree()
		mustApply(t, tr, stored(w(0), 0, 1, 2, 3, 4), stored(w(1), 0, 1, 2, 5))
		return tr
	}
	serial := build()
	mustApply(t, serial, removed(w(0), 4), removed(w(0), 2))
	for _, order := range [][]uint64{{4, 2}, {2, 4}, {4, 2, 2}} {
		b := build()
		mustApply(t, b, removed(w(0), order...))
		if got, want := b.appendSnapshot(nil), serial.appendSnapshot(nil); !dumpEqual(got, want) {
			t.Fatalf("remove %v: dump differs from serial removal", order)
		}
	}
	missing := build()
	if err := missing.Apply(removed(w(0), 999, 3, 3)); !errors.Is(err, ErrBlockNotFound) {
		t.Fatalf("err = %v, want ErrBlockNotFound", err)
	}
	want := build()
	mustApply(t, want, removed(w(0), 3))
	if !dumpEqual(missing.appendSnapshot(nil), want.appendSnapshot(nil)) {
		t.Fatal("a removal with a missing hash must still remove the others")
	}
}

func TestRemoveMidChainLeavesHole(t *testing.T) {
	// Dynamo's test_remove_mid_chain_block and reference.rs: after removing block
	// 2, the worker matches only [1]; re-storing 2 under 1 gives a score between
	// the reachable prefix (2) and the held prefix (4).
	tr := NewTree()
	mustApply(t, tr, stored(w(0), 0, 1, 2, 3, 4), removed(w(0), 2))
	eq(t, scores(tr, false, 1, 2, 3, 4), map[WorkerKey]uint32{w(0): 1})
	mustApply(t, tr, stored(w(0), 1, 2))
	got := scores(tr, false, 1, 2, 3, 4)[w(0)]
	if got < 2 || got > 4 {
		t.Fatalf("score after re-store = %d, want within [2, 4]", got)
	}
	// Re-storing the rest through a reachable parent reconnects it.
	mustApply(t, tr, stored(w(0), 2, 3, 4))
	eq(t, scores(tr, false, 1, 2, 3, 4), map[WorkerKey]uint32{w(0): 4})
}

func TestClearAndRemoveWorker(t *testing.T) {
	tr := NewTree()
	r0, r1 := WorkerKey{1, 0}, WorkerKey{1, 1}
	mustApply(t, tr, stored(r0, 0, 1, 2), stored(r1, 0, 1, 2), stored(w(2), 0, 1, 2))
	mustApply(t, tr, &Event{Worker: w(2), Kind: EventCleared})
	eq(t, scores(tr, false, 1, 2), map[WorkerKey]uint32{r0: 2, r1: 2})
	// A cleared worker can store again from the root.
	mustApply(t, tr, stored(w(2), 0, 1))
	tr.RemoveWorker(1)
	eq(t, scores(tr, false, 1, 2), map[WorkerKey]uint32{w(2): 1})
	tr.RemoveWorker(2)
	if s := tr.Stats(); s.Nodes != 0 || s.Entries != 0 || s.OwnerSets != 0 || s.Workers != 0 {
		t.Fatalf("after removing every worker: %+v, want an empty tree", s)
	}
}

func TestSharedContentDifferentEngineHashes(t *testing.T) {
	// Two engines hash the same tokens differently; the tree keys on content, so
	// they share nodes, and each removes with its own hashes.
	tr := NewTree()
	a := &Event{Worker: w(1), Kind: EventStored, Blocks: []Block{{Ext: 11, Local: 1}, {Ext: 12, Local: 2}}}
	b := &Event{Worker: w(2), Kind: EventStored, Blocks: []Block{{Ext: 21, Local: 1}, {Ext: 22, Local: 2}}}
	mustApply(t, tr, a, b)
	if s := tr.Stats(); s.Nodes != 2 || s.Entries != 4 {
		t.Fatalf("stats = %+v, want 2 shared nodes and 4 entries", s)
	}
	mustApply(t, tr, &Event{Worker: w(2), Kind: EventRemoved, Hashes: []uint64{22}})
	eq(t, scores(tr, false, 1, 2), map[WorkerKey]uint32{w(1): 2, w(2): 1})
	if err := tr.Apply(&Event{Worker: w(2), Kind: EventRemoved, Hashes: []uint64{12}}); !errors.Is(err, ErrBlockNotFound) {
		t.Fatalf("removing another worker's hash: err = %v, want ErrBlockNotFound", err)
	}
}

func TestEngineHashReusedForOtherContent(t *testing.T) {
	tr := NewTree()
	mustApply(t, tr,
		&Event{Worker: w(1), Kind: EventStored, Blocks: []Block{{Ext: 7, Local: 1}}},
		&Event{Worker: w(1), Kind: EventStored, Blocks: []Block{{Ext: 7, Local: 2}}})
	eq(t, scores(tr, false, 1), map[WorkerKey]uint32{})
	eq(t, scores(tr, false, 2), map[WorkerKey]uint32{w(1): 1})
	mustApply(t, tr, &Event{Worker: w(1), Kind: EventRemoved, Hashes: []uint64{7}})
	if s := tr.Stats(); s.Nodes != 0 || s.Entries != 0 {
		t.Fatalf("stats = %+v, want empty", s)
	}
}

func TestTieredOverlap(t *testing.T) {
	tr := NewTree()
	// Worker 1: device [1,2], host continues [3,4], disk [5], external [6].
	mustApply(t, tr,
		stored(w(1), 0, 1, 2),
		onTier(stored(w(1), 2, 3, 4), TierHostPinned),
		onTier(stored(w(1), 4, 5), TierDisk),
		onTier(stored(w(1), 5, 6), TierExternal),
		// Worker 2: nothing on device, host from the root [1,2,3].
		onTier(stored(w(2), 0, 1, 2, 3), TierHostPinned),
		// Worker 3: device [1,2,3] and a host copy of [1,2] (offload keeps both).
		stored(w(3), 0, 1, 2, 3),
		onTier(stored(w(3), 0, 1, 2), TierHostPinned),
	)
	got := map[WorkerKey]Overlap{}
	for _, o := range tr.Match([]uint64{1, 2, 3, 4, 5, 6, 7}, false, nil) {
		got[o.Worker] = o
	}
	want := map[WorkerKey]Overlap{
		w(1): {Worker: w(1), Device: 2, Host: 2, Disk: 1, External: 1},
		w(2): {Worker: w(2), Host: 3},
		w(3): {Worker: w(3), Device: 3},
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%v: got %+v, want %+v", k, got[k], v)
		}
	}
	if got := want[w(1)].Cumulative(); got != (Breakdown{GPU: 2, CPU: 4, Disk: 6, LongestMatched: 6}) {
		t.Fatalf("cumulative = %+v, want 2 4 6 6", got)
	}
	// A DP engine reports the max over its ranks, tier by tier.
	per := PerInstance([]Overlap{
		{Worker: WorkerKey{7, 0}, Device: 3},
		{Worker: WorkerKey{7, 1}, Device: 1, Host: 4},
		{Worker: WorkerKey{8, 0}, Disk: 2},
	})
	if per[7] != (Breakdown{GPU: 3, CPU: 5, Disk: 5, LongestMatched: 5}) || per[8] != (Breakdown{Disk: 2, LongestMatched: 2}) {
		t.Fatalf("per instance = %+v", per)
	}
	// Removing a host block of worker 1 cuts its host run and the tiers after it.
	mustApply(t, tr, onTier(removed(w(1), 4), TierHostPinned))
	for _, o := range tr.Match([]uint64{1, 2, 3, 4, 5, 6}, false, nil) {
		if o.Worker == w(1) && (o.Device != 2 || o.Host != 1 || o.Disk != 0 || o.External != 0) {
			t.Fatalf("after host removal: %+v, want device 2 host 1", o)
		}
	}
	// Clearing the device tier keeps the lower tiers.
	mustApply(t, tr, &Event{Worker: w(3), Kind: EventCleared})
	for _, o := range tr.Match([]uint64{1, 2, 3}, false, nil) {
		if o.Worker == w(3) && (o.Device != 0 || o.Host != 2) {
			t.Fatalf("after device clear: %+v, want host 2", o)
		}
	}
}

func TestInvalidEvents(t *testing.T) {
	tr := NewTree()
	for _, ev := range []*Event{{Kind: 9}, {Kind: EventStored, Tier: 7}} {
		if err := tr.Apply(ev); !errors.Is(err, ErrInvalidEvent) {
			t.Errorf("%+v: err = %v, want ErrInvalidEvent", ev, err)
		}
	}
	// Removing from, or clearing, an unknown worker is harmless.
	if err := tr.Apply(removed(w(4), 1)); !errors.Is(err, ErrBlockNotFound) {
		t.Fatalf("err = %v", err)
	}
	mustApply(t, tr, &Event{Worker: w(4), Kind: EventCleared})
	tr.RemoveWorker(4)
	tr.RemoveRank(w(4))
	if tr.Stats() != (Stats{}) {
		t.Fatalf("stats = %+v, want zero", tr.Stats())
	}
}

func TestMatchDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector drops pooled scratch on purpose")
	}
	tr := NewTree()
	for i := range 8 {
		mustApply(t, tr, stored(w(uint64(i)), 0, seqLocals(1, uint64(2+i*10))...))
	}
	q := seqLocals(1, 100)
	dst := make([]Overlap, 0, 16)
	tr.Match(q, false, dst) // warm the pool
	if n := testing.AllocsPerRun(100, func() { dst = tr.Match(q, false, dst[:0]) }); n != 0 {
		t.Fatalf("Match allocates %.1f times per call", n)
	}
	if !slices.ContainsFunc(dst, func(o Overlap) bool { return o.Worker == w(7) && o.Device == 71 }) {
		t.Fatalf("unexpected result %v", dst)
	}
}

// TestParentZeroReadAsRoot: llm-d-inference-sim's array encoding writes parent
// 0 for a chain that starts at the root. That reads as the root unless the
// worker holds a block whose engine hash is 0, when it is that block.
func TestParentZeroReadAsRoot(t *testing.T) {
	wk := WorkerKey{WorkerID: 1}
	zeroParent := func(locals ...uint64) *Event {
		ev := stored(wk, 0, locals...)
		ev.Parent, ev.HasParent = 0, true
		return ev
	}
	tests := []struct {
		name   string
		events []*Event
		query  []uint64
		want   int // matched blocks of w
	}{
		{"first chain of an unknown worker", []*Event{zeroParent(1, 2, 3)}, []uint64{1, 2, 3}, 3},
		{"second root chain of a known worker", []*Event{stored(wk, 0, 7), zeroParent(1, 2)}, []uint64{1, 2}, 2},
		{"child of a real block whose hash is 0", []*Event{
			{Worker: wk, Kind: EventStored, Blocks: []Block{{Ext: 0, Local: 5}}},
			zeroParent(6),
		}, []uint64{5, 6}, 2},
		{"a nonzero unknown parent is still rejected", []*Event{stored(wk, 9, 1, 2)}, []uint64{1, 2}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := NewTree()
			for _, ev := range tc.events {
				_ = tr.Apply(ev)
			}
			got := 0
			for _, m := range tr.Match(tc.query, false, nil) {
				if m.Worker == wk {
					got = int(m.Device)
				}
			}
			if got != tc.want {
				t.Fatalf("matched %d blocks, want %d", got, tc.want)
			}
		})
	}
}

// TestMatchRowsComeInKeyOrder: rows come in (worker id, dp rank) order
// whatever order the ranks first appeared in, when they leave the walk, and
// whether few rows are sorted or many are placed along byKey; a rank removed
// and another stored after it (a reused slot) take their key's place.
func TestMatchRowsComeInKeyOrder(t *testing.T) {
	tests := []struct {
		name    string
		ranks   int
		holders int // ranks holding a prefix of the query, the rest another chain
		remove  []int
	}{
		{name: "every rank matches", ranks: 300, holders: 300},
		{name: "a few of many ranks match", ranks: 300, holders: 5},
		{name: "half match", ranks: 64, holders: 32},
		{name: "slots reused after removals", ranks: 200, holders: 150, remove: []int{0, 7, 99, 150, 199}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := NewTree()
			// Keys in a shuffled order, so slots are not in key order: the
			// worker id descends while the dp rank cycles.
			key := func(i int) WorkerKey {
				return WorkerKey{WorkerID: uint64(1000 - i/4), DPRank: uint32((i * 3) % 4)}
			}
			want := map[WorkerKey]uint32{}
			for i := range tc.ranks {
				if i < tc.holders {
					depth := uint64(1 + i%9) // each leaves the walk at its own depth
					mustApply(t, tr, stored(key(i), 0, seqLocals(1, 1+depth)...))
					want[key(i)] = uint32(depth)
				} else {
					mustApply(t, tr, stored(key(i), 0, seqLocals(500, 502)...))
				}
			}
			for _, i := range tc.remove {
				tr.RemoveRank(key(i))
				delete(want, key(i))
				fresh := WorkerKey{WorkerID: uint64(5000 + i)}
				mustApply(t, tr, stored(fresh, 0, 1, 2))
				want[fresh] = 2
			}
			for range 2 { // the second lookup reuses the pooled scratch
				rows := tr.Match(seqLocals(1, 20), false, []Overlap{{Worker: w(1)}})
				if rows[0].Worker != w(1) {
					t.Fatalf("the row already in dst moved: %v", rows[0])
				}
				rows = rows[1:]
				if !slices.IsSortedFunc(rows, CompareOverlaps) {
					t.Fatalf("rows not in key order: %v", rows)
				}
				got := map[WorkerKey]uint32{}
				for _, o := range rows {
					got[o.Worker] = o.Device
				}
				eq(t, got, want)
			}
		})
	}
}
