package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/regrant"
	"github.com/idemgo/idem/internal/testing/sqltest"
	"github.com/idemgo/idem/sqlstore"
)

// dialects runs f once per dialect whose database is at hand: SQLite always,
// Postgres and MySQL when IDEM_POSTGRES_DSN and IDEM_MYSQL_DSN are set
// (required under CI=true).
func dialects(t *testing.T, f func(t *testing.T, db *sql.DB, d sqlstore.Dialect)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		db, _ := sqltest.SQLite(t)
		f(t, db, sqlstore.SQLite)
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		f(t, sqltest.PostgresPool(t, sqltest.TestConns), sqlstore.Postgres)
	})
	t.Run("mysql", func(t *testing.T) {
		t.Parallel()
		f(t, sqltest.MySQLPool(t, sqltest.TestConns), sqlstore.MySQL)
	})
}

func TestNewRejects(t *testing.T) {
	db, _ := sqltest.SQLite(t)
	long := strings.Repeat("t", 64)
	// Each mistake is refused with a message naming the field at fault.
	cases := []struct {
		name string
		db   *sql.DB
		o    sqlstore.Options
		want string
	}{
		{"nil db", nil, sqlstore.Options{Dialect: sqlstore.SQLite}, "nil *sql.DB"},
		{"no dialect", db, sqlstore.Options{}, "sqlstore: Dialect: 0 is unset; set sqlstore.Postgres, sqlstore.MySQL or sqlstore.SQLite"},
		{"unknown dialect", db, sqlstore.Options{Dialect: 4}, "sqlstore: Dialect: dialect(4) is unknown; set sqlstore.Postgres, sqlstore.MySQL or sqlstore.SQLite"},
		{"negative LockTimeout", db, sqlstore.Options{Dialect: sqlstore.SQLite, LockTimeout: -time.Second}, "sqlstore: LockTimeout: -1s is negative; 0 means the default, 5s"},
		{"negative LeaseTTL", db, sqlstore.Options{Dialect: sqlstore.SQLite, LeaseTTL: -1}, "idem: LeaseTTL: -1ns is negative; 0 means the default, 30s"},
		{"negative Retention", db, sqlstore.Options{Dialect: sqlstore.SQLite, Retention: -1}, "idem: Retention: -1ns is negative; 0 means the default, 24h0m0s"},
		{"Retention shorter than LeaseTTL", db, sqlstore.Options{Dialect: sqlstore.SQLite, Retention: time.Second, LeaseTTL: time.Hour}, "idem: Retention: 1s is shorter than LeaseTTL 1h0m0s"},
		{"quote in table", db, sqlstore.Options{Dialect: sqlstore.SQLite, Table: `keys"; DROP TABLE x; --`}, `sqlstore: Table: "keys\"; DROP TABLE x; --" is not a plain identifier`},
		{"space in table", db, sqlstore.Options{Dialect: sqlstore.SQLite, Table: "idem keys"}, `sqlstore: Table: "idem keys" is not a plain identifier`},
		{"leading digit", db, sqlstore.Options{Dialect: sqlstore.SQLite, Table: "1keys"}, `sqlstore: Table: "1keys" is not a plain identifier`},
		{"three parts", db, sqlstore.Options{Dialect: sqlstore.SQLite, Table: "a.b.c"}, `sqlstore: Table: "a.b.c" has more than one schema qualifier`},
		{"empty schema", db, sqlstore.Options{Dialect: sqlstore.SQLite, Table: ".keys"}, `sqlstore: Table: ".keys" is not a plain identifier`},
		{"empty table", db, sqlstore.Options{Dialect: sqlstore.SQLite, Table: "main."}, `sqlstore: Table: "main." is not a plain identifier`},
		{"64-byte table", db, sqlstore.Options{Dialect: sqlstore.SQLite, Table: long}, `sqlstore: Table: "` + long + `" is not a plain identifier: each part must match [A-Za-z_][A-Za-z0-9_]* and be at most 63 bytes`},
		{"64-byte schema", db, sqlstore.Options{Dialect: sqlstore.SQLite, Table: long + ".keys"}, `sqlstore: Table: "` + long + `.keys" is not a plain identifier`},
		{"non-ASCII table", db, sqlstore.Options{Dialect: sqlstore.SQLite, Table: "clés"}, `sqlstore: Table: "clés" is not a plain identifier`},
	}
	for _, c := range cases {
		if st, err := sqlstore.New(c.db, c.o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New with %s = %v, %v; want an error saying %q", c.name, st, err, c.want)
		}
	}
	if _, err := sqlstore.New(db, sqlstore.Options{Dialect: sqlstore.SQLite, Table: "main." + strings.Repeat("t", 63)}); err != nil {
		t.Errorf("New with a schema and a 63-byte table = %v; want a store", err)
	}
}

// A Dialect other than the one db's driver speaks is refused by New,
// naming the field and the dialect to set, before any I/O (the Postgres
// DSN here points at a closed port; with Dialect SQLite, New would read
// the journal mode through it).
func TestNewRefusesDialectOfAnotherDriver(t *testing.T) {
	lite, _ := sqltest.SQLite(t)
	pg, err := sql.Open("pgx", "postgres://idem@127.0.0.1:1/idem?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	my, err := sql.Open("mysql", "idem@tcp(127.0.0.1:1)/idem?timeout=1s")
	if err != nil {
		t.Fatal(err)
	}
	defer my.Close()
	for _, tc := range []struct {
		name string
		db   *sql.DB
		d    sqlstore.Dialect
		want string
	}{
		{"SQLite db, Dialect Postgres", lite, sqlstore.Postgres, "sqlstore: Dialect: postgres does not match the *sql.DB's driver *sqlite.Driver (modernc.org/sqlite), which speaks sqlite; set Dialect: sqlstore.SQLite"},
		{"pgx db, Dialect SQLite", pg, sqlstore.SQLite, "sqlstore: Dialect: sqlite does not match the *sql.DB's driver *stdlib.Driver (github.com/jackc/pgx/v5/stdlib), which speaks postgres; set Dialect: sqlstore.Postgres"},
		{"pgx db, Dialect MySQL", pg, sqlstore.MySQL, "sqlstore: Dialect: mysql does not match the *sql.DB's driver *stdlib.Driver (github.com/jackc/pgx/v5/stdlib), which speaks postgres; set Dialect: sqlstore.Postgres"},
		{"mysql db, Dialect Postgres", my, sqlstore.Postgres, "sqlstore: Dialect: postgres does not match the *sql.DB's driver *mysql.MySQLDriver (github.com/go-sql-driver/mysql), which speaks mysql; set Dialect: sqlstore.MySQL"},
	} {
		if _, err := sqlstore.New(tc.db, sqlstore.Options{Dialect: tc.d}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New on a %s = %v; want an error saying %q", tc.name, err, tc.want)
		}
	}
	if _, err := sqlstore.New(pg, sqlstore.Options{Dialect: sqlstore.Postgres}); err != nil {
		t.Errorf("New on a pgx db with Dialect Postgres = %v; want a store (and no I/O)", err)
	}
	if _, err := sqlstore.New(lite, sqlstore.Options{Dialect: sqlstore.SQLite}); err != nil {
		t.Errorf("New on a SQLite db with Dialect SQLite = %v; want a store", err)
	}
	if _, err := sqlstore.New(my, sqlstore.Options{Dialect: sqlstore.MySQL}); err != nil {
		t.Errorf("New on a mysql db with Dialect MySQL = %v; want a store (and no I/O)", err)
	}
	// InnoDB indexes keys of at most 3072 bytes: a longer MaxKeyBytes is
	// refused, not cut to fit.
	want := "sqlstore: MaxKeyBytes: 3073 is above 3072, the longest key InnoDB indexes (Dialect MySQL)"
	if _, err := sqlstore.New(my, sqlstore.Options{Dialect: sqlstore.MySQL, MaxKeyBytes: 3073}); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("New on MySQL with MaxKeyBytes 3073 = %v; want an error saying %q", err, want)
	}
	if _, err := sqlstore.New(my, sqlstore.Options{Dialect: sqlstore.MySQL, MaxKeyBytes: 3072}); err != nil {
		t.Errorf("New on MySQL with MaxKeyBytes 3072 = %v; want a store", err)
	}
}

// A table that does not exist is named, with how to create it, by the first
// statement that needs it (New does not look: that would be I/O, and a
// round trip, of its own), instead of the database's raw error; the
// database's error stays matchable.
func TestMissingTableSaysHowToCreateIt(t *testing.T) {
	sqltest.EachDialect(t, func(e *runEnv) {
		ctx := t.Context()
		table := sqltest.UniqueTable()
		st, err := sqlstore.New(e.DB, sqlstore.Options{Dialect: e.Dialect, Table: table})
		if err != nil {
			t.Fatalf("New on a missing table = %v; want a store (the table is looked for by its first statement)", err)
		}
		want := fmt.Sprintf(`table %s does not exist: create it with Store.CreateSchema (development, tests), `+
			`or with the statements of sqlstore.SchemaDDL(sqlstore.%s, %q) in a migration`,
			sqltest.Query(e.Dialect, `"`+table+`"`), dialectConst(e.Dialect), table)
		check := func(call string, err error) {
			t.Helper()
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s on a missing table = %v; want an error saying %q", call, err, want)
			}
		}
		_, err = st.Claim(ctx, "k", nil)
		check("Claim", err)
		_, err = st.Lookup(ctx, "k")
		check("Lookup", err)
		_, _, err = st.Run(ctx, "k", nil, func(context.Context, *sql.Tx) ([]byte, error) { return nil, nil })
		check("Run", err)
		_, err = st.ClaimBatch(ctx, []string{"a", "b"}, nil)
		check("ClaimBatch", err)
		_, err = st.PurgeExpired(ctx)
		check("PurgeExpired", err)
		if err := st.CreateSchema(ctx); err != nil {
			t.Fatal(err)
		}
		if e.Dialect != sqlstore.SQLite {
			t.Cleanup(func() { _, _ = e.DB.Exec(sqltest.Query(e.Dialect, `DROP TABLE IF EXISTS "`+table+`"`)) })
		}
		if c, err := st.Claim(ctx, "k", nil); err != nil || c.Outcome != idem.Claimed {
			t.Errorf("Claim after CreateSchema = %v, %v; want Claimed", c.Outcome, err)
		}
	})
}

func dialectConst(d sqlstore.Dialect) string {
	switch d {
	case sqlstore.SQLite:
		return "SQLite"
	case sqlstore.MySQL:
		return "MySQL"
	}
	return "Postgres"
}

func TestNewSQLiteNeedsWAL(t *testing.T) {
	for _, dsn := range []string{"file:" + filepath.Join(t.TempDir(), "rollback.db"), ":memory:"} {
		db, err := sql.Open("sqlite", dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if _, err := sqlstore.New(db, sqlstore.Options{Dialect: sqlstore.SQLite}); err == nil || !strings.Contains(err.Error(), "WAL") {
			t.Errorf("New on SQLite %q (not WAL) = %v; want an error that asks for WAL mode", dsn, err)
		}
	}
}

func TestSchemaDDL(t *testing.T) {
	for _, d := range []sqlstore.Dialect{sqlstore.Postgres, sqlstore.SQLite, sqlstore.MySQL} {
		ddl, err := sqlstore.SchemaDDL(d, "")
		// MySQL declares the index in the CREATE TABLE.
		want := map[sqlstore.Dialect]int{sqlstore.MySQL: 1}[d]
		if want == 0 {
			want = 2
		}
		if err != nil || len(ddl) != want {
			t.Fatalf("SchemaDDL(%v, \"\") = %d statements, %v; want %d, nil", d, len(ddl), err, want)
		}
		if !strings.Contains(ddl[0], sqltest.Query(d, `CREATE TABLE IF NOT EXISTS "idem_keys"`)) || !strings.Contains(ddl[len(ddl)-1], "(expires_at)") {
			t.Errorf("SchemaDDL(%v, \"\") = %q; want the default table and an index on expires_at", d, ddl)
		}
		ddl, err = sqlstore.SchemaDDL(d, "app.keys")
		if err != nil || !strings.Contains(ddl[0], sqltest.Query(d, `"app"."keys"`)) {
			t.Errorf("SchemaDDL(%v, app.keys) = %q, %v; want the schema-qualified, quoted table", d, ddl, err)
		}
		if _, err := sqlstore.SchemaDDL(d, "keys;"); err == nil {
			t.Errorf("SchemaDDL(%v, \"keys;\") = nil error; want one", d)
		}
	}
	if _, err := sqlstore.SchemaDDL(0, "keys"); err == nil {
		t.Errorf("SchemaDDL of dialect 0 = nil error; want one")
	}
	// The index name stays within Postgres's 63 bytes, so Postgres never
	// truncates it into another table's index name.
	ddl, _ := sqlstore.SchemaDDL(sqlstore.Postgres, strings.Repeat("t", 63))
	if name := strings.Fields(ddl[1])[5]; len(name) > 63+2 {
		t.Errorf("index name %s is %d bytes; want at most 63 plus quotes", name, len(name))
	}
}

func TestSchema(t *testing.T) {
	dialects(t, func(t *testing.T, db *sql.DB, d sqlstore.Dialect) {
		table := sqltest.UniqueTable()
		st := sqltest.NewStore(t, db, sqlstore.Options{Dialect: d, Table: table})
		if err := st.CreateSchema(t.Context()); err != nil {
			t.Errorf("second CreateSchema = %v; want nil (idempotent)", err)
		}
		// A reserved word works as a table name: it is quoted. So does a
		// schema-qualified name.
		schema := map[sqlstore.Dialect]string{sqlstore.Postgres: "public.", sqlstore.SQLite: "main."}[d]
		if d == sqlstore.MySQL {
			// MySQL's schema is the database: the DSN's.
			if err := db.QueryRowContext(t.Context(), "SELECT DATABASE()").Scan(&schema); err != nil {
				t.Fatal(err)
			}
			schema += "."
		}
		for _, name := range []string{"order", schema + sqltest.UniqueTable()} {
			other := sqltest.NewStore(t, db, sqlstore.Options{Dialect: d, Table: name})
			c, err := other.Claim(t.Context(), "k", []byte("fp"))
			if err != nil || c.Outcome != idem.Claimed {
				t.Fatalf("Claim on table %s = %+v, %v; want Claimed", name, c, err)
			}
			if err := other.Confirm(t.Context(), c.Lease, []byte("r")); err != nil {
				t.Errorf("Confirm on table %s = %v", name, err)
			}
			if _, err := other.PurgeExpired(t.Context()); err != nil {
				t.Errorf("PurgeExpired on table %s = %v", name, err)
			}
			if r, err := other.Lookup(t.Context(), "k"); err != nil || string(r.Result) != "r" {
				t.Errorf("Lookup on table %s = %+v, %v; want the confirmation", name, r, err)
			}
		}
		key := "k\x00\xff"
		if _, err := st.Claim(t.Context(), key, nil); err != nil {
			t.Fatalf("Claim = %v", err)
		}
		// Keys are bytes in the table, not text in some encoding.
		var got []byte
		q := sqltest.Query(d, `SELECT key FROM "`+table+`"`)
		if err := db.QueryRowContext(t.Context(), q).Scan(&got); err != nil || string(got) != key {
			t.Errorf("stored key = %q, %v; want %q byte for byte", got, err, key)
		}
		if d == sqlstore.SQLite {
			var typ string
			if err := db.QueryRowContext(t.Context(), `SELECT typeof(key) FROM "`+table+`"`).Scan(&typ); err != nil || typ != "blob" {
				t.Errorf("SQLite typeof(key) = %q, %v; want blob", typ, err)
			}
		}
	})
}

func TestInvalidInputBeforeIO(t *testing.T) {
	// A closed database fails every statement: the errors below must come
	// from validation, before any.
	db, _ := sqltest.SQLite(t)
	st := sqltest.NewStore(t, db, sqlstore.Options{Dialect: sqlstore.SQLite, MaxResultBytes: 4})
	c, err := st.Claim(t.Context(), "k", nil)
	if err != nil || c.Outcome != idem.Claimed {
		t.Fatalf("Claim = %v, %v; want claimed", c.Outcome, err)
	}
	_ = db.Close()
	ctx := t.Context()
	big := strings.Repeat("k", idem.DefaultMaxKeyBytes+1)
	if _, err := st.Claim(ctx, "", nil); !errors.Is(err, idem.ErrInvalidKey) {
		t.Errorf("Claim(\"\") = %v; want ErrInvalidKey", err)
	}
	if _, err := st.Lookup(ctx, big); !errors.Is(err, idem.ErrInvalidKey) {
		t.Errorf("Lookup of a %d-byte key = %v; want ErrInvalidKey", len(big), err)
	}
	if err := st.Confirm(ctx, c.Lease, []byte("12345")); !errors.Is(err, idem.ErrTooLarge) {
		t.Errorf("Confirm of a 5-byte result, MaxResultBytes 4 = %v; want ErrTooLarge", err)
	}
	if _, err := st.ClaimBatch(ctx, []string{"a", ""}, nil); !errors.Is(err, idem.ErrInvalidKey) {
		t.Errorf("ClaimBatch with an empty key = %v; want ErrInvalidKey", err)
	}
	if err := st.Forget(ctx, nil); err == nil || strings.Contains(err.Error(), "closed") {
		t.Errorf("Forget(nil) = %v; want a validation error", err)
	}
	write := func(context.Context, *sql.Tx) ([]byte, error) { t.Error("write called"); return nil, nil }
	if _, _, err := st.Run(ctx, big, nil, write); !errors.Is(err, idem.ErrInvalidKey) {
		t.Errorf("Run of a %d-byte key = %v; want ErrInvalidKey", len(big), err)
	}
	if _, _, err := st.Run(ctx, "k", make([]byte, idem.MaxFingerprintBytes+1), write); !errors.Is(err, idem.ErrTooLarge) {
		t.Errorf("Run with an oversized fingerprint = %v; want ErrTooLarge", err)
	}
	if _, _, err := st.Run(ctx, "k", nil, nil); err == nil || strings.Contains(err.Error(), "closed") {
		t.Errorf("Run with a nil write = %v; want a validation error", err)
	}
}

func TestPurgeExpired(t *testing.T) {
	dialects(t, func(t *testing.T, db *sql.DB, d sqlstore.Dialect) {
		ctx := t.Context()
		table := sqltest.UniqueTable()
		short := sqltest.NewStore(t, db, sqlstore.Options{Dialect: d, Table: table,
			LeaseTTL: idem.MinLeaseTTL, Retention: idem.MinLeaseTTL})
		long, err := sqlstore.New(db, sqlstore.Options{Dialect: d, Table: table})
		if err != nil {
			t.Fatal(err)
		}
		// More than two purge batches of expired rows: claims, confirmations
		// and forgotten claims.
		const n = 2100
		f, err := short.Claim(ctx, "old-forgotten", nil)
		if err != nil {
			t.Fatalf("Claim = %v", err)
		}
		if err := short.Forget(ctx, f.Lease); err != nil {
			t.Fatalf("Forget = %v", err)
		}
		keys := make([]string, n-1)
		for i := range keys {
			keys[i] = fmt.Sprintf("old-%d", i)
		}
		cs, err := short.ClaimBatch(ctx, keys, nil)
		if err != nil {
			t.Fatalf("ClaimBatch = %v", err)
		}
		if err := short.ConfirmBatch(ctx, []*idem.Lease{cs[0].Lease, cs[1].Lease}, nil); err != nil {
			t.Fatalf("ConfirmBatch = %v", err)
		}
		held, _ := long.Claim(ctx, "live-claim", nil)
		done, _ := long.Claim(ctx, "live-done", nil)
		if err := long.Confirm(ctx, done.Lease, []byte("r")); err != nil || held.Lease == nil {
			t.Fatalf("Confirm = %v, lease %v", err, held.Lease)
		}
		// Past the short store's lease and then its Retention (both
		// MinLeaseTTL): its confirmations are gone, and so are its lapsed
		// claims for a store with that Retention.
		time.Sleep(2*idem.MinLeaseTTL + 50*time.Millisecond)
		// The lapsed claims are kept for the purging store's Retention past
		// their lease (24h here), so that the next claim is told it takes
		// over: only the confirmations and the forgotten claim go.
		got, err := long.PurgeExpired(ctx)
		if err != nil || got != 3 {
			t.Fatalf("PurgeExpired with Retention 24h = %d, %v; want 3 (lapsed claims kept), nil", got, err)
		}
		// A store whose Retention (MinLeaseTTL) has passed since the leases
		// ended purges them.
		more, err := short.PurgeExpired(ctx)
		if err != nil || got+more != n {
			t.Fatalf("PurgeExpired with Retention %v = %d, %v; want %d, nil", idem.MinLeaseTTL, more, err, n-got)
		}
		for _, k := range []string{"live-claim", "live-done"} {
			if _, err := long.Lookup(ctx, k); err != nil {
				t.Errorf("Lookup(%q) after PurgeExpired = %v; want the live record kept", k, err)
			}
		}
		var rows int
		if err := db.QueryRowContext(ctx, sqltest.Query(d, `SELECT count(*) FROM "`+table+`"`)).Scan(&rows); err != nil || rows != 2 {
			t.Errorf("rows after PurgeExpired = %d, %v; want 2", rows, err)
		}
		if got, err := long.PurgeExpired(ctx); err != nil || got != 0 {
			t.Errorf("second PurgeExpired = %d, %v; want 0, nil", got, err)
		}
		// A key claimed again after its row was purged still gets a greater
		// token: the clock has moved past the old one.
		c, err := long.Claim(ctx, keys[0], nil)
		if err != nil || c.Outcome != idem.Claimed || c.Lease.Token <= cs[0].Lease.Token {
			t.Errorf("Claim after purge = %+v, %v; want Claimed with a token above %d", c, err, cs[0].Lease.Token)
		}
	})
}

func TestSQLiteWaitsForWriteLock(t *testing.T) {
	db, _ := sqltest.SQLite(t)
	st := sqltest.NewStore(t, db, sqlstore.Options{Dialect: sqlstore.SQLite, LockTimeout: 300 * time.Millisecond})
	ctx := t.Context()
	// Another connection holds SQLite's only write lock.
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = st.Claim(ctx, "k", nil)
	if took := time.Since(start); !errors.Is(err, idem.ErrInProgress) || took < 250*time.Millisecond {
		t.Errorf("Claim while the write lock is held = %v after %v; want ErrInProgress after LockTimeout 300ms", err, took)
	}
	// Released within LockTimeout, the claim goes through.
	go func() {
		time.Sleep(100 * time.Millisecond)
		_, _ = conn.ExecContext(context.Background(), "COMMIT")
	}()
	c, err := st.Claim(ctx, "k", nil)
	if err != nil || c.Outcome != idem.Claimed {
		t.Errorf("Claim as the write lock is released = %+v, %v; want Claimed", c, err)
	}
}

func TestTokensOutrunTheClock(t *testing.T) {
	dialects(t, func(t *testing.T, db *sql.DB, d sqlstore.Dialect) {
		ctx := t.Context()
		table := sqltest.UniqueTable()
		st := sqltest.NewStore(t, db, sqlstore.Options{Dialect: d, Table: table,
			LeaseTTL: idem.MinLeaseTTL})
		c, err := st.Claim(ctx, "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		// A token far ahead of the clock, as a clock stepped back (or many
		// claims in one tick) would leave: the next leases must exceed it
		// all the same.
		const ahead = int64(1) << 60
		q := sqltest.Query(d, `UPDATE "`+table+`" SET token = $1`)
		if _, err := db.ExecContext(ctx, q, ahead); err != nil {
			t.Fatal(err)
		}
		l := regrant.Lease(c.Lease, c.Lease.Key, ahead, c.Lease.Owner).(*idem.Lease)
		if err := st.Forget(ctx, l); err != nil {
			t.Fatalf("Forget = %v", err)
		}
		again, err := st.Claim(ctx, "k", nil)
		if err != nil || again.Outcome != idem.Claimed || again.Lease.Token <= ahead {
			t.Fatalf("Claim after Forget = %+v, %v; want Claimed with a token above %d", again, err, ahead)
		}
		time.Sleep(idem.MinLeaseTTL * 3 / 2)
		over, err := st.Claim(ctx, "k", nil)
		if err != nil || over.Outcome != idem.Claimed || over.Lease.Token <= again.Lease.Token {
			t.Errorf("take-over Claim = %+v, %v; want Claimed with a token above %d", over, err, again.Lease.Token)
		}
	})
}

// TestBytesPerRecord writes 20,000 confirmed records on each SQL server
// (claimed and confirmed in batches of 500, a 36-byte key, a 32-byte
// fingerprint and a 16-byte result, as a deployment's) and reports what a
// record costs on disk, table and indexes: as written (Postgres keeps the
// claim's dead row version until VACUUM; InnoDB fills its pages in key
// order only part way) and compacted (VACUUM FULL; OPTIMIZE TABLE), which
// is what a table whose space is reused settles near. A record must cost
// under 512 bytes compacted.
func TestBytesPerRecord(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 40,000 records; skipped with -short")
	}
	const n, batch = 20_000, 500
	for _, d := range []sqlstore.Dialect{sqlstore.Postgres, sqlstore.MySQL} {
		t.Run(d.String(), func(t *testing.T) {
			ctx := t.Context()
			db := sqltest.Pool(t, d, 4)
			table := sqltest.UniqueTable()
			st := sqltest.NewStore(t, db, sqlstore.Options{Dialect: d, Table: table, Retention: time.Hour})
			fp, result := []byte("0123456789abcdef0123456789abcdef"), []byte("202 Accepted ok.")
			fps, results := make([][]byte, batch), make([][]byte, batch)
			for i := range fps {
				fps[i], results[i] = fp, result
			}
			for i := 0; i < n; i += batch {
				keys := make([]string, batch)
				for j := range keys {
					keys[j] = fmt.Sprintf("%08x-0000-4000-8000-%012x", i+j, i+j) // a UUID's 36 bytes
				}
				cs, err := st.ClaimBatch(ctx, keys, fps)
				if err != nil {
					t.Fatalf("ClaimBatch = %v", err)
				}
				leases := make([]*idem.Lease, batch)
				for j, c := range cs {
					leases[j] = c.Lease
				}
				if err := st.ConfirmBatch(ctx, leases, results); err != nil {
					t.Fatalf("ConfirmBatch = %v", err)
				}
			}
			size := func() float64 {
				t.Helper()
				var bytes int64
				var err error
				if d == sqlstore.MySQL {
					// InnoDB's sizes are its statistics: fresh after ANALYZE.
					if _, err = db.ExecContext(ctx, "ANALYZE TABLE `"+table+"`"); err == nil {
						err = db.QueryRowContext(ctx, `SELECT data_length + index_length FROM information_schema.tables
WHERE table_schema = DATABASE() AND table_name = ?`, table).Scan(&bytes)
					}
				} else {
					err = db.QueryRowContext(ctx, `SELECT pg_total_relation_size($1)`, `"`+table+`"`).Scan(&bytes)
				}
				if err != nil {
					t.Fatalf("table size: %v", err)
				}
				return float64(bytes) / n
			}
			written := size()
			compact := "VACUUM FULL \"" + table + "\""
			if d == sqlstore.MySQL {
				compact = "OPTIMIZE TABLE `" + table + "`"
			}
			if _, err := db.ExecContext(ctx, compact); err != nil {
				t.Fatalf("%s: %v", compact, err)
			}
			compacted := size()
			t.Logf("%s: %.0f bytes per confirmed record as written, %.0f compacted (%d records, table and indexes)", d, written, compacted, n)
			if compacted >= 512 {
				t.Errorf("%s: %.0f bytes per confirmed record compacted; want under 512", d, compacted)
			}
		})
	}
}

// Recording the same checkpoint twice, or renewing twice at once, writes
// nothing new: the lease is still held (MySQL reports no row changed).
func TestCheckpointUnchangedIsHeld(t *testing.T) {
	dialects(t, func(t *testing.T, db *sql.DB, d sqlstore.Dialect) {
		ctx := t.Context()
		st := sqltest.NewStore(t, db, sqlstore.Options{Dialect: d, Table: sqltest.UniqueTable()})
		c, err := st.Claim(ctx, "k", nil)
		if err != nil || c.Outcome != idem.Claimed {
			t.Fatalf("Claim = %+v, %v", c, err)
		}
		for i := range 2 {
			if err := st.Checkpoint(ctx, c.Lease, []byte("step 1")); err != nil {
				t.Errorf("Checkpoint #%d of the same data = %v; want nil", i+1, err)
			}
		}
		if err := st.Forget(ctx, c.Lease); err != nil {
			t.Fatal(err)
		}
		if err := st.Checkpoint(ctx, c.Lease, []byte("step 1")); !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("Checkpoint after Forget = %v; want ErrLeaseLost", err)
		}
		if err := st.Renew(ctx, c.Lease); !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("Renew after Forget = %v; want ErrLeaseLost", err)
		}
	})
}
