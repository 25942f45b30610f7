//go:build race

package testenv

// RaceEnabled reports whether the race detector is on. Allocation counts
// do not hold then (sync.Pool drops items on purpose): the tests that pin
// them run in a pass without -race (.ci/test.sh).
const RaceEnabled = true
