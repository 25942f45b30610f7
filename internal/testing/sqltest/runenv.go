package sqltest

import (
	"context"
	"database/sql"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testing/testenv"
	"github.com/idemgo/idem/sqlstore"
)

// PostgresPool opens the test Postgres (IDEM_POSTGRES_DSN), closed when t
// ends, with a pool of up to conns connections, all opened at once: 64
// racing claims that each had to connect first could take longer than the
// suite's short leases. A throwaway Postgres allows 100 connections (`make
// test` runs other packages' tests beside these), so tests take at most 40.
func PostgresPool(t testing.TB, conns int) *sql.DB {
	t.Helper()
	return pool(t, Postgres(t), conns)
}

// MySQLPool is PostgresPool's twin on the test MySQL or MariaDB
// (IDEM_MYSQL_DSN); `make test` starts MariaDB with 500 connections.
func MySQLPool(t testing.TB, conns int) *sql.DB {
	t.Helper()
	return pool(t, MySQL(t), conns)
}

// Pool opens the test database of a server dialect with a pool of conns.
func Pool(t testing.TB, d sqlstore.Dialect, conns int) *sql.DB {
	t.Helper()
	if d == sqlstore.MySQL {
		return MySQLPool(t, conns)
	}
	return PostgresPool(t, conns)
}

func pool(t testing.TB, db *sql.DB, conns int) *sql.DB {
	t.Helper()
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
			t.Fatalf("the database does not answer: %v", err)
		}
		open[i] = c
	}
	for _, c := range open {
		_ = c.Close() // back to the pool, which keeps it
	}
	return db
}

// TestConns is the Postgres (and MySQL) pool size of tests.
const TestConns = 40

// RunEnv is one dialect's ground for the Run tests: a store on a fresh
// table, and an effects table that the work writes to in Run's transaction,
// so that a test can check that the effect and the record are one fact.
type RunEnv struct {
	T       *testing.T
	DB      *sql.DB
	Dialect sqlstore.Dialect
	DSN     string // how another process opens the database
	Table   string
	Effects string
	St      *sqlstore.Store
	Calls   atomic.Int64 // write functions called
}

// EachDialect runs f on SQLite and, when IDEM_POSTGRES_DSN and
// IDEM_MYSQL_DSN are set, Postgres and MySQL.
func EachDialect(t *testing.T, f func(e *RunEnv)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		db, path := SQLite(t)
		f(NewRunEnv(t, db, sqlstore.SQLite, "file:"+path+"?_pragma=journal_mode(WAL)"))
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		db := PostgresPool(t, TestConns)
		f(NewRunEnv(t, db, sqlstore.Postgres, testenv.PostgresDSN(t)))
	})
	t.Run("mysql", func(t *testing.T) {
		t.Parallel()
		db := MySQLPool(t, TestConns)
		f(NewRunEnv(t, db, sqlstore.MySQL, testenv.MySQLDSN(t)))
	})
}

// NewRunEnv makes a RunEnv of dialect d on db, whose data another process
// opens with dsn; the tables go when t ends.
func NewRunEnv(t *testing.T, db *sql.DB, d sqlstore.Dialect, dsn string) *RunEnv {
	e := &RunEnv{T: t, DB: db, Dialect: d, DSN: dsn, Table: UniqueTable(), Effects: UniqueTable()}
	e.St = NewStore(t, db, sqlstore.Options{Dialect: d, Table: e.Table})
	ddl := `CREATE TABLE "` + e.Effects + `" (key BYTEA NOT NULL, note TEXT NOT NULL)`
	if d == sqlstore.MySQL {
		ddl = "CREATE TABLE `" + e.Effects + "` (`key` VARBINARY(3072) NOT NULL, note TEXT NOT NULL) ENGINE=InnoDB"
	}
	if _, err := db.Exec(ddl); err != nil {
		t.Fatalf("creating the effects table: %v", err)
	}
	if d != sqlstore.SQLite {
		t.Cleanup(func() { _, _ = db.Exec(Query(d, `DROP TABLE "`+e.Effects+`"`)) })
	}
	return e
}

// Store opens another store on e's table with other options.
func (e *RunEnv) Store(o sqlstore.Options) *sqlstore.Store {
	e.T.Helper()
	o.Dialect, o.Table = e.Dialect, e.Table
	st, err := sqlstore.New(e.DB, o)
	if err != nil {
		e.T.Fatalf("sqlstore.New = %v", err)
	}
	return st
}

// Write returns work that writes one effect for key through the
// transaction, then calls hook (which may block, fail or panic), then
// returns result.
func (e *RunEnv) Write(key, result string, hook func(ctx context.Context, tx *sql.Tx) error) func(context.Context, *sql.Tx) ([]byte, error) {
	q := Query(e.Dialect, `INSERT INTO "`+e.Effects+`" (key, note) VALUES ($1, $2)`)
	return func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
		e.Calls.Add(1)
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

// EffectCount counts key's effects.
func (e *RunEnv) EffectCount(key string) int {
	e.T.Helper()
	q := Query(e.Dialect, `SELECT count(*) FROM "`+e.Effects+`" WHERE key = $1`)
	var n int
	if err := e.DB.QueryRow(q, []byte(key)).Scan(&n); err != nil {
		e.T.Fatalf("counting effects: %v", err)
	}
	return n
}

// Fact checks that key's effect and its record are both there (done) or
// both absent: the guarantee of the transactional mode.
func (e *RunEnv) Fact(key string, done bool) {
	e.T.Helper()
	n := e.EffectCount(key)
	rec, err := e.St.Lookup(context.Background(), key)
	switch {
	case done && (n != 1 || err != nil || !rec.Confirmed):
		e.T.Errorf("key %q: %d effects, record %+v, %v; want exactly one effect and its confirmed record", key, n, rec, err)
	case !done && (n != 0 || !errors.Is(err, idem.ErrNotFound)):
		e.T.Errorf("key %q: %d effects, record %+v, %v; want no effect and no record", key, n, rec, err)
	}
}
