package idem_test

import (
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/client"
	"github.com/idemgo/idem/consumer"
	idemamqp "github.com/idemgo/idem/consumer/amqp"
	"github.com/idemgo/idem/consumer/redisstream"
	"github.com/idemgo/idem/internal/testing/sqltest"
	"github.com/idemgo/idem/middleware"
	"github.com/idemgo/idem/sqlstore"
)

// badOption is the one shape of a message refusing an option, in every
// package: "<pkg>: <Field>: <value> <rule>", the field as written in the
// literal (qualified where the package has options structs to confuse),
// the value as given (a string quoted, a nil as nil or (T)(nil), a store
// by its type).
var badOption = regexp.MustCompile(`^(idem|sqlstore|middleware|client|consumer|amqp|redisstream): ` +
	`([A-Z]\w*\.)?[A-Z]\w*(\[\d+\])?: ` +
	`(nil|true|"(?:[^"\\]|\\.)*"|\(\*?[\w.]+\)\(nil\)|\*[\w.]+|[-\w.µ()]+) [a-z]`)

// Every option that a constructor of the root module's packages refuses is
// refused with a message of one shape, written out here in full: a message
// that drifts from the shape, or loses the value or the default, fails. A
// rule that says a value is negative also says what 0 means.
func TestBadOptionMessages(t *testing.T) {
	mem := memStore(idem.Options{})
	small := memStore(idem.Options{MaxResultBytes: 4 << 10})
	rc := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ReadTimeout: 2 * time.Second}) // never dialled
	t.Cleanup(func() { _ = rc.Close() })
	db, _ := sqltest.SQLite(t)
	ctx := t.Context()
	fn := func(context.Context) (int, error) { return 1, nil }
	scope := func(*http.Request) (string, error) { return "t", nil }
	stream := redisstream.Options{Stream: "s", Group: "g", Consumer: "c"}
	const budget = "0 means the default, two thirds of the lease's TTL"

	// Each builds with one mistake and returns the error, or what it
	// panicked with as an error.
	type build func() error
	memory := func(o idem.Options) build {
		return func() error { _, err := idem.NewMemoryStore(o); return err }
	}
	redisStore := func(o idem.RedisOptions) build {
		return func() error { _, err := idem.NewRedisStore(rc, o); return err }
	}
	cache := func(o idem.CacheOptions) build {
		return func() error { _, err := idem.NewCache(mem, o); return err }
	}
	do := func(o idem.DoOptions) build {
		return func() error { _, err := idem.Do(ctx, mem, "k", fn, o); return err }
	}
	sql := func(o sqlstore.Options) build {
		return func() error { _, err := sqlstore.New(db, o); return err }
	}
	mw := func(o middleware.Options) build {
		return func() error { _, err := middleware.New(o); return err }
	}
	tenant := func(o middleware.Options) build { // one valid store and scope, one mistake
		o.Store, o.SingleTenant = mem, true
		return mw(o)
	}
	tr := func(o client.Options) build {
		return func() error { _, err := client.New(o); return err }
	}
	wrap := func(o consumer.Options[string]) build {
		return panics(func() {
			consumer.Idempotent(mem, func(m string) string { return m }, func(context.Context, string) error { return nil }, o)
		})
	}
	amqp := func(o idemamqp.Options) build {
		return panics(func() {
			idemamqp.Handler(mem, func(context.Context, amqp091.Delivery) error { return nil }, o)
		})
	}
	reader := func(edit func(*redisstream.Options)) build {
		o := stream
		edit(&o)
		return func() error {
			_, err := redisstream.NewReader(rc, mem, func(context.Context, redis.XMessage) error { return nil }, o)
			return err
		}
	}

	for _, tc := range []struct {
		build build
		want  string
	}{
		// The options every store shares: idem.Options, RedisOptions and
		// sqlstore.Options name them alike.
		{memory(idem.Options{Retention: -time.Second}), "idem: Retention: -1s is negative; 0 means the default, 24h0m0s"},
		{memory(idem.Options{LeaseTTL: -time.Second}), "idem: LeaseTTL: -1s is negative; 0 means the default, 30s"},
		{memory(idem.Options{MaxKeyBytes: -1}), "idem: MaxKeyBytes: -1 is negative; 0 means the default, 1024"},
		{memory(idem.Options{MaxResultBytes: -1}), "idem: MaxResultBytes: -1 is negative; 0 means the default, 1048576"},
		{memory(idem.Options{Retention: 500 * time.Microsecond}), "idem: Retention: 500µs is under 1ms"},
		{memory(idem.Options{LeaseTTL: 500 * time.Microsecond}), "idem: LeaseTTL: 500µs is under 500ms, too short for KeepAlive to renew (at a third of the lease) before it runs out"},
		{memory(idem.Options{LeaseTTL: time.Millisecond}), "idem: LeaseTTL: 1ms is under 500ms, too short for KeepAlive to renew (at a third of the lease) before it runs out"},
		{memory(idem.Options{LeaseTTL: idem.MinLeaseTTL - 1}), "idem: LeaseTTL: 499.999999ms is under 500ms, too short for KeepAlive to renew (at a third of the lease) before it runs out"},
		{redisStore(idem.RedisOptions{LeaseTTL: time.Millisecond}), "idem: LeaseTTL: 1ms is under 500ms, too short for KeepAlive to renew (at a third of the lease) before it runs out"},
		{sql(sqlstore.Options{Dialect: sqlstore.SQLite, LeaseTTL: time.Millisecond}), "idem: LeaseTTL: 1ms is under 500ms, too short for KeepAlive to renew (at a third of the lease) before it runs out"},
		{func() error { _, err := mem.Share(idem.Options{LeaseTTL: 5 * time.Millisecond}); return err }, "idem: LeaseTTL: 5ms is under 500ms, too short for KeepAlive to renew (at a third of the lease) before it runs out"},
		{memory(idem.Options{Retention: 10 * time.Millisecond}), "idem: Retention: 10ms is shorter than the default LeaseTTL 30s; set LeaseTTL too"},
		{memory(idem.Options{Retention: time.Second, LeaseTTL: 2 * time.Second}), "idem: Retention: 1s is shorter than LeaseTTL 2s"},
		{memory(idem.Options{LeaseTTL: 48 * time.Hour}), "idem: LeaseTTL: 48h0m0s is longer than the default Retention 24h0m0s; set Retention too"},
		{memory(idem.Options{Worker: "a\x00b"}), `idem: Worker: "a\x00b" contains a NUL byte`},
		{memory(idem.Options{Worker: strings.Repeat("w", 300)}), `idem: Worker: "` + strings.Repeat("w", 32) + `..." is 300 bytes; at most 255`},
		{memory(idem.Options{Observer: (*startingObserver)(nil)}), "idem: Observer: (*idem_test.startingObserver)(nil) is nil and would panic on the first operation; leave Observer nil for none"},
		{func() error { _, err := mem.Share(idem.Options{LeaseTTL: -1}); return err }, "idem: LeaseTTL: -1ns is negative; 0 means the default, 30s"},
		{redisStore(idem.RedisOptions{LeaseTTL: -1}), "idem: LeaseTTL: -1ns is negative; 0 means the default, 30s"},
		{sql(sqlstore.Options{Dialect: sqlstore.SQLite, LeaseTTL: -1}), "idem: LeaseTTL: -1ns is negative; 0 means the default, 30s"},

		{redisStore(idem.RedisOptions{Prefix: "{t}:"}), `idem: Prefix: "{t}:" must not contain '{' or '}' (the hash tag after it is idem's)`},
		{redisStore(idem.RedisOptions{WaitReplicas: -1}), "idem: WaitReplicas: -1 is negative; 0 means the default, no wait"},
		{redisStore(idem.RedisOptions{WaitReplicas: 1, WaitTimeout: -time.Second}), "idem: WaitTimeout: -1s is negative; 0 means the default, 1s"},
		{redisStore(idem.RedisOptions{WaitTimeout: time.Second}), "idem: WaitTimeout: 1s is set without WaitReplicas; set WaitReplicas, or leave WaitTimeout 0"},
		{redisStore(idem.RedisOptions{WaitReplicas: 1, WaitTimeout: 500 * time.Microsecond}), "idem: WaitTimeout: 500µs is under 1ms"},
		{redisStore(idem.RedisOptions{WaitReplicas: 1, WaitTimeout: 2 * time.Second}),
			"idem: WaitTimeout: 2s must be shorter than the client's ReadTimeout 2s, or reading WAIT's reply would time out first"},
		{redisStore(idem.RedisOptions{MaxResultBytes: 1 << 30}),
			"idem: MaxResultBytes: 1073741824 exceeds 536866816, what a Redis string holds with the record around it"},
		{redisStore(idem.RedisOptions{MaxKeyBytes: 1 << 28}), "idem: MaxKeyBytes: 268435456 exceeds 178956968, what a Redis key name holds once escaped"},

		{cache(idem.CacheOptions{MaxBytes: -1}), "idem: CacheOptions.MaxBytes: -1 is negative; 0 means the default, 33554432"},
		{cache(idem.CacheOptions{MaxAge: -time.Second}), "idem: CacheOptions.MaxAge: -1s is negative; 0 means the default, 1s"},
		{cache(idem.CacheOptions{MaxAge: time.Microsecond}), "idem: CacheOptions.MaxAge: 1µs is under 1ms"},
		{cache(idem.CacheOptions{ClockMargin: -time.Second}), "idem: CacheOptions.ClockMargin: -1s is negative; 0 means the default, 1s"},

		{do(idem.DoOptions{Wait: -time.Second}), "idem: DoOptions.Wait: -1s is negative; 0 means the default, 5s"},
		{do(idem.DoOptions{MaxHold: -time.Second}), "idem: DoOptions.MaxHold: -1s is negative; 0 means the default, no cap"},
		{do(idem.DoOptions{Errors: []error{nil}}), "idem: DoOptions.Errors[0]: nil matches no error; give a sentinel error"},

		{sql(sqlstore.Options{}), "sqlstore: Dialect: 0 is unset; set sqlstore.Postgres, sqlstore.MySQL or sqlstore.SQLite"},
		{sql(sqlstore.Options{Dialect: 4}), "sqlstore: Dialect: dialect(4) is unknown; set sqlstore.Postgres, sqlstore.MySQL or sqlstore.SQLite"},
		{sql(sqlstore.Options{Dialect: sqlstore.SQLite, Table: "a.b.c"}), `sqlstore: Table: "a.b.c" has more than one schema qualifier; at most schema.table`},
		{sql(sqlstore.Options{Dialect: sqlstore.SQLite, Table: "idem keys"}),
			`sqlstore: Table: "idem keys" is not a plain identifier: each part must match [A-Za-z_][A-Za-z0-9_]* and be at most 63 bytes`},
		{sql(sqlstore.Options{Dialect: sqlstore.SQLite, LockTimeout: -time.Second}), "sqlstore: LockTimeout: -1s is negative; 0 means the default, 5s"},

		{mw(middleware.Options{SingleTenant: true}),
			"middleware: Store: nil while Tx is nil too; set one: Store (lease mode: any idem.Store) or Tx (transactional mode: a TxStore)"},
		{mw(middleware.Options{SingleTenant: true, Store: (*idem.MemoryStore)(nil)}),
			"middleware: Store: (*idem.MemoryStore)(nil) is nil and would panic on the first request"},
		{mw(middleware.Options{Store: mem}), "middleware: Scope: nil while SingleTenant is false; set Scope to name each request's tenant " +
			"from its authenticated principal, or SingleTenant: true when the service has one tenant"},
		{mw(middleware.Options{Store: mem, Scope: scope, SingleTenant: true}),
			"middleware: SingleTenant: true while Scope is set; set one: Scope names each request's tenant, SingleTenant says there is one"},
		{tenant(middleware.Options{Header: "a b"}), `middleware: Header: "a b" is not a header field name (an RFC 9110 token)`},
		{tenant(middleware.Options{LockTimeout: -time.Second}), "middleware: LockTimeout: -1s is negative; 0 means the default, 5s"},
		{tenant(middleware.Options{RecordTimeout: -time.Second}), "middleware: RecordTimeout: -1s is negative; 0 means the default, 10s"},
		{tenant(middleware.Options{RetryAfter: 2 * time.Hour}), "middleware: RetryAfter: 2h0m0s is outside 0..1h; 0 means the default, 1s"},
		{tenant(middleware.Options{MaxKeyBytes: -1}), "middleware: MaxKeyBytes: -1 is negative; 0 means the default, 255"},
		{tenant(middleware.Options{MaxBodyBytes: -1}), "middleware: MaxBodyBytes: -1 is negative; 0 means the default, 10485760"},
		{tenant(middleware.Options{MaxResponseBytes: -1}), "middleware: MaxResponseBytes: -1 is negative; 0 means the default, 524288"},
		{tenant(middleware.Options{MaxResponseBytes: 2 << 20}), "middleware: MaxResponseBytes: 2097152 exceeds the store's MaxResultBytes 1048576 " +
			"less RecordOverhead 8192 (the record's status and headers); at most 1040384"},
		{mw(middleware.Options{SingleTenant: true, Store: small}), "middleware: Store: *idem.MemoryStore with MaxResultBytes 4096 leaves no room " +
			"for a response body beside RecordOverhead 8192 (the record's status and headers); give the store a MaxResultBytes above 8192"},
		{tenant(middleware.Options{RequestIDHeader: "Cookie"}),
			`middleware: RequestIDHeader: "Cookie" carries credentials, which a replay would show to whoever holds the key`},
		{tenant(middleware.Options{Methods: []string{"post"}}),
			`middleware: Methods: "post" never matches a request; HTTP methods are case-sensitive, use "POST"`},
		{tenant(middleware.Options{ReplayHeaders: []string{"Set-Cookie"}}), `middleware: ReplayHeaders: "Set-Cookie" may not be replayed: it carries credentials`},

		{tr(client.Options{Header: "a b"}), `client: Header: "a b" is not a header field name (an RFC 9110 token)`},
		{tr(client.Options{MaxElapsed: -time.Second}), "client: MaxElapsed: -1s is negative; 0 means the default, 30s"},
		{tr(client.Options{MaxAttempts: -1}), "client: MaxAttempts: -1 is negative; 0 means the default, 5"},
		{tr(client.Options{InitialWait: time.Minute}), "client: InitialWait: 1m0s is longer than MaxWait 5s, which caps every wait"},
		{tr(client.Options{Base: (*http.Transport)(nil)}),
			"client: Base: (*http.Transport)(nil) is nil and would panic on the first request; leave Base nil for the default, http.DefaultTransport"},
		{tr(client.Options{Methods: []string{"POST", "POST"}}), `client: Methods: "POST" is listed twice`},

		{wrap(consumer.Options[string]{ConfirmBudget: -time.Second}), "consumer: ConfirmBudget: -1s is negative; " + budget},
		{wrap(consumer.Options[string]{Concurrency: -1}), "consumer: Concurrency: -1 is negative; 0 means the default, 16"},

		{amqp(idemamqp.Options{MinDelay: -time.Second}), "amqp: MinDelay: -1s is negative; 0 means the default, 50ms"},
		{amqp(idemamqp.Options{MaxDelay: -time.Second}), "amqp: MaxDelay: -1s is negative; 0 means the default, 5s"},
		{amqp(idemamqp.Options{ConfirmBudget: -time.Second}), "amqp: ConfirmBudget: -1s is negative; " + budget},

		{reader(func(o *redisstream.Options) { o.Stream = "" }), `redisstream: Stream: "" is empty; set the stream to read`},
		{reader(func(o *redisstream.Options) { o.Count = -1 }), "redisstream: Count: -1 is negative; 0 means the default, 100"},
		{reader(func(o *redisstream.Options) { o.ConfirmBudget = -1 }), "redisstream: ConfirmBudget: -1ns is negative; " + budget},
	} {
		err := tc.build()
		if err == nil {
			t.Errorf("no error; want %q", tc.want)
			continue
		}
		got := err.Error()
		if got != tc.want {
			t.Errorf("error %q;\n want %q", got, tc.want)
		}
		if !badOption.MatchString(got) {
			t.Errorf("error %q is not of the shape <pkg>: <Field>: <value> <rule>", got)
		}
		if strings.Contains(got, " is negative") && !strings.Contains(got, "; 0 means the default, ") {
			t.Errorf("error %q refuses a negative value without saying what 0 means", got)
		}
	}
}

// panics returns a build that runs f and returns what it panicked with,
// as an error; nil if it returned.
func panics(f func()) func() error {
	return func() (err error) {
		defer func() {
			if v := recover(); v != nil {
				err = fmt.Errorf("%v", v)
			}
		}()
		f()
		return nil
	}
}

// A constructor that can fail says so with an error naming the field at
// fault, never a panic: one rule for bad input across every package.
func TestNewMemoryStoreRefusesBadOptions(t *testing.T) {
	cases := []struct {
		o     idem.Options
		field string
	}{
		{idem.Options{LeaseTTL: -time.Second}, "LeaseTTL"},
		{idem.Options{Retention: time.Second, LeaseTTL: time.Minute}, "Retention"},
		{idem.Options{MaxKeyBytes: -1}, "MaxKeyBytes"},
		{idem.Options{Worker: "a\x00b"}, "Worker"},
	}
	for _, c := range cases {
		s, err := idem.NewMemoryStore(c.o)
		if err == nil || s != nil {
			t.Errorf("NewMemoryStore(%+v) = %v, %v; want nil and an error naming %s", c.o, s, err, c.field)
			continue
		}
		if !strings.Contains(err.Error(), c.field) {
			t.Errorf("NewMemoryStore(%+v) error %q; want it to name %s", c.o, err, c.field)
		}
		m := memStore(idem.Options{})
		if _, err := m.Share(c.o); err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("Share(%+v) error %v; want one naming %s", c.o, err, c.field)
		}
	}
	if _, err := idem.NewMemoryStoreClock(idem.Options{}, nil); err == nil {
		t.Error("NewMemoryStoreClock(nil clock) = nil error; want one")
	}
}

// A store that no constructor made says which constructor to use, instead
// of judging a key against limits it never resolved.
func TestZeroValueStoreNamesItsConstructor(t *testing.T) {
	ctx := context.Background()
	l := &idem.Lease{Key: "k", Token: 1, Owner: "w"}
	for _, tc := range []struct {
		name, constructor string
		s                 idem.Store
	}{
		{"MemoryStore", "NewMemoryStore", &idem.MemoryStore{}},
		{"RedisStore", "NewRedisStore", &idem.RedisStore{}},
		{"sqlstore.Store", "sqlstore.New", &sqlstore.Store{}},
	} {
		b := tc.s.(idem.Batcher)
		for op, call := range map[string]func() error{
			"Claim":        func() error { _, err := tc.s.Claim(ctx, "k", nil); return err },
			"Renew":        func() error { return tc.s.Renew(ctx, l) },
			"Confirm":      func() error { return tc.s.Confirm(ctx, l, nil) },
			"Forget":       func() error { return tc.s.Forget(ctx, l) },
			"Lookup":       func() error { _, err := tc.s.Lookup(ctx, "k"); return err },
			"ClaimBatch":   func() error { _, err := b.ClaimBatch(ctx, nil, nil); return err },
			"ConfirmBatch": func() error { return b.ConfirmBatch(ctx, nil, nil) },
		} {
			if err := call(); err == nil || !strings.Contains(err.Error(), tc.constructor) {
				t.Errorf("zero %s: %s = %v; want an error naming %s", tc.name, op, err, tc.constructor)
			}
		}
	}
	// A store of one's own built on a zero or nil Core answers the same,
	// naming NewCore, and never panics.
	for name, c := range map[string]*idem.Core{"zero Core": {}, "nil *Core": nil} {
		for op, err := range map[string]error{
			"CheckClaim":        c.CheckClaim("k", nil),
			"CheckKey":          c.CheckKey("k"),
			"CheckLease":        c.CheckLease(l),
			"CheckForget":       c.CheckForget(l),
			"CheckResult":       c.CheckResult(l, nil),
			"CheckClaimBatch":   c.CheckClaimBatch(nil, nil),
			"CheckConfirmBatch": c.CheckConfirmBatch(nil, nil),
		} {
			if err == nil || !strings.Contains(err.Error(), "NewCore") {
				t.Errorf("%s: %s = %v; want an error naming NewCore", name, op, err)
			}
		}
		c.Observe(ctx, idem.Event{Op: idem.OpClaim}, "k", time.Now()) // must not panic
	}
}

// The options every store shares are repeated in each store's flat options
// (RedisOptions, sqlstore.Options): their docs must say the same, or a
// user reading one store's options learns another contract.
func TestSharedOptionDocsAgree(t *testing.T) {
	want := fieldDocs(t, "options.go", "Options")
	for _, o := range []struct{ file, typ string }{
		{"redisstore.go", "RedisOptions"},
		{"sqlstore/sqlstore.go", "Options"},
	} {
		got := fieldDocs(t, o.file, o.typ)
		for name, doc := range want {
			d, ok := got[name]
			if !ok {
				t.Errorf("%s.%s is missing; want the shared option %s", o.typ, name, name)
				continue
			}
			if d != doc {
				t.Errorf("%s.%s (%s) is documented\n\t%q\nwant, as idem.Options.%s,\n\t%q", o.typ, name, o.file, d, name, doc)
			}
		}
	}
}

// fieldDocs returns the doc comment of each exported field of type typ in
// file.
func fieldDocs(t *testing.T, file, typ string) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	docs := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok || ts.Name.Name != typ {
			return true
		}
		for _, fl := range ts.Type.(*ast.StructType).Fields.List {
			for _, name := range fl.Names {
				if name.IsExported() {
					docs[name.Name] = strings.TrimSpace(fl.Doc.Text())
				}
			}
		}
		return false
	})
	if len(docs) == 0 {
		t.Fatalf("no type %s in %s", typ, file)
	}
	return docs
}
