package sqlstore

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/badopt"
)

// DefaultLockTimeout is how long a Store waits for a lock by default.
const DefaultLockTimeout = 5 * time.Second

// Options configure a Store in one flat literal. The fields up to
// RevealKeys are those of idem.Options, with the same meaning and defaults.
// The zero value of each field means its documented default; only Dialect
// must be set.
type Options struct {
	// Retention is how long a confirmed key is remembered. At least
	// LeaseTTL. Default 24h.
	Retention time.Duration
	// LeaseTTL is how long a claim binds unless renewed. At least
	// idem.MinLeaseTTL (500ms), which KeepAlive can renew in time. Default
	// 30s.
	LeaseTTL time.Duration
	// Worker names this store's leases (Lease.Owner); no two stores may
	// share one. At most 255 bytes, no NUL. Default: a random UUID.
	Worker string
	// MaxKeyBytes bounds keys. Default 1024.
	MaxKeyBytes int
	// MaxResultBytes bounds Confirm's result. Default 1 MiB.
	MaxResultBytes int
	// Logger receives what an operator must see (a late confirm, a lost
	// lease, a store failure at most once a second, a damaged record, and
	// on Redis what first contact found unsafe but allowed). Default: none.
	Logger *slog.Logger
	// Observer is called once per operation. Default: none.
	Observer idem.Observer
	// KeyHasher hashes keys for errors, the Logger and the Observer.
	// Default: a random secret per process.
	KeyHasher *idem.KeyHasher
	// RevealKeys makes errors and log lines name keys as they are (quoted)
	// instead of by their hash, for debugging. Keys may carry personal
	// data: leave it off in production. Default false.
	RevealKeys bool
	// MaxTakeOvers is how many take-overs in a row (claims whose lease ran
	// out unconfirmed, each taken over by the next Claim) a key may have;
	// when the last of them lapses too, the next Claim quarantines the key
	// instead of running the work once more. Not negative. Default 3.
	MaxTakeOvers int
	// Dialect is the database: Postgres, MySQL (MariaDB too) or SQLite.
	// Required.
	Dialect Dialect
	// Table holds the records: a plain identifier, optionally qualified by
	// a schema ("idem.keys"), each part [A-Za-z_][A-Za-z0-9_]* and at most
	// 63 bytes. It is quoted, so it is case-sensitive. Default "idem_keys".
	Table string
	// LockTimeout bounds how long an operation waits for a lock: on
	// Postgres and MySQL, a Run waiting for another Run of the same key
	// (then idem.ErrInProgress); on SQLite, any operation waiting for the
	// database's single write lock. MySQL counts its lock wait
	// (innodb_lock_wait_timeout) in whole seconds: there it is rounded up
	// to the next second. Default 5s.
	LockTimeout time.Duration
}

// OptionsFrom returns Options with the fields of o, the options every
// store shares, and dialect d; Table and LockTimeout are left zero for the
// caller to set. It serves code that holds the shared options, as a
// storetest Backend's Open does.
func OptionsFrom(o idem.Options, d Dialect) Options {
	return Options{Retention: o.Retention, LeaseTTL: o.LeaseTTL, Worker: o.Worker,
		MaxKeyBytes: o.MaxKeyBytes, MaxResultBytes: o.MaxResultBytes, Logger: o.Logger,
		Observer: o.Observer, KeyHasher: o.KeyHasher, RevealKeys: o.RevealKeys, MaxTakeOvers: o.MaxTakeOvers, Dialect: d}
}

// shared returns the settings o shares with every store.
func (o Options) shared() idem.Options {
	return idem.Options{Retention: o.Retention, LeaseTTL: o.LeaseTTL, Worker: o.Worker,
		MaxKeyBytes: o.MaxKeyBytes, MaxResultBytes: o.MaxResultBytes, Logger: o.Logger,
		Observer: o.Observer, KeyHasher: o.KeyHasher, RevealKeys: o.RevealKeys, MaxTakeOvers: o.MaxTakeOvers}
}

// Store is an idem.Store and idem.Batcher on a SQL table (Postgres,
// MySQL 8 / MariaDB 10.11+ or SQLite), with a transactional mode, Run, in
// which the record commits in the same transaction as the work.
//
// One row per key (see SchemaDDL). Claim is an INSERT ... ON CONFLICT DO
// NOTHING (on MySQL a read, then an INSERT; see "MySQL and MariaDB" in the
// package documentation); taking over an expired claim is one UPDATE whose
// WHERE clause holds the expiry check, so check and take-over are one
// atomic statement. Expiry is judged by the database's clock (Postgres's
// statement_timestamp(), MySQL's UTC_TIMESTAMP(6); on SQLite, which runs
// in the process, the process's clock). Nothing on the hot path deletes rows: call PurgeExpired
// on a schedule.
//
// Fencing tokens are the database clock in microseconds when a key's row is
// created; a take-over, or a claim after a Forget, sets the token to the
// greater of the clock and the old token plus one, under the row's lock, so
// tokens strictly increase for as long as the row exists. Forget therefore
// keeps the row (state 'F') with its token. The guarantee ends where the
// row does and the clock misbehaves: after PurgeExpired (or a hand) deleted
// a key's row, a new claim's token is the clock again, which exceeds the old
// token unless the database clock was stepped back by more than the lease or
// retention that had to pass before the row could be purged.
//
// Statements run at the database's default isolation, which must be READ
// COMMITTED on Postgres (the default). On SQLite the database must be a
// file in WAL mode; an operation that finds the write lock taken retries for
// up to LockTimeout, whether or not the connection has a busy_timeout.
//
// On MySQL and MariaDB the table is InnoDB. The store's transactions (Run,
// the batches, PurgeExpired) begin at READ COMMITTED whatever the server's
// default (REPEATABLE READ): under it a read in a transaction sees the
// snapshot of the transaction's first read, so a Run that waited for
// another would not see what that one committed, and locking an absent key
// locks the gap around it, where concurrent claims of new keys deadlock.
// Lease-mode calls are single statements in autocommit, where the level
// makes no difference. A claim reads the key first (a duplicate writes
// nothing), then inserts it or takes it over with the expiry check and the
// limit of take-overs in the UPDATE's WHERE clause. A deadlock (InnoDB rolls back the whole
// transaction) met before any work ran is retried a few times, the whole
// transaction over; met by a Run's write function, it is write's error, and
// nothing is recorded. A lock wait past innodb_lock_wait_timeout (the
// server's, 50s by default; LockTimeout in a Run) is idem.ErrInProgress.
//
// The table name is the only text interpolated into SQL; keys, results and
// fingerprints are always bind parameters. A Store is safe for
// concurrent use by many goroutines and processes.
type Store struct {
	db          *sql.DB
	core        *idem.Core
	o           idem.Options // core.Options(), read on every call
	dialect     Dialect
	table       sqlTable
	lockTimeout time.Duration
	leaseMs     int64
	retentionMs int64
	q           sqlStatements
	gate        chan struct{}    // SQLite only: see sqlitelock.go
	binds       map[string][]int // MySQL only: see bind
	lockWaitSec int64            // MySQL only: LockTimeout in whole seconds, rounded up
	ttlUnit     time.Duration    // the unit of {ttl}: a millisecond, on MySQL a microsecond
}

// New returns a store on db, whose table must exist (CreateSchema,
// or SchemaDDL in a migration). It errors on invalid options, naming the
// field at fault: an unknown dialect, a Dialect that is not the one db's
// driver speaks (told from the driver's Go package, without I/O: pgx or
// lib/pq for Postgres, go-sql-driver/mysql for MySQL, a SQLite driver for
// SQLite; other drivers, wrappers included, are not checked), a negative
// duration, a table name that is not a plain identifier, on MySQL a
// MaxKeyBytes above MaxMySQLKeyBytes. On SQLite it checks that the database is in WAL
// mode: in rollback-journal mode a commit can fail for a mere reader, and a
// connection pool of an in-memory database is several databases.
//
// New does not look for the table: a missing one is found by the first
// statement that needs it, whose error then names the table and how to
// create it, at no cost to the calls that find it.
func New(db *sql.DB, o Options) (*Store, error) {
	if db == nil {
		return nil, errors.New("sqlstore: New with a nil *sql.DB")
	}
	if o.Dialect != Postgres && o.Dialect != SQLite && o.Dialect != MySQL {
		return nil, errDialect(o.Dialect)
	}
	if err := checkDriver(db, o.Dialect); err != nil {
		return nil, err
	}
	if o.Table == "" {
		o.Table = DefaultTable
	}
	t, err := parseTable(o.Table)
	if err != nil {
		return nil, err
	}
	// Leases are this table's: another table's, or another kind of
	// store's, are refused (a Confirm would record a key never claimed here).
	core, err := idem.NewCore("sqlstore table "+strconv.Quote(o.Table), o.shared())
	if err != nil {
		return nil, err
	}
	if o.LockTimeout < 0 {
		return nil, badopt.Default("sqlstore", "LockTimeout", o.LockTimeout, DefaultLockTimeout, "is negative")
	}
	if o.LockTimeout == 0 {
		o.LockTimeout = DefaultLockTimeout
	}
	// Postgres counts lock_timeout in whole milliseconds, and 0 there
	// means no bound at all: round up, never down.
	if r := o.LockTimeout % time.Millisecond; r != 0 {
		o.LockTimeout += time.Millisecond - r
	}
	opts := core.Options()
	if o.Dialect == MySQL && opts.MaxKeyBytes > MaxMySQLKeyBytes {
		return nil, badopt.Error("sqlstore", "MaxKeyBytes", opts.MaxKeyBytes,
			"is above %d, the longest key InnoDB indexes (Dialect MySQL)", MaxMySQLKeyBytes)
	}
	s := &Store{
		db: db, core: core, o: opts, dialect: o.Dialect, table: t, lockTimeout: o.LockTimeout,
		leaseMs: opts.LeaseTTL.Milliseconds(), retentionMs: opts.Retention.Milliseconds(),
		lockWaitSec: int64((o.LockTimeout + time.Second - 1) / time.Second), ttlUnit: time.Millisecond,
	}
	if o.Dialect == MySQL {
		s.ttlUnit = time.Microsecond
	}
	text := func(q string) string {
		text, order := sqlText(o.Dialect, t, q)
		if order != nil {
			if s.binds == nil {
				s.binds = map[string][]int{}
			}
			s.binds[text] = order
		}
		return text
	}
	s.q = sqlStatements{
		claim: text(sqlClaim), read: text(sqlRead), readAny: text(sqlReadAny),
		claimOrRead: text(sqlClaimOrRead), takeOver: text(sqlTakeOver),
		quarantine: text(sqlQuarantine), checkpoint: text(sqlCheckpoint), quarantined: text(sqlQuarantined),
		resolveConfirm: text(sqlResolveConfirm), resolveForget: text(sqlResolveForget), resolveClear: text(sqlResolveClear),
		renew: text(sqlRenew), confirm: text(sqlConfirm), confirmLate: text(sqlConfirmLate),
		forget: text(sqlForget), record: text(sqlRecordPostgres), release: text(sqlRelease), purge: text(sqlPurgePostgres),
	}
	if o.Dialect == MySQL {
		s.q.claim, s.q.takeOver, s.q.takenOver = text(sqlClaimMySQL), text(sqlTakeOverMySQL), text(sqlTakenOverMySQL)
		s.q.held = text(sqlHeldMySQL)
		s.q.confirmLate, s.q.confirmLateInsert = text(sqlConfirmLateMySQL), text(sqlConfirmLateInsertMySQL)
		s.q.record, s.q.purge, s.q.purgeDelete = text(sqlRecordMySQL), text(sqlPurgeSelectMySQL), text(sqlPurgeDeleteMySQL)
	}
	if o.Dialect == SQLite {
		s.q.purge, s.q.record = text(sqlPurgeSQLite), text(sqlRecord)
		s.gate = sqliteGate(db)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var mode string
		if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
			return nil, fmt.Errorf("sqlstore: reading SQLite journal_mode: %w", err)
		}
		if mode != "wal" {
			return nil, fmt.Errorf("sqlstore: SQLite journal_mode is %q; the store needs a file database in WAL mode "+
				"(run PRAGMA journal_mode=WAL once, or open it with _pragma=journal_mode(WAL))", mode)
		}
	}
	return s, nil
}

// bind returns args in the order query's placeholders take them. Only
// MySQL needs it: it binds by position alone, and New recorded the order of
// each statement whose $n are not 1, 2, 3... in the text. Elsewhere, and for
// the other statements, args go as they are.
func (s *Store) bind(query string, args ...any) []any {
	if s.binds == nil {
		return args
	}
	order, ok := s.binds[query]
	if !ok {
		return args
	}
	out := make([]any, len(order))
	for i, n := range order {
		out[i] = args[n]
	}
	return out
}

// sqlQuerier is what *sql.DB, *sql.Tx and *sql.Conn have in common.
type sqlQuerier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

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
		s.core.Observe(ctx, idem.Event{Op: idem.OpClaim, Outcome: c.Outcome, TakeOver: c.TakeOver, Err: err}, key, start)
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
		)
		err := s.locked(ctx, q, func() error {
			var err error
			if c, err = s.found(ctx, q, key, start, true); !errors.Is(err, errNoRecord) {
				answered = true
				return err
			}
			return s.upsert(ctx, q, k, fp, &up)
		})
		switch {
		case answered:
			return s.quarantined(c, err)
		case err == nil:
			return s.claimed(key, fp, up, start), nil
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
		if c, err := s.found(ctx, q, key, start, false); !errors.Is(err, errNoRecord) {
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
		return s.claimed(key, fp, up, start), nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return idem.Claim{}, err
	}
	return s.quarantineLapsed(ctx, q, key, k, start)
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

// found answers a claim of a key with a live record: Duplicate, InProgress,
// or a quarantined key (Claim.Record alone). Without one it returns
// errNoRecord. any reads the row whatever its state (SQLite only, where
// reads are in process and cheap; see read).
func (s *Store) found(ctx context.Context, q sqlQuerier, key string, start time.Time, any bool) (idem.Claim, error) {
	rec, err := s.read(ctx, q, key, start, any)
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

// read returns the key's live record, or errNoRecord. With any (SQLite
// only) it reads the row whatever its state and answers errNoRecord for
// one that is not live: the claim that reads before it writes learns so
// that it must write.
func (s *Store) read(ctx context.Context, q sqlQuerier, key string, start time.Time, any bool) (*idem.Record, error) {
	query := s.q.read
	if any {
		query = s.q.readAny
	}
	var rec *idem.Record
	err := s.reading(ctx, q, func() error {
		var err error
		rec, err = s.scanRecord(q.QueryRowContext(ctx, query, []byte(key)), key, start)
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

// fail wraps a database error with the operation and the (redacted) key,
// and says how to create the table when the error is that it is missing.
func (s *Store) fail(op, key string, err error) error {
	if m := s.missingTable(err); m != "" {
		return fmt.Errorf("sqlstore: %s of %s: %s: %w", op, s.core.KeyName(key), m, err)
	}
	return fmt.Errorf("sqlstore: %s of %s: %w", op, s.core.KeyName(key), err)
}

// exec runs a statement that affects at most one row and says whether it did.
func (s *Store) exec(ctx context.Context, q sqlQuerier, query string, args ...any) (bool, error) {
	var n int64
	err := s.locked(ctx, q, func() error {
		r, err := q.ExecContext(ctx, query, s.bind(query, args...)...)
		if err == nil {
			n, err = r.RowsAffected()
		}
		return err
	})
	return n == 1, err
}

// Renew implements idem.Store in one statement.
func (s *Store) Renew(ctx context.Context, l *idem.Lease) (err error) {
	start := time.Now()
	defer func() { s.core.Observe(ctx, idem.Event{Op: idem.OpRenew, Err: err}, leaseKey(l), start) }()
	if err := s.core.CheckLease(l); err != nil {
		return err
	}
	ok, err := s.exec(ctx, s.db, s.q.renew, []byte(l.Key), l.Owner, l.Token, s.leaseMs)
	if err == nil && !ok {
		ok, err = s.heldUnchanged(ctx, l)
	}
	if err != nil {
		return s.fail("renew", l.Key, err)
	}
	if !ok {
		return s.core.LeaseLost(idem.OpRenew, l)
	}
	return nil
}

// Confirm implements idem.Store: one UPDATE while the lease is held; after
// a lost lease, an upsert that records over anything but a live
// confirmation.
func (s *Store) Confirm(ctx context.Context, l *idem.Lease, result []byte) (err error) {
	start := time.Now()
	late := false
	defer func() { s.core.Observe(ctx, idem.Event{Op: idem.OpConfirm, Late: late, Err: err}, leaseKey(l), start) }()
	if err := s.core.CheckResult(l, result); err != nil {
		return err
	}
	late, err = s.confirmIn(ctx, s.db, l, result, start)
	if late {
		s.core.LogLate(ctx, l)
	}
	if err != nil && !errors.Is(err, idem.ErrAlreadyConfirmed) {
		return s.fail("confirm", l.Key, err)
	}
	return err
}

// confirmIn records l's work with q and reports whether the lease had been
// lost (late), as idem.MemoryStore does: a repeat confirm by the same lease is
// not late; a confirm that finds another lease's confirmation is, and its
// error wraps idem.ErrAlreadyConfirmed.
func (s *Store) confirmIn(ctx context.Context, q sqlQuerier, l *idem.Lease, result []byte, start time.Time) (late bool, err error) {
	k, fp, res := []byte(l.Key), nonNil(l.Fingerprint), nonNil(result)
	ok, err := s.exec(ctx, q, s.q.confirm, k, l.Owner, l.Token, fp, res, s.retentionMs)
	if err != nil || ok {
		return false, err
	}
	for range claimAttempts {
		var tok int64
		err := s.locked(ctx, q, func() error {
			if s.dialect == MySQL {
				return s.confirmLateMySQL(ctx, q, k, l.Token, fp, res)
			}
			return q.QueryRowContext(ctx, s.q.confirmLate, k, l.Token, fp, res, s.retentionMs).Scan(&tok)
		})
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return false, err
		}
		// A live confirmation stays; whose is it?
		rec, err := s.read(ctx, q, l.Key, start, false)
		if errors.Is(err, errNoRecord) {
			continue // it expired in between: record ours
		}
		if err != nil {
			return false, err
		}
		if rec.Token != l.Token {
			return true, s.core.AlreadyConfirmed(l)
		}
		return false, nil
	}
	return false, errChanged
}

// confirmLateMySQL records a late confirm on MySQL (see
// sqlConfirmLateMySQL): sql.ErrNoRows when a live confirmation is there.
func (s *Store) confirmLateMySQL(ctx context.Context, q sqlQuerier, key []byte, token int64, fp, res []byte) error {
	r, err := q.ExecContext(ctx, s.q.confirmLate, s.bind(s.q.confirmLate, key, token, fp, res, s.retentionMs)...)
	if err != nil {
		return err
	}
	if n, err := r.RowsAffected(); err != nil || n == 1 {
		return err
	}
	_, err = q.ExecContext(ctx, s.q.confirmLateInsert, key, token, fp, res, s.retentionMs)
	if isDuplicateKey(err) {
		return sql.ErrNoRows
	}
	return err
}

// Forget implements idem.Store in one statement. The row stays, marked
// forgotten, so that the next claim's token exceeds this lease's.
func (s *Store) Forget(ctx context.Context, l *idem.Lease) (err error) {
	start := time.Now()
	defer func() { s.core.Observe(ctx, idem.Event{Op: idem.OpForget, Err: err}, leaseKey(l), start) }()
	if err := s.core.CheckForget(l); err != nil {
		return err
	}
	ok, err := s.exec(ctx, s.db, s.q.forget, []byte(l.Key), l.Owner, l.Token)
	if err != nil {
		return s.fail("forget", l.Key, err)
	}
	if !ok {
		return s.core.LeaseLost(idem.OpForget, l)
	}
	return nil
}

// Lookup implements idem.Store in one statement.
func (s *Store) Lookup(ctx context.Context, key string) (rec *idem.Record, err error) {
	start := time.Now()
	defer func() { s.core.Observe(ctx, idem.Event{Op: idem.OpLookup, Err: err}, key, start) }()
	if err := s.core.CheckKey(key); err != nil {
		return nil, err
	}
	rec, err = s.read(ctx, s.db, key, start, false)
	if errors.Is(err, errNoRecord) {
		return nil, s.core.NotFound(key)
	}
	if err != nil {
		return nil, s.fail("lookup", key, err)
	}
	return rec, nil
}

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
		rec.Lapsed = &idem.Attempt{Owner: rec.Owner, Token: rec.Token, Claimed: time.UnixMicro(rec.Token)}
		rec.Expires = start.Add(time.Duration(ttl)*s.ttlUnit + s.o.Retention)
	}
	return rec, nil
}

// heldUnchanged says, after a Renew or Checkpoint changed no row, whether
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
	ok, err := s.exec(ctx, s.db, s.q.checkpoint, []byte(l.Key), l.Owner, l.Token, cp)
	if err == nil && !ok {
		ok, err = s.heldUnchanged(ctx, l)
	}
	if err != nil {
		return s.fail("checkpoint", l.Key, err)
	}
	if !ok {
		return s.core.LeaseLost(idem.OpCheckpoint, l)
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
		rec, err := s.read(ctx, s.db, key, start, false)
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

// leaseKey is l's key, or "" for a nil lease (which the operation rejects).
func leaseKey(l *idem.Lease) string {
	if l == nil {
		return ""
	}
	return l.Key
}

// MaxResultBytes returns the largest result Confirm accepts (the option
// resolved to its default), so that a wrapper recording responses can
// refuse, where it is configured, a limit the store would not hold.
func (s *Store) MaxResultBytes() int { return s.o.MaxResultBytes }
