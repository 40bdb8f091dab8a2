// Package stats summarises measured samples for the benchmarks: the one
// quantile every harness and simulation reports, and the spread of counts.
package stats

import (
	"cmp"
	"math"
	"slices"
)

// Quantile is the q-quantile (0 ≤ q ≤ 1) of samples: the sample at 0-based
// rank ⌊q·n⌋ in ascending order, the largest for q = 1, the zero value for no
// samples. When q·n is not a whole number that is the nearest-rank quantile;
// when it is, the sample just above (the upper median for q = 0.5 and an even
// n). samples is not modified.
func Quantile[T cmp.Ordered](samples []T, q float64) T {
	if len(samples) == 0 {
		var zero T
		return zero
	}
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	return SortedQuantile(sorted, q)
}

// SortedQuantile is Quantile of samples already in ascending order, without
// copying them: for several quantiles of one large set.
func SortedQuantile[T cmp.Ordered](sorted []T, q float64) T {
	if len(sorted) == 0 {
		var zero T
		return zero
	}
	return sorted[min(int(q*float64(len(sorted))), len(sorted)-1)]
}

// CV is the coefficient of variation of counts (the population standard
// deviation over the mean): 0 is a perfect spread, and so are no counts and
// all zeros.
func CV(counts []int) float64 {
	if len(counts) == 0 {
		return 0
	}
	var sum float64
	for _, v := range counts {
		sum += float64(v)
	}
	mean := sum / float64(len(counts))
	if mean == 0 {
		return 0
	}
	var ss float64
	for _, v := range counts {
		ss += (float64(v) - mean) * (float64(v) - mean)
	}
	return math.Sqrt(ss/float64(len(counts))) / mean
}
