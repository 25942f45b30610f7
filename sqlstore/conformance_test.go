package sqlstore_test

import (
	"database/sql"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testing/sqltest"
	"github.com/idemgo/idem/internal/testing/testenv"
	"github.com/idemgo/idem/sqlstore"
	"github.com/idemgo/idem/storetest"
)

// The storetest suite on every dialect: a Store here answers as every
// other Store does.

func TestConformancePostgres(t *testing.T) {
	db := sqltest.PostgresPool(t, sqltest.TestConns)
	storetest.Run(t, func(t *testing.T) storetest.Backend { return sqlBackend(t, db, sqlstore.Postgres) })
}

func TestConformanceMySQL(t *testing.T) {
	db := sqltest.MySQLPool(t, sqltest.TestConns)
	storetest.Run(t, func(t *testing.T) storetest.Backend { return sqlBackend(t, db, sqlstore.MySQL) })
}

// The store is correct with the driver's options that change what a
// statement's reply says: interpolateParams (statements sent as text, not
// prepared) and clientFoundRows (rows affected counts the rows found, not
// the rows changed).
func TestConformanceMySQLDriverOptions(t *testing.T) {
	dsn := testenv.MySQLDSN(t)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	db, err := sql.Open("mysql", dsn+sep+"interpolateParams=true&clientFoundRows=true")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(sqltest.TestConns)
	db.SetMaxIdleConns(sqltest.TestConns)
	storetest.Run(t, func(t *testing.T) storetest.Backend { return sqlBackend(t, db, sqlstore.MySQL) })
}

// On SQLite each store the suite opens has a *sql.DB of its own on the
// file, as separate processes would: the stores of one *sql.DB take turns
// through one write gate and answer a live key from their read, so only
// stores of different handles race their claims into the upsert, whose
// expiry check (the take-over guard) must then hold.
func TestConformanceSQLite(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Backend {
		path := filepath.Join(t.TempDir(), "idem.db")
		table := sqltest.UniqueTable()
		sqltest.NewStore(t, sqltest.OpenSQLite(t, path), sqlstore.Options{Dialect: sqlstore.SQLite, Table: table})
		return storetest.Backend{Open: func(o idem.Options) (idem.Store, error) {
			so := sqlstore.OptionsFrom(o, sqlstore.SQLite)
			so.Table = table
			return sqlstore.New(sqltest.OpenSQLite(t, path), so)
		}}
	})
}

// sqlBackend opens the suite's stores on a fresh table of db. Every record
// the suite writes expires within seconds; the table is dropped when t ends.
func sqlBackend(t *testing.T, db *sql.DB, d sqlstore.Dialect) storetest.Backend {
	table := sqltest.UniqueTable()
	sqltest.NewStore(t, db, sqlstore.Options{Dialect: d, Table: table})
	return storetest.Backend{Open: func(o idem.Options) (idem.Store, error) {
		so := sqlstore.OptionsFrom(o, d)
		so.Table = table
		return sqlstore.New(db, so)
	}}
}
