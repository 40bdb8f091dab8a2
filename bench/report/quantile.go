package report

import (
	"slices"
	"time"
)

// Quantile is the q-quantile (0..1) of d by the nearest-rank method, 0 for
// no samples; d is not modified.
func Quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}
