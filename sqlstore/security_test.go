package sqlstore_test

import (
	"database/sql"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemgo/idem/internal/testing/sqltest"
	"github.com/idemgo/idem/internal/testing/testenv"
	"github.com/idemgo/idem/sqlstore"
)

// countingDB opens a database of dialect d whose connections are counted
// (sqltest.CountingDB): with no idle connection kept, the count is the
// number of statements sent.
func countingDB(t *testing.T, d sqlstore.Dialect) (*sql.DB, *atomic.Int64) {
	t.Helper()
	if d == sqlstore.SQLite {
		path := filepath.Join(t.TempDir(), "idem.db")
		return sqltest.CountingDB(t, "sqlite", "file:"+path+"?_pragma=journal_mode(WAL)")
	}
	if d == sqlstore.MySQL {
		return sqltest.CountingDB(t, "mysql", testenv.MySQLDSN(t))
	}
	return sqltest.CountingDB(t, "pgx", testenv.PostgresDSN(t))
}

// Table names are the only text a Store puts into SQL: anything but a
// plain, optionally schema-qualified identifier is refused at construction
// (and by SchemaDDL) before the database is touched.
func TestSecuritySQLIdentifiers(t *testing.T) {
	attempts := []string{
		`keys"; DROP TABLE idem_keys; --`,
		`idem_keys; DELETE FROM idem_keys`,
		`idem_keys--`,
		`idem_keys/*`,
		`"idem_keys"`,
		`idem_keys"`,
		`public."idem_keys"`,
		`idem keys`,
		"idem_keys\x00",
		"idem_keys\n",
		`idem_keys'`,
		`idem_keys)`,
		`pg_catalog.pg_class WHERE 1=1`,
		`a.b.c`,
		`.idem_keys`,
		`idem_keys.`,
		`1keys`,
		`idem-keys`,
		`idem$keys`,
		"idem_kéys",
		"idem_keys\u200b", // a zero-width space
		strings.Repeat("t", 64),
		strings.Repeat("s", 64) + ".keys",
	}
	for _, d := range []sqlstore.Dialect{sqlstore.SQLite, sqlstore.Postgres, sqlstore.MySQL} {
		t.Run(d.String(), func(t *testing.T) {
			db, conns := countingDB(t, d)
			for _, table := range attempts {
				before := conns.Load()
				if _, err := sqlstore.New(db, sqlstore.Options{Dialect: d, Table: table}); err == nil || !strings.Contains(err.Error(), "sqlstore: Table: ") {
					t.Errorf("New(Table %q) = %v; want an error naming the Table field", table, err)
				}
				if ddl, err := sqlstore.SchemaDDL(d, table); err == nil {
					t.Errorf("SchemaDDL(%q) = %q; want an error", table, ddl)
				}
				if n := conns.Load(); n != before {
					t.Errorf("New(Table %q) opened %d connections before refusing it; want none", table, n-before)
				}
			}
			// The check is not a refusal of everything: a plain name passes.
			if _, err := sqlstore.New(db, sqlstore.Options{Dialect: d, Table: "public_keys"}); err != nil {
				t.Errorf("New(Table %q) = %v; want a store", "public_keys", err)
			}
		})
	}
}
