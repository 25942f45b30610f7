package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemgo/idem"
)

// A row read into a Record: the columns, their scan, and the states a row
// can be in (sqlstore.go).

// found answers a claim of a key with a live record: Duplicate, InProgress,
// or a quarantined key (Claim.Record alone). Without one it returns
// errNoRecord. With old it reads the row whatever its state into *old (see
// read).
func (s *Store) found(ctx context.Context, q sqlQuerier, key string, start time.Time, old *dbRow) (idem.Claim, error) {
	rec, err := s.read(ctx, q, key, start, old)
	if err != nil {
		return idem.Claim{}, err
	}
	return foundClaim(rec), nil
}

// foundClaim is the answer of a claim that found live record rec.
func foundClaim(rec *idem.Record) idem.Claim {
	switch {
	case rec.Quarantined:
		return idem.Claim{Record: rec}
	case rec.Confirmed:
		return idem.Claim{Outcome: idem.Duplicate, Record: rec}
	default:
		return idem.Claim{Outcome: idem.InProgress, Record: rec}
	}
}

// read returns the key's live record, or errNoRecord. With old (the
// claims of SQLite and MySQL, which read before they write) it reads the
// row whatever its state into *old and answers errNoRecord for one that is
// not live: the claim learns so that it must write, and what it takes over
// (withEnded).
func (s *Store) read(ctx context.Context, q sqlQuerier, key string, start time.Time, old *dbRow) (*idem.Record, error) {
	query, r := s.q.read, old
	if old == nil {
		r = new(dbRow)
	} else {
		query = s.q.readAny
	}
	var rec *idem.Record
	err := s.reading(ctx, q, func() error {
		if err := q.QueryRowContext(ctx, query, []byte(key)).Scan(r.dest()...); err != nil {
			return err
		}
		var err error
		rec, err = r.record(key, start, s.ttlUnit)
		return err
	})
	if errors.Is(err, sql.ErrNoRows) || errors.Is(err, errNotLive) {
		return nil, errNoRecord
	}
	return rec, err
}

// errNotLive is scanRecord's answer for a forgotten claim or a row past
// its time.
var errNotLive = errors.New("sqlstore: not live")

// rowScanner is a *sql.Row or *sql.Rows.
type rowScanner interface{ Scan(dest ...any) error }

// dbRow is a row of sqlColumns as read.
type dbRow struct {
	st, owner  string
	tok, ttl   int64
	fp, res    []byte
	takeovers  int64
	priorOwner sql.NullString
	priorToken sql.NullInt64
	priorAt    sql.NullInt64
	checkpoint []byte
}

// dest returns what Scan reads a row of sqlColumns into, then extra.
func (r *dbRow) dest(extra ...any) []any {
	return append([]any{&r.st, &r.owner, &r.tok, &r.fp, &r.res, &r.ttl, &r.takeovers,
		&r.priorOwner, &r.priorToken, &r.priorAt, &r.checkpoint}, extra...)
}

// scanRecord reads key's record from a row of sqlColumns, then into extra
// the columns that follow them.
func (s *Store) scanRecord(row rowScanner, key string, start time.Time, extra ...any) (*idem.Record, error) {
	var r dbRow
	if err := row.Scan(r.dest(extra...)...); err != nil {
		return nil, err
	}
	return r.record(key, start, s.ttlUnit)
}

// record is the live record r holds for key, or errNotLive; unit is the
// unit of r.ttl (Store.ttlUnit).
func (r *dbRow) record(key string, start time.Time, unit time.Duration) (*idem.Record, error) {
	if r.st == "F" || r.ttl <= 0 {
		return nil, errNotLive
	}
	if r.st != "C" && r.st != "D" && r.st != "Q" {
		return nil, fmt.Errorf("%w: state %q", idem.ErrDamaged, r.st)
	}
	rec := &idem.Record{Key: key, Confirmed: r.st == "D", Token: r.tok, Owner: r.owner, Fingerprint: nonNil(r.fp),
		Expires: start.Add(time.Duration(r.ttl) * unit)}
	if rec.Confirmed {
		rec.Result = nonNil(r.res)
		rec.Owner, rec.Resolved = "", r.owner == ownerResolved
		return rec, nil
	}
	rec.Quarantined, rec.TakeOvers, rec.Checkpoint = r.st == "Q", int(r.takeovers), nilIfEmpty(r.checkpoint)
	rec.Ended = string(r.res) // a claim's result column holds why its holder gave it up (sqlAbandon)
	if r.takeovers > 0 && r.priorToken.Valid {
		rec.Prior = &idem.Attempt{Owner: r.priorOwner.String, Token: r.priorToken.Int64, Claimed: time.UnixMilli(r.priorAt.Int64)}
	}
	return rec, nil
}

// nilIfEmpty returns nil for an empty b: a checkpoint cleared or never
// recorded.
func nilIfEmpty(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}

// nonNil returns b, or an empty slice for nil: the columns are NOT NULL, and
// drivers send a nil []byte as NULL.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
