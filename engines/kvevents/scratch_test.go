package kvevents

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/kvselect/kvselect/selection/index"
)

// TestSharedScratchMatchesOwn: decoders sharing one Scratch, their batches
// interleaved, decode exactly what decoders with their own buffers do:
// events, stats, errors and event ids, failed batches included.
func TestSharedScratchMatchesOwn(t *testing.T) {
	cfgs := []Config{
		{WorkerID: wid, DPRank: 7, BlockSize: 2},
		{WorkerID: wid + 1, BlockSize: 2, Eagle: true},
		{WorkerID: wid + 2, DPRank: 1, BlockSize: 2, MaxNamespaceEntries: 3},
	}
	tests := []struct {
		name     string
		corpus   [][]byte
		trimEach bool
	}{
		{"one-pass corpus", onePassCorpus(), false},
		{"one-pass corpus, trimmed after each batch", onePassCorpus(), true},
		{"large and small batches", [][]byte{storedBatch(t, 8), warmBatch, storedBatch(t, 2*keepScratch), followBatch, storedBatch(t, 3)}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var shared Scratch
			var own, sharing []*Decoder
			for _, c := range cfgs {
				own = append(own, newDec(t, c))
				c.Scratch = &shared
				sharing = append(sharing, newDec(t, c))
			}
			for i, p := range tt.corpus {
				for k := range cfgs {
					// Every publisher decodes every payload, in turns, so
					// that each batch follows another decoder's in the
					// shared buffers.
					j := (i + k) % len(cfgs)
					a, b := own[j], sharing[j]
					gotA, stA, errA := a.Decode(p, nil)
					gotB, stB, errB := b.Decode(p, nil)
					if err := sameDecode(gotA, gotB, stA, stB, errA, errB); err != nil {
						t.Fatalf("payload %d, decoder %d: %v", i, j, err)
					}
					if a.NextID() != b.NextID() {
						t.Fatalf("payload %d, decoder %d: next id %d, shared %d", i, j, a.NextID(), b.NextID())
					}
					if tt.trimEach {
						a.Trim()
						b.Trim()
					}
				}
			}
		})
	}
}

// sameDecode reports how two decoders' results for one payload differ.
func sameDecode(gotA, gotB []index.Event, stA, stB Stats, errA, errB error) error {
	if (errA == nil) != (errB == nil) || errA != nil && errA.Error() != errB.Error() {
		return fmt.Errorf("errors: %v, shared %v", errA, errB)
	}
	if stA != stB {
		return fmt.Errorf("stats: %+v, shared %+v", stA, stB)
	}
	if !reflect.DeepEqual(normal(gotA), normal(gotB)) {
		return fmt.Errorf("events:\n%+v\nshared %+v", gotA, gotB)
	}
	return nil
}
