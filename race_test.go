//go:build race

package idem_test

// raceEnabled: the race detector is on, and sync.Pool drops items on
// purpose, so allocation counts do not hold.
const raceEnabled = true
