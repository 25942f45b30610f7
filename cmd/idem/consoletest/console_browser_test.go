package consoletest

import (
	"bufio"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/sqlstore"
)

// The settle the browser makes, and what the next Do must replay: a Do
// value as JSON, in the console's "do-json" form. When the forms change
// (issue 44), this is the line to re-point.
var settle = struct{ form, field, input, want string }{"do-json", "json", `{"n":7}`, `{"n":7}`}

// crashLease is the crash children's lease: each crash waits for it to
// run out before the next child takes the key over.
const (
	crashLease   = idem.MinLeaseTTL
	maxTakeOvers = 2
)

// result is the value the crash children's Do computes (never, as each
// dies first) and the operator settles.
type result struct {
	N int `json:"n"`
}

// need returns the environment variable name, or skips t without it
// (fails it under CI=true, where a green run must mean the service ran).
func need(t *testing.T, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set: under CI=true the real service is required (run `make test`)", name)
		}
		t.Skipf("%s is not set; skipping (make test sets it)", name)
	}
	return v
}

// chromium returns the path of the browser, or skips t without it.
func chromium(t *testing.T) string {
	t.Helper()
	for _, n := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is not on PATH: under CI=true it is required (.ci/services.sh install)")
	}
	t.Skip("chromium is not on PATH (Debian: apt-get install chromium); skipping the browser test")
	return ""
}

var (
	buildOnce sync.Once
	idemBin   string
	buildErr  error
)

// idemCommand builds the idem command from this tree, once per run.
func idemCommand(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..", "..", "..")
		dir, err := os.MkdirTemp("", "idem-consoletest")
		if err != nil {
			buildErr = err
			return
		}
		idemBin = filepath.Join(dir, "idem")
		goTool, err := exec.LookPath("go")
		if err != nil {
			buildErr = fmt.Errorf("the go command builds idem for the test: %w", err)
			return
		}
		cmd := exec.Command(goTool, "build", "-o", idemBin, "./cmd/idem")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/idem: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return idemBin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if idemBin != "" {
		_ = os.RemoveAll(filepath.Dir(idemBin))
	}
	os.Exit(code)
}

// backend is one store the test runs on: the store, how the crash
// children and the console reach it.
type backend struct {
	name    string
	store   idem.Store
	child   []string // the children's environment
	console []string // the console's store flags
}

func unique() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func redisBackend(t *testing.T) backend {
	addr := need(t, "IDEM_REDIS_ADDR")
	prefix := "consoletest:" + unique() + ":"
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	s, err := idem.NewRedisStore(c, idem.RedisOptions{Prefix: prefix, LeaseTTL: crashLease, MaxTakeOvers: maxTakeOvers})
	if err != nil {
		t.Fatal(err)
	}
	return backend{name: "redis", store: s,
		child:   []string{"CONSOLETEST_STORE=redis", "CONSOLETEST_ADDR=" + addr, "CONSOLETEST_NAME=" + prefix},
		console: []string{"--redis", addr, "--prefix", prefix}}
}

func postgresBackend(t *testing.T) backend {
	dsn := need(t, "IDEM_POSTGRES_DSN")
	table := "consoletest_" + unique()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = db.Exec("DROP TABLE IF EXISTS " + table)
		_ = db.Close()
	})
	s, err := sqlstore.New(db, sqlstore.Options{Dialect: sqlstore.Postgres, Table: table, LeaseTTL: crashLease, MaxTakeOvers: maxTakeOvers})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	return backend{name: "postgres", store: s,
		child:   []string{"CONSOLETEST_STORE=postgres", "CONSOLETEST_ADDR=" + dsn, "CONSOLETEST_NAME=" + table},
		console: []string{"--postgres", dsn, "--table", table}}
}

// TestCrashChild is the crash test's other process: it runs Do on the
// key, says "working" inside the work and waits to be killed. It answers
// "quarantined" when the store refuses the key, "busy" when the last
// child's lease is still live. It does nothing in a normal run.
func TestCrashChild(t *testing.T) {
	kind := os.Getenv("CONSOLETEST_STORE")
	if kind == "" {
		return
	}
	addr, name, key := os.Getenv("CONSOLETEST_ADDR"), os.Getenv("CONSOLETEST_NAME"), os.Getenv("CONSOLETEST_KEY")
	var s idem.Store
	var err error
	switch kind {
	case "redis":
		s, err = idem.NewRedisStore(redis.NewClient(&redis.Options{Addr: addr}), idem.RedisOptions{Prefix: name, LeaseTTL: crashLease, MaxTakeOvers: maxTakeOvers})
	case "postgres":
		var db *sql.DB
		if db, err = sql.Open("pgx", addr); err == nil {
			s, err = sqlstore.New(db, sqlstore.Options{Dialect: sqlstore.Postgres, Table: name, LeaseTTL: crashLease, MaxTakeOvers: maxTakeOvers})
		}
	}
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	_, err = idem.Do(context.Background(), s, key, func(context.Context) (result, error) {
		fmt.Println("working")
		select {} // until SIGKILL
	})
	switch {
	case errors.Is(err, idem.ErrQuarantined):
		fmt.Println("quarantined")
	case errors.Is(err, idem.ErrInProgress):
		fmt.Println("busy")
	default:
		fmt.Println("error", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// crashUntilQuarantined runs crash children on key, each killed with
// SIGKILL in the middle of its work, until the store quarantines the key
// (after maxTakeOvers take-overs); it returns how many were killed.
func crashUntilQuarantined(t *testing.T, b backend, key string) int {
	t.Helper()
	killed := 0
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$")
		cmd.Env = append(append(os.Environ(), b.child...), "CONSOLETEST_KEY="+key)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		var said []string
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			said = append(said, line)
			if line == "working" {
				_ = cmd.Process.Signal(syscall.SIGKILL)
				killed++
				break
			}
		}
		_, _ = io.Copy(io.Discard, out)
		_ = cmd.Wait()
		switch last := strings.Join(said, "\n"); {
		case strings.Contains(last, "quarantined"):
			if killed != maxTakeOvers+1 {
				t.Fatalf("the key was quarantined after %d killed attempts; want %d (MaxTakeOvers %d + 1)", killed, maxTakeOvers+1, maxTakeOvers)
			}
			return killed
		case strings.Contains(last, "error"):
			t.Fatalf("crash child: %s", last)
		}
		time.Sleep(crashLease / 2) // a killed child's lease runs out; a busy answer waits for it
	}
	t.Fatalf("the key was not quarantined within a minute (%d children killed)", killed)
	return 0
}

// console runs idem console with args and returns its URL with the token.
func console(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(idemCommand(t), append([]string{"console", "--listen", "127.0.0.1:0", "--every", "500ms"}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		t.Logf("idem console's stderr:\n%s", stderr.String())
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("idem console printed no URL: %v (stderr %q)", err, stderr.String())
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	u := regexp.MustCompile(`http://\S+\?token=[0-9a-f]+`).FindString(line)
	if u == "" {
		t.Fatalf("idem console printed %q; want a URL with its token", line)
	}
	return u
}

// browser returns a chromedp context on a fresh headless Chromium.
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium(t)),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 860),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	actx, cancelA := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(cancelA)
	bctx, cancelB := chromedp.NewContext(actx)
	t.Cleanup(cancelB)
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("starting Chromium: %v", err)
	}
	return bctx
}

// do runs steps in the browser, failing t on an error.
func do(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatal(err)
	}
}

// get runs a in the browser and returns its value, failing t on an error.
func get[T any](t *testing.T, ctx context.Context, a chromedp.Action[T]) T {
	t.Helper()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// visible waits for the element of the CSS selector sel.
func visible(sel string) chromedp.Action[chromedp.Void] {
	return chromedp.WaitVisible(chromedp.CSS(sel))
}

// click clicks the element of the CSS selector sel.
func click(sel string) chromedp.Action[chromedp.Void] { return chromedp.Click(chromedp.CSS(sel)) }

// text returns the text of the element of the CSS selector sel.
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	return get(t, ctx, chromedp.Text(chromedp.CSS(sel)))
}

// secretFile writes a key hash secret for the console, and returns its
// path and a hasher with it: the test finds its key in the page by the
// same hash.
func secretFile(t *testing.T) (string, *idem.KeyHasher) {
	t.Helper()
	secret := []byte("consoletest-secret-" + unique() + unique())
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	h, err := idem.NewKeyHasher(secret)
	if err != nil {
		t.Fatal(err)
	}
	return p, h
}

// screenshot saves the page into docs/ when IDEM_CONSOLE_SCREENSHOTS=1.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if os.Getenv("IDEM_CONSOLE_SCREENSHOTS") != "1" {
		return
	}
	png := get(t, ctx, chromedp.FullScreenshot(100))
	_, file, _, _ := runtime.Caller(0)
	p := filepath.Join(filepath.Dir(file), "..", "..", "..", "docs", "console-"+name+".png")
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// state is what the refused requests must leave unchanged.
func state(t *testing.T, s idem.Store, key string) string {
	t.Helper()
	r, err := s.Lookup(context.Background(), key)
	if err != nil {
		return "lookup: " + err.Error()
	}
	return fmt.Sprintf("quarantined %v confirmed %v token %d take-overs %d", r.Quarantined, r.Confirmed, r.Token, r.TakeOvers)
}

// TestConsoleInBrowser: a key quarantined by real crashes on Redis and on
// Postgres is seen in the console, opened and settled with a confirm in
// Chromium, and the next Do replays the operator's result; a request
// without the token, a POST without the CSRF token and a cross-origin
// POST are refused, and none changes the key.
func TestConsoleInBrowser(t *testing.T) {
	for name, mk := range map[string]func(*testing.T) backend{"redis": redisBackend, "postgres": postgresBackend} {
		t.Run(name, func(t *testing.T) {
			b := mk(t)
			key := "order-" + unique()
			crashUntilQuarantined(t, b, key)
			secret, hasher := secretFile(t)
			u := console(t, append(b.console, "--key-hash-secret-file", secret)...)
			base := strings.SplitN(u, "?", 2)[0]
			ctx := browser(t)
			hash := "#" + hasher.Hash(key)

			// Open with the token: the list shows the key by its hash.
			do(t, ctx, chromedp.Navigate(u), visible("#quarantined"))
			list := text(t, ctx, "#quarantined")
			if loc := get(t, ctx, chromedp.Location()); strings.Contains(loc, "token") {
				t.Errorf("location after opening = %q; want the token gone from the URL", loc)
			}
			if !strings.Contains(list, hash) || strings.Contains(list, key) {
				t.Fatalf("the list shows %q; want the key by its hash %s only", list, hash)
			}
			screenshot(t, ctx, "list")

			// Open it: quarantined, with its take-overs.
			do(t, ctx, chromedp.Click(fmt.Sprintf(`//a[text()=%q]`, hash)), visible("#record"))
			rec := text(t, ctx, "#record")
			keyURL := get(t, ctx, chromedp.Location())
			csrf := get(t, ctx, chromedp.AttributeValue(chromedp.CSS(`input[name="csrf"]`), "value")).Value
			if !strings.Contains(rec, "quarantined") || !strings.Contains(rec, fmt.Sprintf("%d in a row", maxTakeOvers)) {
				t.Fatalf("the key's page shows %q; want quarantined after %d take-overs", rec, maxTakeOvers)
			}
			screenshot(t, ctx, "key")
			id := keyURL[strings.LastIndex(keyURL, "/")+1:]
			before := state(t, b.store, key)

			// Refused: no token; a POST without the CSRF token; a
			// cross-origin POST from a page on another origin.
			if resp, err := http.Get(base); err != nil || resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("GET %s without the token = %v, %v; want 401", base, resp.Status, err)
			} else {
				resp.Body.Close()
			}
			jar, _ := cookiejar.New(nil)
			hc := &http.Client{Jar: jar}
			if resp, err := hc.Get(u); err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("GET with the token = %v, %v", resp, err)
			} else {
				resp.Body.Close()
			}
			resp, err := hc.PostForm(base+"settle", url.Values{"id": {id}, "form": {"forget"}, "step": {"do"}})
			if err != nil || resp.StatusCode != http.StatusForbidden {
				t.Errorf("POST /settle without the CSRF token = %v, %v; want 403", resp.Status, err)
			} else {
				resp.Body.Close()
			}
			evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				fmt.Fprintf(w, `<!doctype html><form method="post" action="%ssettle"><input type="hidden" name="id" value="%s">`+
					`<input type="hidden" name="form" value="forget"><input type="hidden" name="step" value="do">`+
					`<input type="hidden" name="csrf" value="%s"><button id="go">win a prize</button></form>`, base, id, csrf)
			}))
			defer evil.Close()
			do(t, ctx, chromedp.Navigate(evil.URL), click("#go"), visible("#error"))
			refused := text(t, ctx, "#error")
			if !strings.Contains(refused, "cross-origin") {
				t.Errorf("the cross-origin POST's page says %q; want it refused as cross-origin", refused)
			}
			if after := state(t, b.store, key); after != before {
				t.Fatalf("after the refused requests the key is %q; was %q: a refused request changed state", after, before)
			}

			// Settle it with a confirm: the form, then the confirmation.
			form := "#settle-" + settle.form
			do(t, ctx, chromedp.Navigate(keyURL), visible(form),
				chromedp.SendKeys(chromedp.CSS(form+` [name="`+settle.field+`"]`), settle.input),
				click(form+" button"), visible("#confirm"))
			screenshot(t, ctx, "confirm")
			do(t, ctx, click("#confirm button"), visible("#done"))
			done := text(t, ctx, "#done")
			if !strings.Contains(done, "recorded as done") {
				t.Errorf("after the settle the page says %q; want it recorded as done", done)
			}

			// The next Do replays the operator's result.
			v, err := idem.Do(context.Background(), b.store, key, func(context.Context) (result, error) {
				t.Error("Do ran the work of a key the operator settled as done")
				return result{}, nil
			})
			if err != nil || fmt.Sprintf(`{"n":%d}`, v.N) != settle.want {
				t.Errorf("Do after the settle = %+v, %v; want %s replayed", v, err, settle.want)
			}

			// The live view counts on the store and draws its chart.
			do(t, ctx, chromedp.Navigate(base+"live"), visible("#latest"))
			live := text(t, ctx, "#latest")
			if !strings.Contains(live, "round-trip time") {
				t.Errorf("the live view shows %q; want its figures", live)
			}
			if b.name == "redis" {
				screenshot(t, ctx, "live")
			}
		})
	}
}

// TestDemoPoisonSettledInBrowser: idem demo --poison 3 on a real Redis
// leaves three quarantined poison messages; one is settled in the browser
// as done (a consumer's plain result, empty), and its next delivery
// through consumer.Idempotent is a duplicate: the handler does not run.
func TestDemoPoisonSettledInBrowser(t *testing.T) {
	addr := need(t, "IDEM_REDIS_ADDR")
	prefix := "consoletest:demo:" + unique() + ":"
	out, err := exec.Command(idemCommand(t), "demo", "--redis", addr, "--prefix", prefix, "--messages", "60", "--workers", "4",
		"--poison", "3", "--lease", "500ms").CombinedOutput()
	if err != nil {
		t.Fatalf("idem demo --poison 3: %v\n%s", err, out)
	}
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	s, err := idem.NewRedisStore(c, idem.RedisOptions{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	recs, err := s.Quarantined(context.Background(), 0)
	if err != nil || len(recs) != 3 {
		t.Fatalf("after the demo Quarantined = %d records, %v; want the 3 poison messages\n%s", len(recs), err, out)
	}
	key := recs[0].Key
	secret, hasher := secretFile(t)
	u := console(t, "--redis", addr, "--prefix", prefix, "--key-hash-secret-file", secret)
	ctx := browser(t)
	do(t, ctx, chromedp.Navigate(u), visible("#quarantined"),
		chromedp.Click(fmt.Sprintf(`//a[text()=%q]`, "#"+hasher.Hash(key))),
		visible("#settle-bytes"), click("#settle-bytes button"),
		visible("#confirm"), click("#confirm button"), visible("#done"))
	if done := text(t, ctx, "#done"); !strings.Contains(done, "recorded as done") {
		t.Errorf("after the settle the page says %q; want it recorded as done", done)
	}
	ran := false
	deliver := consumer.Idempotent(s, func(k string) string { return k }, func(context.Context, string) error {
		ran = true
		return nil
	})
	if err := deliver(context.Background(), key); err != nil || ran {
		t.Errorf("the next delivery of the settled poison message = %v, handler ran %v; want a duplicate, not run", err, ran)
	}
	if n, _ := s.Quarantined(context.Background(), 0); len(n) != 2 {
		t.Errorf("after one settle %d keys are quarantined; want 2", len(n))
	}
}
