package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/idemgo/idem"
)

// After a crash, and the operator: a holder's checkpoint and its
// abandon, a lapsed
// attempt shown (Inspect), a quarantined key settled or any key cleared
// (Resolve), the quarantined keys listed (sqlstore.go).

// Inspect implements idem.Inspector in one statement: the row whatever
// its state, a lapsed claim answered as one (Record.Lapsed). A lapsed
// claim is kept until PurgeExpired, called with this store's Retention,
// deletes it a Retention after its lease: its Expires says so.
func (s *Store) Inspect(ctx context.Context, key string) (rec *idem.Record, err error) {
	if err := s.core.CheckKey(key); err != nil {
		return nil, err
	}
	start := time.Now()
	var r dbRow
	err = s.reading(ctx, s.db, func() error {
		return s.db.QueryRowContext(ctx, s.q.readAny, []byte(key)).Scan(r.dest()...)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return nil, s.core.NotFound(key)
	}
	if err != nil {
		return nil, s.fail("inspect", key, err)
	}
	ttl := r.ttl
	lapsed := r.st == "C" && ttl <= 0
	if lapsed {
		r.ttl = 1 // read as the claim it was
	}
	rec, err = r.record(key, start, s.ttlUnit)
	if errors.Is(err, errNotLive) {
		return nil, s.core.NotFound(key)
	}
	if err != nil {
		return nil, s.fail("inspect", key, err)
	}
	if lapsed {
		// Tokens are the database's clock in microseconds when claimed.
		rec.Lapsed = &idem.Attempt{Owner: rec.Owner, Token: rec.Token, Claimed: time.UnixMicro(rec.Token), Ended: rec.Ended}
		rec.Expires = start.Add(time.Duration(ttl)*s.ttlUnit + s.o.Retention)
	}
	return rec, nil
}

// heldUnchanged says, after a Renew, Checkpoint or Abandon changed no row, whether
// that was because the row already held what it wrote (the same
// checkpoint; a renewal in the same microsecond) while l's lease is live.
// MySQL counts only the rows an UPDATE changed (unless the DSN sets
// clientFoundRows), so there no row changed is not yet a lost lease; a
// second statement tells, on this rare path only. Elsewhere the count is
// of the rows matched, and the answer is no.
func (s *Store) heldUnchanged(ctx context.Context, l *idem.Lease) (bool, error) {
	if s.dialect != MySQL {
		return false, nil
	}
	var n int
	err := s.db.QueryRowContext(ctx, s.q.held, []byte(l.Key), l.Owner, l.Token).Scan(&n)
	return n == 1, err
}

// Checkpoint implements idem.Checkpointer in one statement.
func (s *Store) Checkpoint(ctx context.Context, l *idem.Lease, data []byte) (err error) {
	start := time.Now()
	defer func() { s.core.Observe(ctx, idem.Event{Op: idem.OpCheckpoint, Err: err}, leaseKey(l), start) }()
	if err := s.core.CheckCheckpoint(l, data); err != nil {
		return err
	}
	var cp any
	if len(data) > 0 {
		cp = data
	}
	return s.setHeld(ctx, idem.OpCheckpoint, s.q.checkpoint, l, cp)
}

// Abandon implements idem.Abandoner in one statement.
func (s *Store) Abandon(ctx context.Context, l *idem.Lease, reason string) (err error) {
	start := time.Now()
	defer func() { s.core.Observe(ctx, idem.Event{Op: idem.OpAbandon, Err: err}, leaseKey(l), start) }()
	if err := s.core.CheckAbandon(l, reason); err != nil {
		return err
	}
	if err := s.setHeld(ctx, idem.OpAbandon, s.q.abandon, l, []byte(reason)); err != nil {
		return err
	}
	s.core.LogAbandoned(ctx, l, reason)
	return nil
}

// setHeld runs stmt, an UPDATE of l's own live claim that sets one column
// to value (Checkpoint, Abandon): ErrLeaseLost when l holds no live claim.
func (s *Store) setHeld(ctx context.Context, op idem.Op, stmt string, l *idem.Lease, value any) error {
	ok, err := s.exec(ctx, s.db, stmt, []byte(l.Key), l.Owner, l.Token, value)
	if err == nil && !ok {
		ok, err = s.heldUnchanged(ctx, l)
	}
	if err != nil {
		return s.fail(op.String(), l.Key, err)
	}
	if !ok {
		return s.core.LeaseLost(op, l)
	}
	return nil
}

// Resolve implements idem.Resolver in one statement.
func (s *Store) Resolve(ctx context.Context, key string, r idem.Resolution) (err error) {
	start := time.Now()
	defer func() { s.core.Observe(ctx, idem.Event{Op: idem.OpResolve, Err: err}, key, start) }()
	if err := s.core.CheckResolve(key, r); err != nil {
		return err
	}
	var ok bool
	switch {
	case r.Confirm:
		ok, err = s.exec(ctx, s.db, s.q.resolveConfirm, []byte(key), nonNil(r.Result), s.retentionMs)
	case r.Force:
		ok, err = s.exec(ctx, s.db, s.q.resolveClear, []byte(key))
	default:
		ok, err = s.exec(ctx, s.db, s.q.resolveForget, []byte(key))
	}
	if err != nil {
		return s.fail("resolve", key, err)
	}
	switch {
	case ok:
		return nil
	case r.Force:
		// Nothing cleared: a live claim, or no record. Read to say which.
		rec, err := s.read(ctx, s.db, key, start, nil)
		if err == nil && !rec.Confirmed && !rec.Quarantined {
			return s.core.LiveClaim(key)
		}
		return s.core.NothingToClear(key)
	}
	return s.core.NotQuarantined(key)
}

// Quarantined implements idem.Resolver in one query.
func (s *Store) Quarantined(ctx context.Context, limit int) (recs []*idem.Record, err error) {
	if limit <= 0 {
		limit = math.MaxInt32
	}
	start := time.Now()
	err = s.reading(ctx, s.db, func() error {
		recs = nil
		rows, err := s.db.QueryContext(ctx, s.q.quarantined, limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var key []byte
			rec, err := s.scanRecord(rows, "", start, &key)
			if errors.Is(err, errNotLive) {
				continue
			}
			if err != nil {
				return err
			}
			rec.Key = string(key)
			recs = append(recs, rec)
		}
		return rows.Err()
	})
	if err != nil {
		if m := s.missingTable(err); m != "" {
			return nil, fmt.Errorf("sqlstore: quarantined: %s: %w", m, err)
		}
		return nil, fmt.Errorf("sqlstore: quarantined: %w", err)
	}
	return recs, nil
}
