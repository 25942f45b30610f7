package sqlstore

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemgo/idem"
)

// Claim: the upsert that inserts a key or takes over a lapsed claim, the
// read of a live one, the quarantine at the limit of take-overs; each
// dialect's way of it (sqlstore.go).

// claimAttempts bounds Claim's statements: a row can expire, be forgotten
// or be purged between them, and each of those sends Claim round again.
const claimAttempts = 8

var (
	errNoRecord = errors.New("sqlstore: no live record")
	// errChanged: the row kept changing between a claim's statements.
	errChanged = fmt.Errorf("the record changed under each of %d attempts", claimAttempts)
)

// Claim implements idem.Store: one upsert that inserts a new key or takes
// over an expired or forgotten claim (the expiry check in its WHERE
// clause), and when the key is live, a SELECT of it. One round trip for a new key, two
// for a duplicate; never a read followed by a write that depends on it.
func (s *Store) Claim(ctx context.Context, key string, fingerprint []byte) (c idem.Claim, err error) {
	start := time.Now()
	defer func() {
		s.core.Observe(ctx, idem.Event{Op: idem.OpClaim, Outcome: c.Outcome, TakeOver: c.TakeOver, Prior: c.Prior, Err: err}, key, start)
	}()
	if err := s.core.CheckClaim(key, fingerprint); err != nil {
		return idem.Claim{}, err
	}
	if err := ctx.Err(); err != nil {
		return idem.Claim{}, err
	}
	c, err = s.claimIn(ctx, s.db, key, fingerprint, start)
	if errors.Is(err, idem.ErrQuarantined) {
		return c, err
	}
	if isLockTimeout(err) {
		// A transaction (a Run) held the key's row past the database's lock
		// wait (on MySQL innodb_lock_wait_timeout, 50s by default).
		err = fmt.Errorf("%w: a transaction held the key's row past the database's lock wait: %w", idem.ErrInProgress, err)
	}
	if err != nil {
		return idem.Claim{}, s.fail("claim", key, err)
	}
	return c, s.core.FingerprintMismatch(c, key, fingerprint)
}

// claimIn claims key with q's statements: the database, or a transaction
// (ClaimBatch's, Run's). A quarantined key is answered with its Claim
// (the record) and an error wrapping idem.ErrQuarantined.
//
// On SQLite, where writes queue for the one write lock and reads are in
// process and cheap, a claim reads first, in its turn as this process's
// writer, and writes only when it found nothing live, so that racing claims
// of one key do not each write. MySQL's claim reads first too: a
// duplicate there is then one read that takes no lock, where the INSERT
// that finds the key would lock it (see sqlClaimMySQL). Answering from the
// read is sound (the record was live when read, and only the writer could
// have changed it since); the take-over itself is still the one statement
// with the expiry check in its WHERE clause, which holds against other
// processes too. On Postgres one statement inserts or reads (claimOrRead).
func (s *Store) claimIn(ctx context.Context, q sqlQuerier, key string, fingerprint []byte, start time.Time) (idem.Claim, error) {
	k, fp := []byte(key), nonNil(fingerprint)
	for range claimAttempts {
		if s.dialect == Postgres {
			c, err := s.claimOrRead(ctx, q, key, k, fp, start)
			if !errors.Is(err, errChanged) {
				return s.quarantined(c, err)
			}
			continue
		}
		var (
			c        idem.Claim
			answered bool
			up       upserted
			old      dbRow
		)
		err := s.locked(ctx, q, func() error {
			var err error
			if c, err = s.found(ctx, q, key, start, &old); !errors.Is(err, errNoRecord) {
				answered = true
				return err
			}
			return s.upsert(ctx, q, k, fp, &up)
		})
		switch {
		case answered:
			return s.quarantined(c, err)
		case err == nil:
			return withEnded(s.claimed(key, fp, up, start), &old), nil
		case !errors.Is(err, sql.ErrNoRows):
			return idem.Claim{}, err
		}
		c, err = s.quarantineLapsed(ctx, q, key, k, start)
		if !errors.Is(err, errChanged) {
			return s.quarantined(c, err)
		}
	}
	return idem.Claim{}, errChanged
}

// quarantineLapsed follows a claim that found nothing live and took
// nothing over: a lapsed claim at the limit of take-overs, quarantined now
// and answered so, or a row that changed between the statements
// (errChanged: the caller tries again).
func (s *Store) quarantineLapsed(ctx context.Context, q sqlQuerier, key string, k []byte, start time.Time) (idem.Claim, error) {
	marked, err := s.exec(ctx, q, s.q.quarantine, k, s.o.MaxTakeOvers, s.retentionMs)
	if err != nil {
		return idem.Claim{}, err
	}
	if marked {
		if c, err := s.found(ctx, q, key, start, nil); !errors.Is(err, errNoRecord) {
			return c, err
		}
	}
	return idem.Claim{}, errChanged
}

// claimOrRead claims key on Postgres: one statement inserts a new key or,
// when the key has a row, reads it without a write, so that a duplicate
// writes nothing, holds no lock and waits for no commit flush. A row that
// is not live (a forgotten claim, a lapsed one, a record past its time) is
// taken over by a second statement, an UPDATE whose WHERE clause holds the
// expiry check; a lapsed claim at the limit of take-overs is quarantined
// by a third. errChanged: the row changed between them (or was committed
// after the statement's snapshot): the caller tries again.
func (s *Store) claimOrRead(ctx context.Context, q sqlQuerier, key string, k, fp []byte, start time.Time) (idem.Claim, error) {
	var r dbRow
	err := q.QueryRowContext(ctx, s.q.claimOrRead, k, s.o.Worker, fp, s.leaseMs).Scan(r.dest()...)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return idem.Claim{}, errChanged
	case err != nil:
		return idem.Claim{}, err
	case r.st == "I":
		return s.claimed(key, fp, upserted{tok: r.tok}, start), nil
	}
	rec, err := r.record(key, start, s.ttlUnit)
	if err == nil {
		return foundClaim(rec), nil
	}
	if !errors.Is(err, errNotLive) {
		return idem.Claim{}, err
	}
	var up upserted
	err = q.QueryRowContext(ctx, s.q.takeOver, k, s.o.Worker, fp, s.leaseMs, s.o.MaxTakeOvers).
		Scan(&up.tok, &up.takeovers, &up.priorOwner, &up.priorToken, &up.priorAt, &up.checkpoint)
	if err == nil {
		return withEnded(s.claimed(key, fp, up, start), &r), nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return idem.Claim{}, err
	}
	return s.quarantineLapsed(ctx, q, key, k, start)
}

// withEnded sets c's Prior.Ended from old, the row c's claim read before
// it took the key over, when old is the claim taken over: why its holder
// gave it up (sqlAbandon keeps it in the claim's result column, which the
// take-over clears). A row that moved on between the read and the take-over
// is another attempt's; its reason is not told.
func withEnded(c idem.Claim, old *dbRow) idem.Claim {
	if c.Prior != nil && old.st == "C" && old.tok == c.Prior.Token && old.owner == c.Prior.Owner {
		c.Prior.Ended = string(old.res)
	}
	return c
}

// quarantined returns c with the error of a quarantined key when c's
// record is one, else c and err as they are.
func (s *Store) quarantined(c idem.Claim, err error) (idem.Claim, error) {
	if err == nil && c.Record != nil && c.Record.Quarantined {
		return c, s.core.Quarantined(c.Record)
	}
	return c, err
}

// upserted is what the claim statement returns of the row it wrote.
type upserted struct {
	tok, takeovers int64
	priorOwner     sql.NullString
	priorToken     sql.NullInt64
	priorAt        sql.NullInt64
	checkpoint     []byte
}

// upsert runs the claim statement: sql.ErrNoRows when the key is live (or
// a lapsed claim at the limit of take-overs), else the row it wrote into
// *up.
func (s *Store) upsert(ctx context.Context, q sqlQuerier, key, fp []byte, up *upserted) error {
	if s.dialect == MySQL {
		return s.upsertMySQL(ctx, q, key, fp, up)
	}
	return q.QueryRowContext(ctx, s.q.claim, key, s.o.Worker, fp, s.leaseMs, s.o.MaxTakeOvers).
		Scan(&up.tok, &up.takeovers, &up.priorOwner, &up.priorToken, &up.priorAt, &up.checkpoint)
}

// upsertMySQL inserts key or, when it has a row, takes over the lapsed or
// forgotten claim there (see sqlClaimMySQL): sql.ErrNoRows when the row is
// live, or a lapsed claim at the limit of take-overs. The new token comes
// back as the reply's last insert id; what a take-over carried over is
// read after it, by the token it wrote.
func (s *Store) upsertMySQL(ctx context.Context, q sqlQuerier, key, fp []byte, up *upserted) error {
	r, err := q.ExecContext(ctx, s.q.claim, key, s.o.Worker, fp, s.leaseMs)
	if err == nil {
		up.tok, err = r.LastInsertId()
		return err
	}
	if !isDuplicateKey(err) {
		return err
	}
	r, err = q.ExecContext(ctx, s.q.takeOver, s.bind(s.q.takeOver, key, s.o.Worker, fp, s.leaseMs, s.o.MaxTakeOvers)...)
	if err != nil {
		return err
	}
	if n, err := r.RowsAffected(); err != nil || n == 0 {
		return cmp.Or(err, sql.ErrNoRows)
	}
	if up.tok, err = r.LastInsertId(); err != nil {
		return err
	}
	err = q.QueryRowContext(ctx, s.q.takenOver, key, up.tok).
		Scan(&up.takeovers, &up.priorOwner, &up.priorToken, &up.priorAt, &up.checkpoint)
	if errors.Is(err, sql.ErrNoRows) {
		// The lease ran out and the row moved on within the moment since
		// the take-over: the claim stands, what it carried over is gone.
		return nil
	}
	return err
}

// claimed is the Claim of a successful upsert: a take-over when it counted
// one.
func (s *Store) claimed(key string, fp []byte, up upserted, start time.Time) idem.Claim {
	c := idem.Claim{Outcome: idem.Claimed,
		Lease: s.core.Lease(key, up.tok, s.o.LeaseTTL, start.Add(s.o.LeaseTTL), bytes.Clone(fp))}
	if up.takeovers > 0 {
		c.TakeOver, c.TakeOvers, c.Checkpoint = true, int(up.takeovers), nilIfEmpty(up.checkpoint)
		c.Prior = &idem.Attempt{Owner: up.priorOwner.String, Token: up.priorToken.Int64,
			Claimed: time.UnixMilli(up.priorAt.Int64)}
	}
	return c
}
