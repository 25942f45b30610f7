package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/sqltest"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/sqlstore"
)

// runEnv is one dialect's ground for the Run tests: a store on a fresh
// table, and an effects table that the work writes to in Run's transaction,
// so that a test can check that the effect and the record are one fact.
type runEnv struct {
	t       *testing.T
	db      *sql.DB
	d       sqlstore.Dialect
	dsn     string // how another process opens the database
	table   string
	effects string
	st      *sqlstore.Store
	calls   atomic.Int64 // write functions called
}

// eachDialect runs f on SQLite and, when IDEM_POSTGRES_DSN is set, Postgres.
func eachDialect(t *testing.T, f func(e *runEnv)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		db, path := sqltest.SQLite(t)
		f(newRunEnv(t, db, sqlstore.SQLite, "file:"+path+"?_pragma=journal_mode(WAL)"))
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		db := postgresDB(t, testConns)
		f(newRunEnv(t, db, sqlstore.Postgres, testenv.PostgresDSN(t)))
	})
}

func newRunEnv(t *testing.T, db *sql.DB, d sqlstore.Dialect, dsn string) *runEnv {
	e := &runEnv{t: t, db: db, d: d, dsn: dsn, table: sqltest.UniqueTable(), effects: sqltest.UniqueTable()}
	e.st = sqltest.NewStore(t, db, sqlstore.Options{Dialect: d, Table: e.table})
	if _, err := db.Exec(`CREATE TABLE "` + e.effects + `" (key BYTEA NOT NULL, note TEXT NOT NULL)`); err != nil {
		t.Fatalf("creating the effects table: %v", err)
	}
	if d == sqlstore.Postgres {
		t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE "` + e.effects + `"`) })
	}
	return e
}

// store opens another store on e's table with other options.
func (e *runEnv) store(o sqlstore.Options) *sqlstore.Store {
	e.t.Helper()
	o.Dialect, o.Table = e.d, e.table
	st, err := sqlstore.New(e.db, o)
	if err != nil {
		e.t.Fatalf("New = %v", err)
	}
	return st
}

// write returns work that writes one effect for key through the
// transaction, then calls hook (which may block, fail or panic), then
// returns result.
func (e *runEnv) write(key, result string, hook func(ctx context.Context, tx *sql.Tx) error) func(context.Context, *sql.Tx) ([]byte, error) {
	q := `INSERT INTO "` + e.effects + `" (key, note) VALUES ($1, $2)`
	if e.d == sqlstore.SQLite {
		q = strings.ReplaceAll(q, "$", "?")
	}
	return func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
		e.calls.Add(1)
		if _, err := tx.ExecContext(ctx, q, []byte(key), result); err != nil {
			return nil, err
		}
		if hook != nil {
			if err := hook(ctx, tx); err != nil {
				return nil, err
			}
		}
		return []byte(result), nil
	}
}

// fact checks that key's effect and its record are both there (done) or
// both absent: the guarantee of the transactional mode.
func (e *runEnv) fact(key string, done bool) {
	e.t.Helper()
	q := `SELECT count(*) FROM "` + e.effects + `" WHERE key = $1`
	if e.d == sqlstore.SQLite {
		q = strings.ReplaceAll(q, "$", "?")
	}
	var n int
	if err := e.db.QueryRow(q, []byte(key)).Scan(&n); err != nil {
		e.t.Fatalf("counting effects: %v", err)
	}
	rec, err := e.st.Lookup(context.Background(), key)
	switch {
	case done && (n != 1 || err != nil || !rec.Confirmed):
		e.t.Errorf("key %q: %d effects, record %+v, %v; want exactly one effect and its confirmed record", key, n, rec, err)
	case !done && (n != 0 || !errors.Is(err, idem.ErrNotFound)):
		e.t.Errorf("key %q: %d effects, record %+v, %v; want no effect and no record", key, n, rec, err)
	}
}

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
	eachDialect(t, func(e *runEnv) {
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
				results[i], replayed[i], errs[i] = e.st.Run(e.t.Context(), "k", []byte("fp"), e.write("k", "once", slow))
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
		if got := e.calls.Load(); got != 1 || fresh != 1 {
			t.Errorf("32 concurrent Runs: write called %d times, %d not replayed; want 1 and 1", got, fresh)
		}
		e.fact("k", true)
	})
}

func TestRunWriteFails(t *testing.T) {
	eachDialect(t, func(e *runEnv) {
		ctx := t.Context()
		boom := errors.New("boom")
		_, _, err := e.st.Run(ctx, "err", nil, e.write("err", "x", func(context.Context, *sql.Tx) error { return boom }))
		if !errors.Is(err, boom) {
			t.Errorf("Run with a failing write = %v; want its error", err)
		}
		e.fact("err", false)

		func() {
			defer func() {
				if r := recover(); r != "panic in write" {
					t.Errorf("Run with a panicking write recovered %v; want the panic passed on", r)
				}
			}()
			_, _, _ = e.st.Run(ctx, "panic", nil, e.write("panic", "x", func(context.Context, *sql.Tx) error { panic("panic in write") }))
		}()
		e.fact("panic", false)

		small := e.store(sqlstore.Options{MaxResultBytes: 4})
		if _, _, err := small.Run(ctx, "big", nil, e.write("big", "12345", nil)); !errors.Is(err, idem.ErrTooLarge) {
			t.Errorf("Run whose result exceeds MaxResultBytes = %v; want ErrTooLarge", err)
		}
		e.fact("big", false)

		// Nothing was recorded, so the next Run of each key does the work.
		for _, k := range []string{"err", "panic", "big"} {
			before := e.calls.Load()
			res, replayed, err := e.st.Run(ctx, k, nil, e.write(k, "ok", nil))
			if err != nil || replayed || string(res) != "ok" || e.calls.Load() != before+1 {
				t.Errorf("Run(%q) after a failed one = %q, replayed %v, %v; want the work done: \"ok\"", k, res, replayed, err)
			}
			e.fact(k, true)
		}
	})
}

func TestRunReplay(t *testing.T) {
	eachDialect(t, func(e *runEnv) {
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
		if res, replayed, err := e.st.Run(ctx, "k", []byte("a"), e.write("k", "first", hook)); err != nil || replayed || string(res) != "first" {
			t.Fatalf("first Run = %q, %v, %v; want \"first\", not replayed", res, replayed, err)
		}
		if inside == nil {
			t.Fatal("write was not called")
		}
		if _, ok := sqlstore.TxFromContext(ctx); ok {
			t.Errorf("TxFromContext outside Run = ok; want none")
		}
		res, replayed, err := e.st.Run(ctx, "k", []byte("a"), e.write("k", "second", nil))
		if err != nil || !replayed || string(res) != "first" {
			t.Errorf("second Run = %q, replayed %v, %v; want the recorded \"first\", replayed", res, replayed, err)
		}
		if _, _, err := e.st.Run(ctx, "k", []byte("b"), e.write("k", "third", nil)); !errors.Is(err, idem.ErrFingerprintMismatch) {
			t.Errorf("Run with another fingerprint = %v; want ErrFingerprintMismatch", err)
		}
		if got := e.calls.Load(); got != 1 {
			t.Errorf("write called %d times; want once", got)
		}
		e.fact("k", true)
	})
}

// holdRun starts a Run of key whose write blocks until release is closed,
// then returns result, or fails when fail is set. It returns once the write
// is running; the Run's error arrives on the returned channel.
func (e *runEnv) holdRun(key, result string, release <-chan struct{}, fail bool) <-chan error {
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
		_, _, err := e.st.Run(context.Background(), key, nil, e.write(key, result, hook))
		done <- err
	}()
	<-started
	return done
}

func TestRunWaitsForAnother(t *testing.T) {
	eachDialect(t, func(e *runEnv) {
		for _, firstFails := range []bool{false, true} {
			key := "commits"
			if firstFails {
				key = "rolls-back"
			}
			release := make(chan struct{})
			first := e.holdRun(key, "first", release, firstFails)
			type answer struct {
				res      []byte
				replayed bool
				err      error
			}
			second := make(chan answer, 1)
			go func() {
				res, replayed, err := e.st.Run(context.Background(), key, nil, e.write(key, "second", nil))
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
			e.fact(key, true)
		}
	})
}

func TestRunLockTimeout(t *testing.T) {
	eachDialect(t, func(e *runEnv) {
		impatient := e.store(sqlstore.Options{LockTimeout: 300 * time.Millisecond})
		release := make(chan struct{})
		first := e.holdRun("k", "first", release, false)
		start := time.Now()
		// Without a working LockTimeout this would wait for ever: fail instead.
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		_, _, err := impatient.Run(ctx, "k", nil, e.write("k", "second", nil))
		if took := time.Since(start); !errors.Is(err, idem.ErrInProgress) || took < 250*time.Millisecond || took > 3*time.Second {
			t.Errorf("Run while another holds the key = %v after %v; want ErrInProgress after LockTimeout 300ms", err, took)
		}
		close(release)
		if err := <-first; err != nil {
			t.Fatalf("first Run = %v", err)
		}
		res, replayed, err := impatient.Run(t.Context(), "k", nil, e.write("k", "third", nil))
		if err != nil || !replayed || string(res) != "first" {
			t.Errorf("Run after the first committed = %q, replayed %v, %v; want \"first\", replayed", res, replayed, err)
		}
		e.fact("k", true)
	})
}

func TestRunAndLeases(t *testing.T) {
	eachDialect(t, func(e *runEnv) {
		ctx := t.Context()
		// A live lease: Run does not wait for it (its holder may work for
		// long, and will Confirm), and a different request is told so.
		c, err := e.st.Claim(ctx, "leased", []byte("fp"))
		if err != nil || c.Outcome != idem.Claimed {
			t.Fatalf("Claim = %+v, %v", c, err)
		}
		start := time.Now()
		if _, _, err := e.st.Run(ctx, "leased", []byte("fp"), e.write("leased", "run", nil)); !errors.Is(err, idem.ErrInProgress) || time.Since(start) > time.Second {
			t.Errorf("Run of a key under a live lease = %v after %v; want ErrInProgress at once", err, time.Since(start))
		}
		if _, _, err := e.st.Run(ctx, "leased", []byte("other"), e.write("leased", "run", nil)); !errors.Is(err, idem.ErrFingerprintMismatch) {
			t.Errorf("Run with another fingerprint of a leased key = %v; want ErrFingerprintMismatch", err)
		}
		if err := e.st.Confirm(ctx, c.Lease, []byte("by-lease")); err != nil {
			t.Fatal(err)
		}
		res, replayed, err := e.st.Run(ctx, "leased", []byte("fp"), e.write("leased", "run", nil))
		if err != nil || !replayed || string(res) != "by-lease" {
			t.Errorf("Run of a key confirmed in lease mode = %q, replayed %v, %v; want \"by-lease\", replayed", res, replayed, err)
		}
		if e.calls.Load() != 0 {
			t.Errorf("write called %d times; want never", e.calls.Load())
		}

		// An expired lease is taken over, with a greater token; the stalled
		// holder's late Confirm leaves Run's record alone.
		short := e.store(sqlstore.Options{LeaseTTL: 100 * time.Millisecond})
		c, _ = short.Claim(ctx, "expired", nil)
		time.Sleep(200 * time.Millisecond)
		if res, replayed, err := e.st.Run(ctx, "expired", nil, e.write("expired", "run", nil)); err != nil || replayed || string(res) != "run" {
			t.Errorf("Run of a key whose lease expired = %q, replayed %v, %v; want the work done", res, replayed, err)
		}
		if err := short.Confirm(ctx, c.Lease, []byte("late")); !errors.Is(err, idem.ErrAlreadyConfirmed) {
			t.Errorf("late Confirm after Run's = %v; want ErrAlreadyConfirmed (its result is not the one kept)", err)
		}
		rec, err := e.st.Lookup(ctx, "expired")
		if err != nil || string(rec.Result) != "run" || rec.Token <= c.Lease.Token {
			t.Errorf("record after take-over and late Confirm = %+v, %v; want Run's result and a token above %d", rec, err, c.Lease.Token)
		}
		e.fact("expired", true)

		// A Claim of a key a Run holds waits for the Run, then sees its record.
		release := make(chan struct{})
		run := e.holdRun("running", "run", release, false)
		claimed := make(chan idem.Claim, 1)
		go func() {
			c, err := e.st.Claim(context.Background(), "running", nil)
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
	e := newRunEnv(t, db, sqlstore.SQLite, path)
	impatient := e.store(sqlstore.Options{LockTimeout: 300 * time.Millisecond})
	release := make(chan struct{})
	first := e.holdRun("a", "a", release, false)
	// SQLite has one writer: a Run of another key waits for the first too,
	// and gives up after LockTimeout.
	if _, _, err := impatient.Run(t.Context(), "b", nil, e.write("b", "b", nil)); !errors.Is(err, sqlstore.ErrBusy) || !errors.Is(err, idem.ErrInProgress) {
		t.Errorf("Run of another key while a Run holds SQLite's write lock = %v; want ErrBusy and ErrInProgress after LockTimeout", err)
	}
	other := make(chan error, 1)
	go func() { _, _, err := e.st.Run(context.Background(), "b", nil, e.write("b", "b", nil)); other <- err }()
	if !blocked(other, 200*time.Millisecond) {
		t.Errorf("Run of another key returned while a Run held SQLite's write lock; want it to wait")
	}
	close(release)
	if err := errors.Join(<-first, <-other); err != nil {
		t.Errorf("Runs = %v; want both done", err)
	}
	e.fact("a", true)
	e.fact("b", true)
}

func TestRunPostgresOtherKeysDoNotWait(t *testing.T) {
	e := newRunEnv(t, postgresDB(t, testConns), sqlstore.Postgres, testenv.PostgresDSN(t))
	release := make(chan struct{})
	first := e.holdRun("a", "a", release, false)
	start := time.Now()
	if _, _, err := e.st.Run(t.Context(), "b", nil, e.write("b", "b", nil)); err != nil || time.Since(start) > time.Second {
		t.Errorf("Run of another key while a Run holds \"a\" = %v after %v; want it done without waiting", err, time.Since(start))
	}
	close(release)
	if err := <-first; err != nil {
		t.Error(err)
	}
	e.fact("a", true)
	e.fact("b", true)
}

// A Run that cannot get a connection from the pool is waiting for the
// database, not for its key: ErrBusy after LockTimeout, not a wait as long
// as the caller's context.
func TestRunPoolExhaustedIsBusy(t *testing.T) {
	db := postgresDB(t, 2)
	e := newRunEnv(t, db, sqlstore.Postgres, testenv.PostgresDSN(t))
	impatient := e.store(sqlstore.Options{LockTimeout: 200 * time.Millisecond})
	var held []*sql.Conn
	for range 2 {
		c, err := db.Conn(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	start := time.Now()
	_, _, err := impatient.Run(t.Context(), "pool", nil, e.write("pool", "run", nil))
	if took := time.Since(start); !errors.Is(err, sqlstore.ErrBusy) || !errors.Is(err, idem.ErrInProgress) || took > 2*time.Second {
		t.Errorf("Run with every pool connection taken = %v after %v; want ErrBusy (and ErrInProgress) after LockTimeout 200ms", err, took)
	}
	for _, c := range held {
		_ = c.Close()
	}
	// With a connection free again the same Run does the work.
	if res, replayed, err := impatient.Run(t.Context(), "pool", nil, e.write("pool", "run", nil)); err != nil || replayed || string(res) != "run" {
		t.Errorf("Run once a connection is free = %q, %v, %v; want the work done", res, replayed, err)
	}
	e.fact("pool", true)
}
