package loads

import (
	"math/bits"
	"time"

	"github.com/kvselect/kvselect/selection/index"
)

// Prompt blocks are identified by their tracking-hash path, not by the hash
// alone: Dynamo's newest BlockTracker is a compressed path trie
// (sequences/block_tracker.rs, compressed_path_arena.rs) and its read model a
// prompt-membership trie walked from the root (prompt_registry.rs). For
// server-computed chained hashes the two views coincide, since a sequence hash
// commits to its prefix; for client-supplied hashes that break the chain
// (the hash-only request form is trusted as-is, never re-hashed) the path view
// is what Dynamo counts, e.g. [1,2] and [3,2] are four blocks, not three.
//
// Layout: a path is named by one 64-bit path key that chains its hashes from
// the root (pathKey), so the trie needs no nodes: each rank keeps its held
// paths in one open-addressing table keyed by path key, holding the rank's
// reference count and decay weight inline, and each booking keeps its own
// path keys so Free and the decay walk revisit them without recomputing or a
// parent link. A prompt's path keys are computed once per call and probed
// against every rank. A rank's held paths are prefix-closed (a booking holds
// its whole path), so a prompt's prefix depth on a rank is a binary search
// over the prompt's path keys: O(log n) probes per rank.
//
// The earlier layout kept a partition-wide trie (nodes, a Go map of children)
// and per rank a Go map from node to slot: booking a block cost three map
// operations and a slot allocation, freeing it four, about 100 ns per block
// (BenchmarkAddFree128Blocks64Ranks), and Project spent most of its time in
// the partition walk and the per-rank maps. One probe into a rank's table per
// block and operation measures about 14 ns per block for Add and Free
// together, and Project of 128 blocks over 64 ranks about 2.5 µs instead of
// 5. Go's swiss maps would still cost two operations per block (lookup, then
// insert or delete) plus a separate slot array for in-place reference counts.

// rootKey is the path key of the empty path. It is not zero so that a run of
// zero hashes still chains: with a zero root, pathKey(0, 0) = 0 and the
// client-supplied prompts [0] and [0, 0] would share every key.
const rootKey = 0x243f6a8885a308d3

// pathKey chains a block hash onto its parent's path key. Two different paths
// share a key only by a 64-bit collision, the same assumption every hash in
// the router makes.
func pathKey(parent, hash uint64) uint64 {
	return bits.RotateLeft64(parent*0x9e3779b97f4a7c15, 27) ^ hash
}

// appendPathKeys appends the path key of every prefix of hashes to dst.
func appendPathKeys(dst []uint64, hashes []uint64) []uint64 {
	k := uint64(rootKey)
	for _, h := range hashes {
		k = pathKey(k, h)
		dst = append(dst, k)
	}
	return dst
}

// slot is one rank's hold on a path. 24 bytes: the decay weight has to stay a
// float64 for the weights to sum exactly as Dynamo's f64 tracker does.
type slot struct {
	key     uint64 // path key
	frac    float64
	refs    int32 // live bookings on this rank whose prompt path passes here; 0 marks an empty slot
	hasFrac bool
}

// Table geometry. Linear probing stays short at up to 3/4 load (about 2.5
// slots for a hit and 8.5 for a miss, contiguous) and keeps a rank with 384
// held blocks in 12 KiB. A 1/2 limit measured no faster for Project (within
// the noise of a shared 2-core box) and only ~0.5 µs faster for Add+Free of
// 128 blocks, for twice the memory.
const (
	minSlots      = 16
	maxLoadNum    = 3
	maxLoadDenom  = 4
	fibonacciMult = 0x9e3779b97f4a7c15
	// shrinkSlots: a drained rank keeps a table up to this size (96 KiB,
	// prompts of ~3,000 blocks) for the next booking whatever the time,
	// and a larger one for longTableHold after its last booking.
	shrinkSlots = 4096
)

// longTableHold is how long a drained rank keeps a table larger than
// shrinkSlots (3 MiB for a 1M-token prompt) after its last booking. Long
// prompts come seconds apart on a rank (llm-d's 1M-token perf workload at a
// twentieth of its rate, one every two seconds over four engines), and a
// table dropped between them is allocated and cleared again by the next,
// with a page fault for every 4 KiB page the runtime has returned to the
// system meanwhile: on a virtual machine, 10–25 µs each. Thirty seconds
// without a long prompt on the rank gives the memory back.
const longTableHold = 30 * time.Second

// rank is one (worker, dp_rank)'s state. Block weights are kept as an exact
// count of unit-weight blocks plus a float sum of fractional ones, reset to
// zero when the last fractional block goes, so float drift never survives a
// drain.
type rank struct {
	key index.WorkerKey
	// held is the rank's path table: its length is the number of held paths
	// and its capacity the table size, so the slots are held[:cap(held)]
	// (a power of two, or nil before the first booking). The table
	// shrinks only at an upkeep (Expire) that finds the rank drained and
	// without a booking for longTableHold, and then only from beyond
	// shrinkSlots: a rank that drains and fills again does not allocate,
	// and a long prompt's table does not outlive the traffic that needed
	// it.
	held       []slot
	shift      uint8     // 64 - log2(cap(held))
	booked     bool      // a booking came since the last upkeep
	lastBooked time.Time // the upkeep that last saw booked
	unit       int       // blocks at weight 1
	fracN      int       // blocks carrying a decay fraction
	fracSum    float64
	prefill    int
	prefilling int // requests without prefill completion
	requests   int
}

func newRank(w index.WorkerKey) *rank { return &rank{key: w} }

func (r *rank) load() WorkerLoad {
	blocks := r.unit
	if r.fracSum != 0 {
		blocks = roundHalfAway(float64(r.unit) + r.fracSum)
	}
	return WorkerLoad{
		Worker:              r.key,
		ActivePrefillTokens: r.prefill,
		ActiveDecodeBlocks:  blocks,
		ActiveRequests:      r.requests,
		PrefillingRequests:  r.prefilling,
	}
}

// home is k's preferred slot. Path keys of root-level blocks are the client's
// hashes mixed with a constant, possibly small or sequential; Fibonacci
// hashing spreads them.
func (r *rank) home(k uint64) int { return int((k * fibonacciMult) >> r.shift) }

// find returns the index of k's slot in tab (= r.held[:cap(r.held)]), or -1.
func (r *rank) find(tab []slot, k uint64) int {
	if len(r.held) == 0 {
		return -1
	}
	mask := len(tab) - 1
	for i := r.home(k); ; i = (i + 1) & mask {
		s := &tab[i]
		if s.refs == 0 {
			return -1
		}
		if s.key == k {
			return i
		}
	}
}

// acquire adds one booking's prompt path, given as its path keys.
func (r *rank) acquire(keys []uint64) {
	r.booked = true
	if len(r.held) == 0 && len(keys)*maxLoadDenom > cap(r.held)*maxLoadNum {
		// An empty rank takes a long prompt: one table of its size
		// instead of a rehash at each doubling on the way there.
		r.growTo(len(keys))
	}
	tab := r.held[:cap(r.held)]
	n := len(r.held)
	for _, k := range keys {
		if (n+1)*maxLoadDenom > len(tab)*maxLoadNum {
			r.held = tab[:n]
			r.grow()
			tab = r.held[:cap(r.held)]
		}
		mask := len(tab) - 1
		i := r.home(k)
		for tab[i].refs != 0 && tab[i].key != k {
			i = (i + 1) & mask
		}
		s := &tab[i]
		if s.refs == 0 {
			*s = slot{key: k}
			n++
			r.unit++ // a new block starts at weight 1, even under a fractional parent
		}
		s.refs++
	}
	r.held = tab[:n]
}

// release drops one booking's prompt path, given as its path keys. It goes
// from the tail so each block leaves after every block below it, as in
// acquire's reverse.
func (r *rank) release(keys []uint64) {
	tab := r.held[:cap(r.held)]
	n := len(r.held)
	for j := len(keys) - 1; j >= 0; j-- {
		i := r.find(tab, keys[j])
		if i < 0 {
			panic("loads: released path not held")
		}
		s := &tab[i]
		if s.refs--; s.refs > 0 {
			continue
		}
		r.unweigh(s)
		r.remove(tab, i)
		n--
		r.held = tab[:n] // find reads the count
	}
}

// unweigh takes a path slot's weight, whole or fractional, off the rank's
// sums as the slot is let go.
func (r *rank) unweigh(s *slot) {
	if s.hasFrac {
		r.fracN--
		r.fracSum -= s.frac
	} else {
		r.unit--
	}
}

// releaseAll drops every held path at once: the rank's last booking leaves,
// so its path is all the table holds. A long prompt's path costs one pass
// over the table instead of a probe and a backward shift per block. The
// weights it subtracts are the same; a float sum left when the last
// fractional block goes is cleared by settle either way.
func (r *rank) releaseAll() {
	tab := r.held[:cap(r.held)]
	for i := range tab {
		s := &tab[i]
		if s.refs == 0 {
			continue
		}
		r.unweigh(s)
	}
	clear(tab)
	r.held = tab[:0]
}

// remove empties slot i by backward-shift deletion: later entries of the probe
// run move into the hole, so lookups never meet tombstones.
func (r *rank) remove(tab []slot, i int) {
	mask := len(tab) - 1
	for j := (i + 1) & mask; tab[j].refs != 0; j = (j + 1) & mask {
		home := r.home(tab[j].key)
		// Move j into the hole at i unless its home lies cyclically in (i, j].
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			tab[i] = tab[j]
			i = j
		}
	}
	tab[i] = slot{}
}

func (r *rank) grow() { r.resize(max(2*cap(r.held), minSlots)) }

// growTo sizes the table for at least entries held paths.
func (r *rank) growTo(entries int) {
	size := minSlots
	for entries*maxLoadDenom > size*maxLoadNum {
		size *= 2
	}
	if size > cap(r.held) {
		r.resize(size)
	}
}

// resize moves the held paths into a table of size slots (a power of two).
func (r *rank) resize(size int) {
	old := r.held[:cap(r.held)]
	tab := make([]slot, size)
	r.shift = uint8(64 - bits.TrailingZeros(uint(size)))
	mask := size - 1
	for _, s := range old {
		if s.refs == 0 {
			continue
		}
		i := r.home(s.key)
		for tab[i].refs != 0 {
			i = (i + 1) & mask
		}
		tab[i] = s
	}
	r.held = tab[:len(r.held)]
}

// setExclusiveFraction re-weights the suffix of the path (given as its path
// keys) that only one booking holds. Reference counts never grow towards the
// tail, so the exclusive blocks are exactly a suffix.
func (r *rank) setExclusiveFraction(keys []uint64, f float64) {
	tab := r.held[:cap(r.held)]
	for j := len(keys) - 1; j >= 0; j-- {
		s := &tab[r.find(tab, keys[j])]
		if s.refs != 1 {
			return
		}
		if s.hasFrac {
			r.fracSum += f - s.frac
		} else {
			r.unit--
			r.fracN++
			r.fracSum += f
		}
		s.hasFrac, s.frac = true, f
	}
}

// settle clears float residue once no fractional block is left.
func (r *rank) settle() {
	if r.fracN == 0 {
		r.fracSum = 0
	}
}

// depth is how many leading paths of keys (a prompt's path keys) this rank
// holds.
func (r *rank) depth(keys []uint64) int {
	if len(r.held) == 0 {
		return 0
	}
	tab := r.held[:cap(r.held)]
	// Most ranks share no prefix with a given prompt: one probe settles them
	// before the binary search.
	if len(keys) == 0 || r.find(tab, keys[0]) < 0 {
		return 0
	}
	lo, hi := 1, len(keys) // held on [0, lo), not held on [hi, len)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if r.find(tab, keys[mid]) >= 0 {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}
