//go:build !race

package sizepool

const raceEnabled = false
