package kvlisten

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/kvhash"
)

// A random engine workload and its ground truth: what the engine holds after
// every batch was applied in order. The interop and dropped-message tests
// publish the workload through real sockets (with some batches withheld from
// the live stream) and compare the index with the truth.

// wEvent is one engine event, independent of the encoder.
type wEvent struct {
	Kind   string // BlockStored, BlockRemoved, AllBlocksCleared
	Hashes []uint64
	Parent *uint64
	Tokens []uint32
	Lora   string
	Medium string
}

// wBlock is one block the engine stored.
type wBlock struct {
	path   []uint64 // local hashes from the root to this block
	medium string
	lora   string
	held   bool
}

type workload struct {
	batches [][]wEvent
	drop    []bool // batch i is withheld from the live stream
	blocks  map[uint64]*wBlock
	order   []uint64 // engine hashes in store order
}

// newWorkload builds n batches of random stores (new roots or extensions of a
// held block, GPU or CPU, some under a LoRA adapter), removals of single
// blocks and chain tails, and rare clears. dropRate is the share of batches
// withheld from the live stream.
func newWorkload(seed uint64, n int, dropRate float64) *workload {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	w := &workload{blocks: map[uint64]*wBlock{}}
	nextTok := uint32(1)
	held := func() []uint64 {
		var out []uint64
		for _, h := range w.order {
			if w.blocks[h].held {
				out = append(out, h)
			}
		}
		return out
	}
	for range n {
		var batch []wEvent
		for range 1 + rng.IntN(3) {
			hs := held()
			switch r := rng.IntN(100); {
			case r < 60 || len(hs) == 0: // store
				ev := wEvent{Kind: "BlockStored", Medium: "GPU"}
				var prefix []uint64
				if len(hs) > 0 && rng.IntN(2) == 0 {
					p := hs[rng.IntN(len(hs))]
					pb := w.blocks[p]
					ev.Parent, ev.Medium, ev.Lora, prefix = &p, pb.medium, pb.lora, pb.path
				} else {
					if rng.IntN(5) == 0 {
						ev.Medium = "CPU"
					}
					if rng.IntN(4) == 0 {
						ev.Lora = "adapter-a"
					}
				}
				nb := 1 + rng.IntN(6)
				for range nb * blockSize {
					ev.Tokens = append(ev.Tokens, nextTok)
					nextTok++
				}
				locals := kvhash.LocalBlockHashes(ev.Tokens, ev.Lora, "", kvhash.BlockOptions{BlockSize: blockSize})
				path := append([]uint64(nil), prefix...)
				for i := range nb {
					h := rng.Uint64()
					ev.Hashes = append(ev.Hashes, h)
					path = append(path, locals[i])
					w.blocks[h] = &wBlock{path: append([]uint64(nil), path...), medium: ev.Medium, lora: ev.Lora, held: true}
					w.order = append(w.order, h)
				}
				batch = append(batch, ev)
			case r < 97: // remove one block or a tail of the store order
				ev := wEvent{Kind: "BlockRemoved"}
				first := hs[rng.IntN(len(hs))]
				ev.Medium = w.blocks[first].medium
				ev.Hashes = []uint64{first}
				w.blocks[first].held = false
				batch = append(batch, ev)
			default:
				// AllBlocksCleared carries no medium: it clears the device tier.
				batch = append(batch, wEvent{Kind: "AllBlocksCleared"})
				for _, b := range w.blocks {
					if b.medium == "GPU" {
						b.held = false
					}
				}
			}
		}
		w.batches = append(w.batches, batch)
		w.drop = append(w.drop, rng.Float64() < dropRate)
	}
	return w
}

// check compares ix with the truth: for every block ever stored, the leading
// held blocks of its path on its tier, and the worker's device block count.
func (w *workload) check(ix *index.Index, wk index.WorkerKey) error {
	var heldGPU uint32
	for _, h := range w.order {
		b := w.blocks[h]
		if b.held && b.medium == "GPU" {
			heldGPU++
		}
	}
	held := map[string]map[uint64]bool{}
	for _, h := range w.order {
		if o := w.blocks[h]; o.held {
			if held[o.medium] == nil {
				held[o.medium] = map[uint64]bool{}
			}
			held[o.medium][pathKey(o.path)] = true
		}
	}
	for _, h := range w.order {
		b := w.blocks[h]
		want := leadingHeld(held[b.medium], b)
		var got index.Overlap
		for _, o := range ix.Match(b.path, false, nil) {
			if o.Worker == wk {
				got = o
			}
		}
		gotTier := got.Device
		if b.medium == "CPU" {
			gotTier = got.Host
		}
		if gotTier != want {
			return fmt.Errorf("block %#x (%s, path %d): %d leading blocks indexed, want %d (overlap %+v)",
				h, b.medium, len(b.path), gotTier, want, got)
		}
		if held := ix.Held(wk, index.TierDevice); got.Device != 0 && held != int(heldGPU) {
			return fmt.Errorf("worker holds %d device blocks in the index, want %d", held, heldGPU)
		}
	}
	return nil
}

// leadingHeld is how many leading blocks of b's path the engine holds on b's
// tier (byLocal: the held paths of that tier). Paths only ever extend blocks
// of the same tier.
func leadingHeld(byLocal map[uint64]bool, b *wBlock) uint32 {
	var n uint32
	for i := range b.path {
		if !byLocal[pathKey(b.path[:i+1])] {
			break
		}
		n++
	}
	return n
}

// pathKey folds a path of local hashes into one key (a sequence hash would do
// the same; collisions are not a concern at test sizes).
func pathKey(p []uint64) uint64 {
	var k uint64 = 1469598103934665603
	for _, h := range p {
		k = (k ^ h) * 1099511628211
	}
	return k
}

func TestWorkloadTruthSelfConsistent(t *testing.T) {
	w := newWorkload(1, 200, 0)
	stored, removed := 0, 0
	for _, b := range w.batches {
		for _, ev := range b {
			switch ev.Kind {
			case "BlockStored":
				stored += len(ev.Hashes)
			case "BlockRemoved":
				removed += len(ev.Hashes)
			}
		}
	}
	if stored < 200 || removed < 20 {
		t.Fatalf("workload too small: %d stored, %d removed", stored, removed)
	}
}
