package index

import (
	"math/rand/v2"
	"reflect"
	"testing"
)

// TestApplyBatchMatchesApply: ApplyBatch, which warms each batch's table
// slots and nodes first, leaves the index exactly as applying the same
// events one by one does, and fails the same events: engine steps of many
// ranks mixed with events that name unknown ranks, blocks and parents,
// repeat hashes, clear tiers and carry invalid tiers.
func TestApplyBatchMatchesApply(t *testing.T) {
	const engines = 12
	batched, err := New(Config{BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	single, _ := New(Config{BlockSize: 16})
	r := rand.New(rand.NewPCG(5, 6))
	blocks, hashes := make([]Block, 1), make([]uint64, 1)
	var evs []Event
	for k := range (fleetRequests + 8) * fleetBlocks {
		for w := range engines {
			evs = fleetStep(evs[:0], blocks, hashes, w, k)
			evs = append(evs, junk(r, w, k)...)
			if r.IntN(3) == 0 {
				// A long chain: more hashes than warm reads.
				chain := make([]Block, warmMax+r.IntN(warmMax))
				for i := range chain {
					chain[i] = Block{Ext: r.Uint64(), Local: r.Uint64()}
				}
				evs = append(evs, Event{Worker: evs[0].Worker, Kind: EventStored, Blocks: chain},
					Event{Worker: evs[0].Worker, Kind: EventRemoved, Hashes: []uint64{chain[len(chain)-1].Ext, chain[0].Ext}})
			}
			failed, first := batched.ApplyBatch(evs)
			var wantFailed int
			var wantFirst error
			for i := range evs {
				if err := single.Apply(&evs[i]); err != nil {
					wantFailed++
					if wantFirst == nil {
						wantFirst = err
					}
				}
			}
			if failed != wantFailed || (first == nil) != (wantFirst == nil) || first != nil && first.Error() != wantFirst.Error() {
				t.Fatalf("step %d engine %d: ApplyBatch failed %d (%v), Apply %d (%v)", k, w, failed, first, wantFailed, wantFirst)
			}
		}
	}
	if a, b := batched.Stats(), single.Stats(); a != b || a.Entries == 0 {
		t.Fatalf("stats: batched %+v, one by one %+v", a, b)
	}
	if a, b := batched.Snapshot(), single.Snapshot(); !reflect.DeepEqual(a, b) {
		t.Fatal("the batched index's snapshot differs from the one applied event by event")
	}
}

// junk is zero to two events of engine w at step k that the tree rejects or
// that touch what other events hold.
func junk(r *rand.Rand, w, k int) []Event {
	wk := WorkerKey{WorkerID: uint64(w / 8), DPRank: uint32(w % 8)}
	var out []Event
	for range r.IntN(3) {
		switch r.IntN(7) {
		case 0: // a block the rank does not hold, and one it may
			out = append(out, Event{Worker: wk, Kind: EventRemoved, Hashes: []uint64{r.Uint64(), fleetHash(w, k/fleetBlocks-1, r.IntN(fleetBlocks), 1)}})
		case 1: // an unknown parent
			out = append(out, Event{Worker: wk, Kind: EventStored, Parent: r.Uint64(), HasParent: true, Blocks: []Block{{Ext: r.Uint64(), Local: 1}}})
		case 2: // a repeated engine hash
			h := r.Uint64()
			out = append(out, Event{Worker: wk, Kind: EventStored, Blocks: []Block{{Ext: h, Local: 1}, {Ext: h, Local: 2}}})
		case 3: // a rank that never stored anything
			out = append(out, Event{Worker: WorkerKey{WorkerID: 1 << 40}, Kind: EventRemoved, Hashes: []uint64{1}})
		case 4: // an invalid tier
			out = append(out, Event{Worker: wk, Tier: numTiers, Kind: EventRemoved, Hashes: []uint64{1}})
		case 5: // the host tier, then clearing it
			out = append(out, Event{Worker: wk, Tier: TierHostPinned, Kind: EventStored, Blocks: []Block{{Ext: r.Uint64(), Local: 3}}})
			if r.IntN(4) == 0 {
				out = append(out, Event{Worker: wk, Tier: TierHostPinned, Kind: EventCleared})
			}
		default: // re-store a held block under another local hash (the engine reused its hash)
			out = append(out, Event{Worker: wk, Kind: EventStored, Blocks: []Block{{Ext: fleetHash(w, k/fleetBlocks-2, 0, 1), Local: r.Uint64()}}})
		}
	}
	return out
}
