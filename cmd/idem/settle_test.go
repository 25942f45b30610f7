package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/internal/testing/sqltest"
	"github.com/idemgo/idem/internal/testing/testenv"
	"github.com/idemgo/idem/middleware"
	"github.com/idemgo/idem/middleware/rpccore"
	"github.com/idemgo/idem/sqlstore"
)

// settleStore opens a store of kind name for the settle tests, and the
// flags by which the command reaches it.
func settleStore(t *testing.T, name string, o idem.Options) (idem.Store, []string) {
	t.Helper()
	switch name {
	case "sqlite":
		path, s := sqliteFile(t, o)
		return s, []string{"--sqlite", path}
	case "redis":
		ro := idem.RedisOptionsFrom(o)
		ro.Prefix = testenv.UniquePrefix()
		s, err := idem.NewRedisStore(testenv.Redis(t), ro)
		if err != nil {
			t.Fatal(err)
		}
		return s, []string{"--redis", testenv.Lookup(t, testenv.RedisAddrVar), "--prefix", ro.Prefix}
	case "postgres":
		so := sqlstore.OptionsFrom(o, sqlstore.Postgres)
		so.Table = sqltest.UniqueTable()
		return sqltest.NewStore(t, sqltest.Postgres(t), so), []string{"--postgres", testenv.PostgresDSN(t), "--table", so.Table}
	}
	t.Fatalf("no store %q", name)
	return nil, nil
}

type settledReceipt struct{ ID string }

// Each front door's key, quarantined, then settled by idem resolve in
// that front door's form: the next call through the front door replays
// exactly what the operator gave (Do decodes the JSON into its type, the
// middleware replays the response, the consumer skips the delivery); a
// form the front door cannot replay is refused before anything is
// written; and --forget --force clears a confirmed record. On SQLite,
// real Redis and Postgres.
func TestResolveEachFrontDoorsForm(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"sqlite", "redis", "postgres"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			o := idem.Options{Worker: "w-9", LeaseTTL: quarantineLease, Retention: time.Minute, MaxTakeOvers: 1}
			s, flags := settleStore(t, name, o)
			cmd := func(args ...string) result {
				t.Helper()
				return runCLI(t, nil, append(append([]string{args[0]}, flags...), args[1:]...)...)
			}
			ctx := context.Background()

			// idem.Do: refused unless JSON, then replayed into its type.
			quarantineKey(t, s, "do:1", nil)
			if r := cmd("resolve", "--do", "rcpt-9", "do:1"); r.code != exitUsage || !strings.Contains(r.stderr, "not JSON") {
				t.Errorf("resolve --do rcpt-9 = %d:\n%s%s\nwant 2, not JSON", r.code, r.stdout, r.stderr)
			}
			if r := cmd("resolve", "--do", `{"ID":"rcpt-9"}`, "do:1"); r.code != exitOK || !strings.Contains(r.stdout, "recorded as done") {
				t.Errorf("resolve --do = %d:\n%s%s", r.code, r.stdout, r.stderr)
			}
			v, err := idem.Do(ctx, s, "do:1", func(context.Context) (settledReceipt, error) {
				t.Errorf("Do's fn ran on a key an operator settled")
				return settledReceipt{}, nil
			})
			if err != nil || v.ID != "rcpt-9" {
				t.Errorf("Do(do:1) after resolve --do = %+v, %v; want {rcpt-9}, nil", v, err)
			}
			if r := cmd("inspect", "do:1"); !strings.Contains(r.stdout, "settled      by an operator") || !strings.Contains(r.stdout, "form         idem.Do's") {
				t.Errorf("inspect do:1 = %d:\n%s%s\nwant it marked settled by an operator", r.code, r.stdout, r.stderr)
			}

			// The HTTP middleware: its key takes a response, nothing else.
			hk := middleware.StoreKey("", "pay-1")
			quarantineKey(t, s, hk, nil)
			r := cmd("inspect", hk)
			if !strings.Contains(r.stdout, "--http-status CODE") {
				t.Errorf("inspect of a quarantined middleware key = %d:\n%s\nwant the hint --http-status", r.code, r.stdout)
			}
			for _, bad := range [][]string{{"--confirm", "ok"}, {"--do", "{}"}, {"--http-status", "500"}, {"--http-status", "201", "--header", "Set-Cookie: a=b"}} {
				if r := cmd(append(append([]string{"resolve"}, bad...), hk)...); r.code != exitUsage {
					t.Errorf("resolve %q on a middleware key = %d:\n%s%s\nwant 2, refused", bad, r.code, r.stdout, r.stderr)
				}
			}
			if r := cmd("resolve", "--http-status", "201", "--header", "Location: /payments/77", "--header", "content-type: application/json",
				"--body", `{"id":77}`, hk); r.code != exitOK {
				t.Errorf("resolve --http-status 201 = %d:\n%s%s", r.code, r.stdout, r.stderr)
			}
			mw, err := middleware.New(middleware.Options{Store: s, SingleTenant: true})
			if err != nil {
				t.Fatal(err)
			}
			h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				t.Errorf("handler ran on a key an operator settled")
			}))
			req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{}`))
			req.Header.Set("Idempotency-Key", "pay-1")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code != 201 || w.Body.String() != `{"id":77}` || w.Header().Get("Location") != "/payments/77" || w.Header().Get("Content-Type") != "application/json" {
				t.Errorf("retry after resolve --http-status = %d %v %q; want 201, Location, JSON, {\"id\":77}", w.Code, w.Header(), w.Body)
			}

			// The RPC interceptors: a response message by its type name and
			// wire encoding, recorded as rpccore.Resolution builds it (the
			// form the gRPC and Connect modules replay: their resolve tests).
			gk := rpccore.StoreKey("", "call-1")
			quarantineKey(t, s, gk, nil)
			for _, bad := range [][]string{{"--confirm", "ok"}, {"--do", "{}"}, {"--rpc-type", "google.protobuf.StringValue"},
				{"--rpc-type", "google protobuf", "--confirm-hex", "0a026869"}, {"--rpc-type", "google.protobuf.StringValue", "--confirm-hex", "zz"}} {
				if r := cmd(append(append([]string{"resolve"}, bad...), gk)...); r.code != exitUsage {
					t.Errorf("resolve %q on an RPC key = %d:\n%s%s\nwant 2, refused", bad, r.code, r.stdout, r.stderr)
				}
			}
			if r := cmd("resolve", "--rpc-type", "google.protobuf.StringValue", "--confirm-hex", "0a026869", gk); r.code != exitOK {
				t.Errorf("resolve --rpc-type = %d:\n%s%s", r.code, r.stdout, r.stderr)
			}
			want, err := rpccore.Resolution("google.protobuf.StringValue", []byte("\x0a\x02hi"), nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if rec, err := s.Lookup(ctx, gk); err != nil || !rec.Confirmed || string(rec.Result) != string(want.Result) {
				t.Errorf("Lookup of the RPC key after resolve --rpc-type = %+v, %v; want the record rpccore.Resolution builds", rec, err)
			}

			// A consumer's key: the plain bytes (none); the next delivery is skipped.
			quarantineKey(t, s, "msg-1", nil)
			if r := cmd("resolve", "--confirm", "", "msg-1"); r.code != exitOK {
				t.Errorf("resolve --confirm '' msg-1 = %d:\n%s%s", r.code, r.stdout, r.stderr)
			}
			ran := false
			handle := consumer.Idempotent(s, func(m string) string { return m }, func(context.Context, string) error { ran = true; return nil })
			if err := handle(ctx, "msg-1"); err != nil || ran {
				t.Errorf("delivery of msg-1 after resolve --confirm '' = %v (handler ran: %v); want nil, skipped", err, ran)
			}

			// --forget refuses a confirmed key; --forget --force clears it.
			if r := cmd("resolve", "--forget", "do:1"); r.code != exitFailed || !strings.Contains(r.stderr, "--forget --force") {
				t.Errorf("resolve --forget of a confirmed key = %d:\n%s%s\nwant 1 and the --force way out", r.code, r.stdout, r.stderr)
			}
			r = cmd("resolve", "--forget", "--force", "do:1")
			if r.code != exitOK || !strings.Contains(r.stdout, "an operator's confirmation") || !strings.Contains(r.stdout, "runs the work again") {
				t.Errorf("resolve --forget --force do:1 = %d:\n%s%s\nwant it cleared, saying so", r.code, r.stdout, r.stderr)
			}
			if c, err := s.Claim(ctx, "do:1", nil); err != nil || c.Outcome != idem.Claimed {
				t.Errorf("Claim(do:1) after --forget --force = %v, %v; want Claimed", c.Outcome, err)
			}
			if r := cmd("resolve", "--forget", "--force", "do:1"); r.code != exitFailed || !strings.Contains(r.stderr, "live claim") {
				t.Errorf("resolve --forget --force of a live claim = %d:\n%s%s\nwant 1, a live claim left as it is", r.code, r.stdout, r.stderr)
			}
		})
	}
}

// A damaged record (on Redis, bytes no version reads) is reported as such
// by inspect, with the way out, and cleared by resolve --forget --force.
func TestResolveForceClearsADamagedRecord(t *testing.T) {
	t.Parallel()
	o := idem.Options{Worker: "w-9", LeaseTTL: quarantineLease, Retention: time.Minute}
	s, flags := settleStore(t, "redis", o)
	rs := s.(*idem.RedisStore)
	c := testenv.Redis(t)
	if err := c.Set(context.Background(), rs.RecordKey("broken"), "9Zgarbage", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	cmd := func(args ...string) result {
		t.Helper()
		return runCLI(t, nil, append(append([]string{args[0]}, flags...), args[1:]...)...)
	}
	r := cmd("inspect", "broken")
	if r.code != exitFailed || !strings.Contains(r.stderr, "damaged") || !strings.Contains(r.stderr, "idem resolve broken --forget --force") {
		t.Errorf("inspect of a damaged record = %d:\n%s%s\nwant 1, damaged, and the way out", r.code, r.stdout, r.stderr)
	}
	r = cmd("resolve", "--forget", "--force", "broken")
	if r.code != exitOK || !strings.Contains(r.stdout, "a damaged record") {
		t.Errorf("resolve --forget --force of a damaged record = %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	if cl, err := s.Claim(context.Background(), "broken", nil); err != nil || cl.Outcome != idem.Claimed {
		t.Errorf("Claim(broken) after --forget --force = %v, %v; want Claimed", cl.Outcome, err)
	}
	if _, err := s.Lookup(context.Background(), "none"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Lookup(none) = %v", err)
	}
}

// inspect shows a lapsed attempt before anyone takes it over: its owner,
// token, when claimed, checkpoint and when the store forgets it, and
// whether it crashed or was given up saying why (a failed Reconcile); on
// SQLite, real Redis and Postgres.
func TestInspectShowsALapsedAttempt(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"sqlite", "redis", "postgres"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			o := idem.Options{Worker: "w-9", LeaseTTL: quarantineLease, Retention: time.Minute}
			s, flags := settleStore(t, name, o)
			ctx := context.Background()
			c, err := s.Claim(ctx, "crashed", nil)
			if err != nil || c.Outcome != idem.Claimed {
				t.Fatalf("Claim = %v, %v", c.Outcome, err)
			}
			if err := s.(idem.Checkpointer).Checkpoint(ctx, c.Lease, []byte("charged")); err != nil {
				t.Fatal(err)
			}
			// Beside it, an attempt whose Reconcile failed, as Do records it.
			const why = "Reconcile failed: ledger unreachable"
			ca, err := s.Claim(ctx, "gave-up", nil)
			if err != nil || ca.Outcome != idem.Claimed {
				t.Fatalf("Claim = %v, %v", ca.Outcome, err)
			}
			if err := s.(idem.Abandoner).Abandon(ctx, ca.Lease, why); err != nil {
				t.Fatal(err)
			}
			time.Sleep(quarantineLease + 50*time.Millisecond)
			r := runCLI(t, nil, append(append([]string{"inspect"}, flags...), "crashed")...)
			for _, want := range []string{"state        lapsed\n", "owner        w-9\n", "token        " + strconv.FormatInt(c.Lease.Token, 10) + "\n",
				"claimed      ", `checkpoint   "charged"`, "the store forgets it in", "takes it over",
				"ended        its lease ran out: a crash or a stall\n", "its worker crashed or stalled"} {
				if !strings.Contains(r.stdout, want) {
					t.Errorf("inspect of a lapsed claim = %d, lacks %q:\n%s%s", r.code, want, r.stdout, r.stderr)
				}
			}
			r = runCLI(t, nil, append(append([]string{"inspect"}, flags...), "gave-up")...)
			for _, want := range []string{"state        lapsed\n", "ended        abandoned by its holder: " + why + "\n", "it did not crash"} {
				if !strings.Contains(r.stdout, want) {
					t.Errorf("inspect of an abandoned claim = %d, lacks %q:\n%s%s", r.code, want, r.stdout, r.stderr)
				}
			}
			if strings.Contains(r.stdout, "crashed or stalled") {
				t.Errorf("inspect of an abandoned claim calls it a crash:\n%s", r.stdout)
			}
			r = runCLI(t, nil, append(append([]string{"inspect", "--json"}, flags...), "gave-up")...)
			var ina inspection
			if err := json.Unmarshal([]byte(r.stdout), &ina); err != nil || ina.Ended != why {
				t.Errorf("inspect --json of an abandoned claim = %v\n%s\nwant ended %q", err, r.stdout, why)
			}
			r = runCLI(t, nil, append(append([]string{"inspect", "--json"}, flags...), "crashed")...)
			var in inspection
			if err := json.Unmarshal([]byte(r.stdout), &in); err != nil || in.State != "lapsed" || in.Claimed == nil || in.Token != c.Lease.Token {
				t.Errorf("inspect --json of a lapsed claim = %v\n%s\nwant state lapsed, claimed, token %d", err, r.stdout, c.Lease.Token)
			}
			// It only reads: the next claim takes it over, told so.
			if c2, err := s.Claim(ctx, "crashed", nil); err != nil || !c2.TakeOver || c2.Prior.Token != c.Lease.Token {
				t.Errorf("Claim after inspect = %+v, %v; want the take-over of token %d", c2, err, c.Lease.Token)
			}
		})
	}
}
