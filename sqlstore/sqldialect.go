package sqlstore

// Over 500 lines, one concept: the three dialects' differences
// (placeholders, upserts, locking, the clock, the DDL) side by side.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/badopt"
)

// Dialect names the SQL database a Store talks to. Placeholders, the
// clock, column types and the spelling of max differ between dialects; the
// statements do not otherwise.
type Dialect uint8

const (
	// Postgres is PostgreSQL 12 or later, typically through pgx's
	// database/sql driver (github.com/jackc/pgx/v5/stdlib). Expiry is judged
	// by the server's statement_timestamp().
	Postgres Dialect = iota + 1
	// SQLite is SQLite 3.42 or later (modernc.org/sqlite, pure Go). The
	// database must be a file in WAL mode. SQLite runs in the process, so
	// "the database's clock" is the process's clock.
	SQLite
	// MySQL is MySQL 8.0 or later, or MariaDB 10.11 or later, with InnoDB
	// tables, through github.com/go-sql-driver/mysql. Expiry is judged by
	// the server's UTC_TIMESTAMP(6), whatever the session's time_zone. The
	// store's transactions run at READ COMMITTED, whatever the server's
	// default (see Store). Keys are at most MaxMySQLKeyBytes.
	MySQL
)

// String returns the dialect's name ("postgres", "sqlite", "mysql").
func (d Dialect) String() string {
	switch d {
	case Postgres:
		return "postgres"
	case SQLite:
		return "sqlite"
	case MySQL:
		return "mysql"
	}
	return "dialect(" + strconv.Itoa(int(d)) + ")"
}

// DefaultTable is the table a Store keeps its records in unless told
// otherwise.
const DefaultTable = "idem_keys"

// maxIdentBytes is Postgres's identifier limit (NAMEDATALEN-1). Longer names
// are silently truncated by Postgres, which could make two tables one.
// MySQL's limit is 64.
const maxIdentBytes = 63

// MaxMySQLKeyBytes is the longest key a Store on MySQL or MariaDB takes:
// the key column is the primary key, and InnoDB indexes at most 3072 bytes
// of a key (with its default 16 KiB pages and the DYNAMIC row format the
// table is created with). New refuses a MaxKeyBytes above it rather than
// let a longer key be cut to fit, which could make two keys one record.
const MaxMySQLKeyBytes = 3072

// sqlTable is a validated, possibly schema-qualified table name.
type sqlTable struct {
	schema, name string
}

// parseTable validates a table name: one or two plain identifiers joined by
// a dot, each [A-Za-z_][A-Za-z0-9_]* and at most 63 bytes. It is the only
// text a Store interpolates into SQL, so nothing else may pass.
func parseTable(s string) (sqlTable, error) {
	parts := strings.Split(s, ".")
	if len(parts) > 2 {
		return sqlTable{}, badopt.Error("sqlstore", "Table", s, "has more than one schema qualifier; at most schema.table")
	}
	for _, p := range parts {
		if !plainIdent(p) {
			return sqlTable{}, badopt.Error("sqlstore", "Table", s, "is not a plain identifier: each part must match [A-Za-z_][A-Za-z0-9_]* and be at most %d bytes",
				maxIdentBytes)
		}
	}
	if len(parts) == 2 {
		return sqlTable{schema: parts[0], name: parts[1]}, nil
	}
	return sqlTable{name: parts[0]}, nil
}

func plainIdent(s string) bool {
	if s == "" || len(s) > maxIdentBytes {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		letter := c == '_' || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z')
		if !letter && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// quoted returns the table as a quoted identifier of dialect d (backticks
// on MySQL, double quotes elsewhere), so that a name that happens to be a
// reserved word ("order", "user") still works. Quoting makes the name
// case-sensitive: the table is exactly the name given (on MySQL, where the
// file system decides, as lower_case_table_names says).
func (t sqlTable) quoted(d Dialect) string {
	q := `"`
	if d == MySQL {
		q = "`"
	}
	if t.schema == "" {
		return q + t.name + q
	}
	return q + t.schema + q + "." + q + t.name + q
}

// indexName is the name of the expires_at index, cut to the identifier limit
// rather than letting Postgres truncate it with a notice.
func (t sqlTable) indexName() string {
	const suffix = "_expires_at"
	n := t.name
	if len(n)+len(suffix) > maxIdentBytes {
		n = n[:maxIdentBytes-len(suffix)]
	}
	return n + suffix
}

// SchemaDDL returns the statements that create the table of a Store,
// and its index on expires_at, for a migration tool. They are idempotent
// (IF NOT EXISTS). table is validated as New validates it; "" means
// DefaultTable.
//
// The table holds one row per key: key (BYTEA/BLOB, compared byte for byte),
// state ('C' claimed, 'D' done, 'F' a forgotten claim kept only for its
// token, 'Q' quarantined after repeated crashes), owner, token, fingerprint,
// result, recorded_at (when claimed or confirmed) and expires_at (the
// lease's end while claimed, the retention's or quarantine's end once not),
// then what a take-over tells the next holder: takeovers (in a row),
// prior_owner, prior_token and prior_at (the attempt taken over) and
// checkpoint (the last progress recorded). On Postgres the times are
// TIMESTAMPTZ; on SQLite, INTEGER Unix milliseconds. A table made before
// those columns existed is brought up to date by UpgradeDDL's statements.
// On MySQL the times are DATETIME(6) in UTC, the key is VARBINARY(3072)
// (see MaxMySQLKeyBytes), the table is InnoDB with ROW_FORMAT=DYNAMIC, and
// the index is declared in the CREATE TABLE (MySQL has no CREATE INDEX IF
// NOT EXISTS), so there is one statement.
func SchemaDDL(dialect Dialect, table string) ([]string, error) {
	if table == "" {
		table = DefaultTable
	}
	t, err := parseTable(table)
	if err != nil {
		return nil, err
	}
	var create, index string
	switch dialect {
	case Postgres:
		create = `CREATE TABLE IF NOT EXISTS ` + t.quoted(dialect) + ` (
	key         BYTEA PRIMARY KEY,
	state       CHAR(1) NOT NULL CONSTRAINT "` + t.name + `_state_check" CHECK (state IN ('C', 'D', 'F', 'Q')),
	owner       TEXT NOT NULL,
	token       BIGINT NOT NULL,
	fingerprint BYTEA NOT NULL,
	result      BYTEA,
	recorded_at TIMESTAMPTZ NOT NULL,
	expires_at  TIMESTAMPTZ NOT NULL,
	takeovers   INTEGER NOT NULL DEFAULT 0,
	prior_owner TEXT,
	prior_token BIGINT,
	prior_at    TIMESTAMPTZ,
	checkpoint  BYTEA
)`
		index = `CREATE INDEX IF NOT EXISTS "` + t.indexName() + `" ON ` + t.quoted(dialect) + ` (expires_at)`
	case SQLite:
		create = `CREATE TABLE IF NOT EXISTS ` + t.quoted(dialect) + ` (
	key         BLOB NOT NULL PRIMARY KEY,
	state       TEXT NOT NULL CHECK (state IN ('C', 'D', 'F', 'Q')),
	owner       TEXT NOT NULL,
	token       INTEGER NOT NULL,
	fingerprint BLOB NOT NULL,
	result      BLOB,
	recorded_at INTEGER NOT NULL,
	expires_at  INTEGER NOT NULL,
	takeovers   INTEGER NOT NULL DEFAULT 0,
	prior_owner TEXT,
	prior_token INTEGER,
	prior_at    INTEGER,
	checkpoint  BLOB
)`
		// SQLite qualifies the index, not the table it is on.
		ix := `"` + t.indexName() + `"`
		if t.schema != "" {
			ix = `"` + t.schema + `".` + ix
		}
		index = `CREATE INDEX IF NOT EXISTS ` + ix + ` ON "` + t.name + `" (expires_at)`
	case MySQL:
		// InnoDB, explicitly: another engine has no transactions and row
		// locks. DYNAMIC: the row format that indexes 3072-byte keys, also
		// on a server whose default is another. Binary columns throughout:
		// no character set or collation can change a key or a Worker.
		return []string{`CREATE TABLE IF NOT EXISTS ` + t.quoted(dialect) + ` (
	` + "`key`" + `       VARBINARY(` + strconv.Itoa(MaxMySQLKeyBytes) + `) NOT NULL PRIMARY KEY,
	state       CHAR(1) CHARACTER SET ascii NOT NULL CHECK (state IN ('C', 'D', 'F', 'Q')),
	owner       VARBINARY(255) NOT NULL,
	token       BIGINT NOT NULL,
	fingerprint VARBINARY(` + strconv.Itoa(idem.MaxFingerprintBytes) + `) NOT NULL,
	result      LONGBLOB,
	recorded_at DATETIME(6) NOT NULL,
	expires_at  DATETIME(6) NOT NULL,
	takeovers   INTEGER NOT NULL DEFAULT 0,
	prior_owner VARBINARY(255),
	prior_token BIGINT,
	prior_at    DATETIME(6),
	checkpoint  MEDIUMBLOB,
	INDEX ` + "`" + t.indexName() + "`" + ` (expires_at)
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC`}, nil
	default:
		return nil, errDialect(dialect)
	}
	return []string{create, index}, nil
}

// UpgradeDDL returns the statements that bring a table made by an earlier
// release's SchemaDDL (without the columns of take-over reporting, and
// without the 'Q' state) up to date, for a migration tool; on a table
// already up to date they change nothing. On Postgres they add the columns
// and widen the state's check; SQLite cannot alter a check, so there they
// rebuild the table, rows kept: run them in one transaction. On MySQL there
// is nothing to upgrade (none: the dialect came with those columns).
func UpgradeDDL(dialect Dialect, table string) ([]string, error) {
	if table == "" {
		table = DefaultTable
	}
	t, err := parseTable(table)
	if err != nil {
		return nil, err
	}
	ddl, err := SchemaDDL(dialect, table)
	if err != nil {
		return nil, err
	}
	switch dialect {
	case MySQL:
		return []string{}, nil
	case Postgres:
		q := t.quoted(dialect)
		return []string{
			`ALTER TABLE ` + q + ` ADD COLUMN IF NOT EXISTS takeovers INTEGER NOT NULL DEFAULT 0, ` +
				`ADD COLUMN IF NOT EXISTS prior_owner TEXT, ADD COLUMN IF NOT EXISTS prior_token BIGINT, ` +
				`ADD COLUMN IF NOT EXISTS prior_at TIMESTAMPTZ, ADD COLUMN IF NOT EXISTS checkpoint BYTEA`,
			`ALTER TABLE ` + q + ` DROP CONSTRAINT IF EXISTS "` + t.name + `_state_check", ` +
				`ADD CONSTRAINT "` + t.name + `_state_check" CHECK (state IN ('C', 'D', 'F', 'Q'))`,
		}, nil
	}
	// SQLite: a new table under a temporary name, the rows copied, the
	// old one dropped (its index with it), the new one renamed.
	old := t
	tmp := t
	tmp.name = t.name + "_upgrade"
	create := strings.Replace(ddl[0], old.quoted(dialect), tmp.quoted(dialect), 1)
	cols := "key, state, owner, token, fingerprint, result, recorded_at, expires_at"
	return []string{
		create,
		`INSERT INTO ` + tmp.quoted(dialect) + ` (` + cols + `) SELECT ` + cols + ` FROM ` + old.quoted(dialect),
		`DROP TABLE ` + old.quoted(dialect),
		`ALTER TABLE ` + tmp.quoted(dialect) + ` RENAME TO "` + old.name + `"`,
		ddl[1],
	}, nil
}

// CreateSchema creates the table and its index if they do not exist
// (SchemaDDL's statements). It is meant for development and tests;
// production schemas belong in migrations.
func (s *Store) CreateSchema(ctx context.Context) error {
	ddl, err := SchemaDDL(s.dialect, s.table.String())
	if err != nil {
		return err
	}
	for _, q := range ddl {
		if err := s.exclusive(ctx, func() error { _, err := s.db.ExecContext(ctx, q); return err }); err != nil {
			return fmt.Errorf("sqlstore: creating table %s: %w", s.table.quoted(s.dialect), err)
		}
	}
	return nil
}

// String returns the table name as given.
func (t sqlTable) String() string {
	if t.schema == "" {
		return t.name
	}
	return t.schema + "." + t.name
}

func errDialect(d Dialect) error {
	if d == 0 {
		return badopt.Error("sqlstore", "Dialect", int(d), "is unset; set sqlstore.Postgres, sqlstore.MySQL or sqlstore.SQLite")
	}
	return badopt.Error("sqlstore", "Dialect", d, "is unknown; set sqlstore.Postgres, sqlstore.MySQL or sqlstore.SQLite")
}

// sqlText builds the dialect's version of a statement written with these
// markers:
//
//	{t}         the quoted table
//	{now}       the database's clock (a timestamp on Postgres and MySQL, Unix ms on SQLite)
//	{in $n}     the clock plus $n milliseconds
//	{ttl}       milliseconds (MySQL: microseconds) from the clock to expires_at
//	{tok}       a fresh fencing token: the clock in microseconds
//	{max}       the two-argument maximum
//	{ms prior_at} the column prior_at in Unix milliseconds
//	$n          the n-th bind parameter
//
// On Postgres the clock is statement_timestamp(): fixed for one statement,
// so a check and a write in it agree, and moving on between the statements
// of a transaction (a Run that waited for a lock must not judge expiry by
// the time its transaction began, as now() would). MySQL's UTC_TIMESTAMP(6)
// is the same: fixed for one statement, read again by the next.
//
// MySQL binds by position only (?), so there each $n becomes a ? and order
// lists, for each ?, the index of the argument it takes; order is nil when
// the arguments are given in that order already (see Store.bind). The
// column named key, a reserved word there, is quoted.
func sqlText(d Dialect, t sqlTable, q string) (text string, order []int) {
	var r *strings.Replacer
	switch d {
	case Postgres:
		r = strings.NewReplacer(
			"{t}", t.quoted(d),
			"{now}", "statement_timestamp()",
			"{in ", "statement_timestamp() + interval '1 millisecond' * ",
			"{ttl}", "CAST(EXTRACT(EPOCH FROM expires_at - statement_timestamp()) * 1000 AS BIGINT)",
			"{tok}", "CAST(EXTRACT(EPOCH FROM statement_timestamp()) * 1000000 AS BIGINT)",
			"{max}", "GREATEST",
			"{ms ", "CAST(EXTRACT(EPOCH FROM ",
			"prior_at}", "prior_at) * 1000 AS BIGINT)",
			"}", "",
		)
	case SQLite:
		// SQLite's 'now' is fixed for one statement too; it has millisecond
		// resolution, so tokens are multiples of 1000.
		const now = "CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER)"
		r = strings.NewReplacer(
			"{t}", t.quoted(d),
			"{now}", now,
			"{in ", now+" + ",
			"{ttl}", "(expires_at - "+now+")",
			"{tok}", "("+now+" * 1000)",
			"{max}", "max",
			"{ms ", "",
			"prior_at}", "prior_at",
			"}", "",
			// ?NNN binds by number; SQLite reads $1 as a name, numbered
			// by first appearance.
			"$", "?",
		)
	case MySQL:
		// UTC, never NOW(6): NOW follows the session's time_zone, and two
		// sessions in different zones would disagree on every deadline.
		// DATETIME columns hold it as it is (TIMESTAMP ones would convert
		// it through the session's zone, and end in 2038).
		const now = "UTC_TIMESTAMP(6)"
		q = mysqlIn.ReplaceAllString(q, "("+now+" + INTERVAL ($1 * 1000) MICROSECOND)")
		q = mysqlKey.ReplaceAllString(q, "`key`")
		q = strings.NewReplacer(
			"{t}", t.quoted(d),
			"{now}", now,
			// In microseconds, the clock's own resolution, so that a
			// claim's read tells live from expired exactly as
			// expires_at > {now} does (see Store.ttlUnit).
			"{ttl}", "TIMESTAMPDIFF(MICROSECOND, "+now+", expires_at)",
			// Both sides in UTC: no time zone enters the difference.
			"{tok}", "TIMESTAMPDIFF(MICROSECOND, '1970-01-01', "+now+")",
			"{max}", "GREATEST",
			"{ms prior_at}", "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', prior_at) DIV 1000)",
		).Replace(q)
		identity := true
		text = placeholder.ReplaceAllStringFunc(q, func(p string) string {
			n, _ := strconv.Atoi(p[1:])
			identity = identity && n == len(order)+1
			order = append(order, n-1)
			return "?"
		})
		if identity {
			order = nil
		}
		return text, order
	}
	return r.Replace(q), nil
}

var (
	placeholder = regexp.MustCompile(`\$[0-9]+`)
	mysqlIn     = regexp.MustCompile(`\{in (\$[0-9]+)\}`)
	mysqlKey    = regexp.MustCompile(`\bkey\b`)
)

// checkDriver refuses a Dialect other than the one db's driver speaks,
// told from the driver's Go package, without I/O: a mismatch would
// otherwise fail only at the first statement, with a raw syntax error. A
// driver not known to speak either (a wrapper such as an instrumenting
// one, a driver of its own) is not checked.
func checkDriver(db *sql.DB, d Dialect) error {
	t := reflect.TypeOf(db.Driver())
	if t == nil {
		return nil
	}
	name := t.String()
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	pkg := t.PkgPath()
	var speaks Dialect
	switch {
	case strings.Contains(pkg, "sqlite"):
		speaks = SQLite
	case strings.Contains(pkg, "pgx"), strings.HasSuffix(pkg, "lib/pq"), strings.Contains(pkg, "postgres"):
		speaks = Postgres
	case strings.Contains(pkg, "mysql"):
		speaks = MySQL
	}
	if speaks == 0 || speaks == d {
		return nil
	}
	return badopt.Error("sqlstore", "Dialect", d, "does not match the *sql.DB's driver %s (%s), which speaks %v; set Dialect: sqlstore.%s",
		name, pkg, speaks, dialectName(speaks))
}

// missingTable says, when err is the database's answer to a statement on a
// table (or schema) that does not exist, which and how to create it; else
// "". It is asked only of errors, so finding a table costs no statement.
func (s *Store) missingTable(err error) string {
	var st sqlState
	pgCode := ""
	if errors.As(err, &st) {
		pgCode = st.SQLState()
	}
	missing := false
	switch s.dialect {
	case Postgres:
		// 42P01 undefined_table, 3F000 invalid_schema_name.
		missing = pgCode == "42P01" || pgCode == "3F000"
	case SQLite:
		// SQLITE_ERROR has no code of its own for it; every driver says it.
		msg := err.Error()
		missing = strings.Contains(msg, "no such table") || s.table.schema != "" && strings.Contains(msg, "unknown database")
	case MySQL:
		// ER_NO_SUCH_TABLE, also for a table in a database that does not
		// exist; ER_BAD_DB_ERROR.
		n := mysqlNumber(err)
		missing = n == 1146 || n == 1049
	}
	// A table of an earlier release, without the take-over columns:
	// 42703 undefined_column on Postgres.
	if pgCode == "42703" || s.dialect == SQLite && (strings.Contains(err.Error(), "no such column") ||
		strings.Contains(err.Error(), "has no column named")) {
		return fmt.Sprintf("table %s lacks the columns this release writes (takeovers, prior_owner, prior_token, "+
			"prior_at, checkpoint): add them with the statements of sqlstore.UpgradeDDL(sqlstore.%s, %q) "+
			"(printed by `idem schema --upgrade`)", s.table.quoted(s.dialect), dialectName(s.dialect), s.table.String())
	}
	if !missing {
		return ""
	}
	return fmt.Sprintf("table %s does not exist: create it with Store.CreateSchema (development, tests), "+
		"or with the statements of sqlstore.SchemaDDL(sqlstore.%s, %q) in a migration",
		s.table.quoted(s.dialect), dialectName(s.dialect), s.table.String())
}

// dialectName is d's constant's name, for messages that show code.
func dialectName(d Dialect) string {
	switch d {
	case SQLite:
		return "SQLite"
	case MySQL:
		return "MySQL"
	}
	return "Postgres"
}

// sqlState is implemented by Postgres drivers' errors (pgconn.PgError).
type sqlState interface{ SQLState() string }

// sqlCode is implemented by SQLite drivers' errors (modernc.org/sqlite).
type sqlCode interface{ Code() int }

// isLockTimeout reports whether err is Postgres giving up on a lock after
// lock_timeout (SQLSTATE 55P03, lock_not_available), or MySQL after
// innodb_lock_wait_timeout (ER_LOCK_WAIT_TIMEOUT, 1205). InnoDB then rolls
// back the statement, not the transaction (unless innodb_rollback_on_timeout
// is on): the store rolls back the transaction itself either way.
func isLockTimeout(err error) bool {
	var s sqlState
	return errors.As(err, &s) && s.SQLState() == "55P03" || mysqlNumber(err) == 1205
}

// isDeadlock reports whether err is InnoDB choosing this transaction as a
// deadlock's victim (ER_LOCK_DEADLOCK, 1213). InnoDB has then rolled back the
// whole transaction, so only the whole transaction may be tried again.
// InnoDB meets such cycles where Postgres does not: claims of one new key
// that waited for a transaction which then rolled back each hold a shared
// lock on the key and each want it exclusive.
func isDeadlock(err error) bool { return mysqlNumber(err) == 1213 }

// isDuplicateKey reports whether err is MySQL refusing an INSERT of a key
// that has a row (ER_DUP_ENTRY, 1062). The statement did nothing; the
// transaction, if any, goes on.
func isDuplicateKey(err error) bool { return mysqlNumber(err) == 1062 }

// mysqlNumber returns the server's error number of the MySQL error in err's
// chain (go-sql-driver's *mysql.MySQLError, its Number field), or 0. It is
// read by reflection, as checkDriver tells drivers, so that sqlstore does
// not link a MySQL driver into every program on Postgres or SQLite.
func mysqlNumber(err error) uint16 {
	for err != nil {
		v := reflect.ValueOf(err)
		if v.Kind() == reflect.Pointer && !v.IsNil() && v.Elem().Kind() == reflect.Struct &&
			strings.HasSuffix(v.Elem().Type().PkgPath(), "go-sql-driver/mysql") {
			if f := v.Elem().FieldByName("Number"); f.IsValid() && f.Kind() == reflect.Uint16 {
				return uint16(f.Uint())
			}
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if n := mysqlNumber(e); n != 0 {
					return n
				}
			}
			return 0
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		default:
			return 0
		}
	}
	return 0
}

// isBusy reports whether err is SQLite refusing a lock another connection
// holds (SQLITE_BUSY or SQLITE_LOCKED, with any extended code). Such a
// statement did nothing, so it may be tried again.
func isBusy(err error) bool {
	var c sqlCode
	if errors.As(err, &c) {
		code := c.Code() & 0xff
		return code == 5 || code == 6
	}
	// Drivers without a Code method still say it.
	return err != nil && strings.Contains(err.Error(), "database is locked")
}
