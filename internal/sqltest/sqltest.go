// Package sqltest opens the databases that SQL tests run on: a fresh
// SQLite file, or the Postgres that `make test` starts (through
// internal/testenv, so it skips, or fails under CI=true, when missing).
// Each database is closed when its test ends.
package sqltest

import (
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/idemgo/idem/internal/testenv"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	_ "modernc.org/sqlite"             // database/sql driver "sqlite"
)

// OpenSQLite opens the SQLite file at path in WAL mode, which SQLStore
// requires. It sets no busy_timeout: the store copes with SQLITE_BUSY itself.
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
