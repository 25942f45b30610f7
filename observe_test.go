package idem_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testing/sqltest"
	"github.com/idemgo/idem/internal/testing/testenv"
	"github.com/idemgo/idem/sqlstore"
	"github.com/idemgo/idem/storetest"
)

// recorder is an Observer that keeps every event.
type recorder struct {
	mu sync.Mutex
	es []idem.Event
}

func (r *recorder) Observe(_ context.Context, e idem.Event) {
	r.mu.Lock()
	r.es = append(r.es, e)
	r.mu.Unlock()
}

func (r *recorder) take() []idem.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	es := r.es
	r.es = nil
	return es
}

func mustHasher(t testing.TB, secret string) *idem.KeyHasher {
	t.Helper()
	h, err := idem.NewKeyHasher([]byte(secret))
	if err != nil {
		t.Fatalf("NewKeyHasher = %v", err)
	}
	return h
}

func TestKeyHasher(t *testing.T) {
	if _, err := idem.NewKeyHasher([]byte("short")); err == nil {
		t.Fatal("NewKeyHasher accepted a 5-byte secret")
	}
	a := mustHasher(t, "0123456789abcdef-one")
	a2 := mustHasher(t, "0123456789abcdef-one")
	b := mustHasher(t, "0123456789abcdef-two")
	key := "order-1234"
	if a.Hash(key) != a2.Hash(key) {
		t.Error("one secret, two hashers: hashes differ, so logs of two processes would not correlate")
	}
	if a.Hash(key) == b.Hash(key) {
		t.Error("two secrets give one hash")
	}
	if a.Hash(key) == a.Hash("order-1235") {
		t.Error("two keys give one hash")
	}
	if h := a.Hash(key); len(h) != 16 || strings.Contains(h, key) {
		t.Errorf("Hash = %q; want 16 hex digits", h)
	}
	// The default (nil) hasher is stable within the process and is KeyHash.
	var none *idem.KeyHasher
	if first := idem.KeyHash(key); none.Hash(key) != first || idem.KeyHash(key) != first {
		t.Error("nil KeyHasher and KeyHash disagree")
	}
	// Long keys go through the reused buffer without corrupting later hashes.
	long := strings.Repeat("x", 10000)
	first := a.Hash(long)
	_ = a.Hash(key)
	if a.Hash(long) != first || a.Hash(key) != a2.Hash(key) {
		t.Error("hash of a key changed after hashing others")
	}
	if n := testing.AllocsPerRun(100, func() { _ = a.Hash(key) }); n > 1 && !testenv.RaceEnabled {
		t.Errorf("Hash allocates %v times; want at most the result string", n)
	}
}

func TestEventClass(t *testing.T) {
	cases := []struct {
		err  error
		want idem.ErrorClass
	}{
		{nil, idem.ClassNone},
		{fmt.Errorf("x: %w", idem.ErrLeaseLost), idem.ClassLeaseLost},
		{idem.ErrNotFound, idem.ClassNotFound},
		{idem.ErrInvalidKey, idem.ClassInvalid},
		{idem.ErrTooLarge, idem.ClassInvalid},
		{idem.ErrInProgress, idem.ClassConflict},
		{idem.ErrFingerprintMismatch, idem.ClassConflict},
		{context.DeadlineExceeded, idem.ClassCanceled},
		{fmt.Errorf("idem: claim of key#1: %w", context.Canceled), idem.ClassCanceled},
		{errors.Join(context.Canceled, context.DeadlineExceeded), idem.ClassCanceled},
		{fmt.Errorf("%w: key 1: %w", errors.New("consumer: work done but not recorded"),
			errors.Join(errors.New("i/o timeout"), context.DeadlineExceeded)), idem.ClassStore},
		{idem.ErrDamaged, idem.ClassDamaged},
		{errors.New("dial tcp: connection refused"), idem.ClassStore},
	}
	for _, c := range cases {
		e := idem.Event{Err: c.err}
		if got := e.Class(); got != c.want {
			t.Errorf("Class(%v) = %v; want %v", c.err, got, c.want)
		}
	}
	if idem.ClassStore.String() != "store" || idem.OpRequest.String() != "request" || idem.OpMessage.String() != "message" ||
		idem.InProgress.String() != "in_progress" || idem.Duplicate.String() != "duplicate" {
		t.Error("names for metric labels changed")
	}
}

func TestObservers(t *testing.T) {
	if idem.Observers() != nil || idem.Observers(nil, nil) != nil {
		t.Error("Observers of none is not nil")
	}
	a, b := &recorder{}, &recorder{}
	if idem.Observers(nil, a) != idem.Observer(a) {
		t.Error("Observers of one is not that one")
	}
	idem.Observers(a, nil, b).Observe(context.Background(), idem.Event{Op: idem.OpClaim})
	if len(a.take()) != 1 || len(b.take()) != 1 {
		t.Error("an event did not reach every observer")
	}
}

// observedStores opens one store of each kind with o.
func observedStores(t *testing.T, o idem.Options) map[string]idem.Store {
	t.Helper()
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	rs, err := idem.NewRedisStore(c, idem.RedisOptionsFrom(o))
	if err != nil {
		t.Fatal(err)
	}
	db, _ := sqltest.SQLite(t)
	so := sqlstore.OptionsFrom(o, sqlstore.SQLite)
	so.Table = sqltest.UniqueTable()
	ss := sqltest.NewStore(t, db, so)
	return map[string]idem.Store{"memory": memStore(o), "redis": rs, "sqlite": ss}
}

// Every store reports one event per operation, with the keyed hash of the
// key and never the key.
func TestStoresReportEvents(t *testing.T) {
	ctx := context.Background()
	h := mustHasher(t, "a secret shared by the fleet")
	rec := &recorder{}
	for name, st := range observedStores(t, idem.Options{Observer: rec, KeyHasher: h}) {
		t.Run(name, func(t *testing.T) {
			key := "customer-42/" + name
			c, err := st.Claim(ctx, key, nil)
			if err != nil || c.Outcome != idem.Claimed {
				t.Fatalf("Claim = %+v, %v", c, err)
			}
			if err := st.Renew(ctx, c.Lease); err != nil {
				t.Fatal(err)
			}
			if err := st.Confirm(ctx, c.Lease, []byte("ok")); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Claim(ctx, key, nil); err != nil {
				t.Fatal(err)
			}
			if err := st.Forget(ctx, c.Lease); !errors.Is(err, idem.ErrLeaseLost) {
				t.Fatalf("Forget after Confirm = %v", err)
			}
			if _, err := st.Lookup(ctx, "absent/"+name); !errors.Is(err, idem.ErrNotFound) {
				t.Fatalf("Lookup = %v", err)
			}
			b := st.(idem.Batcher)
			if _, err := b.ClaimBatch(ctx, []string{"b1/" + name, "b2/" + name}, nil); err != nil {
				t.Fatal(err)
			}
			es := rec.take()
			want := []struct {
				op      idem.Op
				outcome idem.Outcome
				class   idem.ErrorClass
				key     string
				items   int
			}{
				{idem.OpClaim, idem.Claimed, idem.ClassNone, key, 1},
				{idem.OpRenew, 0, idem.ClassNone, key, 1},
				{idem.OpConfirm, 0, idem.ClassNone, key, 1},
				{idem.OpClaim, idem.Duplicate, idem.ClassNone, key, 1},
				{idem.OpForget, 0, idem.ClassLeaseLost, key, 1},
				{idem.OpLookup, 0, idem.ClassNotFound, "absent/" + name, 1},
				{idem.OpClaimBatch, 0, idem.ClassNone, "", 2},
			}
			if len(es) != len(want) {
				t.Fatalf("%d events: %+v; want %d", len(es), es, len(want))
			}
			for i, w := range want {
				e := es[i]
				wantHash := ""
				if w.key != "" {
					wantHash = h.Hash(w.key)
				}
				if e.Op != w.op || e.Outcome != w.outcome || e.Class() != w.class || e.KeyHash != wantHash ||
					e.Items != w.items || e.Took <= 0 {
					t.Errorf("event %d = %+v (class %v); want op %v outcome %v class %v hash %q items %d",
						i, e, e.Class(), w.op, w.outcome, w.class, wantHash, w.items)
				}
			}
		})
	}
}

// takeOverSequence claims key three ways and checks TakeOver on each: fresh
// (false), after Forget (false: the failure was reported), and after the
// lease ran out unconfirmed (true). expire lets the lease run out.
func takeOverSequence(t *testing.T, st idem.Store, rec *recorder, expire func()) {
	t.Helper()
	ctx := context.Background()
	c, err := st.Claim(ctx, "job", nil)
	if err != nil || c.Outcome != idem.Claimed || c.TakeOver {
		t.Fatalf("first Claim = %+v, %v; want Claimed, no take-over", c, err)
	}
	if err := st.Forget(ctx, c.Lease); err != nil {
		t.Fatal(err)
	}
	c, err = st.Claim(ctx, "job", nil)
	if err != nil || c.Outcome != idem.Claimed || c.TakeOver {
		t.Fatalf("Claim after Forget = %+v, %v; want Claimed, no take-over", c, err)
	}
	expire()
	c, err = st.Claim(ctx, "job", nil)
	if err != nil || c.Outcome != idem.Claimed || !c.TakeOver {
		t.Fatalf("Claim after the lease ran out = %+v, %v; want Claimed by take-over", c, err)
	}
	var seen []bool
	for _, e := range rec.take() {
		if e.Op == idem.OpClaim {
			seen = append(seen, e.TakeOver)
		}
	}
	if fmt.Sprint(seen) != "[false false true]" {
		t.Errorf("claim events' TakeOver = %v; want [false false true]", seen)
	}
}

func TestClaimTakeOverMemory(t *testing.T) {
	rec := &recorder{}
	b := storetest.MemoryBackend()
	st := must(b.Open(idem.Options{LeaseTTL: time.Second, Observer: rec}))
	takeOverSequence(t, st, rec, func() { b.Advance(2 * time.Second) })
}

// The Logger gets the events that need a human, with keyed hashes for keys,
// and a store outage is one line, not one per operation.
func TestStoreLogsForOperators(t *testing.T) {
	ctx := context.Background()
	var buf bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewJSONHandler(&lockedWriter{w: &buf, mu: &mu}, nil))
	h := mustHasher(t, "a secret shared by the fleet")
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = c.Close() })
	st, err := idem.NewRedisStore(c, idem.RedisOptions{Logger: logger, KeyHasher: h, LeaseTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	const key = "card-4111-1111"
	cl, err := st.Claim(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	m.FastForward(2 * time.Second)
	if err := st.Renew(ctx, cl.Lease); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Renew after expiry = %v", err)
	}
	m.Close()
	for range 10 {
		if _, err := st.Claim(ctx, key, nil); err == nil {
			t.Fatal("Claim on a closed Redis succeeded")
		}
	}
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	if strings.Contains(out, key) {
		t.Errorf("the log holds the raw key:\n%s", out)
	}
	if got := strings.Count(out, `"msg":"idem: lease lost`); got != 1 {
		t.Errorf("%d lease-lost lines; want 1:\n%s", got, out)
	}
	if !strings.Contains(out, `"key_hash":"`+h.Hash(key)+`"`) {
		t.Errorf("no line names the key's keyed hash %s:\n%s", h.Hash(key), out)
	}
	if got := strings.Count(out, `"msg":"idem: store operation failed"`); got != 1 {
		t.Errorf("%d store-failure lines for 10 failures within a second; want 1:\n%s", got, out)
	}
}

// The log tells a take-over of an attempt that crashed from one whose
// holder gave it up saying why (a failed Reconcile), and logs the giving
// up itself; on every store kind, here the memory store's.
func TestTakeOverLogsHowThePriorEnded(t *testing.T) {
	ctx := context.Background()
	var buf bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewJSONHandler(&lockedWriter{w: &buf, mu: &mu}, nil))
	b := storetest.MemoryBackend()
	st := must(b.Open(idem.Options{LeaseTTL: time.Second, Logger: logger}))
	crashed := must(st.Claim(ctx, "crashed", nil))
	gaveUp := must(st.Claim(ctx, "gave-up", nil))
	if err := st.(idem.Abandoner).Abandon(ctx, gaveUp.Lease, "Reconcile failed: ledger unreachable"); err != nil {
		t.Fatal(err)
	}
	inBatch := must(st.Claim(ctx, "in-batch", nil))
	b.Advance(2 * time.Second)
	for _, k := range []string{"crashed", "gave-up"} {
		if c := must(st.Claim(ctx, k, nil)); !c.TakeOver {
			t.Fatalf("Claim(%q) after the lapse: no take-over", k)
		}
	}
	// A batch's take-overs are logged too: where a consumer claims.
	if cs := must(st.(idem.Batcher).ClaimBatch(ctx, []string{"in-batch", "fresh"}, nil)); !cs[0].TakeOver || cs[1].TakeOver {
		t.Fatalf("ClaimBatch after the lapse: take-overs %v, %v; want the first only", cs[0].TakeOver, cs[1].TakeOver)
	}
	mu.Lock()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	mu.Unlock()
	want := [][]string{
		{`"msg":"idem: attempt abandoned unconfirmed`, `"reason":"Reconcile failed: ledger unreachable"`},
		{`"msg":"idem: take-over:`, `"prior_token":` + strconv.FormatInt(crashed.Lease.Token, 10), `"prior_ended":"(its lease ran out: a crash or a stall)"`},
		{`"msg":"idem: take-over:`, `"prior_token":` + strconv.FormatInt(gaveUp.Lease.Token, 10), `"prior_ended":"(abandoned: Reconcile failed: ledger unreachable)"`},
		{`"msg":"idem: take-over:`, `"prior_token":` + strconv.FormatInt(inBatch.Lease.Token, 10), `"prior_ended":"(its lease ran out: a crash or a stall)"`},
	}
	if len(lines) != len(want) {
		t.Fatalf("%d log lines; want 4 (the abandon, three take-overs):\n%s", len(lines), strings.Join(lines, "\n"))
	}
	for i, ws := range want {
		for _, w := range ws {
			if !strings.Contains(lines[i], w) {
				t.Errorf("log line %d lacks %s:\n%s", i+1, w, lines[i])
			}
		}
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestRevealKeys: errors and log lines name a key by its hash unless
// RevealKeys asks for the key itself, for debugging.
func TestRevealKeys(t *testing.T) {
	const key = "customer-ada@example.com"
	for _, reveal := range []bool{false, true} {
		var logs strings.Builder
		logger := slog.New(slog.NewTextHandler(&logs, nil))
		st := memStore(idem.Options{RevealKeys: reveal, Logger: logger, LeaseTTL: idem.MinLeaseTTL, Retention: time.Hour})
		_, err := st.Lookup(t.Context(), key)
		if !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("Lookup = %v; want ErrNotFound", err)
		}
		c, _ := st.Claim(t.Context(), key, nil)
		time.Sleep(idem.MinLeaseTTL + 5*time.Millisecond)
		_ = st.Renew(t.Context(), c.Lease) // lost: logged
		if got := strings.Contains(err.Error(), key); got != reveal {
			t.Errorf("RevealKeys %v: error %q names the key: %v; want %v", reveal, err, got, reveal)
		}
		if got := strings.Contains(logs.String(), key); got != reveal {
			t.Errorf("RevealKeys %v: log %q names the key: %v; want %v", reveal, logs.String(), got, reveal)
		}
		if !strings.Contains(logs.String(), "lease lost") {
			t.Errorf("log = %q; want the lost lease logged", logs.String())
		}
	}
}

type startKey struct{}

// startingObserver records the ops it is started for, and marks the context.
type startingObserver struct {
	name    string
	started []idem.Op
}

func (s *startingObserver) Observe(context.Context, idem.Event) {}

func (s *startingObserver) Start(ctx context.Context, op idem.Op) context.Context {
	s.started = append(s.started, op)
	prev, _ := ctx.Value(startKey{}).(string)
	return context.WithValue(ctx, startKey{}, prev+s.name)
}

type plainObserver struct{}

func (plainObserver) Observe(context.Context, idem.Event) {}

func TestObserversStart(t *testing.T) {
	a, b := &startingObserver{name: "a"}, &startingObserver{name: "b"}
	obs := idem.Observers(a, plainObserver{}, b)
	s, ok := obs.(idem.Starter)
	if !ok {
		t.Fatal("Observers of several is not a Starter")
	}
	ctx := s.Start(context.Background(), idem.OpMessage)
	if got, _ := ctx.Value(startKey{}).(string); got != "ab" {
		t.Errorf("Start chained the contexts as %q; want %q (each on the one before)", got, "ab")
	}
	if len(a.started) != 1 || a.started[0] != idem.OpMessage || len(b.started) != 1 {
		t.Errorf("started a %v, b %v; want one OpMessage each", a.started, b.started)
	}
}

// An Event of an operation that claims nothing prints no outcome: "", as
// its ErrorClass prints "" for no error, not "outcome(0)".
func TestZeroOutcomePrintsNothing(t *testing.T) {
	e := idem.Event{Op: idem.OpConfirm}
	if got := fmt.Sprintf("%v %v %v", e.Op, e.Outcome, e.Class()); got != "confirm  " {
		t.Errorf("a Confirm's event prints %q; want %q", got, "confirm  ")
	}
	if got := idem.Claimed.String(); got != "claimed" {
		t.Errorf("Claimed.String() = %q", got)
	}
}
