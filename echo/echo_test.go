package idemecho

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

	"github.com/labstack/echo/v4"
	echomw "github.com/labstack/echo/v4/middleware"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/middleware"
	"github.com/idemgo/idem/middleware/middlewaretest"
)

// The middleware's scenarios, unchanged, on Echo: the middleware on the
// Echo, on a group under a prefix, and on each route.
func TestScenarios(t *testing.T) {
	for name, mount := range map[string]func(e *echo.Echo, mw echo.MiddlewareFunc, h echo.HandlerFunc){
		"Use": func(e *echo.Echo, mw echo.MiddlewareFunc, h echo.HandlerFunc) {
			e.Use(mw)
			e.Any("/orders", h)
			e.Any("/orders/:id", h)
		},
		"Group": func(e *echo.Echo, mw echo.MiddlewareFunc, h echo.HandlerFunc) {
			g := e.Group("/orders", mw)
			g.Any("", h)
			g.Any("/:id", h)
		},
		"Route": func(e *echo.Echo, mw echo.MiddlewareFunc, h echo.HandlerFunc) {
			e.Any("/orders", h, mw)
			e.Any("/orders/:id", h, mw)
		},
	} {
		t.Run(name, func(t *testing.T) {
			middlewaretest.Run(t, func(o middleware.Options, h http.Handler) (http.Handler, error) {
				mw, err := New(o)
				if err != nil {
					return nil, err
				}
				e := echo.New()
				mount(e, mw, echo.WrapHandler(h))
				return e, nil
			})
		})
	}
}

// counter is an Echo handler that counts its runs and answers what the
// request's X-Answer asks: "error" returns a plain error (Echo's 500),
// "http-NNN" an *echo.HTTPError of that code, else 201 by c.JSON.
type counter struct{ runs atomic.Int64 }

func (k *counter) handle(c echo.Context) error {
	n := k.runs.Add(1)
	var token int64
	if l, ok := idem.LeaseFrom(c.Request().Context()); ok {
		token = l.Token
	}
	switch a := c.Request().Header.Get("X-Answer"); {
	case a == "error":
		return errors.New("the database said no (secret internals)")
	case strings.HasPrefix(a, "http-"):
		var code int
		fmt.Sscanf(a, "http-%d", &code)
		return echo.NewHTTPError(code, fmt.Sprintf("refused, run %d", n))
	}
	return c.JSON(http.StatusCreated, map[string]any{"run": n, "token": token, "path": c.Path(), "tenant": c.Get("tenant")})
}

func memStore(t testing.TB) idem.Store {
	t.Helper()
	s, err := idem.NewMemoryStore(idem.Options{})
	if err != nil {
		t.Fatalf("NewMemoryStore = %v", err)
	}
	return s
}

func mustNew(t testing.TB, o middleware.Options) echo.MiddlewareFunc {
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

// An error the handler returns is answered by Echo's error handler inside
// the middleware: a 4xx the keep rules keep is recorded and replayed,
// body and all; a 500 or a 409 releases the key, and a retry runs the
// handler. A replay returns no error, so nothing around it runs the
// handler or answers twice; the error still reaches a middleware around
// (Echo's Logger calls the error handler again; the answer is not
// doubled).
func TestHandlerErrors(t *testing.T) {
	for _, c := range []struct {
		answer string
		status int
		kept   bool
	}{
		{"http-400", 400, true},
		{"http-422", 422, true},
		{"http-409", 409, false},
		{"http-404", 404, false},
		{"error", 500, false},
	} {
		t.Run(c.answer, func(t *testing.T) {
			var k counter
			var seen []error
			e := echo.New()
			e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
				return func(ec echo.Context) error {
					err := next(ec)
					seen = append(seen, err)
					if err != nil {
						ec.Error(err) // as Echo's Logger middleware does
					}
					return err
				}
			})
			e.Use(mustNew(t, middleware.Options{Store: memStore(t), SingleTenant: true}))
			e.POST("/orders", k.handle)
			first := post(e, "/orders", "k", `{}`, "X-Answer", c.answer)
			if first.Code != c.status || first.Header().Get(middleware.HeaderReplayed) != "" {
				t.Fatalf("first = %d %v %s; want %d from Echo's error handler", first.Code, first.Header(), first.Body, c.status)
			}
			var msg struct{ Message string }
			if err := json.Unmarshal(first.Body.Bytes(), &msg); err != nil || msg.Message == "" || strings.Contains(first.Body.String(), "secret") {
				t.Errorf("first body = %q; want one JSON answer of Echo's error handler, no internal text", first.Body)
			}
			retry := post(e, "/orders", "k", `{}`, "X-Answer", c.answer)
			if c.kept {
				if retry.Code != c.status || retry.Header().Get(middleware.HeaderReplayed) != "true" || retry.Body.String() != first.Body.String() {
					t.Errorf("retry = %d %v %q; want the recorded %d %q replayed", retry.Code, retry.Header(), retry.Body, c.status, first.Body)
				}
				if n := k.runs.Load(); n != 1 {
					t.Errorf("handler ran %d times; want 1", n)
				}
				if len(seen) != 2 || seen[0] == nil || seen[1] != nil {
					t.Errorf("errors seen around = %v; want the handler's, then none for the replay", seen)
				}
				return
			}
			if retry.Code != c.status || retry.Header().Get(middleware.HeaderReplayed) != "" {
				t.Errorf("retry = %d %v; want the handler run again", retry.Code, retry.Header())
			}
			if n := k.runs.Load(); n != 2 {
				t.Errorf("handler ran %d times; want 2 (a %d is not kept)", n, c.status)
			}
		})
	}
}

// A panic under Echo's Recover (around the middleware) is answered 500 and
// releases the key: the retry runs the handler.
func TestRecover(t *testing.T) {
	var runs atomic.Int64
	e := echo.New()
	e.Use(echomw.Recover())
	e.Use(mustNew(t, middleware.Options{Store: memStore(t), SingleTenant: true}))
	e.POST("/orders", func(c echo.Context) error {
		if runs.Add(1) == 1 {
			panic("the first run fails")
		}
		return c.String(http.StatusCreated, "done")
	})
	if w := post(e, "/orders", "k", `{}`); w.Code != 500 {
		t.Fatalf("first = %d %s; want Recover's 500", w.Code, w.Body)
	}
	if w := post(e, "/orders", "k", `{}`); w.Code != 201 || w.Header().Get(middleware.HeaderReplayed) != "" {
		t.Errorf("retry = %d %v; want 201, run again", w.Code, w.Header())
	}
	if w := post(e, "/orders", "k", `{}`); w.Code != 201 || w.Header().Get(middleware.HeaderReplayed) != "true" {
		t.Errorf("second retry = %d %v; want the 201 replayed", w.Code, w.Header())
	}
}

// What Echo's middleware put in the context reaches Scope through
// Context, and the handler's request carries the lease; once the
// middleware returns, the context holds Echo's own request again.
func TestContextValues(t *testing.T) {
	var k counter
	var after []bool // whether a lease was in c.Request() after the middleware
	e := echo.New()
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			c.Set("tenant", c.Request().Header.Get("X-Tenant"))
			err := next(c)
			_, leased := idem.LeaseFrom(c.Request().Context())
			after = append(after, leased)
			return err
		}
	})
	e.Use(mustNew(t, middleware.Options{Store: memStore(t), Scope: func(r *http.Request) (string, error) {
		return Context(r).Get("tenant").(string), nil
	}}))
	e.POST("/orders", k.handle)
	type answer struct {
		Run, Token int64
		Tenant     string
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
	if a1.Token <= 0 || b1.Token <= 0 {
		t.Errorf("lease tokens = %d, %d; want the lease in the handler's c.Request()", a1.Token, b1.Token)
	}
	for i, leased := range after {
		if leased {
			t.Errorf("request %d: c.Request() after the middleware carries the lease; want Echo's own request back", i)
		}
	}
	if c := Context(httptest.NewRequest("POST", "/", nil)); c != nil {
		t.Errorf("Context of a request outside the middleware = %v; want nil", c)
	}
}

// One key is one record however the middleware is mounted: a request
// answered by a service that mounts it on a group under /api is replayed
// by services that mount it on the Echo, on the route, or as the net/http
// middleware around the whole Echo: a deploy that changes the mounting
// runs nothing twice. A key reused on another route is 422.
func TestMountingKeepsIdentity(t *testing.T) {
	store := memStore(t)
	o := middleware.Options{Store: store, SingleTenant: true}
	var k counter
	group := echo.New()
	api := group.Group("/api", mustNew(t, o))
	api.POST("/orders/:id", k.handle)
	api.POST("/refunds", k.handle)

	global := echo.New()
	global.Use(mustNew(t, o))
	global.POST("/api/orders/:id", k.handle)
	global.POST("/api/refunds", k.handle)

	route := echo.New()
	route.POST("/api/orders/:id", k.handle, mustNew(t, o))
	route.POST("/api/refunds", k.handle, mustNew(t, o))

	plain := echo.New()
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
	store, err := idem.NewRedisStore(rc, idem.RedisOptions{Prefix: fmt.Sprintf("idem-echo-test-%d:", time.Now().UnixNano())})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var runs atomic.Int64
	e := echo.New()
	e.Use(mustNew(t, middleware.Options{Store: store, SingleTenant: true, LockTimeout: 100 * time.Millisecond}))
	e.POST("/orders", func(c echo.Context) error {
		n := runs.Add(1)
		if c.Request().Header.Get("X-Hold") != "" {
			<-release
		}
		return c.JSON(http.StatusCreated, map[string]int64{"run": n})
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
