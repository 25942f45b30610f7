package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"

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
)

// String returns the dialect's name ("postgres", "sqlite").
func (d Dialect) String() string {
	switch d {
	case Postgres:
		return "postgres"
	case SQLite:
		return "sqlite"
	}
	return "dialect(" + strconv.Itoa(int(d)) + ")"
}

// DefaultTable is the table a Store keeps its records in unless told
// otherwise.
const DefaultTable = "idem_keys"

// maxIdentBytes is Postgres's identifier limit (NAMEDATALEN-1). Longer names
// are silently truncated by Postgres, which could make two tables one.
const maxIdentBytes = 63

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

// quoted returns the table as a quoted identifier, so that a name that
// happens to be a reserved word ("order", "user") still works. Quoting makes
// the name case-sensitive: the table is exactly the name given.
func (t sqlTable) quoted() string {
	if t.schema == "" {
		return `"` + t.name + `"`
	}
	return `"` + t.schema + `"."` + t.name + `"`
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
		create = `CREATE TABLE IF NOT EXISTS ` + t.quoted() + ` (
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
		index = `CREATE INDEX IF NOT EXISTS "` + t.indexName() + `" ON ` + t.quoted() + ` (expires_at)`
	case SQLite:
		create = `CREATE TABLE IF NOT EXISTS ` + t.quoted() + ` (
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
// rebuild the table, rows kept: run them in one transaction.
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
	case Postgres:
		q := t.quoted()
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
	create := strings.Replace(ddl[0], old.quoted(), tmp.quoted(), 1)
	cols := "key, state, owner, token, fingerprint, result, recorded_at, expires_at"
	return []string{
		create,
		`INSERT INTO ` + tmp.quoted() + ` (` + cols + `) SELECT ` + cols + ` FROM ` + old.quoted(),
		`DROP TABLE ` + old.quoted(),
		`ALTER TABLE ` + tmp.quoted() + ` RENAME TO "` + old.name + `"`,
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
			return fmt.Errorf("sqlstore: creating table %s: %w", s.table.quoted(), err)
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
		return badopt.Error("sqlstore", "Dialect", int(d), "is unset; set sqlstore.Postgres or sqlstore.SQLite")
	}
	return badopt.Error("sqlstore", "Dialect", d, "is unknown; set sqlstore.Postgres or sqlstore.SQLite")
}

// sqlText builds the dialect's version of a statement written with these
// markers:
//
//	{t}         the quoted table
//	{now}       the database's clock (a timestamp on Postgres, Unix ms on SQLite)
//	{in $n}     the clock plus $n milliseconds
//	{ttl}       milliseconds from the clock to expires_at
//	{tok}       a fresh fencing token: the clock in microseconds
//	{max}       the two-argument maximum
//	{ms prior_at} the column prior_at in Unix milliseconds
//	$n          the n-th bind parameter
//
// On Postgres the clock is statement_timestamp(): fixed for one statement,
// so a check and a write in it agree, and moving on between the statements
// of a transaction (a Run that waited for a lock must not judge expiry by
// the time its transaction began, as now() would).
func sqlText(d Dialect, t sqlTable, q string) string {
	var r *strings.Replacer
	switch d {
	case Postgres:
		r = strings.NewReplacer(
			"{t}", t.quoted(),
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
			"{t}", t.quoted(),
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
	}
	return r.Replace(q)
}

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
	}
	if speaks == 0 || speaks == d {
		return nil
	}
	want := "sqlstore.Postgres"
	if speaks == SQLite {
		want = "sqlstore.SQLite"
	}
	return badopt.Error("sqlstore", "Dialect", d, "does not match the *sql.DB's driver %s (%s), which speaks %v; set Dialect: %s",
		name, pkg, speaks, want)
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
	}
	// A table of an earlier release, without the take-over columns:
	// 42703 undefined_column on Postgres.
	if pgCode == "42703" || s.dialect == SQLite && (strings.Contains(err.Error(), "no such column") ||
		strings.Contains(err.Error(), "has no column named")) {
		return fmt.Sprintf("table %s lacks the columns this release writes (takeovers, prior_owner, prior_token, "+
			"prior_at, checkpoint): add them with the statements of sqlstore.UpgradeDDL(sqlstore.%s, %q) "+
			"(printed by `idem schema --upgrade`)", s.table.quoted(), dialectName(s.dialect), s.table.String())
	}
	if !missing {
		return ""
	}
	return fmt.Sprintf("table %s does not exist: create it with Store.CreateSchema (development, tests), "+
		"or with the statements of sqlstore.SchemaDDL(sqlstore.%s, %q) in a migration",
		s.table.quoted(), dialectName(s.dialect), s.table.String())
}

// dialectName is d's constant's name, for messages that show code.
func dialectName(d Dialect) string {
	if d == SQLite {
		return "SQLite"
	}
	return "Postgres"
}

// sqlState is implemented by Postgres drivers' errors (pgconn.PgError).
type sqlState interface{ SQLState() string }

// sqlCode is implemented by SQLite drivers' errors (modernc.org/sqlite).
type sqlCode interface{ Code() int }

// isLockTimeout reports whether err is Postgres giving up on a lock after
// lock_timeout (SQLSTATE 55P03, lock_not_available).
func isLockTimeout(err error) bool {
	var s sqlState
	return errors.As(err, &s) && s.SQLState() == "55P03"
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
