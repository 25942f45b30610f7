package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/sqlstore"
)

// A lease belongs to its table: a store on another table of the same
// database refuses it before any write.
func TestLeaseOfAnotherTable(t *testing.T) {
	dialects(t, func(t *testing.T, db *sql.DB, d sqlstore.Dialect) {
		ctx := context.Background()
		open := func(table string) *sqlstore.Store {
			st, err := sqlstore.New(db, sqlstore.Options{Dialect: d, Table: table})
			if err != nil {
				t.Fatalf("New(Table %q): %v", table, err)
			}
			if err := st.CreateSchema(ctx); err != nil {
				t.Fatalf("CreateSchema(%q): %v", table, err)
			}
			return st
		}
		a, b := open("idem_own_a"), open("idem_own_b")
		key := fmt.Sprintf("%s/%d", t.Name(), time.Now().UnixNano()) // the tables outlive a run
		c, err := a.Claim(ctx, key, nil)
		if err != nil || c.Outcome != idem.Claimed {
			t.Fatalf("Claim = %v, %v; want claimed", c.Outcome, err)
		}
		if err := b.Confirm(ctx, c.Lease, []byte("r")); !errors.Is(err, idem.ErrInvalidLease) {
			t.Errorf("Confirm on table b of a lease of table a = %v; want ErrInvalidLease", err)
		}
		if _, err := b.Lookup(ctx, key); !errors.Is(err, idem.ErrNotFound) {
			t.Errorf("Lookup on table b after the refused Confirm = %v; want ErrNotFound", err)
		}
		if err := a.Confirm(ctx, c.Lease, []byte("r")); err != nil {
			t.Errorf("Confirm on its own table = %v; want nil", err)
		}
	})
}
