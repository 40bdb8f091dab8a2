//go:build !race

package loads

const raceEnabled = false
