//go:build race

package consumer_test

const raceEnabled = true
