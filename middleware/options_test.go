package middleware

import (
	"context"
	"database/sql"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testing/obstest"
	"github.com/idemgo/idem/sqlstore"
)

// Each mistake in Options is refused by New with an error that names the
// field at fault first, then the value given, so that the user knows what
// to change without reading the source. A case holds one mistake: if its
// check is removed, New accepts it or blames another field, and the case
// fails.
func TestNewRefuses(t *testing.T) {
	st := newCounting()
	scope := func(*http.Request) (string, error) { return "t", nil }
	mib := memStore(idem.Options{MaxResultBytes: 1 << 20})
	key := func(*http.Request) (string, error) { return "k", nil }
	for _, tc := range []struct {
		name  string
		o     Options
		field string   // the message starts "middleware: <field>: "
		want  []string // what else it says: the value given, ...
	}{
		{"no store", Options{}, "Store", []string{"Store: nil while Tx is nil too", "lease mode", "Tx", "transactional mode"}},
		{"both stores", Options{SingleTenant: true, Store: st, Tx: &txStub{}}, "Tx", []string{"Tx: *middleware.txStub while Store is set too", "lease mode", "transactional mode"}},
		{"typed-nil store", Options{SingleTenant: true, Store: (*idem.RedisStore)(nil)}, "Store", []string{"(*idem.RedisStore)(nil)"}},
		{"typed-nil store, tx set", Options{SingleTenant: true, Store: (*idem.MemoryStore)(nil), Tx: &txStub{}}, "Store", []string{"(*idem.MemoryStore)(nil)"}},
		{"typed-nil tx", Options{SingleTenant: true, Tx: (*sqlstore.Store)(nil)}, "Tx", []string{"(*sqlstore.Store)(nil)"}},
		{"typed-nil tx, store set", Options{SingleTenant: true, Store: st, Tx: (*txStub)(nil)}, "Tx", []string{"(*middleware.txStub)(nil)"}},
		{"typed-nil observer", Options{SingleTenant: true, Store: st, Observer: (*obstest.Log)(nil)}, "Observer", []string{"(*obstest.Log)(nil)"}},

		{"bad header", Options{SingleTenant: true, Store: st, Header: "Idempotency Key"}, "Header", []string{`"Idempotency Key"`}},
		{"header with key", Options{SingleTenant: true, Store: st, Header: "X-Key", Key: key}, "Header", []string{`"X-Key"`, "never read"}},
		{"no scope", Options{Store: st}, "Scope", []string{"nil", "SingleTenant", "authenticated principal", "one tenant"}},
		{"no scope, tx", Options{Tx: &txStub{}}, "Scope", []string{"SingleTenant"}},
		{"scope and single tenant", Options{Store: st, Scope: scope, SingleTenant: true}, "SingleTenant", []string{"Scope"}},
		{"request id not a token", Options{SingleTenant: true, Store: st, RequestIDHeader: "X-Request Id"}, "RequestIDHeader", []string{`"X-Request Id"`}},
		{"request id is the key's", Options{SingleTenant: true, Store: st, RequestIDHeader: "idempotency-key"}, "RequestIDHeader", []string{`"idempotency-key"`, "idempotency key"}},
		{"request id is the key's header", Options{SingleTenant: true, Store: st, Header: "X-Key", RequestIDHeader: "x-key"}, "RequestIDHeader", []string{`"x-key"`}},
		{"request id is credentials", Options{SingleTenant: true, Store: st, RequestIDHeader: "Authorization"}, "RequestIDHeader", []string{`"Authorization"`, "credentials"}},
		{"request id is a cookie", Options{SingleTenant: true, Store: st, RequestIDHeader: "cookie"}, "RequestIDHeader", []string{`"cookie"`, "credentials"}},

		{"negative lock", Options{SingleTenant: true, Store: st, LockTimeout: -time.Second}, "LockTimeout", []string{"-1s"}},
		{"negative record", Options{SingleTenant: true, Store: st, RecordTimeout: -time.Millisecond}, "RecordTimeout", []string{"-1ms"}},
		{"negative retry-after", Options{SingleTenant: true, Store: st, RetryAfter: -time.Second}, "RetryAfter", []string{"-1s"}},
		{"retry-after over 1h", Options{SingleTenant: true, Store: st, RetryAfter: 2 * time.Hour}, "RetryAfter", []string{"2h0m0s"}},
		{"negative key bytes", Options{SingleTenant: true, Store: st, MaxKeyBytes: -1}, "MaxKeyBytes", []string{"-1"}},
		{"negative body", Options{SingleTenant: true, Store: st, MaxBodyBytes: -2}, "MaxBodyBytes", []string{"-2"}},
		{"negative response", Options{SingleTenant: true, Store: st, MaxResponseBytes: -3}, "MaxResponseBytes", []string{"-3"}},
		{"response over the store's", Options{SingleTenant: true, Store: mib, MaxResponseBytes: 2 << 20}, "MaxResponseBytes",
			[]string{"middleware: MaxResponseBytes: 2097152 exceeds the store's MaxResultBytes 1048576", "at most 1040384"}},
		{"response at the store's, no room for headers", Options{SingleTenant: true, Store: mib, MaxResponseBytes: 1 << 20}, "MaxResponseBytes",
			[]string{"1048576", "RecordOverhead 8192"}},
		{"response over the tx store's", Options{SingleTenant: true, Tx: &limitedTx{max: 64 << 10}, MaxResponseBytes: 64 << 10}, "MaxResponseBytes",
			[]string{"65536", "at most 57344"}},
		{"store too small for a record", Options{SingleTenant: true, Store: memStore(idem.Options{MaxResultBytes: 4 << 10})}, "Store",
			[]string{"Store: *idem.MemoryStore with MaxResultBytes 4096", "RecordOverhead 8192"}},

		{"method not a token", Options{SingleTenant: true, Store: st, Methods: []string{"PO ST"}}, "Methods", []string{`"PO ST"`}},
		{"method empty", Options{SingleTenant: true, Store: st, Methods: []string{"POST", ""}}, "Methods", []string{`""`}},
		{"method lower case", Options{SingleTenant: true, Store: st, Methods: []string{"post"}}, "Methods",
			[]string{`middleware: Methods: "post" never matches a request; HTTP methods are case-sensitive, use "POST"`}},
		{"method mixed case", Options{SingleTenant: true, Store: st, Methods: []string{"PUT", "Patch"}}, "Methods", []string{`"Patch"`, `use "PATCH"`}},
		{"method twice", Options{SingleTenant: true, Store: st, Methods: []string{"POST", "PUT", "POST"}}, "Methods", []string{`"POST"`, "twice"}},

		{"replay not a token", Options{SingleTenant: true, Store: st, ReplayHeaders: []string{"Set-Cookie "}}, "ReplayHeaders", []string{`"Set-Cookie "`}},
		{"set-cookie replayed", Options{SingleTenant: true, Store: st, ReplayHeaders: []string{"set-cookie"}}, "ReplayHeaders", []string{`"set-cookie"`, "credentials"}},
		{"auth replayed", Options{SingleTenant: true, Store: st, ReplayHeaders: []string{"Content-Type", "Authorization"}}, "ReplayHeaders", []string{`"Authorization"`}},
		{"challenge replayed", Options{SingleTenant: true, Store: st, ReplayHeaders: []string{"WWW-Authenticate"}}, "ReplayHeaders", []string{`"WWW-Authenticate"`}},
		{"proxy challenge replayed", Options{SingleTenant: true, Store: st, ReplayHeaders: []string{"proxy-authenticate"}}, "ReplayHeaders", []string{`"proxy-authenticate"`}},
		{"replay header twice", Options{SingleTenant: true, Store: st, ReplayHeaders: []string{"Location", "ETag", "location"}}, "ReplayHeaders", []string{`"location"`, "twice"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.o)
			if err == nil {
				t.Fatalf("New(%s) = nil error; want one naming %s", tc.name, tc.field)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "middleware: "+tc.field+": ") {
				t.Errorf("New(%s) = %q; want it to start %q: the field at fault first", tc.name, msg, "middleware: "+tc.field+": ")
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("New(%s) = %q; want it to say %q", tc.name, msg, w)
				}
			}
			// A message may name the field at fault, and fields the user
			// set (the one the fault is with), never one left unset.
			o := reflect.ValueOf(tc.o)
			for _, f := range namedFields(msg) {
				if f != tc.field && o.FieldByName(f).IsZero() && !slices.Contains(tc.want, f) {
					t.Errorf("New(%s) = %q; it names %s, which the options leave unset", tc.name, msg, f)
				}
			}
		})
	}
}

// New refuses nothing valid: every field set to something other than its
// default, and the zero Options but for the Store.
func TestNewAccepts(t *testing.T) {
	st := newCounting()
	hasher, err := idem.NewKeyHasher([]byte("0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	for name, o := range map[string]Options{
		"store only":           {Store: st, SingleTenant: true},
		"tx only":              {Tx: &txStub{}, SingleTenant: true},
		"at the store's limit": {Store: memStore(idem.Options{MaxResultBytes: 1 << 20}), SingleTenant: true, MaxResponseBytes: 1<<20 - RecordOverhead},
		"every field": {
			Store: st, Header: "x-request-key", Required: true, RequestIDHeader: "x-request-id",
			Methods: []string{"PUT", "M-SEARCH"}, Scope: func(*http.Request) (string, error) { return "t", nil },
			LockTimeout: time.Second, MaxKeyBytes: 64,
			MaxBodyBytes: 1 << 10, MaxResponseBytes: 1 << 10, ReplayHeaders: []string{"location", "ETag"},
			Keep:  func(int) bool { return true },
			Error: WriteProblem, RecordTimeout: time.Second, KeyHasher: hasher,
			Observer: &obstest.Log{}, Logger: slog.New(slog.DiscardHandler),
			Fingerprint: func(*http.Request, io.Reader) ([]byte, error) { return []byte("f"), nil },
		},
		"key": {
			Store: st, SingleTenant: true, Key: func(*http.Request) (string, error) { return "k", nil },
			// With Key, the Idempotency-Key header is free for another use.
			RequestIDHeader: "Idempotency-Key",
		},
	} {
		if _, err := New(o); err != nil {
			t.Errorf("New(%s) = %v; want no error", name, err)
		}
	}
}

// Without MaxResponseBytes, the default fits the store: a store whose
// MaxResultBytes is under the default's needs gets a smaller one, so that
// a response of that size is recorded whole.
func TestMaxResponseBytesDefaultFitsStore(t *testing.T) {
	for _, tc := range []struct {
		store idem.Store
		want  int
	}{
		{memStore(idem.Options{}), DefaultMaxResponseBytes},
		{memStore(idem.Options{MaxResultBytes: 64 << 10}), 64<<10 - RecordOverhead},
		{newCounting(), DefaultMaxResponseBytes}, // does not report its limit
	} {
		c, err := Options{Store: tc.store, SingleTenant: true}.config()
		if err != nil {
			t.Fatalf("config(%T) = %v", tc.store, err)
		}
		if c.MaxResponseBytes != tc.want {
			t.Errorf("MaxResponseBytes with %T = %d; want %d", tc.store, c.MaxResponseBytes, tc.want)
		}
	}
}

// quoted matches a %q string in a message: the user's value, whose words
// are not field names ("Idempotency Key").
var quoted = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)

// namedFields returns the Options fields that msg names, as whole words
// outside quoted values.
func namedFields(msg string) []string {
	msg = quoted.ReplaceAllString(msg, `""`)
	var names []string
	typ := reflect.TypeFor[Options]()
	for i := range typ.NumField() {
		name := typ.Field(i).Name
		// A type's name (sqlstore.Store) is not the field.
		if regexp.MustCompile(`(?:^|[^.\w])` + name + `\b`).MatchString(msg) {
			names = append(names, name)
		}
	}
	return names
}

// txStub is a TxStore that is never called: New only looks at it.
type txStub struct{}

func (*txStub) Run(context.Context, string, []byte, func(context.Context, *sql.Tx) ([]byte, error)) ([]byte, bool, error) {
	panic("txStub.Run")
}

func (*txStub) Lookup(context.Context, string) (*idem.Record, error) { panic("txStub.Lookup") }

// limitedTx is a txStub that reports its MaxResultBytes, as sqlstore.Store
// does.
type limitedTx struct {
	txStub
	max int
}

func (s *limitedTx) MaxResultBytes() int { return s.max }
