package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/idemgo/idem"
)

// txKey is the context key under which Run hands the transaction to write.
type txKey struct{}

// TxFromContext returns the transaction of the Run whose write function
// received ctx (or a context derived from it), so that code deep in a
// handler joins the transaction that records the work.
func TxFromContext(ctx context.Context) (*sql.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(*sql.Tx)
	return tx, ok
}

// Run does the work of key once, in the transactional mode: one transaction
// claims key, runs write, records write's result and commits. The record and
// write's effects commit together or not at all, so there is no lease to
// lose and nothing to confirm later.
//
//   - The first Run of key runs write(ctx, tx) and returns its result, with
//     replayed false. ctx carries tx (TxFromContext). write must do its work
//     through tx and must not commit or roll it back: one that does (Commit,
//     Rollback, or a COMMIT or ROLLBACK statement through tx) gets an error
//     wrapping ErrTxEnded that says which, no record, and the key released
//     at once.
//   - A Run of a key whose work is recorded (by Run or by a lease-mode
//     Confirm, within retention) does not call write: it returns the
//     recorded result with replayed true, or idem.ErrFingerprintMismatch when
//     fingerprint differs from the recorded one.
//   - A Run that meets another Run of key in progress waits for it, for at
//     most LockTimeout, then replays what the first committed or, if the
//     first rolled back, runs write itself. Past LockTimeout it returns
//     idem.ErrInProgress.
//   - A key claimed by a live lease (Claim) is idem.ErrInProgress at once, or
//     idem.ErrFingerprintMismatch when the holder's fingerprint differs: a
//     lease can run for a long time, and its holder may still Confirm. Run
//     takes over a claim whose lease ran out, as Claim would.
//   - When write returns an error or panics, or the result exceeds
//     MaxResultBytes (idem.ErrTooLarge), or the commit fails, the transaction
//     rolls back: no record, no effect, and the next Run does the work. A
//     commit whose outcome is unknown (the connection died) is safe to
//     retry: the retry replays or runs, never both.
//
// On Postgres the transaction is READ COMMITTED, and SET LOCAL lock_timeout
// = LockTimeout bounds the wait for another Run's row; write's own
// statements run under the same lock_timeout. Lease-mode calls (Claim,
// Lookup, ...) on a key a Run holds wait for its transaction to end.
//
// On MySQL the transaction is READ COMMITTED too, and Run sets the
// session's innodb_lock_wait_timeout to LockTimeout (in whole seconds,
// rounded up) for its transaction, restoring the session's own value after
// it: two statements more than on Postgres. A deadlock met before write
// ran starts the Run over; one met by write's statements is write's error
// (InnoDB has rolled everything back: no record, no effect). Statements
// that commit implicitly (CREATE, ALTER, DROP, ...) end the transaction
// there: a write that sends one gets ErrTxEnded, as for a COMMIT.
//
// On SQLite there is one writer per database: a Run holds the database's
// write lock from its claim to its commit, so Runs of different keys, and
// every other write, wait for it too. A Run that cannot get the write lock
// within LockTimeout returns an error wrapping ErrBusy (and
// idem.ErrInProgress), whatever key holds it. Keep write short there.
//
// On both, a Run that gets no connection from db's pool within LockTimeout
// returns an error wrapping ErrBusy (and idem.ErrInProgress) too: it waited
// for the database, not for its key.
func (s *Store) Run(ctx context.Context, key string, fingerprint []byte,
	write func(ctx context.Context, tx *sql.Tx) ([]byte, error)) (result []byte, replayed bool, err error) {
	start := time.Now()
	defer func() {
		// A replay is a duplicate answered from the record; a run did the work.
		var o idem.Outcome
		if err == nil {
			o = idem.Claimed
			if replayed {
				o = idem.Duplicate
			}
		}
		s.core.Observe(ctx, idem.Event{Op: idem.OpRun, Outcome: o, Err: err}, key, start)
	}()
	if err := s.core.CheckClaim(key, fingerprint); err != nil {
		return nil, false, err
	}
	if write == nil {
		return nil, false, errors.New("sqlstore: Run with a nil write function")
	}
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	var final error
	// On SQLite the whole transaction is the single writer's. Only a claim
	// that met SQLite's write lock is started over; once write has run, its
	// error is final.
	err = s.exclusive(ctx, func() error {
		var claimErr error
		result, replayed, claimErr, final = s.run(ctx, key, nonNil(fingerprint), write)
		return claimErr
	})
	if err != nil {
		return nil, false, err
	}
	return result, replayed, final
}

// run is one attempt of Run. claimErr is an error met before write ran
// (which exclusive may start over on SQLite); err is write's error or one
// met after it.
func (s *Store) run(ctx context.Context, key string, fp []byte,
	write func(ctx context.Context, tx *sql.Tx) ([]byte, error)) (result []byte, replayed bool, claimErr, err error) {
	start := time.Now()
	conn, tx, release, err := s.beginBounded(ctx)
	if errors.Is(err, ErrBusy) {
		return nil, false, err, nil
	}
	if err != nil {
		return nil, false, s.fail("run", key, err), nil
	}
	lockWaitSet := false
	defer func() {
		if lockWaitSet {
			s.restoreLockWait(conn)
		}
		release()
	}()
	done := false
	defer func() {
		if !done { // also when write panics
			_ = tx.Rollback()
		}
	}()
	switch s.dialect {
	case Postgres:
		lt := strconv.FormatInt(s.lockTimeout.Milliseconds(), 10) + "ms"
		if _, err := tx.ExecContext(ctx, "SELECT set_config('lock_timeout', $1, true)", lt); err != nil {
			return nil, false, s.fail("run", key, err), nil
		}
	case MySQL:
		// MySQL has no SET LOCAL: the session's value is kept in a user
		// variable of the session and put back once the transaction ends.
		set := "SET @idem_lock_wait = @@SESSION.innodb_lock_wait_timeout, SESSION innodb_lock_wait_timeout = " +
			strconv.FormatInt(s.lockWaitSec, 10)
		if _, err := tx.ExecContext(ctx, set); err != nil {
			return nil, false, s.fail("run", key, err), nil
		}
		lockWaitSet = true
	}
	c, err := s.claimIn(ctx, tx, key, fp, start)
	if isLockTimeout(err) {
		return nil, false, fmt.Errorf("%w: run of %s: another Run held it for LockTimeout %v",
			idem.ErrInProgress, s.core.KeyName(key), s.lockTimeout), nil
	}
	if errors.Is(err, idem.ErrQuarantined) {
		return nil, false, err, nil
	}
	if err != nil {
		return nil, false, s.fail("run", key, err), nil
	}
	s.core.LogTakeOvers(ctx, []string{key}, []idem.Claim{c}, nil)
	switch c.Outcome {
	case idem.Duplicate, idem.InProgress:
		if err := s.core.FingerprintMismatch(c, key, fp); err != nil {
			return nil, false, err, nil
		}
		if c.Outcome == idem.InProgress {
			return nil, false, fmt.Errorf("%w: run of %s: a lease is held by %q until about %v",
				idem.ErrInProgress, s.core.KeyName(key), c.Record.Owner, c.Record.Expires.Format(time.RFC3339Nano)), nil
		}
		return c.Record.Result, true, nil, nil
	}
	result, err = write(context.WithValue(ctx, txKey{}, tx), tx)
	if err == nil && len(result) > s.o.MaxResultBytes {
		err = fmt.Errorf("%w: result of %d bytes for %s exceeds MaxResultBytes %d; the transaction was rolled back",
			idem.ErrTooLarge, len(result), s.core.KeyName(key), s.o.MaxResultBytes)
	}
	if err != nil && isDeadlock(err) {
		// InnoDB rolled back the whole transaction, the claim with it: the
		// key is free, nothing is recorded. Not started over: write may
		// have had effects outside the database.
		return nil, false, nil, fmt.Errorf("sqlstore: run of %s: the database rolled the transaction back (deadlock) "+
			"while write ran: nothing is recorded, and the key is free: %w", s.core.KeyName(key), err)
	}
	// A write that committed or rolled back the transaction itself: on
	// SQLite asked before the record, in process; on Postgres and MySQL
	// after a failed write, else the record statement finds out for free.
	if (err != nil || s.dialect == SQLite) && s.txEnded(ctx, tx) {
		done = true
		return nil, false, nil, s.release(ctx, conn, tx, key, c.Lease, err)
	}
	if err != nil {
		return nil, false, nil, err
	}
	ok, err := s.exec(ctx, tx, s.q.record, []byte(key), c.Lease.Token, nonNil(result), s.retentionMs)
	if errors.Is(err, sql.ErrTxDone) || err == nil && !ok && s.txEnded(ctx, tx) {
		done = true
		return nil, false, nil, s.release(ctx, conn, tx, key, c.Lease, nil)
	}
	if err == nil && !ok {
		err = errors.New("the claimed row is gone: did write change idem's table?")
	}
	if err != nil {
		return nil, false, nil, s.fail("run", key, err)
	}
	done = true
	if err := tx.Commit(); err != nil {
		return nil, false, nil, s.fail("run (commit)", key, err)
	}
	return result, false, nil, nil
}

// restoreLockWait puts back the session's innodb_lock_wait_timeout that Run
// changed on conn (MySQL). A connection it cannot restore is dropped from
// the pool rather than lend Run's lock wait to the pool's next user.
func (s *Store) restoreLockWait(conn *sql.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), s.lockTimeout)
	defer cancel()
	if _, err := conn.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = @idem_lock_wait"); err != nil {
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	}
}

// beginBounded begins Run's transaction on a connection taken from the pool
// within LockTimeout: waiting longer for one is waiting for the database,
// not for the key, and gives up with ErrBusy (wrapping ErrInProgress, as
// the other waits for the database do). release returns the connection to
// the pool; call it once the transaction has ended.
func (s *Store) beginBounded(ctx context.Context) (*sql.Conn, *sql.Tx, func(), error) {
	cctx, cancel := context.WithTimeout(ctx, s.lockTimeout)
	conn, err := s.db.Conn(cctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			return nil, nil, nil, fmt.Errorf("%w: %w: no database connection was free within LockTimeout %v", ErrBusy, idem.ErrInProgress, s.lockTimeout)
		}
		return nil, nil, nil, err
	}
	tx, err := conn.BeginTx(ctx, s.txOptions())
	if err != nil {
		_ = conn.Close()
		return nil, nil, nil, err
	}
	return conn, tx, func() { _ = conn.Close() }, nil
}

// ErrTxEnded is wrapped by the error of a Run whose write function
// committed or rolled back the transaction itself (tx.Commit, tx.Rollback,
// or a COMMIT or ROLLBACK statement sent through tx). The record could not
// commit with the effect, so Run records nothing and releases the key at
// once; the error says which it was. If write committed, its effects up to
// then are committed without a record, and the next Run of the key runs
// write again. write must return, and let Run commit.
var ErrTxEnded = errors.New("sqlstore: the write function ended Run's transaction")

// txEnded reports whether Run's transaction has ended before Run ended it:
// the write function committed or rolled it back.
func (s *Store) txEnded(ctx context.Context, tx *sql.Tx) bool {
	if s.dialect == SQLite {
		// SQLite has no function that says; BEGIN in a transaction fails,
		// in process, and outside one begins a transaction that release
		// rolls back.
		_, err := tx.ExecContext(ctx, "BEGIN")
		return err == nil || errors.Is(err, sql.ErrTxDone)
	}
	// The claim gave the transaction an id; a statement on its own has
	// none until it writes. MySQL says whether one is open.
	q := "SELECT txid_current_if_assigned() IS NULL"
	if s.dialect == MySQL {
		q = "SELECT @@in_transaction = 0"
	}
	var ended bool
	err := tx.QueryRowContext(ctx, q).Scan(&ended)
	return ended || errors.Is(err, sql.ErrTxDone)
}

// release answers a Run whose write function ended the transaction (see
// ErrTxEnded): it ends what is left of tx and forgets l's claim, if write
// committed it, on Run's own connection (on SQLite Run holds the write
// gate, and a pool may have no other connection). writeErr is write's
// error, if any.
func (s *Store) release(ctx context.Context, conn *sql.Conn, tx *sql.Tx, key string, l *idem.Lease, writeErr error) error {
	_ = tx.Rollback()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.lockTimeout)
	defer cancel()
	var n int64
	err := s.retryBusy(rctx, time.Now().Add(s.lockTimeout), func() error {
		r, err := conn.ExecContext(rctx, s.q.release, []byte(key), l.Owner, l.Token)
		if err == nil {
			n, err = r.RowsAffected()
		}
		return err
	})
	what := "rolled it back: nothing is recorded, and the key is free"
	if n == 1 {
		what = "committed it: its effects are committed without a record, and the key is released (the next Run runs write again)"
	}
	e := fmt.Errorf("%w: run of %s: write %s; write must return and let Run commit", ErrTxEnded, s.core.KeyName(key), what)
	if err != nil {
		e = fmt.Errorf("%w; releasing the key failed, so it stays claimed until its lease runs out: %w", e, err)
	}
	if writeErr != nil {
		e = fmt.Errorf("%w (write returned: %w)", e, writeErr)
	}
	return e
}
