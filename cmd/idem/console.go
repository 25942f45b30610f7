package main

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/httprecord"
)

const consoleAbout = `Serves an operator's console for a store, in a browser: the quarantined
keys (each with its last attempt, its take-overs, its checkpoint and the
front door that wrote it), one key's record as idem inspect shows it,
settling a quarantined key (forget it, or confirm it with a result in the
form its front door replays: a Do value as JSON, an HTTP response, plain
bytes), and a live view of what the store can say cheaply (quarantined
keys, live claims that are take-overs, the round-trip time), sampled every
--every into a chart of the last --window.

Safe by default: it listens on 127.0.0.1 unless --listen says otherwise; it
prints at start a URL holding a random access token (the page then keeps
it in a cookie, not in the URL), or, with --token-file, takes its tokens
from a file of name:token lines (one per operator, each of at least 16
characters), so that every settle is logged with who made it. Every request
needs a token; every change is a POST carrying a CSRF token, and a
cross-origin POST is refused. Keys, checkpoints and results are shown by
their keyed hash (idem.KeyHasher: the secret of --key-hash-secret-file,
the one the service's KeyHasher uses, so that hashes match its logs;
otherwise a random one per start) unless --reveal: they may carry personal
data. --read-only shows everything and settles nothing. Each settle is a
line on stderr: who, what, and the key's hash.

The live counts cost the store little: on Redis a SCAN of at most --scan
keys (per master; the page says when the keyspace holds more), on SQL a
COUNT per figure over the expires_at index.`

// The console's defaults.
const (
	consoleListen = "127.0.0.1:8089"
	// consoleMaxKey bounds a key typed into the console: the stores'
	// default MaxKeyBytes.
	consoleMaxKey = 1024
	// consoleMinToken is the shortest token --token-file accepts.
	consoleMinToken = 16
)

//go:embed consoleweb
var consoleWeb embed.FS

func (c *cli) console(args []string) int {
	fs := flag.NewFlagSet("console", flag.ContinueOnError)
	var sf storeFlags
	sf.register(fs, c.getenv, kindsAll)
	listen := fs.String("listen", consoleListen, "the `HOST:PORT` to listen on (another host than loopback exposes the console: put TLS in front)")
	tokenFile := fs.String("token-file", "", "read the access tokens from `FILE`: name:token lines (default: one random token, printed)")
	secretFile := fs.String("key-hash-secret-file", "", "hash keys with the secret in `FILE` (the service's KeyHasher secret, a final line end dropped; default: random per start)")
	reveal := fs.Bool("reveal", false, "show keys, checkpoints and results as they are instead of their hash")
	readOnly := fs.Bool("read-only", false, "show, never settle")
	limit := fs.Int("limit", 200, "list at most `N` quarantined keys")
	every := fs.Duration("every", 5*time.Second, "sample the live view every `D`")
	window := fs.Duration("window", 15*time.Minute, "keep `D` of samples for the chart")
	scan := fs.Int("scan", 20000, "on Redis, count in at most `N` keys per master per sample")
	pos, done, st := c.parse(fs, args, "[store flags] [--listen HOST:PORT] [--token-file FILE] [--reveal] [--read-only]", consoleAbout+"\n\n"+envHelp(kindsAll))
	if done {
		return st
	}
	if len(pos) > 0 {
		return c.noArgs("console", pos)
	}
	switch {
	case *limit <= 0:
		return c.usageError("console", fmt.Errorf("--limit %d: give a positive number", *limit))
	case *every < 100*time.Millisecond:
		return c.usageError("console", fmt.Errorf("--every %v: give at least 100ms", *every))
	case *window < 2**every:
		return c.usageError("console", fmt.Errorf("--window %v: give at least two samples' worth (2 × --every)", *window))
	case *scan <= 0:
		return c.usageError("console", fmt.Errorf("--scan %d: give a positive number", *scan))
	}
	tokens := map[string]string{}
	var printed string
	if *tokenFile != "" {
		var err error
		if tokens, err = readTokenFile(*tokenFile); err != nil {
			return c.usageError("console", err)
		}
	} else {
		var b [24]byte
		_, _ = rand.Read(b[:])
		printed = hex.EncodeToString(b[:])
		tokens[printed] = "operator"
	}
	hasher := (*idem.KeyHasher)(nil)
	if *secretFile != "" {
		secret, err := os.ReadFile(*secretFile)
		if err != nil {
			return c.usageError("console", fmt.Errorf("--key-hash-secret-file: %w", err))
		}
		// The line end an editor or echo adds is not part of the secret
		// the service was given.
		secret = bytes.TrimSuffix(bytes.TrimSuffix(secret, []byte("\n")), []byte("\r"))
		if hasher, err = idem.NewKeyHasher(secret); err != nil {
			return c.usageError("console", fmt.Errorf("--key-hash-secret-file: %w", err))
		}
	}
	if err := c.chooseStore("console", fs, &sf); err != nil {
		return c.usageError("console", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	b, err := sf.open(ctx, false, true)
	if err != nil {
		return c.fail("console", exitUsage, err)
	}
	defer b.close()
	b.allowEviction = true // it reads, and settles what a worker would
	s, err := b.store(idem.Options{})
	if err != nil {
		return c.usageError("console", err)
	}
	var counter liveCounter
	if b.isSQL() {
		counter = newSQLCounter(b.db, b.dialect, b.table)
	} else {
		counter = &redisCounter{c: b.redis, prefix: or(b.prefix, idem.DefaultPrefix), max: *scan}
	}
	con, err := newConsole(consoleConfig{
		Store: s, Desc: b.desc, Tokens: tokens, Hasher: hasher, Reveal: *reveal, ReadOnly: *readOnly,
		Limit: *limit, Live: newLiveView(counter, *every, *window), Log: c.stderr,
	})
	if err != nil {
		return c.usageError("console", err)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return c.usageError("console", fmt.Errorf("--listen: %w", err))
	}
	go con.cfg.Live.run(ctx)
	srv := &http.Server{Handler: con, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second}
	base := "http://" + ln.Addr().String() + "/"
	mode := ""
	if *readOnly {
		mode = ", read-only"
	}
	if printed != "" {
		fmt.Fprintf(c.stdout, "idem console for %s%s: open %s?token=%s\n", b.desc, mode, base, printed)
	} else {
		fmt.Fprintf(c.stdout, "idem console for %s%s on %s (%d tokens from %s: open %s?token=YOUR-TOKEN)\n", b.desc, mode, base, len(tokens), *tokenFile, base)
	}
	if err := serveUntil(ctx, srv, ln); err != nil {
		return c.fail("console", exitFailed, err)
	}
	return exitOK
}

// readTokenFile reads name:token lines (blank lines and # comments
// skipped) into a map from token to name.
func readTokenFile(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--token-file: %w", err)
	}
	tokens := map[string]string{}
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, tok, ok := strings.Cut(line, ":")
		name, tok = strings.TrimSpace(name), strings.TrimSpace(tok)
		switch {
		case !ok || name == "":
			return nil, fmt.Errorf("--token-file %s line %d: want name:token", path, i+1)
		case len(tok) < consoleMinToken:
			return nil, fmt.Errorf("--token-file %s line %d: the token of %q has %d characters; give at least %d", path, i+1, name, len(tok), consoleMinToken)
		case tokens[tok] != "":
			return nil, fmt.Errorf("--token-file %s line %d: %q has the token of %q; give each its own", path, i+1, name, tokens[tok])
		}
		tokens[tok] = name
	}
	if len(tokens) == 0 {
		return nil, fmt.Errorf("--token-file %s: no name:token line", path)
	}
	return tokens, nil
}

// consoleConfig is what a console serves and how.
type consoleConfig struct {
	Store  idem.Store // a Resolver too, to list and settle
	Desc   string     // the store, for the pages and the log
	Tokens map[string]string
	Hasher *idem.KeyHasher // nil: the process's random secret
	Reveal bool
	// ReadOnly refuses every settle.
	ReadOnly bool
	Limit    int       // the most quarantined keys a list shows
	Live     *liveView // sampled by the caller (run); nil: no live view
	Log      io.Writer // one line per settle
}

// console is the console's http.Handler.
type console struct {
	cfg      consoleConfig
	res      idem.Resolver
	sessions map[string]string // session id (the cookie) → name
	cookie   string            // the cookie's name, this console's own
	secret   [32]byte          // CSRF tokens and sessions
	aead     cipher.AEAD       // seals keys into the URLs' ids
	pages    map[string]*template.Template
	mux      *http.ServeMux
	origin   *http.CrossOriginProtection
}

func newConsole(cfg consoleConfig) (*console, error) {
	res, ok := cfg.Store.(idem.Resolver)
	if !ok {
		return nil, fmt.Errorf("the store of %s (%T) cannot list or settle quarantined keys", cfg.Desc, cfg.Store)
	}
	if len(cfg.Tokens) == 0 {
		return nil, errors.New("no access token")
	}
	con := &console{cfg: cfg, res: res, sessions: map[string]string{}, pages: map[string]*template.Template{},
		origin: http.NewCrossOriginProtection()}
	_, _ = rand.Read(con.secret[:])
	for tok, name := range cfg.Tokens {
		con.sessions[con.mac("session", tok)] = name
	}
	// The cookie's name is this console's own: cookies ignore the port,
	// and two consoles on one host must not take each other's session.
	con.cookie = "idem_console_" + con.mac("cookie", "")[:8]
	block, err := aes.NewCipher(con.secret[:])
	if err != nil {
		return nil, err
	}
	if con.aead, err = cipher.NewGCM(block); err != nil {
		return nil, err
	}
	funcs := template.FuncMap{
		"when": formatWhen,
		"ago": func(t time.Time) string {
			d := time.Until(t).Round(time.Second)
			if d <= 0 {
				return (-d).String() + " ago"
			}
			return "in " + d.String()
		},
		"ms": func(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 2, 64) },
	}
	for _, p := range []string{"list", "key", "confirm", "done", "live", "error"} {
		t, err := template.New("").Funcs(funcs).ParseFS(consoleWeb, "consoleweb/base.html", "consoleweb/"+p+".html")
		if err != nil {
			return nil, err
		}
		con.pages[p] = t
	}
	static, _ := fs.Sub(consoleWeb, "consoleweb")
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", con.list)
	mux.HandleFunc("GET /key/{id}", con.key)
	mux.HandleFunc("POST /lookup", con.lookup)
	mux.HandleFunc("POST /settle", con.settle)
	mux.HandleFunc("GET /live", con.live)
	mux.HandleFunc("GET /live.json", con.liveJSON)
	mux.Handle("GET /style.css", http.FileServerFS(static))
	con.mux = mux
	return con, nil
}

// formatWhen writes a time as the pages show it: UTC, to the millisecond.
func formatWhen(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

// mac is the hex HMAC of v under the console's secret, for purpose.
func (con *console) mac(purpose, v string) string {
	m := hmac.New(sha256.New, con.secret[:])
	m.Write([]byte(purpose))
	m.Write([]byte{0})
	m.Write([]byte(v))
	return hex.EncodeToString(m.Sum(nil))
}

// ServeHTTP sets the security headers, admits only requests with a token
// (moving one given in the URL into the cookie), refuses a cross-origin
// POST or one without the session's CSRF token, and serves the page.
func (con *console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	if r.URL.Path == "/style.css" && r.Method == http.MethodGet {
		// The style sheet holds nothing of the store's: the refusal
		// pages of a request without a token use it too.
		con.mux.ServeHTTP(w, r)
		return
	}
	if tok := r.URL.Query().Get("token"); tok != "" {
		sess := con.mac("session", tok)
		if _, ok := con.sessions[sess]; !ok || r.Method != http.MethodGet {
			con.refuse(w, r, http.StatusUnauthorized, "This access token is not one of the console's: open the URL idem console printed at start.")
			return
		}
		http.SetCookie(w, &http.Cookie{Name: con.cookie, Value: sess, Path: "/", HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
		q := r.URL.Query()
		q.Del("token")
		u := url.URL{Path: r.URL.Path, RawQuery: q.Encode()}
		http.Redirect(w, r, u.String(), http.StatusSeeOther)
		return
	}
	sess, name := con.session(r)
	if name == "" {
		con.refuse(w, r, http.StatusUnauthorized, "This console needs its access token: open the URL idem console printed at start (or send Authorization: Bearer TOKEN).")
		return
	}
	if r.Method == http.MethodPost {
		if err := con.origin.Check(r); err != nil {
			con.refuse(w, r, http.StatusForbidden, "A cross-origin request is refused: settle from the console's own pages.")
			return
		}
		if got := r.PostFormValue("csrf"); subtle.ConstantTimeCompare([]byte(got), []byte(con.csrf(sess))) != 1 {
			con.refuse(w, r, http.StatusForbidden, "This form's CSRF token is missing or stale: reload the page and try again.")
			return
		}
	}
	r = r.WithContext(context.WithValue(r.Context(), whoKey{}, session{id: sess, name: name}))
	con.mux.ServeHTTP(w, r)
}

type whoKey struct{}

// session is who made a request: the session id (the cookie, or the
// token's HMAC) and the token's name.
type session struct{ id, name string }

// session returns the request's session id and the name of its token; ""
// for none.
func (con *console) session(r *http.Request) (id, name string) {
	if c, err := r.Cookie(con.cookie); err == nil {
		if n := con.sessions[c.Value]; n != "" {
			return c.Value, n
		}
	}
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		id = con.mac("session", strings.TrimSpace(tok))
		if n := con.sessions[id]; n != "" {
			return id, n
		}
	}
	return "", ""
}

func (con *console) csrf(sess string) string { return con.mac("csrf", sess)[:32] }

// refuse answers a request the console will not serve, with a page that
// says why.
func (con *console) refuse(w http.ResponseWriter, r *http.Request, status int, why string) {
	con.render(w, r, status, "error", "Refused", errorPage{Message: why})
}

// errorPage is the error page's content.
type errorPage struct {
	Message string
	Back    string // a link back; "" for the list
}

// page is what every page's template gets.
type page struct {
	Title    string
	Store    string
	Who      string
	CSRF     string
	ReadOnly bool
	Reveal   bool
	Refresh  int // seconds; 0: none
	Body     any
}

func (con *console) render(w http.ResponseWriter, r *http.Request, status int, name, title string, body any) {
	p := page{Title: title, Store: con.cfg.Desc, ReadOnly: con.cfg.ReadOnly, Reveal: con.cfg.Reveal, Body: body}
	if s, ok := r.Context().Value(whoKey{}).(session); ok {
		p.Who, p.CSRF = s.name, con.csrf(s.id)
	}
	if name == "live" && con.cfg.Live != nil {
		p.Refresh = max(int(con.cfg.Live.every/time.Second), 1)
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if err := con.pages[name].ExecuteTemplate(w, "base", p); err != nil {
		fmt.Fprintf(con.cfg.Log, "idem console: rendering %s: %v\n", name, err)
	}
}

func (con *console) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	con.render(w, r, status, "error", "Error", errorPage{Message: msg})
}

// keyID seals key into the id that names it in the console's URLs: the
// URL (and the browser's history) never holds the key itself.
func (con *console) keyID(key string) string {
	nonce := make([]byte, con.aead.NonceSize())
	_, _ = rand.Read(nonce)
	return base64.RawURLEncoding.EncodeToString(con.aead.Seal(nonce, nonce, []byte(key), nil))
}

// idKey opens an id keyID made.
func (con *console) idKey(id string) (string, bool) {
	b, err := base64.RawURLEncoding.DecodeString(id)
	if err != nil || len(b) < con.aead.NonceSize() {
		return "", false
	}
	n := con.aead.NonceSize()
	k, err := con.aead.Open(nil, b[:n], b[n:], nil)
	return string(k), err == nil
}

// show is how the console writes a key, a checkpoint or a result: as it is
// with --reveal, else by its keyed hash.
func (con *console) show(v []byte) string {
	if con.cfg.Reveal {
		if isText(v) {
			return strconv.Quote(string(v))
		}
		return "0x" + hex.EncodeToString(v)
	}
	return "#" + con.cfg.Hasher.Hash(string(v))
}

func (con *console) keyName(k string) string {
	if con.cfg.Reveal {
		return quoteKey(k)
	}
	return "#" + con.cfg.Hasher.Hash(k)
}

// keyRow is a quarantined key in the list.
type keyRow struct {
	ID, Name, FrontDoor string
	Owner               string
	Token               int64
	TakeOvers           int
	// Prior is the attempt before the last ("owner, claimed at"; "-"
	// for none), Expires the quarantine's end: formatted here, as a
	// template's function calls cost a list of 1,000 keys a third of its
	// time.
	Prior      string
	Checkpoint string // its size and first bytes (or hash)
	Expires    string
}

// listPage is the list's content.
type listPage struct {
	Rows     []keyRow
	More     bool // the store holds more than Limit
	Limit    int
	Err      string
	Latest   *liveSample
	LiveHow  string
	Forms    []pageForm
	Duration time.Duration
}

func (con *console) list(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(r.Context(), 20*time.Second)
	defer cancel()
	lp := listPage{Limit: con.cfg.Limit}
	recs, err := con.res.Quarantined(ctx, con.cfg.Limit+1)
	if err != nil {
		lp.Err = oneLine(err.Error())
	}
	// The newest last attempt first: what crashed last is what the person
	// on call came for.
	slices.SortFunc(recs, func(a, b *idem.Record) int { return compareInt64(b.Token, a.Token) })
	if len(recs) > con.cfg.Limit {
		recs, lp.More = recs[:con.cfg.Limit], true
	}
	lp.Rows = make([]keyRow, 0, len(recs))
	for _, rec := range recs {
		prior := "-"
		if in := newInspection(rec); in.Prior != nil {
			prior = or(in.Prior.Owner, "-") + ", " + formatWhen(in.Prior.Claimed)
		}
		lp.Rows = append(lp.Rows, keyRow{ID: con.keyID(rec.Key), Name: con.keyName(rec.Key), FrontDoor: frontDoor(rec),
			Owner: or(rec.Owner, "-"), Token: rec.Token, TakeOvers: rec.TakeOvers, Prior: prior,
			Checkpoint: con.checkpoint(rec.Checkpoint), Expires: formatWhen(rec.Expires)})
	}
	if con.cfg.Live != nil {
		if ss := con.cfg.Live.samples(); len(ss) > 0 {
			lp.Latest = &ss[len(ss)-1]
		}
		lp.LiveHow = con.cfg.Live.counter.how()
	}
	lp.Duration = time.Since(start).Round(100 * time.Microsecond)
	con.render(w, r, http.StatusOK, "list", "Quarantined keys", lp)
}

func compareInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// checkpoint says a checkpoint's size and its first bytes (with --reveal)
// or its hash.
func (con *console) checkpoint(cp []byte) string {
	if cp == nil {
		return "none"
	}
	if !con.cfg.Reveal {
		return fmt.Sprintf("%d bytes, %s", len(cp), con.show(cp))
	}
	head := cp
	if len(head) > 48 {
		head = head[:48]
	}
	s := fmt.Sprintf("%d bytes: %s", len(cp), con.show(head))
	if len(head) < len(cp) {
		s += "…"
	}
	return s
}

// keyPage is a key's page: what idem inspect shows, and the settle forms.
type keyPage struct {
	ID, Name  string
	In        inspection
	FrontDoor string
	Record    bool // false: no live record
	// The recorded answer: Response for an HTTP response, Value for a Do
	// value (or its hash), Result for other bytes.
	Response   *shownResponse
	Value      string
	DoError    bool
	Result     string
	Checkpoint string
	Forms      []pageForm
	CanSettle  bool
	CanClear   bool
	Clear      pageForm
}

// shownResponse is a recorded HTTP response as the key page shows it.
type shownResponse struct {
	Status     int
	StatusText string
	Header     []string // "Name: value" lines, values hashed unless --reveal
	Body       string
	Omitted    bool
}

func (con *console) key(w http.ResponseWriter, r *http.Request) {
	key, ok := con.idKey(r.PathValue("id"))
	if !ok {
		con.fail(w, r, http.StatusNotFound, "Unknown key: this link is not one of this console's (a console's links last as long as it runs).")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	kp := keyPage{ID: r.PathValue("id"), Name: con.keyName(key), Forms: pageForms}
	rec, err := lookupAny(ctx, con.cfg.Store, []string{key}) // a lapsed attempt too
	switch {
	case errors.Is(err, idem.ErrNotFound):
		kp.In = inspection{Key: key, State: "none"}
	case errors.Is(err, idem.ErrDamaged):
		// No front door can read it: the way out is to clear it.
		kp.Record, kp.In = true, inspection{Key: key, State: "damaged", Error: oneLine(err.Error())}
		kp.CanClear = !con.cfg.ReadOnly
	case err != nil:
		con.fail(w, r, http.StatusBadGateway, fmt.Sprintf("Reading %s from %s: %s", kp.Name, con.cfg.Desc, oneLine(err.Error())))
		return
	default:
		kp.Record, kp.In, kp.FrontDoor = true, newInspection(rec), frontDoor(rec)
		kp.CanSettle = rec.Quarantined && !con.cfg.ReadOnly
		// Force clears any record but a live claim (Resolution.Force).
		kp.CanClear = !con.cfg.ReadOnly && (rec.Confirmed || rec.Quarantined || rec.Lapsed != nil)
		kp.Checkpoint = con.checkpoint(rec.Checkpoint)
		if rec.Confirmed {
			con.answer(&kp, rec)
		}
	}
	kp.Clear = clearForm
	con.render(w, r, http.StatusOK, "key", "Key "+kp.Name, kp)
}

// answer fills kp's recorded answer from a confirmed rec, in its front
// door's form.
func (con *console) answer(kp *keyPage, rec *idem.Record) {
	if resp, err := httprecord.Decode(rec.Result); err == nil && kp.FrontDoor == doorHTTP {
		rr := newRecordedResponse(resp)
		sr := &shownResponse{Status: rr.Status, StatusText: http.StatusText(rr.Status), Omitted: rr.BodyOmitted, Body: con.show(resp.Body)}
		for _, k := range slices.Sorted(func(yield func(string) bool) {
			for k := range rr.Header {
				if !yield(k) {
					return
				}
			}
		}) {
			for _, v := range rr.Header[k] {
				sr.Header = append(sr.Header, k+": "+con.show([]byte(v)))
			}
		}
		kp.Response = sr
		return
	}
	if kp.FrontDoor == doorDo {
		v := rec.Result
		if !rec.Resolved { // Do's own record: a tag byte, then the JSON
			v, kp.DoError = rec.Result[1:], rec.Result[0] == 'e'
		}
		if con.cfg.Reveal {
			kp.Value = string(v)
		} else {
			kp.Value = fmt.Sprintf("%d bytes of JSON, %s", len(v), con.show(v))
		}
		return
	}
	kp.Result = fmt.Sprintf("%d bytes, %s", len(rec.Result), con.show(rec.Result))
}

func (con *console) lookup(w http.ResponseWriter, r *http.Request) {
	key := r.PostFormValue("key")
	if r.PostFormValue("hex") != "" {
		b, err := hex.DecodeString(strings.TrimSpace(key))
		if err != nil {
			con.fail(w, r, http.StatusBadRequest, "The key is not hex: "+err.Error())
			return
		}
		key = string(b)
	}
	switch {
	case key == "":
		con.fail(w, r, http.StatusBadRequest, "Give a key to look up.")
		return
	case len(key) > consoleMaxKey:
		con.fail(w, r, http.StatusBadRequest, fmt.Sprintf("The key has %d bytes: a store's keys have at most %d.", len(key), consoleMaxKey))
		return
	}
	http.Redirect(w, r, "/key/"+con.keyID(key), http.StatusSeeOther)
}

// confirmPage asks the operator to confirm a settle.
type confirmPage struct {
	ID, Name, Form, Label, Help string
	Input                       pageInput
	Bytes                       int
	Confirm                     bool
}

// donePage says what a settle did.
type donePage struct {
	ID, Name, What string
}

func (con *console) settle(w http.ResponseWriter, r *http.Request) {
	if con.cfg.ReadOnly {
		con.fail(w, r, http.StatusForbidden, "This console is read-only (--read-only): it settles nothing.")
		return
	}
	id := r.PostFormValue("id")
	key, ok := con.idKey(id)
	if !ok {
		con.fail(w, r, http.StatusBadRequest, "Unknown key: this form is not one of this console's (reload the key's page).")
		return
	}
	name := con.keyName(key)
	form := r.PostFormValue("form")
	in := pageInput{JSON: r.PostFormValue("json"), Status: r.PostFormValue("status"), Header: r.PostFormValue("header"),
		Body: r.PostFormValue("body"), Type: r.PostFormValue("type"), Text: r.PostFormValue("text"), Hex: r.PostFormValue("hex")}
	res, err := pageResolution(key, form, in)
	if err != nil {
		con.render(w, r, http.StatusBadRequest, "error", "Not settled", errorPage{Message: "Nothing was written: " + strings.TrimPrefix(err.Error(), errBadSettle.Error()+": ") + ".", Back: "/key/" + id})
		return
	}
	var sf pageForm
	for _, f := range append(pageForms, clearForm) {
		if f.Name == form {
			sf = f
		}
	}
	if r.PostFormValue("step") != "do" {
		con.render(w, r, http.StatusOK, "confirm", "Settle "+name+"?", confirmPage{ID: id, Name: name, Form: form,
			Label: sf.Label, Help: sf.Help, Input: in, Bytes: len(res.Result), Confirm: res.Confirm})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	who := r.Context().Value(whoKey{}).(session).name
	if err := con.res.Resolve(ctx, key, res); err != nil {
		if errors.Is(err, idem.ErrNotFound) {
			con.render(w, r, http.StatusConflict, "error", "Not settled", errorPage{Message: fmt.Sprintf("Key %s is not quarantined (settled already, or never was): left as it is.", name), Back: "/key/" + id})
			return
		}
		fmt.Fprintf(con.cfg.Log, "idem console: settle by %s: %s of key %s in %s failed: %s\n", who, form, name, con.cfg.Desc, oneLine(err.Error()))
		con.fail(w, r, http.StatusBadGateway, "Settling failed: "+oneLine(err.Error()))
		return
	}
	what := fmt.Sprintf("forgotten: the next delivery or call of key %s runs the work as new", name)
	if res.Confirm {
		what = fmt.Sprintf("recorded as done (%s, %d bytes): every duplicate of key %s is answered with it", sf.Label, len(res.Result), name)
	}
	fmt.Fprintf(con.cfg.Log, "idem console: settle by %s: %s of key %s (%d bytes of result) in %s\n", who, form, name, len(res.Result), con.cfg.Desc)
	con.render(w, r, http.StatusOK, "done", "Settled", donePage{ID: id, Name: name, What: what})
}

// livePage is the live view's content.
type livePage struct {
	Latest  *liveSample
	How     string
	Every   time.Duration
	Counts  chart
	RTT     chart
	Samples int
}

func (con *console) live(w http.ResponseWriter, r *http.Request) {
	if con.cfg.Live == nil {
		con.fail(w, r, http.StatusNotFound, "This console samples nothing.")
		return
	}
	ss := con.cfg.Live.samples()
	lp := livePage{How: con.cfg.Live.counter.how(), Every: con.cfg.Live.every, Samples: len(ss)}
	if len(ss) > 0 {
		lp.Latest = &ss[len(ss)-1]
	}
	lp.Counts = newChart(ss, []series{
		{"quarantined keys", "q", func(s liveSample) float64 { return float64(s.Quarantined) }},
		{"live claims that are take-overs", "t", func(s liveSample) float64 { return float64(s.TakeOvers) }},
	}, "")
	lp.RTT = newChart(ss, []series{{"round-trip time (ms)", "r", func(s liveSample) float64 { return float64(s.RTT) / 1e6 }}}, " ms")
	con.render(w, r, http.StatusOK, "live", "Live", lp)
}

func (con *console) liveJSON(w http.ResponseWriter, r *http.Request) {
	if con.cfg.Live == nil {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(struct {
		How     string       `json:"how"`
		Samples []liveSample `json:"samples"`
	}{con.cfg.Live.counter.how(), con.cfg.Live.samples()})
}

// series is one line of a chart.
type series struct {
	Name, Class string
	value       func(liveSample) float64
}

// chart is an SVG line chart drawn on the server: no script draws it.
type chart struct {
	W, H       int
	Lines      []chartLine
	Max        string // the top of the scale
	From, To   time.Time
	Empty      bool
	Failed     int // samples that failed: gaps in the lines
	ScaleLines []int
}

// chartLine is one series' polyline.
type chartLine struct {
	Name, Class, Points, Last string
}

func newChart(ss []liveSample, lines []series, unit string) chart {
	c := chart{W: 720, H: 160, Empty: len(ss) == 0, ScaleLines: []int{0, 40, 80, 120}}
	if len(ss) == 0 {
		return c
	}
	c.From, c.To = ss[0].At, ss[len(ss)-1].At
	top := 1.0
	for _, s := range ss {
		if s.Err != "" {
			c.Failed++
			continue
		}
		for _, l := range lines {
			top = max(top, l.value(s))
		}
	}
	span := c.To.Sub(c.From).Seconds()
	for _, l := range lines {
		var b strings.Builder
		last := "-"
		for _, s := range ss {
			if s.Err != "" {
				continue
			}
			x := float64(c.W)
			if span > 0 {
				x = s.At.Sub(c.From).Seconds() / span * float64(c.W)
			}
			y := float64(c.H) - l.value(s)/top*float64(c.H-4) - 2
			fmt.Fprintf(&b, "%.1f,%.1f ", x, y)
			last = strconv.FormatFloat(l.value(s), 'f', -1, 64)
			if unit != "" {
				last = strconv.FormatFloat(l.value(s), 'f', 2, 64) + unit
			}
		}
		c.Lines = append(c.Lines, chartLine{Name: l.Name, Class: l.Class, Points: b.String(), Last: last})
	}
	c.Max = strconv.FormatFloat(top, 'f', -1, 64) + unit
	if unit != "" {
		c.Max = strconv.FormatFloat(top, 'f', 2, 64) + unit
	}
	return c
}
