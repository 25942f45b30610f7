package middleware

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testing/testenv"
	"github.com/idemgo/idem/sqlstore"
	"github.com/redis/go-redis/v9"
)

// secBackend is a middleware configuration over one real backend: lease
// mode (Store) or transactional mode (Tx), and the store itself for
// looking records up.
type secBackend struct {
	opts  Options
	store idem.Store
}

// secBackends are the backends the security tests run on: the memory
// store, the real Redis, and Postgres in lease and in transactional mode.
func secBackends() map[string]func(t *testing.T) secBackend {
	return map[string]func(t *testing.T) secBackend{
		"memory": func(t *testing.T) secBackend {
			s := memStore(idem.Options{})
			return secBackend{Options{SingleTenant: true, Store: s}, s}
		},
		"redis": func(t *testing.T) secBackend {
			s := realRedisStore(t)
			return secBackend{Options{SingleTenant: true, Store: s}, s}
		},
		"postgres": func(t *testing.T) secBackend {
			s := newTxEnv(t, sqlstore.Postgres).store
			return secBackend{Options{SingleTenant: true, Store: s}, s}
		},
		"postgres-tx": func(t *testing.T) secBackend {
			s := newTxEnv(t, sqlstore.Postgres).store
			return secBackend{Options{SingleTenant: true, Tx: s}, s}
		},
	}
}

// tenantHeader names the tenant in these tests; Scope refuses a request
// without it.
const tenantHeader = "X-Tenant"

func tenantScope(r *http.Request) (string, error) {
	vs, ok := r.Header[tenantHeader]
	if !ok || len(vs) != 1 {
		return "", errors.New("no tenant")
	}
	return vs[0], nil
}

// tenantEcho answers 201 with the tenant it served and its run number; a
// body of "block" waits for release first.
type tenantEcho struct {
	runs    atomic.Int64
	started chan struct{}
	release chan struct{}
}

func (e *tenantEcho) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := e.runs.Add(1)
	body, _ := io.ReadAll(r.Body)
	if string(body) == "block" {
		e.started <- struct{}{}
		<-e.release
	}
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, "tenant=%q run=%d", r.Header.Get(tenantHeader), n)
}

// One Idempotency-Key sent by many tenants is one record per tenant: no
// tenant is ever answered with another's response, nor told (422, 409)
// that another used the key. The tenants are chosen so that a plain
// concatenation of tenant, method and key would make some of them one. (An
// empty tenant is refused: see "empty scope" in TestProblemAnswers.)
func TestSecurityTenantIsolation(t *testing.T) {
	tenants := []string{"a", "a:", "1:a", "a1:", "acme", "ACME", "acme4:POST", "acme\x00", "h1"}
	for name, open := range secBackends() {
		t.Run(name, func(t *testing.T) {
			b := open(t)
			e := &tenantEcho{started: make(chan struct{}), release: make(chan struct{})}
			o := b.opts
			o.SingleTenant, o.Scope = false, tenantScope
			o.LockTimeout = 50 * time.Millisecond
			h := mustNew(t, o, e)
			send := func(tenant, key, body string) (int, string, string) {
				w := do(h, req{key: key, body: body, header: map[string]string{tenantHeader: tenant}})
				return w.Code, w.Body.String(), w.Header().Get(HeaderReplayed)
			}
			first := map[string]string{}
			for _, tn := range tenants {
				code, body, replayed := send(tn, "k", "{}")
				if code != 201 || replayed != "" || !strings.HasPrefix(body, fmt.Sprintf("tenant=%q ", tn)) {
					t.Fatalf("tenant %q first request = %d %q (replayed %q); want its own 201", tn, code, body, replayed)
				}
				first[tn] = body
			}
			for _, tn := range tenants {
				if code, body, replayed := send(tn, "k", "{}"); code != 201 || replayed != "true" || body != first[tn] {
					t.Errorf("tenant %q retry = %d %q (replayed %q); want the replay of its own %q", tn, code, body, replayed, first[tn])
				}
			}
			if n := e.runs.Load(); n != int64(len(tenants)) {
				t.Errorf("handler ran %d times for %d tenants; want once each", n, len(tenants))
			}

			// Another tenant's different request under the key is not a
			// mismatch (422): that would tell it the key is taken.
			if code, body, _ := send("other", "k", `{"x":1}`); code != 201 {
				t.Errorf("tenant %q, same key, other body = %d %q; want its own 201, not 422", "other", code, body)
			}
			// Nor is another tenant's request in flight a conflict (409).
			done := make(chan int)
			go func() {
				code, _, _ := send("slow", "k2", "block")
				done <- code
			}()
			<-e.started
			code, body, _ := send("fast", "k2", "block2")
			close(e.release)
			if code != 201 {
				t.Errorf("tenant %q while %q holds the key = %d %q; want its own 201, not 409", "fast", "slow", code, body)
			}
			if c := <-done; c != 201 {
				t.Errorf("tenant %q = %d; want 201", "slow", c)
			}

			// No tenant at all: 400 before the store is asked.
			wantProblem(t, do(h, req{key: "k", body: "{}"}), 400, TypeScopeInvalid)
		})
	}
}

// credentialHandler answers with credentials and internal headers beside
// the representation's.
type credentialHandler struct{ runs atomic.Int64 }

const cookieSecret = "session=s3cr3t-cookie"

var credentialHeaders = map[string]string{
	"Set-Cookie":         cookieSecret,
	"Authorization":      "Bearer s3cr3t-token",
	"Www-Authenticate":   `Bearer realm="s3cr3t-realm"`,
	"Proxy-Authenticate": `Basic realm="s3cr3t-proxy"`,
	"X-Internal-Token":   "s3cr3t-internal",
}

func (c *credentialHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.runs.Add(1)
	h := w.Header()
	for k, v := range credentialHeaders {
		h.Set(k, v)
	}
	h.Set("Content-Type", "application/json")
	h.Set("Location", "/orders/9")
	h.Set("Etag", `"v1"`)
	h.Set("X-Request-Cost", "3")
	w.WriteHeader(http.StatusCreated)
	_, _ = io.WriteString(w, `{"id":9}`)
}

// checkReplayHeaders fails t unless the replayed headers are exactly want
// (plus Idempotent-Replayed).
func checkReplayHeaders(t *testing.T, got http.Header, want ...string) {
	t.Helper()
	var names []string
	for k := range got {
		names = append(names, k)
	}
	want = append(want, HeaderReplayed)
	slices.Sort(names)
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("replayed headers %q; want exactly %q", names, want)
	}
	for k, vs := range got {
		for _, v := range vs {
			if strings.Contains(v, "s3cr3t") && !slices.Contains(want, k) {
				t.Errorf("replayed header %s: %q carries a secret not allowlisted", k, v)
			}
		}
	}
}

// Only allowlisted response headers are recorded and replayed: never
// credentials, whatever the handler set, and never a header the allowlist
// no longer holds, even if a wider one recorded it.
func TestSecurityReplayHeaderAllowlist(t *testing.T) {
	for name, open := range secBackends() {
		t.Run(name, func(t *testing.T) {
			b := open(t)
			var c credentialHandler
			h := mustNew(t, b.opts, &c)

			first := do(h, req{key: "k", body: "{}"})
			if first.Code != 201 || first.Header().Get("Set-Cookie") != cookieSecret {
				t.Fatalf("first response = %d %v; want 201 with the handler's own headers, cookie included", first.Code, first.Header())
			}
			replay := do(h, req{key: "k", body: "{}"})
			if replay.Code != 201 || replay.Body.String() != `{"id":9}` {
				t.Fatalf("replay = %d %q; want the recorded 201 and body", replay.Code, replay.Body)
			}
			checkReplayHeaders(t, replay.Header(), "Content-Type", "Location", "Etag")

			// What is stored holds no credential either: a store is read
			// by operators and tools, not only by this middleware.
			rec, err := b.store.Lookup(context.Background(), storeKey("", "k"))
			if err != nil || !rec.Confirmed {
				t.Fatalf("Lookup of the record = %v, %v; want the confirmation", rec, err)
			}
			if strings.Contains(string(rec.Result), "s3cr3t") || strings.Contains(string(rec.Result), "Set-Cookie") {
				t.Errorf("stored result %q holds a credential header", rec.Result)
			}

			// A custom allowlist is exact: its headers and no others.
			custom := b.opts
			custom.ReplayHeaders = []string{"x-request-cost", "X-Internal-Token"}
			hc := mustNew(t, custom, &c)
			do(hc, req{key: "k2", body: "{}"})
			checkReplayHeaders(t, do(hc, req{key: "k2", body: "{}"}).Header(), "X-Request-Cost", "X-Internal-Token")

			// Narrowed later: a record made under the wider list replays
			// only what today's list allows.
			checkReplayHeaders(t, do(h, req{key: "k2", body: "{}"}).Header())
			if n := c.runs.Load(); n != 2 {
				t.Errorf("handler ran %d times; want 2 (one per key)", n)
			}
		})
	}
	// No spelling lets a credential into the allowlist.
	for _, name := range []string{"SET-COOKIE", "set-cookie", "authorization", "Www-Authenticate", "PROXY-AUTHENTICATE", "Set-Cookie "} {
		if _, err := New(Options{SingleTenant: true, Store: memStore(idem.Options{}), ReplayHeaders: []string{"Location", name}}); err == nil {
			t.Errorf("New(ReplayHeaders holding %q) = nil error; want credentials refused", name)
		}
	}
}

// chunked is a body of unknown length (no Content-Length).
type chunked struct{ io.Reader }

// Oversized and malformed requests are answered 400 or 413 with a problem
// before the real Redis sees a single command, and the handler never runs.
func TestSecurityOversizedBeforeIO(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testenv.Lookup(t, testenv.RedisAddrVar)})
	t.Cleanup(func() { _ = c.Close() })
	sent := &testenv.IOCounter{}
	c.AddHook(sent)
	st, err := idem.NewRedisStore(c, idem.RedisOptions{Prefix: uniqueName("idem-mw-sec-") + ":"})
	if err != nil {
		t.Fatalf("NewRedisStore = %v", err)
	}
	var ran counter
	o := Options{Store: st, MaxBodyBytes: 1024, Scope: tenantScope}
	h := mustNew(t, o, &ran)
	withKey := mustNew(t, Options{SingleTenant: true, Store: st, Key: func(r *http.Request) (string, error) { return r.Header.Get("Webhook-Id"), nil }}, &ran)
	tenant := map[string]string{tenantHeader: "t"}
	hugeTenant := map[string]string{tenantHeader: strings.Repeat("t", 1000)}
	for _, tc := range []struct {
		name   string
		h      http.Handler
		q      req
		status int
		typ    string
	}{
		{"256-byte key", h, req{key: strings.Repeat("k", 256), body: "{}", header: tenant}, 400, TypeKeyInvalid},
		{"258-byte quoted key", h, req{key: `"` + strings.Repeat("k", 256) + `"`, body: "{}", header: tenant}, 400, TypeKeyInvalid},
		{"malformed key", h, req{key: "a, b", body: "{}", header: tenant}, 400, TypeKeyInvalid},
		{"two key fields", h, req{keys: []string{"a", "b"}, body: "{}", header: tenant}, 400, TypeKeyInvalid},
		{"256-byte Key option", withKey, req{body: "{}", header: map[string]string{"Webhook-Id": strings.Repeat("w", 256)}}, 400, TypeKeyInvalid},
		{"body over MaxBodyBytes", h, req{key: "k", body: strings.Repeat("b", 1025), header: tenant}, 413, TypeBodyTooLarge},
		{"no tenant", h, req{key: "k", body: "{}"}, 400, TypeScopeInvalid},
		// 1000 bytes of tenant, 255 of key: the store key is over the
		// store's 1024 bytes, which the store refuses before I/O.
		{"store key over MaxKeyBytes", h, req{key: strings.Repeat("k", 255), body: "{}", header: hugeTenant}, 400, TypeKeyInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := sent.N.Load()
			wantProblem(t, do(tc.h, tc.q), tc.status, tc.typ)
			if n := sent.N.Load() - before; n != 0 {
				t.Errorf("Redis saw %d commands or dials; want none before the refusal", n)
			}
		})
	}
	t.Run("chunked body over MaxBodyBytes", func(t *testing.T) {
		before := sent.N.Load()
		r := req{key: "k", header: tenant}.build()
		r.Body, r.ContentLength = io.NopCloser(chunked{strings.NewReader(strings.Repeat("b", 4096))}), -1
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		wantProblem(t, w, 413, TypeBodyTooLarge)
		if n := sent.N.Load() - before; n != 0 {
			t.Errorf("Redis saw %d commands or dials; want none before the refusal", n)
		}
	})
	if ran.runs.Load() != 0 {
		t.Errorf("handler ran %d times; want never for a refused request", ran.runs.Load())
	}
	// The counter counts: a good request does reach Redis.
	before := sent.N.Load()
	if w := do(h, req{key: "k", body: "{}", header: tenant}); w.Code != 201 || sent.N.Load() == before {
		t.Errorf("a good request = %d after %d Redis commands; want 201 and some", w.Code, sent.N.Load()-before)
	}
}

// deadRedisStore is a RedisStore whose server is gone.
func deadRedisStore(t *testing.T) idem.Store {
	t.Helper()
	st, err := idem.NewRedisStore(testenv.DeadRedis(t), idem.RedisOptions{AllowEviction: true}) // no I/O: the check is skipped
	if err != nil {
		t.Fatalf("NewRedisStore = %v", err)
	}
	return st
}

// closedSQLStore is a Postgres SQLStore whose database handle is closed.
func closedSQLStore(t *testing.T) *sqlstore.Store {
	t.Helper()
	db, err := sql.Open("pgx", testenv.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	st, err := sqlstore.New(db, sqlstore.Options{Dialect: sqlstore.Postgres, Table: uniqueName("idemsec_")})
	if err != nil {
		t.Fatal(err)
	}
	_ = db.Close()
	return st
}

// A store that cannot be reached fails closed: 503 problem with
// Retry-After, the handler never runs, no internal error text is shown.
func TestSecurityFailClosed(t *testing.T) {
	for name, o := range map[string]func(t *testing.T) Options{
		"redis down":       func(t *testing.T) Options { return Options{SingleTenant: true, Store: deadRedisStore(t)} },
		"postgres closed":  func(t *testing.T) Options { return Options{SingleTenant: true, Store: closedSQLStore(t)} },
		"postgres-tx down": func(t *testing.T) Options { return Options{SingleTenant: true, Tx: closedSQLStore(t)} },
		"claim errors": func(t *testing.T) Options {
			s := newCounting()
			s.claimErr = context.DeadlineExceeded // a store timeout, not the client's
			return Options{SingleTenant: true, Store: s}
		},
	} {
		t.Run(name, func(t *testing.T) {
			var c counter
			h := mustNew(t, o(t), &c)
			for range 2 {
				w := do(h, req{key: "k", body: "{}"})
				wantProblem(t, w, 503, TypeStoreUnavailable)
				if w.Header().Get("Retry-After") == "" {
					t.Errorf("503 without Retry-After")
				}
				if strings.Contains(w.Body.String(), "refused") || strings.Contains(w.Body.String(), "closed") {
					t.Errorf("problem body %q shows the store's error", w.Body)
				}
			}
			if n := c.runs.Load(); n != 0 {
				t.Errorf("handler ran %d times with the store down; want never", n)
			}
		})
	}
}
