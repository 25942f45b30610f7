package soak_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/idemgo/idem/internal/testing/soak"
	"github.com/idemgo/idem/internal/testing/testenv"
)

// TestMain lets the broker re-execute this test binary as a worker process
// (see soak.IsWorker), the usual way for a Go test to run a subprocess it
// can SIGKILL.
func TestMain(m *testing.M) {
	if soak.IsWorker() {
		os.Exit(soak.RunWorker())
	}
	os.Exit(m.Run())
}

// LongEnv selects the long soak (100k messages per mode, hundreds of kills),
// which `make soak` runs; without it the tests run the short soak that fits
// in `make test`. IDEM_SOAK_SEED seeds the broker's random choices, to
// repeat a run's as nearly as timing allows.
const (
	LongEnv = "IDEM_SOAK"
	SeedEnv = "IDEM_SOAK_SEED"
)

func config(t *testing.T, mode soak.Mode) soak.Config {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c := soak.Config{
		Mode:            mode,
		Messages:        2000,
		Workers:         4,
		LeaseTTL:        time.Second,
		Visibility:      2 * time.Second,
		DupRate:         0.05,
		LateDups:        100,
		KillEvery:       700 * time.Millisecond,
		KillAfterEffect: 0.004,
		MaxKills:        8,
		Tail:            time.Millisecond,
		Timeout:         60 * time.Second,
		Command:         []string{exe},
		Logf:            t.Logf,
	}
	if os.Getenv(LongEnv) == "1" {
		c.Messages = 100_000
		c.Workers = 6
		c.LateDups = 2000
		c.KillEvery = 500 * time.Millisecond
		c.KillAfterEffect = 0.002
		c.MaxKills = 300
		c.Timeout = 25 * time.Minute
	}
	if s := os.Getenv(SeedEnv); s != "" {
		if c.Seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", SeedEnv, s, err)
		}
	}
	return c
}

// TestSoakRedis: lease mode. Every message is done at least once, and the
// only duplicates are effects whose worker was killed before confirming.
func TestSoakRedis(t *testing.T) {
	c := config(t, soak.Redis)
	c.RedisAddr = testenv.Lookup(t, testenv.RedisAddrVar)
	runSoak(t, c)
}

// TestSoakSQL: transactional mode. Every message is done exactly once,
// however the kills fall.
func TestSoakSQL(t *testing.T) {
	c := config(t, soak.SQL)
	c.PostgresDSN = testenv.PostgresDSN(t)
	rep := runSoak(t, c)
	if rep != nil && rep.Duplicates != 0 {
		t.Errorf("transactional mode: %d duplicate ledger rows; want 0", rep.Duplicates)
	}
}

func runSoak(t *testing.T, c soak.Config) *soak.Report {
	t.Helper()
	if c.Seed == 0 {
		c.Seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (%s=%d repeats the broker's random choices)", c.Seed, SeedEnv, c.Seed)
	rep, err := soak.Run(context.Background(), c)
	if rep != nil {
		t.Logf("report:\n%s", rep)
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range rep.Problems {
		t.Errorf("check: %s", p)
	}
	// A run that crashed nobody or redelivered nothing tested nothing.
	if rep.Kills == 0 {
		t.Errorf("no worker was killed; want up to %d kills", c.MaxKills)
	}
	if rep.Redeliveries == 0 {
		t.Errorf("no delivery was redelivered after the visibility timeout; the kills should have left some unacked")
	}
	if rep.DupsLate != c.LateDups {
		t.Errorf("%d late duplicates injected; want %d", rep.DupsLate, c.LateDups)
	}
	return rep
}
