// Package sqlstore keeps idem's records in a table of Postgres, MySQL (or
// MariaDB) or SQLite:
// an [idem.Store] and [idem.Batcher] like the others, plus a transactional
// mode, [Store.Run], in which the record commits in the same transaction as
// the work.
//
//	store, err := sqlstore.New(db, sqlstore.Options{Dialect: sqlstore.Postgres})
//
// [New] takes a *sql.DB (pgx's database/sql driver for Postgres,
// github.com/go-sql-driver/mysql for MySQL and MariaDB, modernc.org/sqlite
// for SQLite) and one flat [Options] literal: the fields
// every store shares, as in idem.Options, and Dialect (required), Table
// (default [DefaultTable], "idem_keys") and LockTimeout (default
// [DefaultLockTimeout], 5s). A Dialect that is not the one the driver
// speaks (a SQLite *sql.DB with Dialect Postgres) is refused there, naming
// the field, without I/O.
//
// # Lease mode
//
// Claim, Renew, Confirm, Forget and Lookup keep the contract of idem.Store,
// which package storetest checks on every dialect: use them, or the
// wrappers of packages consumer and middleware over them, when the work is
// not a write to this database (a call to a payment provider, a message
// sent). On Postgres a claim is one statement that inserts a new key or,
// ON CONFLICT DO NOTHING, reads the row there: a duplicate is a read, with
// no write, no lock and no commit flush. A row that is not live is taken
// over by an UPDATE whose WHERE clause holds the expiry check, so check and
// take-over are one statement. On SQLite the claim reads first and writes
// only when nothing live is there. ClaimBatch and ConfirmBatch run a whole
// batch in one transaction. A claim that takes over a lapsed one is told so
// (idem.Claim.TakeOver), a lapsed claim being kept until PurgeExpired of a
// store whose Retention has passed since its lease ended.
//
// # Transactional mode
//
// When the work is a write to the same database, Run claims the key, calls
// the work's write function with the transaction, records its result and
// commits: the record and the effect are one fact, so there is no lease to
// lose and no moment at which the work is done but not recorded. The
// context handed to the write function carries the transaction, and
// [TxFromContext] finds it for code deep in a handler (the middleware's
// transactional mode works so).
//
//	result, replayed, err := store.Run(ctx, "charge:"+orderID, fingerprint,
//		func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
//			_, err := tx.ExecContext(ctx, `INSERT INTO charges (order_id, amount) VALUES ($1, $2)`, orderID, amount)
//			return []byte("charged"), err // an error rolls back the insert and the record
//		})
//
// A second Run of the key waits for the first's transaction, for at most
// LockTimeout (then idem.ErrInProgress), and replays what the first
// committed or, if it rolled back, does the work itself. A replay with
// another fingerprint is idem.ErrFingerprintMismatch. The write function
// must not commit or roll back the transaction: Run does; one that does
// gets an error wrapping [ErrTxEnded], no record, and its key released at
// once.
//
// # Schema and purge
//
// The table holds one row per key, the key as bytes (BYTEA, BLOB), and one
// expiry column for both deadlines: the lease's while claimed, the
// retention's once confirmed. [SchemaDDL] returns its statements for a
// migration tool; [Store.CreateSchema] is for development and tests. New
// does not look for the table (no I/O, no round trip): a missing one fails
// the first statement that needs it, with an error that names the table
// and how to create it, the database's own error wrapped.
// Nothing on the hot path deletes rows: [Store.PurgeExpired] deletes the
// expired ones in statements of at most 1000 rows. Run it on a schedule
// (`idem prune` does).
//
// # Clocks
//
// Lease and retention expiry are judged by the database's clock, never the
// caller's, so workers with skewed clocks cannot take over each other's
// live leases: on Postgres, the server's statement_timestamp(); on MySQL,
// its UTC_TIMESTAMP(6), whatever the session's time_zone. SQLite runs
// in the process, so there "the database's clock" is the process's: the
// processes that share one SQLite file share their host's clock, and a
// clock stepped back there moves every deadline. Fencing tokens derive from
// the same clock, and increase for as long as a key's row exists (see
// [Store]).
//
// # SQLite
//
// The database must be a file in WAL mode. SQLite has one writer: a Store
// queues its writes per *sql.DB and retries a busy database for up to
// LockTimeout, and a Run holds the write lock from its claim to its commit,
// so that Runs of every key take turns. Past LockTimeout the error wraps
// [ErrBusy]: the database, not the key, was held. Keep the write function
// short there.
//
// # MySQL and MariaDB
//
// MySQL 8.0 or later and MariaDB 10.11 or later, InnoDB tables. What the
// dialect does where MySQL differs, and why:
//
//   - A claim reads the key first, then INSERTs a new key or, when the key
//     has a row, takes over a lapsed or forgotten claim with one UPDATE
//     whose WHERE clause holds the expiry check and the limit of
//     take-overs: MySQL has no RETURNING and no upsert with a WHERE clause
//     (INSERT ... ON DUPLICATE KEY UPDATE evaluates its assignments one
//     after another, so a guard over two columns sees a half-written row).
//     A duplicate is one read, with no lock. The fencing token comes back in
//     the statement's reply through LAST_INSERT_ID(expr); a take-over reads
//     what it carried over (the prior attempt, the checkpoint) after it, by
//     its token. Never INSERT IGNORE: it would turn a key too long for its
//     column into a cut one.
//   - Keys are VARBINARY(3072), the longest primary key InnoDB indexes with
//     16 KiB pages: New refuses a MaxKeyBytes above [MaxMySQLKeyBytes].
//   - Time is UTC_TIMESTAMP(6) in DATETIME(6) columns, never NOW(): NOW
//     follows the session's time_zone.
//   - The store's transactions begin at READ COMMITTED whatever the
//     server's default, REPEATABLE READ (see [Store]).
//   - A Run bounds its lock wait with the session's innodb_lock_wait_timeout,
//     in whole seconds (LockTimeout rounded up), and puts the session's own
//     value back after.
//   - A deadlock before any work ran is retried, the whole transaction
//     over; a deadlock met by a Run's write is its error, and nothing is
//     recorded. A claim that waited past the server's
//     innodb_lock_wait_timeout for a Run's row is idem.ErrInProgress.
//   - PurgeExpired locks a batch with SELECT ... FOR UPDATE SKIP LOCKED,
//     then deletes it by key.
//
// The driver sends a statement with arguments as a prepared statement: two
// round trips. interpolateParams=true in the DSN halves that, and the store
// is correct either way (and with clientFoundRows either way).
package sqlstore
