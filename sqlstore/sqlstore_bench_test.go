package sqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testing/sqltest"
	"github.com/idemgo/idem/internal/testing/testenv"
	"github.com/idemgo/idem/sqlstore"
)

// BenchmarkSQL measures one message's cost on each SQL server, Postgres
// and MySQL (MariaDB under make test), at 8 and 64 goroutines: lease mode
// (Claim + Confirm), transactional mode (Run with a write that does
// nothing, so only idem's cost shows), and as each server's yardstick the
// same two writes as plain SQL on a table of the same shape (Postgres:
// INSERT ... ON CONFLICT DO NOTHING + UPDATE; MySQL: INSERT ... ON
// DUPLICATE KEY UPDATE of nothing + UPDATE). mysql-interp is MySQL with
// interpolateParams=true in the DSN: the driver then sends each statement
// as text, one round trip, instead of preparing it first, two. They are
// sub-benchmarks of one benchmark, so one run measures them all back to
// back, the servers in turns at each goroutine count; -count repeats each
// sub-benchmark in a row, so for alternating rounds repeat the whole run:
//
//	for i in 1 2 3 4 5; do go test -run '^$' -bench SQL ./sqlstore/; done
func BenchmarkSQL(b *testing.B) {
	type server struct {
		name     string
		d        sqlstore.Dialect
		db       *sql.DB
		baseline func(key string) error
		st       *sqlstore.Store
	}
	ctx := context.Background()
	fp, result := []byte("0123456789abcdef0123456789abcdef"), []byte("202 Accepted ok.")
	var servers []*server
	add := func(name string, d sqlstore.Dialect, db *sql.DB) {
		sv := &server{name: name, d: d, db: db}
		sv.st = sqltest.NewStore(b, db, sqlstore.Options{Dialect: d, Table: sqltest.UniqueTable()})
		base := sqltest.UniqueTable()
		sqltest.NewStore(b, db, sqlstore.Options{Dialect: d, Table: base})
		insert := `INSERT INTO "` + base + `" (key, state, owner, token, fingerprint, result, recorded_at, expires_at)
VALUES ($1, 'C', $2, $3, $4, NULL, now(), now() + interval '30 seconds') ON CONFLICT (key) DO NOTHING`
		update := `UPDATE "` + base + `" SET state = 'D', owner = '', result = $2, expires_at = now() + interval '24 hours' WHERE key = $1`
		if d == sqlstore.MySQL {
			insert = sqltest.Query(d, `INSERT INTO "`+base+`" (key, state, owner, token, fingerprint, result, recorded_at, expires_at)
VALUES ($1, 'C', $2, $3, $4, NULL, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 30 SECOND) ON DUPLICATE KEY UPDATE token = token`)
			update = sqltest.Query(d, `UPDATE "`+base+`" SET state = 'D', owner = '', result = $1, expires_at = UTC_TIMESTAMP(6) + INTERVAL 24 HOUR WHERE key = $2`)
		}
		sv.baseline = func(key string) error {
			if _, err := db.ExecContext(ctx, insert, []byte(key), "worker", int64(1), fp); err != nil {
				return err
			}
			var err error
			if d == sqlstore.MySQL {
				_, err = db.ExecContext(ctx, update, result, []byte(key))
			} else {
				_, err = db.ExecContext(ctx, update, []byte(key), result)
			}
			return err
		}
		servers = append(servers, sv)
	}
	add("postgres", sqlstore.Postgres, sqltest.PostgresPool(b, 64)) // a connection per goroutine
	add("mysql", sqlstore.MySQL, sqltest.MySQLPool(b, 64))
	add("mysql-interp", sqlstore.MySQL, mysqlInterpolating(b, 64))

	prefix := sqltest.UniqueTable() // fresh keys for every run of the benchmark
	for _, g := range []int{8, 64} {
		for _, sv := range servers {
			modes := []struct {
				name string
				op   func(key string) error
			}{
				{"baseline", sv.baseline},
				{"lease", func(key string) error {
					c, err := sv.st.Claim(ctx, key, fp)
					if err != nil {
						return err
					}
					if c.Outcome != idem.Claimed {
						return fmt.Errorf("Claim(%q) = %v; want Claimed", key, c.Outcome)
					}
					return sv.st.Confirm(ctx, c.Lease, result)
				}},
				{"run", func(key string) error {
					_, replayed, err := sv.st.Run(ctx, key, fp, func(context.Context, *sql.Tx) ([]byte, error) { return result, nil })
					if err == nil && replayed {
						err = fmt.Errorf("Run(%q) replayed; want the work done", key)
					}
					return err
				}},
			}
			for _, m := range modes {
				b.Run(fmt.Sprintf("%s/%s/g=%d", sv.name, m.name, g), func(b *testing.B) {
					// The framework may call this more than once with the same N.
					keys := prefix + "/" + m.name + "/" + strconv.FormatInt(benchRuns.Add(1), 10) + "/"
					parallel(b, g, func(i int64) error { return m.op(keys + strconv.FormatInt(i, 10)) })
				})
			}
		}
	}
}

// mysqlInterpolating opens the test MySQL with interpolateParams=true and a
// pool of conns, all opened at once.
func mysqlInterpolating(b *testing.B, conns int) *sql.DB {
	dsn := testenv.MySQLDSN(b)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	db, err := sql.Open("mysql", dsn+sep+"interpolateParams=true")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	return db
}

var benchRuns atomic.Int64

// parallel runs op b.N times, spread over g goroutines.
func parallel(b *testing.B, g int, op func(i int64) error) {
	b.ReportAllocs()
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	b.ResetTimer()
	for range g {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := op(i); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkPostgresReplay: a Claim of a key confirmed before, the path of
// every duplicate delivery, at 8 and 64 goroutines over 1,024 keys, with
// the WAL Postgres wrote per Claim (pg_current_wal_lsn before and after):
// a duplicate that writes nothing writes no WAL and waits for no commit.
func BenchmarkPostgresReplay(b *testing.B) {
	db := sqltest.PostgresPool(b, 64)
	ctx := context.Background()
	st := sqltest.NewStore(b, db, sqlstore.Options{Dialect: sqlstore.Postgres, Table: sqltest.UniqueTable()})
	fp, result := []byte("0123456789abcdef0123456789abcdef"), []byte("202 Accepted ok.")
	const keys = 1024
	for i := range keys {
		key := strconv.Itoa(i)
		c, err := st.Claim(ctx, key, fp)
		if err != nil || c.Outcome != idem.Claimed {
			b.Fatalf("Claim(%q) = %v, %v", key, c.Outcome, err)
		}
		if err := st.Confirm(ctx, c.Lease, result); err != nil {
			b.Fatal(err)
		}
	}
	lsn := func() string {
		var l string
		if err := db.QueryRowContext(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&l); err != nil {
			b.Fatal(err)
		}
		return l
	}
	for _, g := range []int{8, 64} {
		b.Run(fmt.Sprintf("g=%d", g), func(b *testing.B) {
			from := lsn()
			parallel(b, g, func(i int64) error {
				key := strconv.FormatInt(i%keys, 10)
				c, err := st.Claim(ctx, key, fp)
				if err == nil && c.Outcome != idem.Duplicate {
					err = fmt.Errorf("Claim(%q) = %v; want Duplicate", key, c.Outcome)
				}
				return err
			})
			b.StopTimer()
			var wal float64
			if err := db.QueryRowContext(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)", from).Scan(&wal); err != nil {
				b.Fatal(err)
			}
			// Other clients of the server write WAL too: on a shared
			// server this is an upper bound.
			b.ReportMetric(wal/float64(b.N), "wal-B/op")
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "claims/s")
		})
	}
}
