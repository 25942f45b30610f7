package idem_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/storeopts"
	"github.com/idemgo/idem/internal/testenv"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite"
)

// countingConnector opens a connection of a database/sql driver, counting
// each. Used with SetMaxIdleConns(0), every statement opens a connection,
// so the count is the number of statements sent.
type countingConnector struct {
	d   driver.Driver
	dsn string
	n   atomic.Int64
}

func (c *countingConnector) Connect(context.Context) (driver.Conn, error) {
	c.n.Add(1)
	return c.d.Open(c.dsn)
}

func (c *countingConnector) Driver() driver.Driver { return c.d }

// countingDB opens dsn with driverName through a countingConnector.
func countingDB(t *testing.T, driverName, dsn string) (*sql.DB, *countingConnector) {
	t.Helper()
	probe, err := sql.Open(driverName, dsn)
	if err != nil {
		t.Fatalf("sql.Open(%s) = %v", driverName, err)
	}
	c := &countingConnector{d: probe.Driver(), dsn: dsn}
	_ = probe.Close()
	db := sql.OpenDB(c)
	db.SetMaxIdleConns(0)
	t.Cleanup(func() { _ = db.Close() })
	return db, c
}

// sqlBackends returns a countingDB of each SQL backend with its dialect.
func sqlBackends(t *testing.T) map[string]func(t *testing.T) (*sql.DB, *countingConnector, idem.Dialect) {
	return map[string]func(t *testing.T) (*sql.DB, *countingConnector, idem.Dialect){
		"sqlite": func(t *testing.T) (*sql.DB, *countingConnector, idem.Dialect) {
			path := filepath.Join(t.TempDir(), "idem.db")
			db, c := countingDB(t, "sqlite", "file:"+path+"?_pragma=journal_mode(WAL)")
			return db, c, idem.SQLite
		},
		"postgres": func(t *testing.T) (*sql.DB, *countingConnector, idem.Dialect) {
			db, c := countingDB(t, "pgx", testenv.PostgresDSN(t))
			return db, c, idem.Postgres
		},
	}
}

// maxResult is the MaxResultBytes of the stores under test.
const maxResult = 64

// checkRefusedBeforeIO sends every kind of oversized or empty input to s
// and checks that each is refused with its sentinel and a message that
// says what is wrong, while io (the store's I/O so far) does not move.
func checkRefusedBeforeIO(t *testing.T, s idem.Store, io func() int64) {
	t.Helper()
	ctx := context.Background()
	long := strings.Repeat("k", idem.DefaultMaxKeyBytes+1)
	bigFP := make([]byte, idem.MaxFingerprintBytes+1)
	bigResult := make([]byte, maxResult+1)
	good := &idem.Lease{Key: "sec-ok", Token: 1, Owner: "w"}
	longLease := &idem.Lease{Key: long, Token: 1, Owner: "w"}
	emptyLease := &idem.Lease{Key: "", Token: 1, Owner: "w"}
	type call struct {
		name string
		do   func() error
		want error
		says string
	}
	calls := []call{
		{"Claim(empty key)", func() error { _, err := s.Claim(ctx, "", nil); return err }, idem.ErrInvalidKey, "empty key"},
		{"Claim(1025-byte key)", func() error { _, err := s.Claim(ctx, long, nil); return err }, idem.ErrInvalidKey, "exceeds MaxKeyBytes"},
		{"Claim(1025-byte fingerprint)", func() error { _, err := s.Claim(ctx, "sec-ok", bigFP); return err }, idem.ErrTooLarge, "fingerprint of 1025 bytes exceeds"},
		{"Lookup(1025-byte key)", func() error { _, err := s.Lookup(ctx, long); return err }, idem.ErrInvalidKey, "exceeds MaxKeyBytes"},
		{"Lookup(empty key)", func() error { _, err := s.Lookup(ctx, ""); return err }, idem.ErrInvalidKey, "empty key"},
		{"Renew(1025-byte key)", func() error { return s.Renew(ctx, longLease) }, idem.ErrInvalidKey, "exceeds MaxKeyBytes"},
		{"Forget(empty key)", func() error { return s.Forget(ctx, emptyLease) }, idem.ErrInvalidKey, "empty key"},
		{"Confirm(1025-byte key)", func() error { return s.Confirm(ctx, longLease, nil) }, idem.ErrInvalidKey, "exceeds MaxKeyBytes"},
		{"Confirm(oversized result)", func() error { return s.Confirm(ctx, good, bigResult) }, idem.ErrTooLarge, "exceeds MaxResultBytes"},
		{"Confirm(nil lease)", func() error { return s.Confirm(ctx, nil, nil) }, idem.ErrInvalidLease, "nil *Lease"},
	}
	if b, ok := s.(idem.Batcher); ok {
		calls = append(calls,
			call{"ClaimBatch(one long key among good ones)", func() error {
				_, err := b.ClaimBatch(ctx, []string{"sec-a", long, "sec-b"}, nil)
				return err
			}, idem.ErrInvalidKey, "batch item 1"},
			call{"ClaimBatch(one oversized fingerprint)", func() error {
				_, err := b.ClaimBatch(ctx, []string{"sec-a", "sec-b"}, [][]byte{nil, bigFP})
				return err
			}, idem.ErrTooLarge, "batch item 1"},
			call{"ClaimBatch(fingerprints not matching keys)", func() error {
				_, err := b.ClaimBatch(ctx, []string{"sec-a", "sec-b"}, [][]byte{nil})
				return err
			}, nil, "2 keys and 1 fingerprints"},
			call{"ConfirmBatch(one oversized result)", func() error {
				return b.ConfirmBatch(ctx, []*idem.Lease{good, good}, [][]byte{nil, bigResult})
			}, idem.ErrTooLarge, "batch item 1"},
		)
	}
	if sq, ok := s.(*idem.SQLStore); ok {
		write := func(context.Context, *sql.Tx) ([]byte, error) {
			t.Errorf("Run called write for a refused input")
			return nil, nil
		}
		calls = append(calls,
			call{"Run(1025-byte key)", func() error { _, _, err := sq.Run(ctx, long, nil, write); return err }, idem.ErrInvalidKey, "exceeds MaxKeyBytes"},
			call{"Run(1025-byte fingerprint)", func() error { _, _, err := sq.Run(ctx, "sec-ok", bigFP, write); return err }, idem.ErrTooLarge, "exceeds"},
		)
	}
	before := io()
	for _, c := range calls {
		err := c.do()
		if err == nil || (c.want != nil && !errors.Is(err, c.want)) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s = %v; want an error matching %v that says %q", c.name, err, c.want, c.says)
		}
		if n := io(); n != before {
			t.Errorf("%s did I/O (%d operations) before refusing its input; want none", c.name, n-before)
			before = n
		}
	}
}

// Oversized and empty inputs are refused with a clear error before any I/O,
// on every store: the Redis client sends and dials nothing, the database
// opens no connection.
func TestSecurityOversizedInputsBeforeIO(t *testing.T) {
	o := idem.Options{MaxResultBytes: maxResult}
	t.Run("memory", func(t *testing.T) {
		s := idem.NewMemoryStore(o)
		checkRefusedBeforeIO(t, s, func() int64 { return 0 })
		// Refused is not truncated: the 1024-byte prefix of the long key
		// was not claimed in its place.
		if _, err := s.Lookup(context.Background(), strings.Repeat("k", idem.DefaultMaxKeyBytes)); !errors.Is(err, idem.ErrNotFound) {
			t.Errorf("Lookup of the long key's first 1024 bytes = %v; want ErrNotFound", err)
		}
	})
	t.Run("redis", func(t *testing.T) {
		c := redis.NewClient(&redis.Options{Addr: testenv.Lookup(t, testenv.RedisAddrVar)})
		t.Cleanup(func() { _ = c.Close() })
		io := &testenv.IOCounter{}
		c.AddHook(io)
		ro := storeopts.Redis(o)
		ro.Prefix = testenv.UniquePrefix()
		s, err := idem.NewRedisStore(c, ro)
		if err != nil {
			t.Fatalf("NewRedisStore = %v", err)
		}
		if io.N.Load() == 0 {
			t.Fatalf("the hook saw nothing of NewRedisStore's CONFIG GET; want it to count what the client sends")
		}
		checkRefusedBeforeIO(t, s, io.N.Load)
	})
	for name, open := range sqlBackends(t) {
		t.Run(name, func(t *testing.T) {
			db, conns, d := open(t)
			table := uniqueTable()
			ddl, err := idem.SchemaDDL(d, table)
			if err != nil {
				t.Fatal(err)
			}
			for _, q := range ddl {
				if _, err := db.Exec(q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE "` + table + `"`) })
			so := storeopts.SQL(o, d)
			so.Table = table
			s, err := idem.NewSQLStore(db, so)
			if err != nil {
				t.Fatalf("NewSQLStore = %v", err)
			}
			if _, err := s.Lookup(context.Background(), "sec-probe"); !errors.Is(err, idem.ErrNotFound) {
				t.Fatalf("Lookup = %v; want ErrNotFound", err)
			}
			if conns.n.Load() == 0 {
				t.Fatalf("no connection counted for the schema and a Lookup; want the connector to count them")
			}
			checkRefusedBeforeIO(t, s, conns.n.Load)
		})
	}
}

// Table names are the only text an SQLStore puts into SQL: anything but a
// plain, optionally schema-qualified identifier is refused at construction
// (and by SchemaDDL) before the database is touched.
func TestSecuritySQLIdentifiers(t *testing.T) {
	attempts := []string{
		`keys"; DROP TABLE idem_keys; --`,
		`idem_keys; DELETE FROM idem_keys`,
		`idem_keys--`,
		`idem_keys/*`,
		`"idem_keys"`,
		`idem_keys"`,
		`public."idem_keys"`,
		`idem keys`,
		"idem_keys\x00",
		"idem_keys\n",
		`idem_keys'`,
		`idem_keys)`,
		`pg_catalog.pg_class WHERE 1=1`,
		`a.b.c`,
		`.idem_keys`,
		`idem_keys.`,
		`1keys`,
		`idem-keys`,
		`idem$keys`,
		"idem_kéys",
		"idem_keys\u200b", // a zero-width space
		strings.Repeat("t", 64),
		strings.Repeat("s", 64) + ".keys",
	}
	for name, open := range sqlBackends(t) {
		t.Run(name, func(t *testing.T) {
			db, conns, d := open(t)
			for _, table := range attempts {
				before := conns.n.Load()
				if _, err := idem.NewSQLStore(db, idem.SQLOptions{Dialect: d, Table: table}); err == nil || !strings.Contains(err.Error(), "table name") {
					t.Errorf("NewSQLStore(Table %q) = %v; want an error naming the table name", table, err)
				}
				if ddl, err := idem.SchemaDDL(d, table); err == nil {
					t.Errorf("SchemaDDL(%q) = %q; want an error", table, ddl)
				}
				if n := conns.n.Load(); n != before {
					t.Errorf("NewSQLStore(Table %q) opened %d connections before refusing it; want none", table, n-before)
				}
			}
			// The check is not a refusal of everything: a plain name passes.
			if _, err := idem.NewSQLStore(db, idem.SQLOptions{Dialect: d, Table: "public_keys"}); err != nil {
				t.Errorf("NewSQLStore(Table %q) = %v; want a store", "public_keys", err)
			}
		})
	}
}

// A store that cannot reach its server answers every operation with an
// error, never with an outcome: not Claimed (the work would run unguarded),
// not ErrNotFound (a caller would take the key for new).
func TestSecurityStoreDownIsError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stores := map[string]func(t *testing.T) idem.Store{
		"redis": func(t *testing.T) idem.Store {
			s, err := idem.NewRedisStore(testenv.DeadRedis(t), idem.RedisOptions{AllowEviction: true})
			if err != nil {
				t.Fatalf("NewRedisStore(AllowEviction) = %v; want a store, no I/O yet", err)
			}
			return s
		},
	}
	for name, open := range sqlBackends(t) {
		stores[name] = func(t *testing.T) idem.Store {
			db, _, d := open(t)
			s, err := idem.NewSQLStore(db, idem.SQLOptions{Dialect: d, Table: uniqueTable()})
			if err != nil {
				t.Fatalf("NewSQLStore = %v", err)
			}
			_ = db.Close() // the database is gone from here on
			return s
		}
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			s := open(t)
			l := &idem.Lease{Key: "k", Token: 1, Owner: "w"}
			cl, err := s.Claim(ctx, "k", nil)
			if err == nil || cl.Outcome != 0 || cl.Lease != nil {
				t.Errorf("Claim = %v, %v; want an error and no outcome", cl.Outcome, err)
			}
			if _, err := s.Lookup(ctx, "k"); err == nil || errors.Is(err, idem.ErrNotFound) {
				t.Errorf("Lookup = %v; want an error other than ErrNotFound", err)
			}
			if err := s.Confirm(ctx, l, nil); err == nil {
				t.Errorf("Confirm = nil; want an error")
			}
			if err := s.Renew(ctx, l); err == nil || errors.Is(err, idem.ErrLeaseLost) {
				t.Errorf("Renew = %v; want an error other than ErrLeaseLost (KeepAlive retries those)", err)
			}
		})
	}
}
