package main

// The console's http.Handler: built from its config, the checks every
// request passes before a page (token, session cookie, origin, CSRF), the
// ids that seal keys out of the URLs, how a key or a value is shown (its
// keyed hash unless --reveal), and the rendering every page goes through.

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/idemgo/idem"
)

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
