package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
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
		quarantine: text(sqlQuarantine), checkpoint: text(sqlCheckpoint), abandon: text(sqlAbandon), quarantined: text(sqlQuarantined),
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
		rec, err := s.read(ctx, q, l.Key, start, nil)
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
	rec, err = s.read(ctx, s.db, key, start, nil)
	if errors.Is(err, errNoRecord) {
		return nil, s.core.NotFound(key)
	}
	if err != nil {
		return nil, s.fail("lookup", key, err)
	}
	return rec, nil
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
