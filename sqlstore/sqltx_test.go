package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testing/sqltest"
	"github.com/idemgo/idem/internal/testing/testenv"
	"github.com/idemgo/idem/sqlstore"
)

// runEnv is the ground of the Run tests, shared with internal/testing/reliability.
type runEnv = sqltest.RunEnv

// blocked reports whether ch stays open for d.
func blocked[T any](ch <-chan T, d time.Duration) bool {
	select {
	case <-ch:
		return false
	case <-time.After(d):
		return true
	}
}

func TestRunExactlyOnceOf32(t *testing.T) {
	sqltest.EachDialect(t, func(e *runEnv) {
		const n = 32
		var (
			wg       sync.WaitGroup
			start    = make(chan struct{})
			results  = make([][]byte, n)
			replayed = make([]bool, n)
			errs     = make([]error, n)
		)
		slow := func(context.Context, *sql.Tx) error { time.Sleep(100 * time.Millisecond); return nil }
		for i := range n {
			wg.Go(func() {
				<-start
				results[i], replayed[i], errs[i] = e.St.Run(e.T.Context(), "k", []byte("fp"), e.Write("k", "once", slow))
			})
		}
		close(start)
		wg.Wait()
		fresh := 0
		for i := range n {
			if errs[i] != nil || string(results[i]) != "once" {
				t.Errorf("Run #%d = %q, %v; want the one result \"once\"", i, results[i], errs[i])
			}
			if !replayed[i] {
				fresh++
			}
		}
		if got := e.Calls.Load(); got != 1 || fresh != 1 {
			t.Errorf("32 concurrent Runs: write called %d times, %d not replayed; want 1 and 1", got, fresh)
		}
		e.Fact("k", true)
	})
}

func TestRunWriteFails(t *testing.T) {
	sqltest.EachDialect(t, func(e *runEnv) {
		ctx := t.Context()
		boom := errors.New("boom")
		_, _, err := e.St.Run(ctx, "err", nil, e.Write("err", "x", func(context.Context, *sql.Tx) error { return boom }))
		if !errors.Is(err, boom) {
			t.Errorf("Run with a failing write = %v; want its error", err)
		}
		e.Fact("err", false)

		func() {
			defer func() {
				if r := recover(); r != "panic in write" {
					t.Errorf("Run with a panicking write recovered %v; want the panic passed on", r)
				}
			}()
			_, _, _ = e.St.Run(ctx, "panic", nil, e.Write("panic", "x", func(context.Context, *sql.Tx) error { panic("panic in write") }))
		}()
		e.Fact("panic", false)

		small := e.Store(sqlstore.Options{MaxResultBytes: 4})
		if _, _, err := small.Run(ctx, "big", nil, e.Write("big", "12345", nil)); !errors.Is(err, idem.ErrTooLarge) {
			t.Errorf("Run whose result exceeds MaxResultBytes = %v; want ErrTooLarge", err)
		}
		e.Fact("big", false)

		// Nothing was recorded, so the next Run of each key does the work.
		for _, k := range []string{"err", "panic", "big"} {
			before := e.Calls.Load()
			res, replayed, err := e.St.Run(ctx, k, nil, e.Write(k, "ok", nil))
			if err != nil || replayed || string(res) != "ok" || e.Calls.Load() != before+1 {
				t.Errorf("Run(%q) after a failed one = %q, replayed %v, %v; want the work done: \"ok\"", k, res, replayed, err)
			}
			e.Fact(k, true)
		}
	})
}

// A write that commits or rolls back Run's transaction itself gets an
// error wrapping ErrTxEnded that says which, no record, and the key at once
// free: the next Run runs write (not InProgress for the whole lease, not a
// record apart from the effect).
func TestRunWriteEndsTransaction(t *testing.T) {
	sqltest.EachDialect(t, func(e *runEnv) {
		ctx := t.Context()
		exec := func(stmt string) func(context.Context, *sql.Tx) error {
			return func(ctx context.Context, tx *sql.Tx) error { _, err := tx.ExecContext(ctx, stmt); return err }
		}
		boom := errors.New("boom")
		for _, tc := range []struct {
			name      string
			end       func(context.Context, *sql.Tx) error
			committed bool // write's effect is committed
		}{
			{"tx.Commit", func(_ context.Context, tx *sql.Tx) error { return tx.Commit() }, true},
			{"tx.Rollback", func(_ context.Context, tx *sql.Tx) error { return tx.Rollback() }, false},
			{"COMMIT", exec("COMMIT"), true},
			{"ROLLBACK", exec("ROLLBACK"), false},
			{"tx.Commit, then an error", func(_ context.Context, tx *sql.Tx) error { return errors.Join(tx.Commit(), boom) }, true},
			{"COMMIT, then an error", func(ctx context.Context, tx *sql.Tx) error { return errors.Join(exec("COMMIT")(ctx, tx), boom) }, true},
		} {
			k := "end:" + tc.name
			_, _, err := e.St.Run(ctx, k, nil, e.Write(k, "x", tc.end))
			want := "rolled it back"
			if tc.committed {
				want = "committed it"
			}
			if !errors.Is(err, sqlstore.ErrTxEnded) || !strings.Contains(err.Error(), want) {
				t.Errorf("%s in write: Run = %v; want ErrTxEnded saying write %s the transaction", tc.name, err, want)
			}
			if strings.Contains(tc.name, "error") && !errors.Is(err, boom) {
				t.Errorf("%s in write: Run = %v; want write's error in it too", tc.name, err)
			}
			if rec, err := e.St.Lookup(ctx, k); !errors.Is(err, idem.ErrNotFound) {
				t.Errorf("%s in write: Lookup(%q) = %+v, %v; want ErrNotFound: no record, the key released", tc.name, k, rec, err)
			}
			res, replayed, err := e.St.Run(ctx, k, nil, e.Write(k, "again", nil))
			if err != nil || replayed || string(res) != "again" {
				t.Errorf("%s in write: the next Run = %q, replayed %v, %v; want write run at once: \"again\"", tc.name, res, replayed, err)
			}
			effects := 1
			if tc.committed {
				effects = 2
			}
			if n := e.EffectCount(k); n != effects {
				t.Errorf("%s in write: %d effects; want %d", tc.name, n, effects)
			}
		}
	})
}

func TestRunReplay(t *testing.T) {
	sqltest.EachDialect(t, func(e *runEnv) {
		ctx := t.Context()
		var inside *sql.Tx
		hook := func(ctx context.Context, tx *sql.Tx) error {
			got, ok := sqlstore.TxFromContext(ctx)
			if !ok || got != tx {
				t.Errorf("TxFromContext in write = %p, %v; want the transaction %p", got, ok, tx)
			}
			inside = tx
			return nil
		}
		if res, replayed, err := e.St.Run(ctx, "k", []byte("a"), e.Write("k", "first", hook)); err != nil || replayed || string(res) != "first" {
			t.Fatalf("first Run = %q, %v, %v; want \"first\", not replayed", res, replayed, err)
		}
		if inside == nil {
			t.Fatal("write was not called")
		}
		if _, ok := sqlstore.TxFromContext(ctx); ok {
			t.Errorf("TxFromContext outside Run = ok; want none")
		}
		res, replayed, err := e.St.Run(ctx, "k", []byte("a"), e.Write("k", "second", nil))
		if err != nil || !replayed || string(res) != "first" {
			t.Errorf("second Run = %q, replayed %v, %v; want the recorded \"first\", replayed", res, replayed, err)
		}
		if _, _, err := e.St.Run(ctx, "k", []byte("b"), e.Write("k", "third", nil)); !errors.Is(err, idem.ErrFingerprintMismatch) {
			t.Errorf("Run with another fingerprint = %v; want ErrFingerprintMismatch", err)
		}
		if got := e.Calls.Load(); got != 1 {
			t.Errorf("write called %d times; want once", got)
		}
		e.Fact("k", true)
	})
}

// holdRun starts a Run of key whose write blocks until release is closed,
// then returns result, or fails when fail is set. It returns once the write
// is running; the Run's error arrives on the returned channel.
func holdRun(e *runEnv, key, result string, release <-chan struct{}, fail bool) <-chan error {
	started, done := make(chan struct{}), make(chan error, 1)
	hook := func(context.Context, *sql.Tx) error {
		close(started)
		<-release
		if fail {
			return errors.New("first run failed")
		}
		return nil
	}
	go func() {
		_, _, err := e.St.Run(context.Background(), key, nil, e.Write(key, result, hook))
		done <- err
	}()
	<-started
	return done
}

func TestRunWaitsForAnother(t *testing.T) {
	sqltest.EachDialect(t, func(e *runEnv) {
		for _, firstFails := range []bool{false, true} {
			key := "commits"
			if firstFails {
				key = "rolls-back"
			}
			release := make(chan struct{})
			first := holdRun(e, key, "first", release, firstFails)
			type answer struct {
				res      []byte
				replayed bool
				err      error
			}
			second := make(chan answer, 1)
			go func() {
				res, replayed, err := e.St.Run(context.Background(), key, nil, e.Write(key, "second", nil))
				second <- answer{res, replayed, err}
			}()
			if !blocked(second, 200*time.Millisecond) {
				t.Fatalf("%s: the second Run returned while the first was in progress; want it to wait", key)
			}
			close(release)
			<-first
			a := <-second
			switch {
			case !firstFails && (a.err != nil || !a.replayed || string(a.res) != "first"):
				t.Errorf("Run after the first committed = %q, replayed %v, %v; want the first's result, replayed", a.res, a.replayed, a.err)
			case firstFails && (a.err != nil || a.replayed || string(a.res) != "second"):
				t.Errorf("Run after the first rolled back = %q, replayed %v, %v; want its own work: \"second\"", a.res, a.replayed, a.err)
			}
			e.Fact(key, true)
		}
	})
}

func TestRunLockTimeout(t *testing.T) {
	sqltest.EachDialect(t, func(e *runEnv) {
		impatient := e.Store(sqlstore.Options{LockTimeout: 300 * time.Millisecond})
		release := make(chan struct{})
		first := holdRun(e, "k", "first", release, false)
		start := time.Now()
		// Without a working LockTimeout this would wait for ever: fail instead.
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		_, _, err := impatient.Run(ctx, "k", nil, e.Write("k", "second", nil))
		if took := time.Since(start); !errors.Is(err, idem.ErrInProgress) || took < 250*time.Millisecond || took > 3*time.Second {
			t.Errorf("Run while another holds the key = %v after %v; want ErrInProgress after LockTimeout 300ms", err, took)
		}
		close(release)
		if err := <-first; err != nil {
			t.Fatalf("first Run = %v", err)
		}
		res, replayed, err := impatient.Run(t.Context(), "k", nil, e.Write("k", "third", nil))
		if err != nil || !replayed || string(res) != "first" {
			t.Errorf("Run after the first committed = %q, replayed %v, %v; want \"first\", replayed", res, replayed, err)
		}
		e.Fact("k", true)
	})
}

func TestRunAndLeases(t *testing.T) {
	sqltest.EachDialect(t, func(e *runEnv) {
		ctx := t.Context()
		// A live lease: Run does not wait for it (its holder may work for
		// long, and will Confirm), and a different request is told so.
		c, err := e.St.Claim(ctx, "leased", []byte("fp"))
		if err != nil || c.Outcome != idem.Claimed {
			t.Fatalf("Claim = %+v, %v", c, err)
		}
		start := time.Now()
		if _, _, err := e.St.Run(ctx, "leased", []byte("fp"), e.Write("leased", "run", nil)); !errors.Is(err, idem.ErrInProgress) || time.Since(start) > time.Second {
			t.Errorf("Run of a key under a live lease = %v after %v; want ErrInProgress at once", err, time.Since(start))
		}
		if _, _, err := e.St.Run(ctx, "leased", []byte("other"), e.Write("leased", "run", nil)); !errors.Is(err, idem.ErrFingerprintMismatch) {
			t.Errorf("Run with another fingerprint of a leased key = %v; want ErrFingerprintMismatch", err)
		}
		if err := e.St.Confirm(ctx, c.Lease, []byte("by-lease")); err != nil {
			t.Fatal(err)
		}
		res, replayed, err := e.St.Run(ctx, "leased", []byte("fp"), e.Write("leased", "run", nil))
		if err != nil || !replayed || string(res) != "by-lease" {
			t.Errorf("Run of a key confirmed in lease mode = %q, replayed %v, %v; want \"by-lease\", replayed", res, replayed, err)
		}
		if e.Calls.Load() != 0 {
			t.Errorf("write called %d times; want never", e.Calls.Load())
		}

		// An expired lease is taken over, with a greater token; the stalled
		// holder's late Confirm leaves Run's record alone.
		short := e.Store(sqlstore.Options{LeaseTTL: idem.MinLeaseTTL})
		c, _ = short.Claim(ctx, "expired", nil)
		time.Sleep(2 * idem.MinLeaseTTL)
		if res, replayed, err := e.St.Run(ctx, "expired", nil, e.Write("expired", "run", nil)); err != nil || replayed || string(res) != "run" {
			t.Errorf("Run of a key whose lease expired = %q, replayed %v, %v; want the work done", res, replayed, err)
		}
		if err := short.Confirm(ctx, c.Lease, []byte("late")); !errors.Is(err, idem.ErrAlreadyConfirmed) {
			t.Errorf("late Confirm after Run's = %v; want ErrAlreadyConfirmed (its result is not the one kept)", err)
		}
		rec, err := e.St.Lookup(ctx, "expired")
		if err != nil || string(rec.Result) != "run" || rec.Token <= c.Lease.Token {
			t.Errorf("record after take-over and late Confirm = %+v, %v; want Run's result and a token above %d", rec, err, c.Lease.Token)
		}
		e.Fact("expired", true)

		// A Claim of a key a Run holds waits for the Run, then sees its record.
		release := make(chan struct{})
		run := holdRun(e, "running", "run", release, false)
		claimed := make(chan idem.Claim, 1)
		go func() {
			c, err := e.St.Claim(context.Background(), "running", nil)
			if err != nil {
				t.Errorf("Claim of a key a Run holds = %v", err)
			}
			claimed <- c
		}()
		if !blocked(claimed, 200*time.Millisecond) {
			t.Errorf("Claim of a key a Run holds returned at once; want it to wait for the Run's transaction")
		}
		close(release)
		<-run
		if c := <-claimed; c.Outcome != idem.Duplicate || string(c.Record.Result) != "run" {
			t.Errorf("Claim after the Run committed = %v %+v; want Duplicate with the Run's result", c.Outcome, c.Record)
		}
	})
}

func TestRunSQLiteSingleWriter(t *testing.T) {
	db, path := sqltest.SQLite(t)
	e := sqltest.NewRunEnv(t, db, sqlstore.SQLite, path)
	impatient := e.Store(sqlstore.Options{LockTimeout: 300 * time.Millisecond})
	release := make(chan struct{})
	first := holdRun(e, "a", "a", release, false)
	// SQLite has one writer: a Run of another key waits for the first too,
	// and gives up after LockTimeout.
	if _, _, err := impatient.Run(t.Context(), "b", nil, e.Write("b", "b", nil)); !errors.Is(err, sqlstore.ErrBusy) || !errors.Is(err, idem.ErrInProgress) {
		t.Errorf("Run of another key while a Run holds SQLite's write lock = %v; want ErrBusy and ErrInProgress after LockTimeout", err)
	}
	other := make(chan error, 1)
	go func() { _, _, err := e.St.Run(context.Background(), "b", nil, e.Write("b", "b", nil)); other <- err }()
	if !blocked(other, 200*time.Millisecond) {
		t.Errorf("Run of another key returned while a Run held SQLite's write lock; want it to wait")
	}
	close(release)
	if err := errors.Join(<-first, <-other); err != nil {
		t.Errorf("Runs = %v; want both done", err)
	}
	e.Fact("a", true)
	e.Fact("b", true)
}

// servers runs f on each database server: Postgres and MySQL.
func servers(t *testing.T, f func(t *testing.T, d sqlstore.Dialect, dsn func(testing.TB) string)) {
	t.Run("postgres", func(t *testing.T) { t.Parallel(); f(t, sqlstore.Postgres, testenv.PostgresDSN) })
	t.Run("mysql", func(t *testing.T) { t.Parallel(); f(t, sqlstore.MySQL, testenv.MySQLDSN) })
}

func TestRunServerOtherKeysDoNotWait(t *testing.T) {
	servers(t, func(t *testing.T, d sqlstore.Dialect, dsn func(testing.TB) string) {
		testRunOtherKeysDoNotWait(t, sqltest.NewRunEnv(t, sqltest.Pool(t, d, sqltest.TestConns), d, dsn(t)))
	})
}

func testRunOtherKeysDoNotWait(t *testing.T, e *runEnv) {
	release := make(chan struct{})
	first := holdRun(e, "a", "a", release, false)
	start := time.Now()
	if _, _, err := e.St.Run(t.Context(), "b", nil, e.Write("b", "b", nil)); err != nil || time.Since(start) > time.Second {
		t.Errorf("Run of another key while a Run holds \"a\" = %v after %v; want it done without waiting", err, time.Since(start))
	}
	close(release)
	if err := <-first; err != nil {
		t.Error(err)
	}
	e.Fact("a", true)
	e.Fact("b", true)
}

// A Run that cannot get a connection from the pool is waiting for the
// database, not for its key: ErrBusy after LockTimeout, not a wait as long
// as the caller's context.
func TestRunPoolExhaustedIsBusy(t *testing.T) {
	servers(t, func(t *testing.T, d sqlstore.Dialect, dsn func(testing.TB) string) {
		db := sqltest.Pool(t, d, 2)
		testRunPoolExhaustedIsBusy(t, db, sqltest.NewRunEnv(t, db, d, dsn(t)))
	})
}

func testRunPoolExhaustedIsBusy(t *testing.T, db *sql.DB, e *runEnv) {
	impatient := e.Store(sqlstore.Options{LockTimeout: 200 * time.Millisecond})
	var held []*sql.Conn
	for range 2 {
		c, err := db.Conn(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	start := time.Now()
	_, _, err := impatient.Run(t.Context(), "pool", nil, e.Write("pool", "run", nil))
	if took := time.Since(start); !errors.Is(err, sqlstore.ErrBusy) || !errors.Is(err, idem.ErrInProgress) || took > 2*time.Second {
		t.Errorf("Run with every pool connection taken = %v after %v; want ErrBusy (and ErrInProgress) after LockTimeout 200ms", err, took)
	}
	for _, c := range held {
		_ = c.Close()
	}
	// With a connection free again the same Run does the work.
	if res, replayed, err := impatient.Run(t.Context(), "pool", nil, e.Write("pool", "run", nil)); err != nil || replayed || string(res) != "run" {
		t.Errorf("Run once a connection is free = %q, %v, %v; want the work done", res, replayed, err)
	}
	e.Fact("pool", true)
}

// On MySQL a lease-mode Claim that waits for a Run's row past the server's
// innodb_lock_wait_timeout is ErrInProgress, not a store failure, and does
// not take the key; once the Run commits, the key is a duplicate.
func TestMySQLClaimPastLockWait(t *testing.T) {
	e := sqltest.NewRunEnv(t, sqltest.MySQLPool(t, 4), sqlstore.MySQL, testenv.MySQLDSN(t))
	sep := "?"
	if strings.Contains(e.DSN, "?") {
		sep = "&"
	}
	// The driver sets parameters it does not know as session variables.
	short, err := sql.Open("mysql", e.DSN+sep+"innodb_lock_wait_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer short.Close()
	st, err := sqlstore.New(short, sqlstore.Options{Dialect: sqlstore.MySQL, Table: e.Table})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	first := holdRun(e, "k", "first", release, false)
	start := time.Now()
	_, err = st.Claim(t.Context(), "k", nil)
	if took := time.Since(start); !errors.Is(err, idem.ErrInProgress) || took < 900*time.Millisecond {
		t.Errorf("Claim of a key a Run holds, innodb_lock_wait_timeout 1 = %v after %v; want ErrInProgress after about 1s", err, took)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("Run = %v", err)
	}
	c, err := st.Claim(t.Context(), "k", nil)
	if err != nil || c.Outcome != idem.Duplicate || string(c.Record.Result) != "first" {
		t.Errorf("Claim after the Run committed = %+v, %v; want Duplicate with its result", c, err)
	}
	e.Fact("k", true)
}

// A Run on MySQL sets its connection's innodb_lock_wait_timeout to
// LockTimeout and puts the session's own value back after: the pool's next
// user of that connection finds what it set, whatever Run's outcome.
func TestMySQLRunRestoresLockWait(t *testing.T) {
	db := sqltest.MySQLPool(t, 1) // every statement on the one connection
	e := sqltest.NewRunEnv(t, db, sqlstore.MySQL, testenv.MySQLDSN(t))
	if _, err := db.Exec("SET SESSION innodb_lock_wait_timeout = 7"); err != nil {
		t.Fatal(err)
	}
	st := e.Store(sqlstore.Options{LockTimeout: 2500 * time.Millisecond})
	var inside int
	seen := func(ctx context.Context, tx *sql.Tx) error {
		return tx.QueryRowContext(ctx, "SELECT @@SESSION.innodb_lock_wait_timeout").Scan(&inside)
	}
	boom := errors.New("boom")
	for _, fail := range []bool{false, true} {
		hook := seen
		if fail {
			hook = func(ctx context.Context, tx *sql.Tx) error { return errors.Join(seen(ctx, tx), boom) }
		}
		key := fmt.Sprintf("k-%v", fail)
		_, _, err := st.Run(t.Context(), key, nil, e.Write(key, "r", hook))
		if fail != (err != nil) {
			t.Fatalf("Run (write fails: %v) = %v", fail, err)
		}
		var after int
		if err := db.QueryRow("SELECT @@SESSION.innodb_lock_wait_timeout").Scan(&after); err != nil {
			t.Fatal(err)
		}
		if inside != 3 || after != 7 {
			t.Errorf("write failing %v: innodb_lock_wait_timeout in Run %d, after %d; want 3 (LockTimeout 2.5s rounded up), then the session's 7 again", fail, inside, after)
		}
	}
}
