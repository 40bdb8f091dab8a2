//go:build race

package kvevents

const raceEnabled = true
