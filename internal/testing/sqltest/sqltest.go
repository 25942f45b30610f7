// Package sqltest opens the databases that SQL tests run on: a fresh
// SQLite file, or the Postgres or MariaDB that `make test` starts (through
// internal/testing/testenv, so it skips, or fails under CI=true, when missing).
// Each database is closed when its test ends. It also opens a
// sqlstore.Store on a table of its own, and counts the connections a
// database opens.
package sqltest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	_ "github.com/go-sql-driver/mysql" // database/sql driver "mysql"
	"github.com/idemgo/idem/internal/testing/testenv"
	"github.com/idemgo/idem/sqlstore"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	_ "modernc.org/sqlite"             // database/sql driver "sqlite"
)

// OpenSQLite opens the SQLite file at path in WAL mode, which
// sqlstore.Store requires. It sets no busy_timeout: the store copes with
// SQLITE_BUSY itself.
func OpenSQLite(t testing.TB, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)")
	if err != nil {
		t.Fatalf("sql.Open(sqlite) = %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// SQLite opens a new SQLite file in t's temporary directory and returns it
// with its path.
func SQLite(t testing.TB) (*sql.DB, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "idem.db")
	return OpenSQLite(t, path), path
}

// Postgres opens the test Postgres (IDEM_POSTGRES_DSN).
func Postgres(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", testenv.PostgresDSN(t))
	if err != nil {
		t.Fatalf("sql.Open(pgx) = %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// MySQL opens the test MySQL or MariaDB (IDEM_MYSQL_DSN).
func MySQL(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", testenv.MySQLDSN(t))
	if err != nil {
		t.Fatalf("sql.Open(mysql) = %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// Open opens the test database of dialect d (a new file for SQLite).
func Open(t testing.TB, d sqlstore.Dialect) *sql.DB {
	t.Helper()
	switch d {
	case sqlstore.Postgres:
		return Postgres(t)
	case sqlstore.MySQL:
		return MySQL(t)
	}
	db, _ := SQLite(t)
	return db
}

// Query turns a test's statement, written for Postgres (double-quoted
// names, $n parameters each used once and in order), into dialect d's.
func Query(d sqlstore.Dialect, q string) string {
	switch d {
	case sqlstore.SQLite:
		return strings.ReplaceAll(q, "$", "?")
	case sqlstore.MySQL:
		q = strings.ReplaceAll(q, `"`, "`")
		q = keyColumn.ReplaceAllString(q, "`key`")
		return param.ReplaceAllString(q, "?")
	}
	return q
}

var (
	keyColumn = regexp.MustCompile(`\bkey\b`)
	param     = regexp.MustCompile(`\$[0-9]+`)
)

// UniqueTable names a table no other test uses.
func UniqueTable() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "idemtest_" + hex.EncodeToString(b[:])
}

// NewStore opens a store on db with o, creates its table (o.Table, which a
// test on Postgres or MySQL names with UniqueTable), and on Postgres and
// MySQL drops the table when t ends.
func NewStore(t testing.TB, db *sql.DB, o sqlstore.Options) *sqlstore.Store {
	t.Helper()
	st, err := sqlstore.New(db, o)
	if err != nil {
		t.Fatalf("sqlstore.New(%+v) = %v; want a store", o, err)
	}
	if err := st.CreateSchema(context.Background()); err != nil {
		t.Fatalf("CreateSchema = %v", err)
	}
	if o.Dialect != sqlstore.SQLite {
		quoted := Query(o.Dialect, `"`+strings.ReplaceAll(o.Table, ".", `"."`)+`"`)
		t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE IF EXISTS ` + quoted) })
	}
	return st
}

// CountingDB opens dsn with driverName through a connector that counts the
// connections it opens, closed when t ends. The pool keeps no idle
// connection, so every statement opens one: the count is the number of
// statements sent.
func CountingDB(t testing.TB, driverName, dsn string) (*sql.DB, *atomic.Int64) {
	t.Helper()
	probe, err := sql.Open(driverName, dsn)
	if err != nil {
		t.Fatalf("sql.Open(%s) = %v", driverName, err)
	}
	c := &countingConnector{d: probe.Driver(), dsn: dsn}
	_ = probe.Close()
	db := sql.OpenDB(c)
	db.SetMaxIdleConns(0)
	t.Cleanup(func() { _ = db.Close() })
	return db, &c.n
}

// countingConnector opens connections of a database/sql driver, counting
// each.
type countingConnector struct {
	d   driver.Driver
	dsn string
	n   atomic.Int64
}

func (c *countingConnector) Connect(context.Context) (driver.Conn, error) {
	c.n.Add(1)
	return c.d.Open(c.dsn)
}

func (c *countingConnector) Driver() driver.Driver { return c.d }
