package main

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/sqlstore"
)

// fakeClock is a clock a test moves by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// consoleRig is a console under test, with its store, its log and a
// browser-like client.
type consoleRig struct {
	t     *testing.T
	srv   *httptest.Server
	store idem.Store
	log   *strings.Builder
	token string
}

func newConsoleRig(t *testing.T, s idem.Store, mod func(*consoleConfig)) *consoleRig {
	t.Helper()
	var log strings.Builder
	cfg := consoleConfig{Store: s, Desc: "test store", Tokens: map[string]string{"0123456789abcdef0123": "alice"},
		Limit: 50, Log: &syncWriter{w: &log}}
	if mod != nil {
		mod(&cfg)
	}
	con, err := newConsole(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(con)
	t.Cleanup(srv.Close)
	return &consoleRig{t: t, srv: srv, store: s, log: &log, token: "0123456789abcdef0123"}
}

type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}

// client returns an HTTP client with a cookie jar that does not follow
// redirects, signed in with the token when signIn.
func (r *consoleRig) client(signIn bool) *http.Client {
	r.t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	if signIn {
		resp, err := c.Get(r.srv.URL + "/?token=" + r.token)
		if err != nil {
			r.t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" {
			r.t.Fatalf("GET /?token= = %d, Location %q; want 303 to / (the token moved to a cookie)", resp.StatusCode, resp.Header.Get("Location"))
		}
	}
	return c
}

func (r *consoleRig) get(c *http.Client, path string) (int, string) {
	r.t.Helper()
	resp, err := c.Get(r.srv.URL + path)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (r *consoleRig) post(c *http.Client, path string, form url.Values, header map[string]string) (int, string) {
	r.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, r.srv.URL+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

var (
	keyLinkRE = regexp.MustCompile(`href="/key/([A-Za-z0-9_-]+)"`)
	csrfRE    = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)
)

// firstKey opens the list and the first key's page; it returns the key's
// id and the session's CSRF token.
func (r *consoleRig) firstKey(c *http.Client) (id, csrf string) {
	r.t.Helper()
	st, body := r.get(c, "/")
	m := keyLinkRE.FindStringSubmatch(body)
	if st != http.StatusOK || m == nil {
		r.t.Fatalf("GET / = %d, no key link in %q", st, body)
	}
	cm := csrfRE.FindStringSubmatch(body)
	if cm == nil {
		r.t.Fatalf("GET / has no CSRF token: %q", body)
	}
	if st, body = r.get(c, "/key/"+m[1]); st != http.StatusOK {
		r.t.Fatalf("GET /key/%s = %d: %q", m[1], st, body)
	}
	return m[1], cm[1]
}

func quarantinedMem(t *testing.T, keys ...string) (*idem.MemoryStore, *fakeClock) {
	t.Helper()
	clk := &fakeClock{t: time.Now()}
	s, err := idem.NewMemoryStoreClock(idem.Options{MaxTakeOvers: 1, LeaseTTL: time.Second}, clk.now)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 2 {
		for _, k := range keys {
			c, err := s.Claim(ctx, k, nil)
			if err != nil || c.Outcome != idem.Claimed {
				t.Fatalf("Claim(%q) = %v, %v; want Claimed", k, c.Outcome, err)
			}
			if i == 1 {
				if err := s.Checkpoint(ctx, c.Lease, []byte("step 2 of 3")); err != nil {
					t.Fatal(err)
				}
			}
		}
		clk.add(2 * time.Second)
	}
	for _, k := range keys {
		if _, err := s.Claim(ctx, k, nil); !errors.Is(err, idem.ErrQuarantined) {
			t.Fatalf("Claim(%q) after two lapses with MaxTakeOvers 1 = %v; want ErrQuarantined", k, err)
		}
	}
	return s, clk
}

func isQuarantined(t *testing.T, s idem.Store, key string) bool {
	t.Helper()
	r, err := s.Lookup(context.Background(), key)
	return err == nil && r.Quarantined
}

// The console refuses a request without its token, a POST without the
// CSRF token, a cross-origin POST and a settle on a read-only console,
// each with 0 state changes; it never shows a key unless --reveal.
func TestConsoleRefuses(t *testing.T) {
	t.Parallel()
	const key = "order-4711-alice@example.com"
	s, _ := quarantinedMem(t, key)
	r := newConsoleRig(t, s, nil)
	anon := r.client(false)
	if st, body := r.get(anon, "/"); st != http.StatusUnauthorized || strings.Contains(body, "#") && strings.Contains(body, "/key/") {
		t.Errorf("GET / without token = %d; want 401 and no key", st)
	}
	if st, body := r.get(anon, "/style.css"); st != http.StatusOK || !strings.Contains(body, "font") {
		t.Errorf("GET /style.css without token = %d; want 200: the refusal page uses it", st)
	}
	if st, _ := r.get(anon, "/?token=wrong-token-wrong-token"); st != http.StatusUnauthorized {
		t.Errorf("GET /?token=wrong = %d; want 401", st)
	}
	c := r.client(true)
	st, body := r.get(c, "/")
	if st != http.StatusOK || strings.Contains(body, key) || !strings.Contains(body, "#"+idem.KeyHash(key)) {
		t.Errorf("GET / = %d; want 200 showing the key by its hash only:\n%s", st, body)
	}
	for _, h := range []string{"Content-Security-Policy", "X-Frame-Options", "Cache-Control"} {
		resp, _ := c.Get(r.srv.URL + "/")
		if resp.Header.Get(h) == "" {
			t.Errorf("GET / has no %s header", h)
		}
		resp.Body.Close()
	}
	id, csrf := r.firstKey(c)
	settle := url.Values{"id": {id}, "form": {"forget"}, "step": {"do"}, "csrf": {csrf}}
	noCSRF := url.Values{"id": {id}, "form": {"forget"}, "step": {"do"}}
	cases := []struct {
		name   string
		c      *http.Client
		form   url.Values
		header map[string]string
		want   int
	}{
		{"no token", anon, settle, nil, http.StatusUnauthorized},
		{"no CSRF token", c, noCSRF, nil, http.StatusForbidden},
		{"another session's CSRF token", c, url.Values{"id": {id}, "form": {"forget"}, "step": {"do"}, "csrf": {strings.Repeat("0", 32)}}, nil, http.StatusForbidden},
		{"cross-site", c, settle, map[string]string{"Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
		{"cross-origin", c, settle, map[string]string{"Origin": "http://evil.example"}, http.StatusForbidden},
		{"token in the URL of a POST", anon, settle, nil, http.StatusUnauthorized},
	}
	for _, tc := range cases {
		path := "/settle"
		if tc.name == "token in the URL of a POST" {
			path += "?token=" + r.token
		}
		if st, body := r.post(tc.c, path, tc.form, tc.header); st != tc.want {
			t.Errorf("%s: POST /settle = %d; want %d\n%s", tc.name, st, tc.want, body)
		}
		if !isQuarantined(t, s, key) {
			t.Fatalf("%s: the key is no longer quarantined: a refused request changed state", tc.name)
		}
	}
	if r.log.Len() != 0 {
		t.Errorf("log after refused requests = %q; want nothing settled", r.log.String())
	}

	ro := newConsoleRig(t, s, func(c *consoleConfig) { c.ReadOnly = true })
	rc := ro.client(true)
	rid, rcsrf := ro.firstKey(rc)
	if st, _ := ro.post(rc, "/settle", url.Values{"id": {rid}, "form": {"forget"}, "step": {"do"}, "csrf": {rcsrf}}, nil); st != http.StatusForbidden || !isQuarantined(t, s, key) {
		t.Errorf("read-only console: POST /settle = %d; want 403 and the key still quarantined", st)
	}
	if _, body := ro.get(rc, "/key/"+rid); strings.Contains(body, `action="/settle"`) {
		t.Errorf("read-only console's key page offers a settle form")
	}
}

// Bad input is an error on the page, never a write: an unknown key, a
// malformed result, a key too long.
func TestConsoleBadInput(t *testing.T) {
	t.Parallel()
	const key = "k-bad-input"
	s, _ := quarantinedMem(t, key)
	r := newConsoleRig(t, s, nil)
	c := r.client(true)
	id, csrf := r.firstKey(c)
	cases := []struct {
		name string
		form url.Values
		want int
	}{
		{"unknown id", url.Values{"id": {"AAAA" + id[4:]}, "form": {"forget"}, "step": {"do"}}, http.StatusBadRequest},
		{"malformed JSON", url.Values{"id": {id}, "form": {"do-json"}, "json": {"{not json"}, "step": {"do"}}, http.StatusBadRequest},
		{"bad HTTP status", url.Values{"id": {id}, "form": {"http"}, "status": {"99"}, "step": {"do"}}, http.StatusBadRequest},
		{"bad header", url.Values{"id": {id}, "form": {"http"}, "status": {"200"}, "header": {"no colon"}, "step": {"do"}}, http.StatusBadRequest},
		{"bad hex", url.Values{"id": {id}, "form": {"bytes"}, "hex": {"zz"}, "step": {"do"}}, http.StatusBadRequest},
		{"unknown form", url.Values{"id": {id}, "form": {"drop-table"}, "step": {"do"}}, http.StatusBadRequest},
	}
	for _, tc := range cases {
		tc.form.Set("csrf", csrf)
		st, body := r.post(c, "/settle", tc.form, nil)
		if st != tc.want || !strings.Contains(body, `id="error"`) {
			t.Errorf("%s: POST /settle = %d; want %d and an error on the page\n%s", tc.name, st, tc.want, body)
		}
		if !isQuarantined(t, s, key) {
			t.Fatalf("%s: the key is no longer quarantined", tc.name)
		}
	}
	if st, _ := r.post(c, "/lookup", url.Values{"key": {strings.Repeat("k", consoleMaxKey+1)}, "csrf": {csrf}}, nil); st != http.StatusBadRequest {
		t.Errorf("lookup of a key too long = %d; want 400", st)
	}
	if st, _ := r.get(c, "/key/not-an-id"); st != http.StatusNotFound {
		t.Errorf("GET /key/not-an-id = %d; want 404", st)
	}
	// Reviewing a settle writes nothing: only the confirmed step does.
	if st, body := r.post(c, "/settle", url.Values{"id": {id}, "form": {"forget"}, "csrf": {csrf}}, nil); st != http.StatusOK || !strings.Contains(body, `id="confirm"`) || !isQuarantined(t, s, key) {
		t.Errorf("POST /settle without step=do = %d; want the confirmation page and no write\n%s", st, body)
	}
}

// A settle with a Do value confirms the key; the next Do replays it, and
// the log says who settled which key by its hash.
func TestConsoleSettleDo(t *testing.T) {
	t.Parallel()
	const key = "pay-42"
	s, _ := quarantinedMem(t, key)
	r := newConsoleRig(t, s, nil)
	c := r.client(true)
	id, csrf := r.firstKey(c)
	st, body := r.post(c, "/settle", url.Values{"id": {id}, "form": {"do-json"}, "json": {`{"charge":"ch_1"}`}, "csrf": {csrf}, "step": {"do"}}, nil)
	if st != http.StatusOK || !strings.Contains(body, `id="done"`) {
		t.Fatalf("settle = %d; want done\n%s", st, body)
	}
	type charge struct{ Charge string }
	v, err := idem.Do(context.Background(), s, key, func(context.Context) (charge, error) {
		t.Error("Do ran the work of a key settled as done")
		return charge{}, nil
	})
	if err != nil || v.Charge != "ch_1" {
		t.Errorf("Do after the settle = %+v, %v; want the operator's value replayed", v, err)
	}
	if want := "settle by alice: do-json of key #" + idem.KeyHash(key); !strings.Contains(r.log.String(), want) {
		t.Errorf("log = %q; want a line with %q", r.log.String(), want)
	}
	if strings.Contains(r.log.String(), key) {
		t.Errorf("log = %q names the key; want its hash only", r.log.String())
	}
	// Settling again: the key is no longer quarantined, left as it is.
	if st, _ := r.post(c, "/settle", url.Values{"id": {id}, "form": {"forget"}, "csrf": {csrf}, "step": {"do"}}, nil); st != http.StatusConflict {
		t.Errorf("second settle = %d; want 409", st)
	}
	if st, body := r.get(c, "/key/"+id); st != http.StatusOK || !strings.Contains(body, "confirmed") || !strings.Contains(body, doorDo) {
		t.Errorf("key page after the settle = %d; want confirmed by Do\n%s", st, body)
	}
}

// With --reveal the key, the checkpoint and the recorded HTTP response are
// shown as they are.
func TestConsoleReveal(t *testing.T) {
	t.Parallel()
	const key = "h20:6:pay-77"
	s, _ := quarantinedMem(t, key)
	r := newConsoleRig(t, s, func(c *consoleConfig) { c.Reveal = true })
	c := r.client(true)
	st, body := r.get(c, "/")
	if st != http.StatusOK || !strings.Contains(body, key) || !strings.Contains(body, "step 2 of 3") || !strings.Contains(body, doorHTTP) {
		t.Fatalf("GET / with reveal = %d; want the key, its checkpoint and front door\n%s", st, body)
	}
	id, csrf := r.firstKey(c)
	st, body = r.post(c, "/settle", url.Values{"id": {id}, "form": {"http"}, "status": {"201"}, "header": {"Content-Type: application/json"},
		"body": {`{"id":"pay-77"}`}, "csrf": {csrf}, "step": {"do"}}, nil)
	if st != http.StatusOK {
		t.Fatalf("settle = %d\n%s", st, body)
	}
	_, body = r.get(c, "/key/"+id)
	for _, want := range []string{"HTTP 201 Created", "Content-Type: &#34;application/json&#34;", "pay-77"} {
		if !strings.Contains(body, want) {
			t.Errorf("key page lacks %q\n%s", want, body)
		}
	}
}

// The live counts on Redis (a bounded SCAN reading record heads) and on
// SQL (COUNTs) see a quarantined key and a live take-over, and not a
// plain claim, a confirmed key or a take-over whose lease ran out.
func TestConsoleLiveCounts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// make builds, on s, one key in each state; lapse lets leases run out.
	make := func(t *testing.T, s idem.Store, lapse func()) {
		t.Helper()
		claim := func(k string) idem.Claim {
			c, err := s.Claim(ctx, k, nil)
			if err != nil {
				t.Fatalf("Claim(%q) = %v", k, err)
			}
			return c
		}
		claim("quarantined")
		claim("takeover")
		claim("takeover-lapsed")
		lapse()
		claim("quarantined")
		claim("takeover-lapsed")
		lapse()
		if _, err := s.Claim(ctx, "quarantined", nil); !errors.Is(err, idem.ErrQuarantined) {
			t.Fatalf("Claim(quarantined) = %v; want ErrQuarantined", err)
		}
		c := claim("takeover")
		if !c.TakeOver {
			t.Fatalf("Claim(takeover) = %+v; want a take-over", c)
		}
		// Its holder gave it up with a long reason, which a record keeps
		// before the take-over count: still a live take-over.
		if err := s.(idem.Abandoner).Abandon(ctx, c.Lease, "Reconcile failed: "+strings.Repeat("r", 900)); err != nil {
			t.Fatal(err)
		}
		claim("plain")
		if err := s.Confirm(ctx, claim("done").Lease, nil); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("redis", func(t *testing.T) {
		m := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: m.Addr()})
		s, err := idem.NewRedisStore(c, idem.RedisOptions{Prefix: "p:", LeaseTTL: time.Second, MaxTakeOvers: 1})
		if err != nil {
			t.Fatal(err)
		}
		make(t, s, func() { m.FastForward(2 * time.Second) })
		var got liveSample
		if err := (&redisCounter{c: c, prefix: "p:", max: 100}).count(ctx, &got); err != nil {
			t.Fatal(err)
		}
		if got.Quarantined != 1 || got.TakeOvers != 1 || got.Scanned != 5 || got.Partial {
			t.Errorf("count = %+v; want 1 quarantined, 1 live take-over, 5 keys read, whole", got)
		}
		got = liveSample{}
		if err := (&redisCounter{c: c, prefix: "p:", max: 2}).count(ctx, &got); err != nil {
			t.Fatal(err)
		}
		if got.Scanned != 2 || !got.Partial {
			t.Errorf("count bounded to 2 keys = %+v; want 2 read, partial", got)
		}
	})
	t.Run("sqlite", func(t *testing.T) {
		path, _ := sqliteFile(t, idem.Options{})
		db, err := sql.Open(sqliteDriver, path)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		s, err := sqlstore.New(db, sqlstore.Options{Dialect: sqlstore.SQLite, LeaseTTL: time.Second, MaxTakeOvers: 1})
		if err != nil {
			t.Fatal(err)
		}
		make(t, s, func() { time.Sleep(1100 * time.Millisecond) })
		var got liveSample
		if err := newSQLCounter(db, sqlstore.SQLite, "").count(ctx, &got); err != nil {
			t.Fatal(err)
		}
		if got.Quarantined != 1 || got.TakeOvers != 1 {
			t.Errorf("count = %+v; want 1 quarantined, 1 live take-over", got)
		}
	})
}

func TestClaimHead(t *testing.T) {
	for _, tc := range []struct {
		head string
		keep int64
		n    int
		ok   bool
	}{
		{"2C17:3:own5:att-186400000:2:17:3:own", 86400000, 2, true},
		{"2C17:3:own5:att-1", 0, 0, false},
		{"2C17:3:ow", 0, 0, false},
		{"2Cx:3:own", 0, 0, false},
	} {
		keep, n, ok := claimHead(tc.head)
		if keep != tc.keep || n != tc.n || ok != tc.ok {
			t.Errorf("claimHead(%q) = %d, %d, %v; want %d, %d, %v", tc.head, keep, n, ok, tc.keep, tc.n, tc.ok)
		}
	}
}

// A quarantined key's page says how its last attempt ended: given up by
// its holder with the reason it gave (a failed Reconcile), or its lease
// run out (a crash or a stall).
func TestConsoleKeyPageSaysHowTheLastAttemptEnded(t *testing.T) {
	t.Parallel()
	for _, reason := range []string{"", "Reconcile failed: ledger unreachable"} {
		clk := &fakeClock{t: time.Now()}
		s, err := idem.NewMemoryStoreClock(idem.Options{MaxTakeOvers: 1, LeaseTTL: time.Second}, clk.now)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		for range 2 {
			c, err := s.Claim(ctx, "k", nil)
			if err != nil || c.Outcome != idem.Claimed {
				t.Fatalf("Claim = %v, %v", c.Outcome, err)
			}
			if reason != "" {
				if err := s.Abandon(ctx, c.Lease, reason); err != nil {
					t.Fatal(err)
				}
			}
			clk.add(2 * time.Second)
		}
		if _, err := s.Claim(ctx, "k", nil); !errors.Is(err, idem.ErrQuarantined) {
			t.Fatalf("Claim after two lapses = %v; want ErrQuarantined", err)
		}
		r := newConsoleRig(t, s, nil)
		c := r.client(true)
		id, _ := r.firstKey(c)
		_, body := r.get(c, "/key/"+id)
		want := `<td id="ended">its lease ran out: a crash or a stall</td>`
		if reason != "" {
			want = `<td id="ended">given up by its holder: ` + reason + `</td>`
		}
		if !strings.Contains(body, want) {
			t.Errorf("key page of a key quarantined after attempts that ended with %q lacks %s:\n%s", reason, want, body)
		}
	}
}
