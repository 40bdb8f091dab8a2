package index

import "slices"

// RepeatsExt reports whether an engine hash repeats among ext(0), …,
// ext(n-1), parent included when hasParent: the chains Apply rejects with
// ErrInvalidBlockSequence (and a decoder turns into an empty removal, as
// Dynamo's convert.rs does).
//
// A chain of up to repeatsFilterMax hashes goes through a 2,048-bit filter on
// the stack and only a hash whose bit is already set is compared with the
// hashes before it: O(n) for the prefills and decode steps engines publish,
// where comparing every pair cost 1.5 µs for a 33-block prefill and sorting a
// copy 1.3 µs. Longer chains sort a copy, in *scratch if it is not nil
// (which keeps the copy's buffer for the next call).
func RepeatsExt(n int, parent uint64, hasParent bool, ext func(i int) uint64, scratch *[]uint64) bool {
	if n > repeatsFilterMax {
		var s []uint64
		if scratch != nil {
			s = (*scratch)[:0]
			defer func() { *scratch = s }()
		}
		for i := range n {
			s = append(s, ext(i))
		}
		if hasParent {
			s = append(s, parent)
		}
		slices.Sort(s)
		for i := 1; i < len(s); i++ {
			if s[i] == s[i-1] {
				return true
			}
		}
		return false
	}
	var bits [repeatsFilterBits / 64]uint64
	seen := func(h uint64) bool {
		b := (h * 0x9e3779b97f4a7c15) >> (64 - repeatsFilterLog)
		w, m := b>>6, uint64(1)<<(b&63)
		old := bits[w]&m != 0
		bits[w] |= m
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
