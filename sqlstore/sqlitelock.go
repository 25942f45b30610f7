package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"
	"weak"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/backoff"
)

// SQLite has one writer per database. A write that finds the lock taken
// fails at once with SQLITE_BUSY (or waits out the connection's
// busy_timeout, if the user set one), and the statement did nothing. A
// Store on SQLite therefore
//
//   - queues its writes on a gate per *sql.DB, so that the goroutines of one
//     process take turns in order instead of polling the file lock (the
//     gate is shared by every Store on the same *sql.DB);
//   - retries a write that still meets SQLITE_BUSY (another process,
//     another *sql.DB on the file) with growing, jittered sleeps;
//   - gives up after LockTimeout with an error wrapping ErrBusy and
//     idem.ErrInProgress.
//
// Reads need no lock in WAL mode. On Postgres none of this applies.

// ErrBusy is wrapped by the error of an operation that gave up after
// LockTimeout waiting for SQLite's single writer or for a free connection:
// other work, on any key, held the database. It is idem.ErrBusy, so that a
// caller of any store (the HTTP middleware's transactional mode) matches
// it without knowing this package. The error wraps idem.ErrInProgress too,
// as it did before ErrBusy existed, for callers that retry that; a caller
// that tells the two apart (the HTTP middleware answers 503, not "key in
// flight") checks ErrBusy first. Postgres waits for the key's own row,
// never for the database: there ErrInProgress alone means that key is
// held.
var ErrBusy = idem.ErrBusy

// sqliteGates maps a *sql.DB, weakly, to its write gate: a channel of
// capacity one, held by the writer. The entry goes when the DB does.
var sqliteGates sync.Map // weak.Pointer[sql.DB] -> chan struct{}

func sqliteGate(db *sql.DB) chan struct{} {
	k := weak.Make(db)
	if g, ok := sqliteGates.Load(k); ok {
		return g.(chan struct{})
	}
	g, loaded := sqliteGates.LoadOrStore(k, make(chan struct{}, 1))
	if !loaded {
		runtime.AddCleanup(db, func(k weak.Pointer[sql.DB]) { sqliteGates.Delete(k) }, k)
	}
	return g.(chan struct{})
}

// exclusive runs f, which writes to the database, as SQLite's single writer:
// through the gate, then retrying while SQLite is busy, all within
// LockTimeout. On MySQL it runs f again after a deadlock (see
// retryDeadlock); on Postgres f just runs.
func (s *Store) exclusive(ctx context.Context, f func() error) error {
	if s.dialect == MySQL {
		return retryDeadlock(ctx, f)
	}
	if s.dialect != SQLite {
		return f()
	}
	deadline := time.Now().Add(s.lockTimeout)
	select {
	case s.gate <- struct{}{}:
	default:
		t := time.NewTimer(time.Until(deadline))
		select {
		case s.gate <- struct{}{}:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
			return fmt.Errorf("%w: %w: this process's SQLite writes were queued for LockTimeout %v", ErrBusy, idem.ErrInProgress, s.lockTimeout)
		}
	}
	defer func() { <-s.gate }()
	return s.retryBusy(ctx, deadline, f)
}

// locked runs f, which writes through q. In a transaction f just runs: the
// transaction took the gate and SQLite's lock, and a statement in it is
// never retried alone (a transaction whose first write met SQLITE_BUSY may
// hold a stale snapshot; it starts over whole).
func (s *Store) locked(ctx context.Context, q sqlQuerier, f func() error) error {
	if _, ok := q.(*sql.DB); !ok {
		return f()
	}
	return s.exclusive(ctx, f)
}

// reading runs f, which only reads through q, retrying the rare
// SQLITE_BUSY a WAL reader can meet.
func (s *Store) reading(ctx context.Context, q sqlQuerier, f func() error) error {
	if _, ok := q.(*sql.DB); !ok || s.dialect != SQLite {
		return f()
	}
	return s.retryBusy(ctx, time.Now().Add(s.lockTimeout), f)
}

// inTx runs f in a transaction and commits it; on SQLite as the single
// writer, starting over while SQLite is busy.
func (s *Store) inTx(ctx context.Context, f func(tx *sql.Tx) error) error {
	return s.exclusive(ctx, func() error {
		tx, err := s.db.BeginTx(ctx, s.txOptions())
		if err != nil {
			return err
		}
		if err := f(tx); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	})
}

// retryBusy runs f, and again while it fails with SQLITE_BUSY, until the
// deadline. The sleeps grow and are jittered, as SQLite's own busy handler's
// do, so it works whether or not the connections set busy_timeout.
func (s *Store) retryBusy(ctx context.Context, deadline time.Time, f func() error) error {
	err := f()
	b := backoff.Backoff{First: 500 * time.Microsecond, Most: 20 * time.Millisecond}
	for s.dialect == SQLite && isBusy(err) {
		d := b.Next()
		if time.Until(deadline) < d {
			return fmt.Errorf("%w: %w: SQLite's write lock was taken for LockTimeout %v: %w", ErrBusy, idem.ErrInProgress, s.lockTimeout, err)
		}
		if !backoff.Sleep(ctx, d) {
			return errors.Join(ctx.Err(), err)
		}
		err = f()
	}
	return err
}

// deadlockAttempts bounds how often a MySQL transaction (or single
// statement) is run again after InnoDB chose it as a deadlock's victim.
const deadlockAttempts = 5

// retryDeadlock runs f, and again, after a short jittered sleep, while it
// fails with a deadlock, at most deadlockAttempts times in all. f is a
// whole transaction or a statement on its own, never a statement inside a
// transaction: InnoDB rolled back the whole transaction, so running f again
// starts it afresh, and nothing of the failed attempt was committed. Run's
// attempts go here only up to its claim: a deadlock in write is write's.
func retryDeadlock(ctx context.Context, f func() error) error {
	err := f()
	b := backoff.Backoff{First: time.Millisecond, Most: 20 * time.Millisecond}
	for i := 1; i < deadlockAttempts && isDeadlock(err); i++ {
		if !backoff.Sleep(ctx, b.Next()) {
			return errors.Join(ctx.Err(), err)
		}
		err = f()
	}
	return err
}
