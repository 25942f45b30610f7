package sqlstore_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testing/obstest"
	"github.com/idemgo/idem/internal/testing/sqltest"
	"github.com/idemgo/idem/sqlstore"
)

// Claim.TakeOver, and the event's, is set only when a claim replaced one
// whose lease ran out unconfirmed: not on a fresh key, not after a Forget
// (the failure was reported).
func TestClaimTakeOver(t *testing.T) {
	dialects(t, func(t *testing.T, db *sql.DB, d sqlstore.Dialect) {
		ctx := t.Context()
		log := &obstest.Log{}
		lease := idem.MinLeaseTTL
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

// Run's take-over of a claim whose lease ran out is logged as a Claim's
// is, with how the attempt taken over ended.
func TestRunLogsTakeOver(t *testing.T) {
	dialects(t, func(t *testing.T, db *sql.DB, d sqlstore.Dialect) {
		ctx := t.Context()
		var buf bytes.Buffer
		var mu sync.Mutex
		logger := slog.New(slog.NewTextHandler(lockedWriter{&buf, &mu}, nil))
		lease := idem.MinLeaseTTL
		st := sqltest.NewStore(t, db, sqlstore.Options{LeaseTTL: lease, Logger: logger, Dialect: d, Table: sqltest.UniqueTable()})
		c, err := st.Claim(ctx, "job", nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Abandon(ctx, c.Lease, "Reconcile failed: ledger unreachable"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(lease + 50*time.Millisecond)
		write := func(context.Context, *sql.Tx) ([]byte, error) { return []byte("ok"), nil }
		if _, _, err := st.Run(ctx, "job", nil, write); err != nil {
			t.Fatalf("Run after the lease ran out = %v", err)
		}
		mu.Lock()
		out := buf.String()
		mu.Unlock()
		if !strings.Contains(out, "idem: take-over") || !strings.Contains(out, "prior_token="+strconv.FormatInt(c.Lease.Token, 10)) ||
			!strings.Contains(out, "Reconcile failed: ledger unreachable") {
			t.Errorf("log after Run's take-over lacks the take-over of token %d and how it ended:\n%s", c.Lease.Token, out)
		}
	})
}

type lockedWriter struct {
	b  *bytes.Buffer
	mu *sync.Mutex
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// Run reports one OpRun event per call: Claimed when its write ran,
// Duplicate when it replayed a recorded result, no outcome on an error.
func TestRunReportsEvents(t *testing.T) {
	dialects(t, func(t *testing.T, db *sql.DB, d sqlstore.Dialect) {
		ctx := t.Context()
		log := &obstest.Log{}
		h, err := idem.NewKeyHasher([]byte("a secret shared by the fleet"))
		if err != nil {
			t.Fatal(err)
		}
		st := sqltest.NewStore(t, db, sqlstore.Options{Observer: log, KeyHasher: h, Dialect: d, Table: sqltest.UniqueTable()})
		write := func(context.Context, *sql.Tx) ([]byte, error) { return []byte("ok"), nil }
		for range 2 {
			if _, _, err := st.Run(ctx, "k", []byte("a"), write); err != nil {
				t.Fatalf("Run = %v", err)
			}
		}
		if _, _, err := st.Run(ctx, "k", []byte("b"), write); err == nil {
			t.Fatalf("Run with another fingerprint = nil error; want ErrFingerprintMismatch")
		}
		es := log.Of(idem.OpRun)
		want := []struct {
			outcome idem.Outcome
			class   idem.ErrorClass
		}{{idem.Claimed, idem.ClassNone}, {idem.Duplicate, idem.ClassNone}, {0, idem.ClassConflict}}
		if len(es) != len(want) {
			t.Fatalf("%d OpRun events: %+v; want %d", len(es), es, len(want))
		}
		for i, w := range want {
			if e := es[i]; e.Outcome != w.outcome || e.Class() != w.class || e.KeyHash != h.Hash("k") || e.Took <= 0 {
				t.Errorf("OpRun event %d = %+v (class %v); want outcome %v class %v hash %q",
					i, e, e.Class(), w.outcome, w.class, h.Hash("k"))
			}
		}
	})
}
