//go:build race

package loads

const raceEnabled = true
