package middleware

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testing/sqltest"
	"github.com/idemgo/idem/sqlstore"
)

// The SQL store is what transactional mode takes.
var _ TxStore = (*sqlstore.Store)(nil)

// txEnv is a transactional-mode store and an orders table the handler
// inserts into.
type txEnv struct {
	db     *sql.DB
	store  *sqlstore.Store
	orders string
	insert string
	// lastInsertID: insert returns no row; the reply carries the id.
	lastInsertID bool
}

func uniqueName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

func newTxEnv(t *testing.T, d sqlstore.Dialect) *txEnv {
	return newTxEnvLock(t, d, 0)
}

// newTxEnvLock is newTxEnv with the store's LockTimeout.
func newTxEnvLock(t *testing.T, d sqlstore.Dialect, lock time.Duration) *txEnv {
	t.Helper()
	var db *sql.DB
	e := &txEnv{orders: uniqueName("orders_")}
	switch d {
	case sqlstore.SQLite:
		db, _ = sqltest.SQLite(t)
		e.insert = "INSERT INTO " + e.orders + " (note) VALUES (?) RETURNING id"
	case sqlstore.Postgres:
		db = sqltest.Postgres(t)
		e.insert = "INSERT INTO " + e.orders + " (note) VALUES ($1) RETURNING id"
	case sqlstore.MySQL:
		// MySQL has no RETURNING: the id is the reply's last insert id.
		db = sqltest.MySQL(t)
		e.insert, e.lastInsertID = "INSERT INTO "+e.orders+" (note) VALUES (?)", true
	}
	e.db = db
	table := uniqueName("idemtest_")
	var err error
	e.store, err = sqlstore.New(db, sqlstore.Options{Dialect: d, Table: table, LockTimeout: lock})
	if err != nil {
		t.Fatalf("sqlstore.New = %v", err)
	}
	ctx := context.Background()
	if err := e.store.CreateSchema(ctx); err != nil {
		t.Fatalf("CreateSchema = %v", err)
	}
	ddl := "CREATE TABLE " + e.orders + " (id INTEGER PRIMARY KEY AUTOINCREMENT, note TEXT)"
	if d != sqlstore.SQLite {
		ddl = "CREATE TABLE " + e.orders + " (id BIGSERIAL PRIMARY KEY, note TEXT)"
		if d == sqlstore.MySQL {
			ddl = "CREATE TABLE " + e.orders + " (id BIGINT AUTO_INCREMENT PRIMARY KEY, note TEXT) ENGINE=InnoDB"
		}
		t.Cleanup(func() {
			_, _ = db.Exec("DROP TABLE IF EXISTS " + e.orders)
			_, _ = db.Exec(sqltest.Query(d, `DROP TABLE IF EXISTS "`+table+`"`))
		})
	}
	if _, err := db.ExecContext(ctx, ddl); err != nil {
		t.Fatalf("%s = %v", ddl, err)
	}
	if d != sqlstore.SQLite {
		warmPool(t, db, 4)
	}
	return e
}

// warmPool leaves n connections open and idle in db's pool: a Run waits
// at most LockTimeout (100 ms here) for a connection, and dialing a new
// one on a loaded machine can take longer, which would read as the
// database being busy when the sequence is about something else.
func warmPool(t *testing.T, db *sql.DB, n int) {
	t.Helper()
	db.SetMaxIdleConns(n)
	conns := make([]*sql.Conn, n)
	for i := range conns {
		c, err := db.Conn(context.Background())
		if err != nil {
			t.Fatalf("opening connection %d of the pool: %v", i+1, err)
		}
		conns[i] = c
	}
	for _, c := range conns {
		_ = c.Close()
	}
}

func (e *txEnv) rows(t *testing.T) int {
	t.Helper()
	var n int
	if err := e.db.QueryRow("SELECT count(*) FROM " + e.orders).Scan(&n); err != nil {
		t.Fatalf("counting orders: %v", err)
	}
	return n
}

// insertOrder inserts an order through tx and returns its id.
func (e *txEnv) insertOrder(ctx context.Context, tx *sql.Tx, note string) (int64, error) {
	if e.lastInsertID {
		res, err := tx.ExecContext(ctx, e.insert, note)
		if err != nil {
			return 0, err
		}
		return res.LastInsertId()
	}
	var id int64
	err := tx.QueryRowContext(ctx, e.insert, note).Scan(&id)
	return id, err
}

// orderHandler inserts an order through the request's transaction, then
// answers with its id; a body of "fail" answers 500 after the insert and
// "panic" panics after it.
func (e *txEnv) orderHandler(runs *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		tx, ok := sqlstore.TxFromContext(r.Context())
		if !ok {
			http.Error(w, "no transaction", 500)
			return
		}
		note, _ := io.ReadAll(r.Body)
		id, err := e.insertOrder(r.Context(), tx, string(note))
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		switch string(note) {
		case "fail":
			http.Error(w, "failed after the insert", 500)
			return
		case "panic":
			panic("after the insert")
		}
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", id))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, id)
	})
}

func eachDialect(t *testing.T, f func(t *testing.T, e *txEnv)) {
	t.Run("sqlite", func(t *testing.T) { f(t, newTxEnv(t, sqlstore.SQLite)) })
	t.Run("postgres", func(t *testing.T) { f(t, newTxEnv(t, sqlstore.Postgres)) })
	t.Run("mysql", func(t *testing.T) { f(t, newTxEnv(t, sqlstore.MySQL)) })
}

// N concurrent retries: the row exists once and every client gets the same
// body.
func TestTxConcurrentRetries(t *testing.T) {
	eachDialect(t, func(t *testing.T, e *txEnv) {
		var runs atomic.Int64
		h := mustNew(t, Options{SingleTenant: true, Tx: e.store}, e.orderHandler(&runs))
		const n = 8
		var wg sync.WaitGroup
		codes, bodies := make([]int, n), make([]string, n)
		for i := range n {
			wg.Go(func() {
				w := do(h, req{key: "order-1", body: "widget"})
				codes[i], bodies[i] = w.Code, w.Body.String()
			})
		}
		wg.Wait()
		for i := range n {
			if codes[i] != 201 || bodies[i] != bodies[0] {
				t.Errorf("client %d = %d %q; want 201 %q like client 0", i, codes[i], bodies[i], bodies[0])
			}
		}
		if got := e.rows(t); got != 1 || runs.Load() != 1 {
			t.Errorf("orders = %d after %d handler runs; want 1 and 1", got, runs.Load())
		}
		wantProblem(t, do(h, req{key: "order-1", body: "gadget"}), 422, TypeFingerprintMismatch)
		if _, ok := idem.LeaseFrom(context.Background()); ok {
			t.Errorf("LeaseFrom outside the middleware = ok")
		}
	})
}

// A 5xx or a panic rolls back the handler's row and the record: the retry
// runs the handler again.
func TestTxRollback(t *testing.T) {
	eachDialect(t, func(t *testing.T, e *txEnv) {
		var runs atomic.Int64
		h := mustNew(t, Options{SingleTenant: true, Tx: e.store}, e.orderHandler(&runs))
		if w := do(h, req{key: "k", body: "fail"}); w.Code != 500 {
			t.Errorf("failing handler = %d; want its 500", w.Code)
		}
		func() {
			defer func() {
				if v := recover(); v != "after the insert" {
					t.Errorf("recovered %v; want the handler's panic", v)
				}
			}()
			do(h, req{key: "k2", body: "panic"})
		}()
		if got := e.rows(t); got != 0 {
			t.Errorf("orders = %d after a 5xx and a panic; want 0 (rolled back)", got)
		}
		// Both keys are free again: different bodies under them are not 422.
		for _, key := range []string{"k", "k2"} {
			if w := do(h, req{key: key, body: "ok-" + key}); w.Code != 201 {
				t.Errorf("retry of %s = %d %q; want 201", key, w.Code, w.Body)
			}
		}
		if got := e.rows(t); got != 2 || runs.Load() != 4 {
			t.Errorf("orders = %d after %d runs; want 2 after 4", got, runs.Load())
		}
	})
}

// A request that meets another of its key in flight waits (each Run for the
// store's LockTimeout, retried up to Options.LockTimeout), then answers 409
// with Retry-After; once the first commits, a retry replays it.
func TestTxInFlight(t *testing.T) {
	for _, d := range []sqlstore.Dialect{sqlstore.SQLite, sqlstore.Postgres, sqlstore.MySQL} {
		t.Run(d.String(), func(t *testing.T) {
			e := newTxEnvLock(t, d, 100*time.Millisecond)
			var runs atomic.Int64
			started, release := make(chan struct{}), make(chan struct{})
			inner := e.orderHandler(&runs)
			h := mustNew(t, Options{SingleTenant: true, Tx: e.store, LockTimeout: 300 * time.Millisecond}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if runs.Load() == 0 {
					close(started)
					<-release
				}
				inner.ServeHTTP(w, r)
			}))
			first := make(chan string)
			go func() { first <- do(h, req{key: "k", body: "slow"}).Body.String() }()
			<-started
			start := time.Now()
			w := do(h, req{key: "k", body: "slow"})
			wantProblem(t, w, 409, TypeInProgress)
			if took := time.Since(start); took < 300*time.Millisecond || w.Header().Get("Retry-After") == "" {
				t.Errorf("409 after %v with Retry-After %q; want it after LockTimeout 300ms, with Retry-After", took, w.Header().Get("Retry-After"))
			}
			close(release)
			body := <-first
			if w := do(h, req{key: "k", body: "slow"}); w.Code != 201 || w.Body.String() != body || w.Header().Get(HeaderReplayed) != "true" {
				t.Errorf("after the commit = %d %q %v; want a replay of %q", w.Code, w.Body, w.Header(), body)
			}
			if got := e.rows(t); got != 1 || runs.Load() != 1 {
				t.Errorf("orders = %d after %d runs; want 1 and 1", got, runs.Load())
			}
		})
	}
}

// In transactional mode a record over the store's MaxResultBytes rolls the
// work back and answers 500: the work is undone, so a retry may run it.
// Only replayed headers beyond RecordOverhead can make it so: without its
// body the record would still not fit.
func TestTxResultTooLarge(t *testing.T) {
	e := newTxEnv(t, sqlstore.SQLite)
	small, err := sqlstore.New(e.db, sqlstore.Options{Dialect: sqlstore.SQLite, Table: uniqueName("idemtest_"), MaxResultBytes: 2 * RecordOverhead})
	if err != nil {
		t.Fatal(err)
	}
	if err := small.CreateSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	inner := e.orderHandler(&runs)
	h := mustNew(t, Options{SingleTenant: true, Tx: small}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "<"+strings.Repeat("x", 2*RecordOverhead)+">")
		inner.ServeHTTP(w, r)
	}))
	wantProblem(t, do(h, req{key: "k", body: "big"}), 500, TypeResponseTooLarge)
	if got := e.rows(t); got != 0 {
		t.Errorf("orders = %d; want 0 (rolled back)", got)
	}
}

// #17, deliver 2: waiting for SQLite's single writer, held by a request of
// another key, is a 503 with Retry-After that says the database is busy,
// not a 409 for a key nobody sent; a request of the held key is still 409.
// On Postgres requests of distinct keys do not wait for each other.
func TestTxBusyWriter(t *testing.T) {
	const sec26 = "https://datatracker.ietf.org/doc/html/draft-ietf-httpapi-idempotency-key-header-07#section-2.6"
	busy := &answer{status: 503, typ: TypeStoreUnavailable, retryable: true, header: map[string]string{"Retry-After": "1"}, detail: "database is busy"}
	inFlight := &answer{status: 409, typ: sec26, retryable: true, key: "a", header: map[string]string{"Retry-After": "1"}, detail: "being processed"}
	for _, c := range []struct {
		name    string
		dialect sqlstore.Dialect
		steps   []step
	}{
		{"SQLite, another key", sqlstore.SQLite, []step{
			{q: req{key: "a", body: "{}"}, hold: true},
			{q: req{key: "b", body: "{}"}, want: busy},
			{q: req{key: "c", body: "{}"}, want: busy},
		}},
		{"SQLite, the same key", sqlstore.SQLite, []step{
			{q: req{key: "a", body: "{}"}, hold: true},
			{q: req{key: "a", body: "{}"}, want: inFlight},
		}},
		{"Postgres, another key", sqlstore.Postgres, []step{
			{q: req{key: "a", body: "{}"}, hold: true},
			{q: req{key: "b", body: "{}"}, code: 201},
		}},
		{"Postgres, the same key", sqlstore.Postgres, []step{
			{q: req{key: "a", body: "{}"}, hold: true},
			{q: req{key: "a", body: "{}"}, want: inFlight},
		}},
		{"MySQL, another key", sqlstore.MySQL, []step{
			{q: req{key: "a", body: "{}"}, hold: true},
			{q: req{key: "b", body: "{}"}, code: 201},
		}},
		{"MySQL, the same key", sqlstore.MySQL, []step{
			{q: req{key: "a", body: "{}"}, hold: true},
			{q: req{key: "a", body: "{}"}, want: inFlight},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newTxEnvLock(t, c.dialect, 100*time.Millisecond)
			runSequence(t, Options{SingleTenant: true, Tx: e.store, LockTimeout: 250 * time.Millisecond}, c.steps)
		})
	}
}

// #17, deliver 7: in transactional mode a request without a key (Required
// false), like one of a method not covered, passes through: the handler
// runs without a transaction, TxFromContext reports false, nothing is
// recorded, and each such request runs it again. With Required it is 400
// and the handler does not run.
func TestTxNoKey(t *testing.T) {
	eachDialect(t, func(t *testing.T, e *txEnv) {
		var runs, withTx atomic.Int64
		// The fallback of the package documentation: the handler's own
		// transaction when the middleware gave it none.
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			tx, ok := sqlstore.TxFromContext(r.Context())
			if ok {
				withTx.Add(1)
			} else {
				own, err := e.db.BeginTx(r.Context(), nil)
				if err != nil {
					http.Error(w, err.Error(), 500)
					return
				}
				defer func() { _ = own.Rollback() }()
				tx = own
			}
			id, err := e.insertOrder(r.Context(), tx, "no key")
			if err == nil && !ok {
				err = tx.Commit()
			}
			if err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"id":%d}`, id)
		})
		h := mustNew(t, Options{SingleTenant: true, Tx: e.store}, handler)
		for i, q := range []req{{body: "{}"}, {body: "{}"}, {method: "PUT", body: "{}"}} {
			w := do(h, q)
			if w.Code != 201 || w.Header().Get(HeaderReplayed) != "" || w.Body.String() != fmt.Sprintf(`{"id":%d}`, i+1) {
				t.Errorf("%s without a key = %d %q %v; want 201 from a run of the handler, not a replay", cmp.Or(q.method, "POST"), w.Code, w.Body, w.Header())
			}
		}
		if got := e.rows(t); got != 3 || runs.Load() != 3 || withTx.Load() != 0 {
			t.Errorf("orders = %d after %d runs, %d in a transaction of the middleware; want 3, 3 and 0", got, runs.Load(), withTx.Load())
		}
		if w := do(h, req{key: "k", body: "{}"}); w.Code != 201 || withTx.Load() != 1 {
			t.Errorf("with a key = %d, %d runs in the middleware's transaction; want 201 and 1", w.Code, withTx.Load())
		}

		required := mustNew(t, Options{SingleTenant: true, Tx: e.store, Required: true}, handler)
		wantProblem(t, do(required, req{body: "{}"}), 400, TypeKeyMissing)
		if runs.Load() != 4 {
			t.Errorf("handler runs = %d after a 400 for a missing key; want 4 (it does not run)", runs.Load())
		}
	})
}

// #17, deliver 2: waiting for a connection from the pool is waiting for the
// database, not for the key: 503 with Retry-After, not 409.
func TestTxPoolExhaustedIs503(t *testing.T) {
	for _, d := range []sqlstore.Dialect{sqlstore.Postgres, sqlstore.MySQL} {
		t.Run(d.String(), func(t *testing.T) { testTxPoolExhaustedIs503(t, d) })
	}
}

func testTxPoolExhaustedIs503(t *testing.T, d sqlstore.Dialect) {
	e := newTxEnvLock(t, d, 100*time.Millisecond)
	e.db.SetMaxOpenConns(1)
	held, err := e.db.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	runs := 0
	mw, err := New(Options{SingleTenant: true, Tx: e.store})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs++; w.WriteHeader(201) }))
	req := httptest.NewRequest("POST", "/orders", strings.NewReader("{}"))
	req.Header.Set("Idempotency-Key", "pool-1")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != 503 || rec.Header().Get("Retry-After") == "" || !strings.Contains(rec.Body.String(), "database is busy") || runs != 0 {
		t.Errorf("request with every pool connection taken = %d, Retry-After %q, body %s, handler runs %d; want 503 saying the database is busy, Retry-After, the handler not run",
			rec.Code, rec.Header().Get("Retry-After"), rec.Body.String(), runs)
	}
}
