//go:build race

package index

// raceEnabled: the race detector makes sync.Pool drop a quarter of what is
// put back, on purpose, so allocation counts of pooled paths mean nothing.
const raceEnabled = true
