package idemgin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/middleware"
	"github.com/idemgo/idem/middleware/middlewaretest"
)

func init() { gin.SetMode(gin.TestMode) }

// The middleware's scenarios, unchanged, on Gin: the middleware on the
// engine, on a group under a prefix, and on each route.
func TestScenarios(t *testing.T) {
	for name, mount := range map[string]func(e *gin.Engine, mw, h gin.HandlerFunc){
		"Use": func(e *gin.Engine, mw, h gin.HandlerFunc) {
			e.Use(mw)
			e.Any("/orders", h)
			e.Any("/orders/:id", h)
		},
		"Group": func(e *gin.Engine, mw, h gin.HandlerFunc) {
			g := e.Group("/orders", mw)
			g.Any("", h)
			g.Any("/:id", h)
		},
		"Route": func(e *gin.Engine, mw, h gin.HandlerFunc) {
			e.Any("/orders", mw, h)
			e.Any("/orders/:id", mw, h)
		},
	} {
		t.Run(name, func(t *testing.T) {
			middlewaretest.Run(t, func(o middleware.Options, h http.Handler) (http.Handler, error) {
				mw, err := New(o)
				if err != nil {
					return nil, err
				}
				e := gin.New()
				mount(e, mw, gin.WrapH(h))
				return e, nil
			})
		})
	}
}

// counter is a Gin handler that counts its runs and answers what the
// request's X-Answer asks: "abort-NNN" c.AbortWithStatusJSON of that
// code, "status-NNN" c.Status alone, "error" c.Error without an answer,
// else 201 by c.JSON.
type counter struct{ runs atomic.Int64 }

func (k *counter) handle(c *gin.Context) {
	n := k.runs.Add(1)
	var token, fallback int64
	if l, ok := idem.LeaseFrom(c.Request.Context()); ok {
		token = l.Token
	}
	if l, ok := idem.LeaseFrom(c); ok { // with ContextWithFallback
		fallback = l.Token
	}
	var code int
	switch a := c.GetHeader("X-Answer"); {
	case a == "error":
		_ = c.Error(errors.New("the database said no (secret internals)"))
		return
	case strings.HasPrefix(a, "abort-"):
		fmt.Sscanf(a, "abort-%d", &code)
		c.AbortWithStatusJSON(code, gin.H{"message": fmt.Sprintf("refused, run %d", n)})
		return
	case strings.HasPrefix(a, "status-"):
		fmt.Sscanf(a, "status-%d", &code)
		c.Status(code)
		return
	}
	c.JSON(http.StatusCreated, gin.H{"run": n, "token": token, "fallback": fallback, "path": c.FullPath(), "tenant": c.GetString("tenant")})
}

func memStore(t testing.TB) idem.Store {
	t.Helper()
	s, err := idem.NewMemoryStore(idem.Options{})
	if err != nil {
		t.Fatalf("NewMemoryStore = %v", err)
	}
	return s
}

func mustNew(t testing.TB, o middleware.Options) gin.HandlerFunc {
	t.Helper()
	mw, err := New(o)
	if err != nil {
		t.Fatalf("New = %v", err)
	}
	return mw
}

func post(h http.Handler, path, key, body string, header ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// Gin's ways of answering are recorded by their status: an abort with a
// kept 4xx is replayed, body and all; a 409, a 500 or a chain that only
// recorded an error releases the key, and a retry runs the handler. A
// replay aborts the chain: the handler after the middleware, and a
// middleware after it, do not run.
func TestAnswers(t *testing.T) {
	for _, c := range []struct {
		answer string
		status int
		kept   bool
	}{
		{"abort-400", 400, true},
		{"abort-422", 422, true},
		{"status-202", 202, true},
		{"abort-409", 409, false},
		{"abort-500", 500, false},
		{"status-404", 404, false},
		{"error", 500, false},
	} {
		t.Run(c.answer, func(t *testing.T) {
			var k counter
			var after atomic.Int64
			e := gin.New()
			e.Use(mustNew(t, middleware.Options{Store: memStore(t), SingleTenant: true}))
			e.Use(func(c *gin.Context) { after.Add(1); c.Next() })
			e.POST("/orders", k.handle)
			first := post(e, "/orders", "k", `{}`, "X-Answer", c.answer)
			if first.Code != c.status || first.Header().Get(middleware.HeaderReplayed) != "" {
				t.Fatalf("first = %d %v %s; want %d", first.Code, first.Header(), first.Body, c.status)
			}
			if strings.Contains(first.Body.String(), "secret") {
				t.Errorf("first body = %q; want no internal text", first.Body)
			}
			retry := post(e, "/orders", "k", `{}`, "X-Answer", c.answer)
			runs := int64(2)
			if c.kept {
				runs = 1
				if retry.Code != c.status || retry.Header().Get(middleware.HeaderReplayed) != "true" || retry.Body.String() != first.Body.String() {
					t.Errorf("retry = %d %v %q; want the recorded %d %q replayed", retry.Code, retry.Header(), retry.Body, c.status, first.Body)
				}
			} else if retry.Code != c.status || retry.Header().Get(middleware.HeaderReplayed) != "" {
				t.Errorf("retry = %d %v; want the handler run again", retry.Code, retry.Header())
			}
			if n, m := k.runs.Load(), after.Load(); n != runs || m != runs {
				t.Errorf("handler ran %d times, the middleware after it %d; want %d and %d", n, m, runs, runs)
			}
		})
	}
}

// A panic under Gin's Recovery (around the middleware) is answered 500 and
// releases the key: the retry runs the handler.
func TestRecovery(t *testing.T) {
	var runs atomic.Int64
	e := gin.New()
	e.Use(gin.CustomRecoveryWithWriter(io.Discard, func(c *gin.Context, _ any) { c.AbortWithStatus(500) }))
	e.Use(mustNew(t, middleware.Options{Store: memStore(t), SingleTenant: true}))
	e.POST("/orders", func(c *gin.Context) {
		if runs.Add(1) == 1 {
			panic("the first run fails")
		}
		c.String(http.StatusCreated, "done")
	})
	if w := post(e, "/orders", "k", `{}`); w.Code != 500 {
		t.Fatalf("first = %d %s; want Recovery's 500", w.Code, w.Body)
	}
	if w := post(e, "/orders", "k", `{}`); w.Code != 201 || w.Header().Get(middleware.HeaderReplayed) != "" {
		t.Errorf("retry = %d %v; want 201, run again", w.Code, w.Header())
	}
	if w := post(e, "/orders", "k", `{}`); w.Code != 201 || w.Header().Get(middleware.HeaderReplayed) != "true" {
		t.Errorf("second retry = %d %v; want the 201 replayed", w.Code, w.Header())
	}
}

// What Gin's middleware put in the context reaches Scope through Context;
// the handler finds the lease in c.Request's context, and in c itself
// with ContextWithFallback; once the middleware returns, c.Request is
// Gin's own again.
func TestContextValues(t *testing.T) {
	var k counter
	var after []bool // whether a lease was in c.Request after the middleware
	e := gin.New()
	e.ContextWithFallback = true
	e.Use(func(c *gin.Context) {
		c.Set("tenant", c.GetHeader("X-Tenant"))
		c.Next()
		_, leased := idem.LeaseFrom(c.Request.Context())
		after = append(after, leased)
	})
	e.Use(mustNew(t, middleware.Options{Store: memStore(t), Scope: func(r *http.Request) (string, error) {
		return Context(r).GetString("tenant"), nil
	}}))
	e.POST("/orders", k.handle)
	type answer struct {
		Run, Token, Fallback int64
		Tenant               string
	}
	got := func(w *httptest.ResponseRecorder) answer {
		t.Helper()
		var a answer
		if err := json.Unmarshal(w.Body.Bytes(), &a); err != nil {
			t.Fatalf("body %q: %v", w.Body, err)
		}
		return a
	}
	a1 := got(post(e, "/orders", "k", `{}`, "X-Tenant", "acme"))
	b1 := got(post(e, "/orders", "k", `{}`, "X-Tenant", "globex"))
	a2 := got(post(e, "/orders", "k", `{}`, "X-Tenant", "acme"))
	if a1.Tenant != "acme" || b1.Tenant != "globex" || a1.Run == b1.Run || a2 != a1 {
		t.Errorf("acme, globex, acme again = %+v, %+v, %+v; want one run per tenant, acme's replayed", a1, b1, a2)
	}
	if a1.Token <= 0 || b1.Token <= 0 || a1.Fallback != a1.Token || b1.Fallback != b1.Token {
		t.Errorf("answers %+v, %+v; want the lease's token from c.Request.Context() and from c", a1, b1)
	}
	for i, leased := range after {
		if leased {
			t.Errorf("request %d: c.Request after the middleware carries the lease; want Gin's own request back", i)
		}
	}
	if c := Context(httptest.NewRequest("POST", "/", nil)); c != nil {
		t.Errorf("Context of a request outside the middleware = %v; want nil", c)
	}
}

// One key is one record however the middleware is mounted: a request
// answered by an engine that mounts it on a group under /api is replayed
// by engines that mount it with Use, on the route, or as the net/http
// middleware around the whole engine. A key reused on another route is
// 422.
func TestMountingKeepsIdentity(t *testing.T) {
	o := middleware.Options{Store: memStore(t), SingleTenant: true}
	var k counter
	group := gin.New()
	api := group.Group("/api", mustNew(t, o))
	api.POST("/orders/:id", k.handle)
	api.POST("/refunds", k.handle)

	global := gin.New()
	global.Use(mustNew(t, o))
	global.POST("/api/orders/:id", k.handle)
	global.POST("/api/refunds", k.handle)

	route := gin.New()
	route.POST("/api/orders/:id", mustNew(t, o), k.handle)
	route.POST("/api/refunds", mustNew(t, o), k.handle)

	plain := gin.New()
	plain.POST("/api/orders/:id", k.handle)
	plain.POST("/api/refunds", k.handle)
	mw, err := middleware.New(o)
	if err != nil {
		t.Fatal(err)
	}
	around := mw(plain)

	first := post(group, "/api/orders/7", "k", `{"amount":5}`)
	if first.Code != 201 {
		t.Fatalf("first = %d %s; want 201", first.Code, first.Body)
	}
	for name, h := range map[string]http.Handler{"group": group, "Use": global, "route": route, "net/http around": around} {
		w := post(h, "/api/orders/7", "k", `{"amount":5}`)
		if w.Code != 201 || w.Header().Get(middleware.HeaderReplayed) != "true" || w.Body.String() != first.Body.String() {
			t.Errorf("%s: retry = %d %v %q; want the first answer replayed", name, w.Code, w.Header(), w.Body)
		}
		if w := post(h, "/api/refunds", "k", `{"amount":5}`); w.Code != 422 {
			t.Errorf("%s: the key on another route = %d; want 422", name, w.Code)
		}
	}
	if n := k.runs.Load(); n != 1 {
		t.Errorf("handler ran %d times; want 1", n)
	}
}

// Over a real HTTP server and the real Redis store: a retry is replayed,
// another request under the key is 422, a key in flight is 409.
func TestRedis(t *testing.T) {
	addr := os.Getenv("IDEM_REDIS_ADDR")
	if addr == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("IDEM_REDIS_ADDR is not set, and CI=true: the Redis tests must run in CI")
		}
		t.Skip("IDEM_REDIS_ADDR is not set: skipping a test that needs a real Redis")
	}
	rc := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rc.Close() })
	store, err := idem.NewRedisStore(rc, idem.RedisOptions{Prefix: fmt.Sprintf("idem-gin-test-%d:", time.Now().UnixNano())})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var runs atomic.Int64
	e := gin.New()
	e.Use(mustNew(t, middleware.Options{Store: store, SingleTenant: true, LockTimeout: 100 * time.Millisecond}))
	e.POST("/orders", func(c *gin.Context) {
		n := runs.Add(1)
		if c.GetHeader("X-Hold") != "" {
			<-release
		}
		c.JSON(http.StatusCreated, gin.H{"run": n})
	})
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	send := func(key, body string, header ...string) (int, http.Header, string) {
		t.Helper()
		r, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", key)
		for i := 0; i+1 < len(header); i += 2 {
			r.Header.Set(header[i], header[i+1])
		}
		resp, err := srv.Client().Do(r)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(b)
	}
	key := fmt.Sprint("order-", time.Now().UnixNano())
	c1, _, b1 := send(key, `{"a":1}`)
	c2, h2, b2 := send(key, `{"a":1}`)
	c3, _, _ := send(key, `{"a":2}`)
	if c1 != 201 || c2 != 201 || h2.Get(middleware.HeaderReplayed) != "true" || b2 != b1 || c3 != 422 {
		t.Errorf("first, retry, other body = %d %q, %d %v %q, %d; want 201, its replay, 422", c1, b1, c2, h2, b2, c3)
	}
	held := make(chan int, 1)
	go func() { c, _, _ := send(key+"-held", `{}`, "X-Hold", "1"); held <- c }()
	for runs.Load() < 2 {
		time.Sleep(5 * time.Millisecond)
	}
	if c, h, _ := send(key+"-held", `{}`); c != 409 || h.Get("Retry-After") == "" {
		t.Errorf("a retry while in flight = %d %v; want 409 with Retry-After", c, h)
	}
	close(release)
	if c := <-held; c != 201 {
		t.Errorf("held request = %d; want 201", c)
	}
	if n := runs.Load(); n != 2 {
		t.Errorf("handler ran %d times; want 2", n)
	}
}

// Each of Gin's own ways to answer, or to fail, gets the answer plain Gin
// sends for the same chain (measured here on an engine without the
// adapter), recorded or released by its status under the keep rules; the
// one exception is a chain that called c.Error and neither wrote nor set a
// status, which plain Gin answers with an empty 200 and the adapter with a
// 500 that releases the key (see the package documentation).
func TestAnswersAsPlainGin(t *testing.T) {
	errMail := errors.New("receipt e-mail failed")
	for _, c := range []struct {
		name     string
		recovery bool // gin.Recovery mounted first, as gin.Default does
		inside   bool // gin.Recovery mounted after the adapter
		h        gin.HandlerFunc
		kept     bool // the answer is recorded and replayed
		status   int  // the adapter's answer when it differs from plain Gin's
	}{
		{name: "Error+Status204", h: func(c *gin.Context) { _ = c.Error(errMail); c.Status(http.StatusNoContent) }, kept: true},
		{name: "Error+JSON201", h: func(c *gin.Context) { _ = c.Error(errMail); c.JSON(http.StatusCreated, gin.H{"id": 1}) }, kept: true},
		{name: "AbortWithError400", h: func(c *gin.Context) { _ = c.AbortWithError(http.StatusBadRequest, errMail) }, kept: true},
		{name: "AbortWithError500", h: func(c *gin.Context) { _ = c.AbortWithError(http.StatusInternalServerError, errMail) }},
		{name: "AbortWithStatusJSON422", h: func(c *gin.Context) { c.AbortWithStatusJSON(422, gin.H{"error": "no"}) }, kept: true},
		{name: "AbortWithStatusJSON503", h: func(c *gin.Context) { c.AbortWithStatusJSON(503, gin.H{"error": "later"}) }},
		{name: "Status204", h: func(c *gin.Context) { c.Status(http.StatusNoContent) }, kept: true},
		{name: "nothing written", h: func(*gin.Context) {}, kept: true},
		{name: "panic under Recovery", recovery: true, h: func(*gin.Context) { panic("boom") }},
		{name: "panic under Recovery inside", inside: true, h: func(*gin.Context) { panic("boom") }},
		{name: "Error alone", h: func(c *gin.Context) { _ = c.Error(errMail) }, status: http.StatusInternalServerError},
	} {
		t.Run(c.name, func(t *testing.T) {
			engine := func(mw ...gin.HandlerFunc) (*gin.Engine, *atomic.Int64) {
				var runs atomic.Int64
				e := gin.New()
				if c.recovery {
					e.Use(gin.RecoveryWithWriter(io.Discard))
				}
				e.Use(mw...)
				if c.inside {
					e.Use(gin.RecoveryWithWriter(io.Discard))
				}
				e.POST("/orders", func(g *gin.Context) { runs.Add(1); c.h(g) })
				return e, &runs
			}
			plain, _ := engine()
			want := post(plain, "/orders", "k1", `{}`)
			if c.status != 0 {
				if want.Code != http.StatusOK || want.Body.Len() != 0 {
					t.Fatalf("plain Gin = %d %q; want the empty 200 the exception is about", want.Code, want.Body)
				}
				want.Code, want.Body = c.status, nil
			}
			e, runs := engine(mustNew(t, middleware.Options{Store: memStore(t), SingleTenant: true}))
			first := post(e, "/orders", "k1", `{}`)
			if first.Code != want.Code || want.Body != nil && first.Body.String() != want.Body.String() {
				t.Fatalf("first = %d %q; want plain Gin's %d %q", first.Code, first.Body, want.Code, want.Body)
			}
			retry := post(e, "/orders", "k1", `{}`)
			replayed := retry.Header().Get(middleware.HeaderReplayed) == "true"
			if retry.Code != first.Code || retry.Body.String() != first.Body.String() || replayed != c.kept {
				t.Errorf("retry = %d %q replayed %v; want %d %q replayed %v", retry.Code, retry.Body, replayed, first.Code, first.Body, c.kept)
			}
			if n, want := runs.Load(), map[bool]int64{true: 1, false: 2}[c.kept]; n != want {
				t.Errorf("handler ran %d times; want %d", n, want)
			}
		})
	}
}
