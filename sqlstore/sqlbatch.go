package sqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/batch"
)

// ClaimBatch implements idem.Batcher: the whole batch is one transaction, so it
// commits at once (one commit, and on SQLite one write lock, for the lot).
// Keys are claimed in byte order, so two batches sharing keys cannot
// deadlock; a key given twice is claimed once and the second item is
// InProgress with the first as holder. A database error rolls back the whole
// batch and is returned as a plain error: nothing was claimed. An item whose
// row kept changing under it fails alone, in a *BatchError.
func (s *Store) ClaimBatch(ctx context.Context, keys []string, fingerprints [][]byte) (cs []idem.Claim, err error) {
	start := time.Now()
	defer func() {
		s.core.Observe(ctx, idem.Event{Op: idem.OpClaimBatch, Items: len(keys), Err: err}, "", start)
		s.core.LogTakeOvers(ctx, keys, cs, err)
	}()
	if err := s.core.CheckClaimBatch(keys, fingerprints); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		return []idem.Claim{}, nil
	}
	var errs []error
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		cs, errs = make([]idem.Claim, len(keys)), nil
		for _, i := range byteOrder(len(keys), func(i int) string { return keys[i] }) {
			c, err := s.claimIn(ctx, tx, keys[i], batch.Item(fingerprints, i), start)
			if err != nil {
				if errors.Is(err, idem.ErrQuarantined) {
					cs[i] = c
					errs = batch.Collect(errs, len(keys), i, err)
					continue
				}
				if !errors.Is(err, errChanged) {
					return s.fail("claim", keys[i], err) // the transaction is lost
				}
				errs = batch.Collect(errs, len(keys), i, s.fail("claim", keys[i], err))
				continue
			}
			cs[i] = c
			errs = batch.Collect(errs, len(keys), i, s.core.FingerprintMismatch(c, keys[i], batch.Item(fingerprints, i)))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if errs != nil {
		return cs, &idem.BatchError{Errs: errs}
	}
	return cs, nil
}

// ConfirmBatch implements idem.Batcher in one transaction, leases in key order
// (see ClaimBatch). A database error rolls back the whole batch and is
// returned as a plain error: nothing was confirmed.
func (s *Store) ConfirmBatch(ctx context.Context, leases []*idem.Lease, results [][]byte) (err error) {
	start := time.Now()
	late := false
	defer func() {
		s.core.Observe(ctx, idem.Event{Op: idem.OpConfirmBatch, Items: len(leases), Late: late, Err: err}, "", start)
	}()
	if err := s.core.CheckConfirmBatch(leases, results); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(leases) == 0 {
		return nil
	}
	var lates []*idem.Lease
	var errs []error
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		lates, errs = nil, nil
		for _, i := range byteOrder(len(leases), func(i int) string { return leases[i].Key }) {
			l, err := s.confirmIn(ctx, tx, leases[i], batch.Item(results, i), start)
			if err != nil && !errors.Is(err, idem.ErrAlreadyConfirmed) {
				return s.fail("confirm", leases[i].Key, err)
			}
			errs = batch.Collect(errs, len(leases), i, err)
			if l {
				lates = append(lates, leases[i])
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	late = len(lates) > 0
	for _, l := range lates {
		s.core.LogLate(ctx, l)
	}
	if errs != nil {
		return &idem.BatchError{Errs: errs}
	}
	return nil
}

// byteOrder returns 0..n-1 sorted by key, keeping the given order among
// equal keys. Postgres compares BYTEA, and SQLite BLOB, byte for byte, as Go
// compares strings.
func byteOrder(n int, key func(int) string) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(key(a), key(b)) })
	return idx
}

// txOptions are the options of the store's transactions. Claim's statements
// rely on READ COMMITTED on Postgres and MySQL: after waiting for another
// transaction's row, the next statement must see what that one committed
// (on MySQL the driver sends SET TRANSACTION ISOLATION LEVEL first: a round
// trip). SQLite's transactions are serializable, and its drivers refuse
// other levels.
func (s *Store) txOptions() *sql.TxOptions {
	if s.dialect == Postgres || s.dialect == MySQL {
		return &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	return nil
}

// purgeBatch bounds the rows one PurgeExpired statement deletes, so that no
// statement holds locks on a large part of a big table for long.
const purgeBatch = 1000

// PurgeExpired deletes the rows whose retention ran out, and the claims
// whose lease ran out more than this store's Retention ago (until then the
// next claim of the key takes it over and is told so, idem.Claim.TakeOver),
// judged by the database clock, in statements of at most 1000 rows, each its own
// transaction, until a statement finds fewer. It returns how many rows it
// deleted, also when it stops early on an error or ctx. On Postgres and
// MySQL it skips rows locked by a transaction in progress (a Run's), which
// a later purge gets; on MySQL each batch is a transaction of two
// statements (see sqlPurgeSelectMySQL). Run it on a schedule (`idem prune`); the hot path never deletes.
//
// Deleting an expired row is what ends its key's record; a later claim of the
// key gets a clock-derived token again (see Store).
func (s *Store) PurgeExpired(ctx context.Context) (int64, error) {
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		var n int64
		var err error
		if s.dialect == MySQL {
			n, err = s.purgeMySQL(ctx)
		} else {
			err = s.exclusive(ctx, func() error {
				r, err := s.db.ExecContext(ctx, s.q.purge, purgeBatch, -s.retentionMs)
				if err == nil {
					n, err = r.RowsAffected()
				}
				return err
			})
		}
		if err != nil {
			if m := s.missingTable(err); m != "" {
				return total, fmt.Errorf("sqlstore: purging: %s: %w", m, err)
			}
			return total, fmt.Errorf("sqlstore: purging table %s: %w", s.table, err)
		}
		total += n
		if n < purgeBatch {
			return total, nil
		}
	}
}

// purgeMySQL deletes one batch of rows gone on MySQL (see sqlPurgeGone):
// it locks them, skipping those a transaction holds, and deletes them by
// key.
func (s *Store) purgeMySQL(ctx context.Context) (int64, error) {
	var n int64
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		n = 0
		rows, err := tx.QueryContext(ctx, s.q.purge, s.bind(s.q.purge, purgeBatch, -s.retentionMs)...)
		if err != nil {
			return err
		}
		var keys []any
		for rows.Next() {
			var k []byte
			if err := rows.Scan(&k); err != nil {
				_ = rows.Close()
				return err
			}
			keys = append(keys, k)
		}
		if err := rows.Err(); err != nil || len(keys) == 0 {
			return err
		}
		q := s.q.purgeDelete + strings.Repeat("?, ", len(keys)-1) + "?)"
		r, err := tx.ExecContext(ctx, q, keys...)
		if err == nil {
			n, err = r.RowsAffected()
		}
		return err
	})
	return n, err
}
