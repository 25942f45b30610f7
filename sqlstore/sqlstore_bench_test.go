package sqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testing/sqltest"
	"github.com/idemgo/idem/sqlstore"
)

// BenchmarkPostgres measures one message's cost on Postgres at 8 and 64
// goroutines: lease mode (Claim + Confirm), transactional mode (Run
// with a write that does nothing, so only idem's cost shows), and as the
// yardstick a plain INSERT ... ON CONFLICT DO NOTHING + UPDATE on a table of
// the same shape. They are sub-benchmarks of one benchmark, so one run
// measures all three back to back; -count repeats each sub-benchmark in a
// row, so for alternating rounds repeat the whole run:
//
//	for i in 1 2 3 4 5 6 7; do go test -run '^$' -bench Postgres ./sqlstore/; done | benchstat -
func BenchmarkPostgres(b *testing.B) {
	db := sqltest.PostgresPool(b, 64) // a connection per goroutine
	ctx := context.Background()
	st := sqltest.NewStore(b, db, sqlstore.Options{Dialect: sqlstore.Postgres, Table: sqltest.UniqueTable()})
	base := sqltest.UniqueTable()
	sqltest.NewStore(b, db, sqlstore.Options{Dialect: sqlstore.Postgres, Table: base})
	insert := `INSERT INTO "` + base + `" (key, state, owner, token, fingerprint, result, recorded_at, expires_at)
VALUES ($1, 'C', $2, $3, $4, NULL, now(), now() + interval '30 seconds') ON CONFLICT (key) DO NOTHING`
	update := `UPDATE "` + base + `" SET state = 'D', owner = '', result = $2, expires_at = now() + interval '24 hours' WHERE key = $1`

	fp, result := []byte("0123456789abcdef0123456789abcdef"), []byte("202 Accepted ok.")
	prefix := sqltest.UniqueTable() // fresh keys for every run of the benchmark
	modes := []struct {
		name string
		op   func(key string) error
	}{
		{"baseline", func(key string) error {
			if _, err := db.ExecContext(ctx, insert, []byte(key), "worker", int64(1), fp); err != nil {
				return err
			}
			_, err := db.ExecContext(ctx, update, []byte(key), result)
			return err
		}},
		{"lease", func(key string) error {
			c, err := st.Claim(ctx, key, fp)
			if err != nil {
				return err
			}
			if c.Outcome != idem.Claimed {
				return fmt.Errorf("Claim(%q) = %v; want Claimed", key, c.Outcome)
			}
			return st.Confirm(ctx, c.Lease, result)
		}},
		{"run", func(key string) error {
			_, replayed, err := st.Run(ctx, key, fp, func(context.Context, *sql.Tx) ([]byte, error) { return result, nil })
			if err == nil && replayed {
				err = fmt.Errorf("Run(%q) replayed; want the work done", key)
			}
			return err
		}},
	}
	for _, g := range []int{8, 64} {
		for _, m := range modes {
			b.Run(fmt.Sprintf("%s/g=%d", m.name, g), func(b *testing.B) {
				// The framework may call this more than once with the same N.
				keys := prefix + "/" + m.name + "/" + strconv.FormatInt(benchRuns.Add(1), 10) + "/"
				parallel(b, g, func(i int64) error { return m.op(keys + strconv.FormatInt(i, 10)) })
			})
		}
	}
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
