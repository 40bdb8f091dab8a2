package index

import "math/bits"

// RepeatsExt reports whether an engine hash repeats among ext(0), …,
// ext(n-1), parent included when hasParent: the chains Apply rejects with
// ErrInvalidBlockSequence (and a decoder turns into an empty removal, as
// Dynamo's convert.rs does).
//
// A chain of up to repeatsFilterMax hashes goes through a 2,048-bit filter on
// the stack and only a hash whose bit is already set is compared with the
// hashes before it: O(n) for the prefills and decode steps engines publish,
// where comparing every pair cost 1.5 µs for a 33-block prefill and sorting a
// copy 1.3 µs. Longer chains go into an open-addressing set of twice their
// length, in *scratch if it is not nil (which keeps the table for the next
// call): O(n) again, where sorting a copy of a 1M-token prompt's 62,500
// hashes took milliseconds.
func RepeatsExt(n int, parent uint64, hasParent bool, ext func(i int) uint64, scratch *[]uint64) bool {
	if n > repeatsFilterMax {
		return repeatsSet(n, parent, hasParent, ext, scratch)
	}
	var seenBits [repeatsFilterBits / 64]uint64
	seen := func(h uint64) bool {
		b := (h * 0x9e3779b97f4a7c15) >> (64 - repeatsFilterLog)
		w, m := b>>6, uint64(1)<<(b&63)
		old := seenBits[w]&m != 0
		seenBits[w] |= m
		return old
	}
	// A decode step's one block, or a handful, is compared pair by pair:
	// that costs less than the filter.
	filter := n > repeatsPairwiseMax
	if filter && hasParent {
		seen(parent)
	}
	for i := range n {
		h := ext(i)
		if filter && !seen(h) {
			continue
		}
		// The bit was set: by an equal hash, or by chance (~n/2,048).
		if hasParent && h == parent {
			return true
		}
		for j := range i {
			if ext(j) == h {
				return true
			}
		}
	}
	return false
}

const (
	repeatsFilterLog   = 11
	repeatsFilterBits  = 1 << repeatsFilterLog
	repeatsFilterMax   = 256
	repeatsPairwiseMax = 8
)

// repeatsSet is RepeatsExt for long chains: a linear-probing set of the
// hashes, 0 marking an empty slot (a hash of 0 is tracked apart).
func repeatsSet(n int, parent uint64, hasParent bool, ext func(i int) uint64, scratch *[]uint64) bool {
	size := repeatsSetSize(n)
	log := bits.TrailingZeros(uint(size))
	var tab []uint64
	if scratch != nil && cap(*scratch) >= size {
		tab = (*scratch)[:size]
		clear(tab)
	} else {
		tab = make([]uint64, size)
		if scratch != nil {
			*scratch = tab
		}
	}
	mask, shift := uint64(size-1), uint(64-log)
	zero := false
	add := func(h uint64) (repeated bool) {
		if h == 0 {
			repeated, zero = zero, true
			return repeated
		}
		for i := (h * 0x9e3779b97f4a7c15) >> shift; ; i = (i + 1) & mask {
			switch tab[i] {
			case 0:
				tab[i] = h
				return false
			case h:
				return true
			}
		}
	}
	if hasParent {
		add(parent)
	}
	for i := range n {
		if add(ext(i)) {
			return true
		}
	}
	return false
}

// RepeatsScratch is the scratch length RepeatsExt uses for a chain of n
// hashes: 0 up to its filter's reach, else the slots of the set the chain
// (and a parent) is checked in, a power of two over twice their number so
// that probe runs stay short.
func RepeatsScratch(n int) int {
	if n <= repeatsFilterMax {
		return 0
	}
	return repeatsSetSize(n)
}

func repeatsSetSize(n int) int { return 1 << bits.Len(uint(2*(n+1))) }
