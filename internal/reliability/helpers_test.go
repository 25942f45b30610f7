package reliability_test

// Helpers copied from the root package's tests (sqlstore_test.go and
// sqltx_test.go), which the tests here cannot import.

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/sqltest"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/sqlstore"
)

// postgresDB opens the test Postgres (IDEM_POSTGRES_DSN), closed when t
// ends, with a pool of up to conns connections, all opened at once: 64
// racing claims that each had to connect first could take longer than the
// suite's short leases. A throwaway Postgres allows 100 connections (`make
// test` runs other packages' tests beside these), so tests take at most 40.
func postgresDB(t testing.TB, conns int) *sql.DB {
	t.Helper()
	db := sqltest.Postgres(t)
	// The default of 2 idle connections would reconnect on nearly every
	// statement of parallel checks.
	db.SetMaxIdleConns(conns)
	db.SetMaxOpenConns(conns)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	open := make([]*sql.Conn, conns)
	for i := range open {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatalf("Postgres does not answer: %v", err)
		}
		open[i] = c
	}
	for _, c := range open {
		_ = c.Close() // back to the pool, which keeps it
	}
	return db
}

// testConns is the Postgres pool size of tests.
const testConns = 40

// uniqueTable names a table no other test uses.
func uniqueTable() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "idemtest_" + hex.EncodeToString(b[:])
}

// newSQLStore opens a store on table, creating the table (and dropping it
// when t ends).
func newSQLStore(t testing.TB, db *sql.DB, o sqlstore.Options) *sqlstore.Store {
	t.Helper()
	st, err := sqlstore.New(db, o)
	if err != nil {
		t.Fatalf("sqlstore.New(%+v) = %v; want a store", o, err)
	}
	if err := st.CreateSchema(context.Background()); err != nil {
		t.Fatalf("CreateSchema = %v", err)
	}
	if o.Dialect == sqlstore.Postgres {
		quoted := `"` + strings.ReplaceAll(o.Table, ".", `"."`) + `"`
		t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE IF EXISTS ` + quoted) })
	}
	return st
}

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
	e := &runEnv{t: t, db: db, d: d, dsn: dsn, table: uniqueTable(), effects: uniqueTable()}
	e.st = newSQLStore(t, db, sqlstore.Options{Dialect: d, Table: e.table})
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
		e.t.Fatalf("sqlstore.New = %v", err)
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
