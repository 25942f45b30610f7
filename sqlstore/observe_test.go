package sqlstore_test

import (
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/obstest"
	"github.com/idemgo/idem/internal/sqltest"
	"github.com/idemgo/idem/sqlstore"
)

// Claim.TakeOver, and the event's, is set only when a claim replaced one
// whose lease ran out unconfirmed: not on a fresh key, not after a Forget
// (the failure was reported).
func TestClaimTakeOver(t *testing.T) {
	dialects(t, func(t *testing.T, db *sql.DB, d sqlstore.Dialect) {
		ctx := t.Context()
		log := &obstest.Log{}
		lease := 200 * time.Millisecond
		st := sqltest.NewStore(t, db, sqlstore.Options{LeaseTTL: lease, Observer: log, Dialect: d, Table: sqltest.UniqueTable()})
		c, err := st.Claim(ctx, "job", nil)
		if err != nil || c.Outcome != idem.Claimed || c.TakeOver {
			t.Fatalf("first Claim = %+v, %v; want Claimed, no take-over", c, err)
		}
		if err := st.Forget(ctx, c.Lease); err != nil {
			t.Fatal(err)
		}
		c, err = st.Claim(ctx, "job", nil)
		if err != nil || c.Outcome != idem.Claimed || c.TakeOver {
			t.Fatalf("Claim after Forget = %+v, %v; want Claimed, no take-over", c, err)
		}
		time.Sleep(lease + 50*time.Millisecond)
		c, err = st.Claim(ctx, "job", nil)
		if err != nil || c.Outcome != idem.Claimed || !c.TakeOver {
			t.Fatalf("Claim after the lease ran out = %+v, %v; want Claimed by take-over", c, err)
		}
		var seen []bool
		for _, e := range log.Of(idem.OpClaim) {
			seen = append(seen, e.TakeOver)
		}
		if fmt.Sprint(seen) != "[false false true]" {
			t.Errorf("claim events' TakeOver = %v; want [false false true]", seen)
		}
	})
}
