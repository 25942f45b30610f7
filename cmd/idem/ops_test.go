package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testing/sqltest"
	"github.com/idemgo/idem/internal/testing/testenv"
	"github.com/idemgo/idem/middleware"
	"github.com/idemgo/idem/sqlstore"
)

func TestSchema(t *testing.T) {
	t.Parallel()
	for _, d := range []struct {
		flag    string
		dialect sqlstore.Dialect
	}{{"postgres", sqlstore.Postgres}, {"sqlite", sqlstore.SQLite}, {"mysql", sqlstore.MySQL}} {
		r := runCLI(t, nil, "schema", "--dialect", d.flag, "--table", "app.idem_keys")
		ddl, err := sqlstore.SchemaDDL(d.dialect, "app.idem_keys")
		if err != nil {
			t.Fatalf("SchemaDDL = %v", err)
		}
		if want := strings.Join(ddl, ";\n\n") + ";\n"; r.code != exitOK || r.stdout != want {
			t.Errorf("schema --dialect %s = %d\n%s\nwant 0\n%s", d.flag, r.code, r.stdout, want)
		}
	}
	// --mysql is --dialect mysql.
	mysqlDDL, _ := sqlstore.SchemaDDL(sqlstore.MySQL, "idem_keys")
	if r := runCLI(t, nil, "schema", "--mysql"); r.code != exitOK || r.stdout != mysqlDDL[0]+";\n" {
		t.Errorf("schema --mysql = %d\n%s\nwant 0\n%s;", r.code, r.stdout, mysqlDDL[0])
	}
	if r := runCLI(t, nil, "schema", "--mysql", "--dialect", "sqlite"); r.code != exitUsage {
		t.Errorf("schema --mysql --dialect sqlite = %d %q; want a usage error", r.code, r.stderr)
	}
	// The table may also come from the environment.
	r := runCLI(t, map[string]string{envTable: "from_env"}, "schema", "--dialect", "sqlite")
	if !strings.Contains(r.stdout, `"from_env"`) {
		t.Errorf("schema with %s=from_env:\n%s", envTable, r.stdout)
	}
}

// inspect on the SQL and Redis stores: text and JSON, confirmed and
// claimed, and exit 1 for a key without a record.
func TestInspect(t *testing.T) {
	t.Parallel()
	path, sqlStore := sqliteFile(t, idem.Options{Worker: "w-7"})
	m := miniredis.RunT(t)
	rc := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rc.Close() })
	redisStore, err := idem.NewRedisStore(rc, idem.RedisOptions{Worker: "w-7"})
	if err != nil {
		t.Fatalf("NewRedisStore = %v", err)
	}
	for _, tt := range []struct {
		name  string
		store idem.Store
		flags []string
	}{
		{"sqlite", sqlStore, []string{"--sqlite", path}},
		{"redis", redisStore, []string{"--redis", "redis://" + m.Addr()}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			confirm(t, tt.store, "order:1", []byte{0xfe, 0xed}, []byte("hello"))
			if _, err := tt.store.Claim(context.Background(), "order:2", nil); err != nil {
				t.Fatalf("Claim = %v", err)
			}
			args := append([]string{"inspect"}, tt.flags...)
			r := runCLI(t, nil, append(args, "order:1")...)
			for _, want := range []string{"key          order:1\n", "state        confirmed\n", "owner        -\n",
				"fingerprint  feed\n", "result       5 bytes\n", "retention ends in"} {
				if !strings.Contains(r.stdout, want) {
					t.Errorf("inspect order:1 = %d, lacks %q:\n%s%s", r.code, want, r.stdout, r.stderr)
				}
			}
			if !regexp.MustCompile(`(?m)^token        [1-9]\d*$`).MatchString(r.stdout) {
				t.Errorf("inspect order:1 has no token:\n%s", r.stdout)
			}

			r = runCLI(t, nil, append(args, "order:2", "--json")...) // a flag after KEY
			var in inspection
			if err := json.Unmarshal([]byte(r.stdout), &in); err != nil || r.code != exitOK {
				t.Fatalf("inspect --json order:2 = %d %q: %v", r.code, r.stdout, err)
			}
			if in.Key != "order:2" || in.State != "claimed" || in.Owner != "w-7" || in.Token <= 0 ||
				in.Fingerprint != "" || in.ResultBytes != 0 || time.Until(in.Expires) <= 0 {
				t.Errorf("inspect --json order:2 = %+v; want a live claim by w-7", in)
			}

			r = runCLI(t, nil, append(args, "--hex", hex.EncodeToString([]byte("order:1")))...)
			if !strings.Contains(r.stdout, "state        confirmed") {
				t.Errorf("inspect --hex = %d:\n%s%s", r.code, r.stdout, r.stderr)
			}

			r = runCLI(t, nil, append(args, "order:none")...)
			if r.code != exitFailed || !strings.Contains(r.stderr, "no live record") {
				t.Errorf("inspect of a missing key = %d %q; want %d, no live record", r.code, r.stderr, exitFailed)
			}
			r.wantOneLine(t, args)
		})
	}
}

// fillForPrune writes 3 records that expire at once and 2 that live, and
// waits until the 3 have expired.
func fillForPrune(t *testing.T, short, long idem.Store) {
	t.Helper()
	for _, k := range []string{"gone:1", "gone:2", "gone:3"} {
		confirm(t, short, k, nil, nil)
	}
	confirm(t, long, "kept:1", nil, nil)
	if _, err := long.Claim(context.Background(), "kept:2", nil); err != nil {
		t.Fatalf("Claim = %v", err)
	}
	time.Sleep(idem.MinLeaseTTL + 50*time.Millisecond) // past the short retention
}

func checkPruned(t *testing.T, r result, s idem.Store) {
	t.Helper()
	if r.code != exitOK || !strings.Contains(r.stdout, "deleted 3 expired rows") {
		t.Errorf("prune = %d; want 0 and 3 deleted:\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, k := range []string{"kept:1", "kept:2"} {
		if _, err := s.Lookup(context.Background(), k); err != nil {
			t.Errorf("Lookup(%q) after prune = %v; want the live record kept", k, err)
		}
	}
}

func TestPruneSQLite(t *testing.T) {
	t.Parallel()
	path, long := sqliteFile(t, idem.Options{})
	short, err := sqlstore.New(sqltest.OpenSQLite(t, path), sqlstore.Options{Retention: idem.MinLeaseTTL, LeaseTTL: idem.MinLeaseTTL, Dialect: sqlstore.SQLite})
	if err != nil {
		t.Fatalf("sqlstore.New = %v", err)
	}
	fillForPrune(t, short, long)
	checkPruned(t, runCLI(t, nil, "prune", "--sqlite", path), long)
	if r := runCLI(t, nil, "prune", "--sqlite", path); !strings.Contains(r.stdout, "deleted 0 expired rows") {
		t.Errorf("second prune:\n%s", r.stdout)
	}
}

func TestPruneServer(t *testing.T) {
	t.Run("postgres", func(t *testing.T) { t.Parallel(); testPrune(t, sqlstore.Postgres, testenv.PostgresDSN, envPostgresDSN) })
	t.Run("mysql", func(t *testing.T) { t.Parallel(); testPrune(t, sqlstore.MySQL, testenv.MySQLDSN, envMySQLDSN) })
}

func testPrune(t *testing.T, d sqlstore.Dialect, dsnOf func(testing.TB) string, envDSN string) {
	dsn := dsnOf(t)
	db := sqltest.Open(t, d)
	var b [4]byte
	_, _ = rand.Read(b[:])
	table := "idem_prune_" + hex.EncodeToString(b[:])
	t.Cleanup(func() { _, _ = db.Exec(sqltest.Query(d, `DROP TABLE IF EXISTS "`+table+`"`)) })
	newStore := func(retention time.Duration) *sqlstore.Store {
		s, err := sqlstore.New(db, sqlstore.Options{Retention: retention, LeaseTTL: retention, Dialect: d, Table: table})
		if err != nil {
			t.Fatalf("sqlstore.New = %v", err)
		}
		return s
	}
	long := newStore(0)
	if err := long.CreateSchema(context.Background()); err != nil {
		t.Fatalf("CreateSchema = %v", err)
	}
	fillForPrune(t, newStore(idem.MinLeaseTTL), long)
	// The DSN and table come from the environment, as an operator's cron
	// job would set them.
	checkPruned(t, runCLI(t, map[string]string{envDSN: dsn, envTable: table}, "prune"), long)
}

// #17, deliver 6: inspect --http finds the middleware's record from what
// the client sent (scope, client key), whatever the ServeMux pattern the
// middleware wrapped, and --result prints the
// recorded status, headers, request id and body, as text and as JSON.
func TestInspectHTTP(t *testing.T) {
	t.Parallel()
	path, store := sqliteFile(t, idem.Options{})
	serve := func(pattern, scope, requestID, key, body string) {
		t.Helper()
		o := middleware.Options{Store: store, RequestIDHeader: "X-Request-Id", SingleTenant: scope == ""}
		if scope != "" {
			o.Scope = func(*http.Request) (string, error) { return scope, nil }
		}
		mw, err := middleware.New(o)
		if err != nil {
			t.Fatal(err)
		}
		mux := http.NewServeMux()
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("ETag", `"v1"`)
			w.Header().Set("Location", "/payments/7")
			w.Header().Set("Set-Cookie", "session=s3cret") // never recorded
			w.WriteHeader(http.StatusCreated)
			fmt.Fprint(w, `{"payment":7}`)
		})
		r := httptest.NewRequest("POST", "/payments", strings.NewReader(body))
		r.Header.Set("Idempotency-Key", key)
		r.Header.Set("X-Request-Id", requestID)
		w := httptest.NewRecorder()
		mw(mux).ServeHTTP(w, r)
		if w.Code != 201 {
			t.Fatalf("POST /payments = %d %s", w.Code, w.Body)
		}
	}
	serve("POST /payments", "acme", "req-1", "pay-8c5e-1", `{"amount":5}`)
	serve("/payments", "", "", "pay-2", `{}`) // a pattern without its method

	args := []string{"inspect", "--sqlite", path}
	r := runCLI(t, nil, append(args, "--http", "POST /payments", "--scope", "acme", "--result", "pay-8c5e-1")...)
	want := `
HTTP 201 Created
Content-Type: application/json
Etag: "v1"
Idempotent-Replayed: true
Location: /payments/7
Original-Request: req-1

{"payment":7}
`
	if r.code != exitOK || !strings.Contains(r.stdout, "key          h24:acme10:pay-8c5e-1\n") ||
		!strings.Contains(r.stdout, "state        confirmed\n") || !strings.HasSuffix(r.stdout, want) {
		t.Errorf("inspect --http --scope --result = %d:\n%s%s\nwant the record of h24:acme10:pay-8c5e-1 ending\n%s", r.code, r.stdout, r.stderr, want)
	}

	r = runCLI(t, nil, append(args, "--http", "POST /payments", "--result", "--json", "pay-2")...)
	var in inspection
	if err := json.Unmarshal([]byte(r.stdout), &in); err != nil || r.code != exitOK {
		t.Fatalf("inspect --http --result --json = %d %q %q: %v", r.code, r.stdout, r.stderr, err)
	}
	if in.Key != "h20:5:pay-2" || in.Response == nil || in.Response.Status != 201 || in.Response.Body != `{"payment":7}` ||
		in.Response.OriginalRequest != "" || in.Response.Header["Location"][0] != "/payments/7" || in.Response.Header["Set-Cookie"] != nil {
		t.Errorf("inspect --http --result --json = %+v %+v; want pay-2's record under /payments, its 201 and body, no request id, no cookie", in, in.Response)
	}

	for _, tc := range []struct {
		name string
		args []string
		code int
		says string
	}{
		{"another tenant", []string{"--http", "POST /payments", "--scope", "other", "pay-8c5e-1"}, exitFailed, "no live record"},
		{"no scope", []string{"--http", "POST /payments", "pay-8c5e-1"}, exitFailed, "h20:10:pay-8c5e-1 or h10:4:POST14:POST /payments10:pay-8c5e-1 or h10:4:POST9:/payments10:pay-8c5e-1"},
		{"no method", []string{"--http", "/payments", "pay-2"}, exitUsage, "'METHOD ROUTE'"},
		{"scope without http", []string{"--scope", "acme", "pay-2"}, exitUsage, "only with --http"},
	} {
		r := runCLI(t, nil, append(args, tc.args...)...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.says) {
			t.Errorf("inspect %s (%q) = %d %q; want %d saying %q", tc.name, tc.args, r.code, r.stderr, tc.code, tc.says)
		}
		r.wantOneLine(t, tc.args)
	}

	// --result of a record that is not an HTTP response, or not done yet.
	confirm(t, store, "job:1", nil, []byte("not a response"))
	if _, err := store.Claim(context.Background(), "job:2", nil); err != nil {
		t.Fatal(err)
	}
	for key, says := range map[string]string{"job:1": "not a response the middleware recorded", "job:2": "in flight"} {
		if r := runCLI(t, nil, append(args, "--result", key)...); r.code != exitFailed || !strings.Contains(r.stderr, says) {
			t.Errorf("inspect --result %s = %d %q; want %d saying %q", key, r.code, r.stderr, exitFailed, says)
		}
	}
}

// inspect --json answers in JSON on every path a script reads: a key with
// no live record is an object with state "none" and the reason, exit 1.
func TestInspectJSONMissingKey(t *testing.T) {
	t.Parallel()
	path, _ := sqliteFile(t, idem.Options{})
	r := runCLI(t, nil, "inspect", "--sqlite", path, "--json", "no-such-key")
	var got struct {
		Key   string `json:"key"`
		State string `json:"state"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || r.code != exitFailed ||
		got.Key != "no-such-key" || got.State != "none" || !strings.Contains(got.Error, "no live record") {
		t.Errorf("inspect --json of a missing key = %d, stdout %q (%v); want 1 and a JSON object with state none and the reason", r.code, r.stdout, err)
	}
	if !strings.Contains(r.stderr, "no live record") {
		t.Errorf("stderr %q; want the one-line error too", r.stderr)
	}
}
