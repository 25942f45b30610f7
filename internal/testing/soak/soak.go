// Package soak is a crash soak of the consumer wrapper and of the SQL
// store's transactional mode, modelled on Kafka's transactional
// ("exactly once") system tests.
//
// A simulated broker, in the test process, delivers a set of message ids
// at least once to worker processes: it redelivers what is not acked within
// a visibility timeout, publishes some messages twice, injects duplicates of
// messages already acked, and SIGKILLs workers at random moments and right
// after they report an effect, before the confirmation. Workers are the
// test binary re-executed (TestMain calls RunWorker when IsWorker), so a kill
// is a real crash: no deferred call, no Forget, no Confirm runs.
//
// Each worker appends every effect to a ledger. In lease mode (Redis) the
// effect is an RPUSH done by a consumer.Idempotent or consumer.Batch
// handler, before the wrapper confirms; in transactional mode (Postgres) it
// is an INSERT into a table without a unique constraint, in the same
// sqlstore.Store.Run transaction as the record. Check then asserts that the
// ledger holds every input id and nothing else, that transactional mode did every
// message's work exactly once, and that every duplicate in lease mode is one
// that a kill between the effect and the confirmation (or reported lease
// trouble) explains.
package soak

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// Mode names the store and the way the work is recorded.
type Mode string

// The two modes a soak runs in.
const (
	// Redis is lease mode: the consumer wrapper over a RedisStore; the effect
	// is done before Confirm.
	Redis Mode = "redis"
	// SQL is transactional mode: sqlstore.Store.Run on Postgres; the effect
	// commits with the record.
	SQL Mode = "sql"
)

// Config describes one soak run. Zero durations and counts mean the
// defaults given on each field.
type Config struct {
	Mode     Mode
	Messages int // the input set: ids m0000000, m0000001, ...; required
	Workers  int // worker processes alive at a time. Default 4.
	Prefetch int // unacked deliveries per worker. Default 32.

	LeaseTTL   time.Duration // the stores' lease. Default 1s.
	Visibility time.Duration // unacked deliveries are redelivered after this. Default 2s.
	BusyDelay  time.Duration // redelivery delay after idem.ErrInProgress. Default 200ms.

	DupRate  float64 // share of messages published twice, close together. Default 0.
	LateDups int     // duplicates of already acked messages, spread over the run. Default 0.

	KillEvery       time.Duration // mean time between random kills; 0: none
	KillAfterEffect float64       // probability that a worker is killed as soon as it reports an effect
	MaxKills        int           // kills stop after this many, so the run converges
	Tail            time.Duration // bound of a random pause in the handler after the effect. Default 0.

	Timeout time.Duration // the run fails past this. Default 2m.

	RedisAddr   string // Redis mode
	PostgresDSN string // SQL mode
	// Command starts a worker: a binary whose main (a TestMain) calls
	// RunWorker when IsWorker. Required.
	Command []string
	Seed    uint64               // seeds the broker's random choices (their timing still varies); 0: random
	Logf    func(string, ...any) // progress lines; nil: none
}

// Report is what a run did and what Check found.
type Report struct {
	Mode                Mode
	Messages, Workers   int
	Deliveries          int // deliveries sent to workers, redeliveries and duplicates included
	Redeliveries        int // after the visibility timeout
	BusyNacks, ErrNacks int // nacks after idem.ErrInProgress / another error
	Acks, StaleAcks     int // stale: for a delivery already redelivered
	DupsPublished       int
	DupsLate            int
	Kills               int            // SIGKILLs in all
	KillsAfterEffect    int            // of them, right after an "effect done" line
	Spawns              int            // worker processes started
	LeaseEvents         map[string]int // lease trouble the workers reported, by kind
	Elapsed             time.Duration  // from the first spawn to the last ack
	Verdict
}

// String renders r as the lines of a test log.
func (r *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "mode %s: %d messages, %d workers, %v\n", r.Mode, r.Messages, r.Workers, r.Elapsed.Round(time.Millisecond))
	fmt.Fprintf(&b, "  deliveries %d (redelivered after visibility timeout %d; duplicates injected: %d published twice, %d after ack)\n",
		r.Deliveries, r.Redeliveries, r.DupsPublished, r.DupsLate)
	fmt.Fprintf(&b, "  acks %d (stale %d), nacks %d in-progress / %d error\n", r.Acks, r.StaleAcks, r.BusyNacks, r.ErrNacks)
	fmt.Fprintf(&b, "  kills %d (%d right after an effect), worker processes %d, effects interrupted by a kill before confirmation %d\n",
		r.Kills, r.KillsAfterEffect, r.Spawns, r.Interrupted)
	fmt.Fprintf(&b, "  ledger rows %d, duplicates %d: explained by a crash before the confirmation %d (%d after the \"effect done\" line, %d while the effect was in flight), by lease trouble %d, unexplained %d\n",
		r.Rows, r.Duplicates, r.CrashLogged+r.CrashUnlogged, r.CrashLogged, r.CrashUnlogged, r.LeaseExplained, r.Unexplained)
	if len(r.LeaseEvents) > 0 {
		fmt.Fprintf(&b, "  lease trouble reported by the wrappers %v; ids acked after ErrNotRecorded and left without a record %d\n", r.LeaseEvents, r.Unrecorded)
	}
	for _, p := range r.Problems {
		fmt.Fprintf(&b, "  PROBLEM: %s\n", p)
	}
	return b.String()
}

func (c *Config) defaults() error {
	if c.Mode != Redis && c.Mode != SQL {
		return fmt.Errorf("soak: unknown mode %q", c.Mode)
	}
	if c.Messages < 1 {
		return errors.New("soak: Messages must be positive")
	}
	if len(c.Command) == 0 {
		return errors.New("soak: no worker Command")
	}
	if c.Mode == Redis && c.RedisAddr == "" || c.Mode == SQL && c.PostgresDSN == "" {
		return fmt.Errorf("soak: mode %s needs its server's address", c.Mode)
	}
	if c.DupRate < 0 || c.DupRate > 1 || c.KillAfterEffect < 0 || c.KillAfterEffect > 1 {
		return errors.New("soak: DupRate and KillAfterEffect are probabilities, in [0, 1]")
	}
	if c.LateDups < 0 || c.MaxKills < 0 || c.KillEvery < 0 || c.Tail < 0 {
		return errors.New("soak: negative LateDups, MaxKills, KillEvery or Tail")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.LeaseTTL, time.Second)
	def(&c.Visibility, 2*time.Second)
	def(&c.BusyDelay, 200*time.Millisecond)
	def(&c.Timeout, 2*time.Minute)
	if c.Workers < 1 {
		c.Workers = 4
	}
	if c.Prefetch < 1 {
		c.Prefetch = 32
	}
	if c.Seed == 0 {
		c.Seed = rand.Uint64()
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	return nil
}

// ID returns the message id of input number i.
func ID(i int) string { return fmt.Sprintf("m%07d", i) }

// Run runs one soak and checks its ledger. The error reports a run that
// could not be carried out or did not finish (a worker that died on its
// own, the timeout, a server that failed); the report's Problems, what the
// check found wrong.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	run := fmt.Sprintf("%d%04x", time.Now().Unix()%1e6, rand.N(1<<16))
	var env target
	var err error
	switch cfg.Mode {
	case Redis:
		env, err = newRedisTarget(ctx, cfg.RedisAddr, run)
	case SQL:
		env, err = newSQLTarget(ctx, cfg.PostgresDSN, run)
	}
	if err != nil {
		return nil, err
	}
	defer env.close()

	b := newBroker(cfg, env)
	ids := make([]string, cfg.Messages)
	for i := range ids {
		ids[i] = ID(i)
	}
	rep, err := b.run(ctx, ids)
	if err != nil {
		return rep, err
	}
	cctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	rows, err := env.ledger(cctx)
	if err != nil {
		return rep, fmt.Errorf("soak: reading the ledger: %w", err)
	}
	recs, err := lookupAll(cctx, env, ids)
	if err != nil {
		return rep, fmt.Errorf("soak: reading the records: %w", err)
	}
	rep.Verdict = Check(ids, rows, recs, b.ev, cfg.Mode == SQL)
	return rep, nil
}
