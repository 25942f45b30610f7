package idemotel_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/middleware"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

func attrKey(k string) attribute.Key { return attribute.Key(k) }

func attr(s sdktrace.ReadOnlySpan, k string) (string, bool) {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == k {
			return kv.Value.String(), true
		}
	}
	return "", false
}

// byName returns the ended spans called name.
func byName(spans []sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// childrenOf returns the names of parent's children, in end order.
func childrenOf(spans []sdktrace.ReadOnlySpan, parent sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, s := range spans {
		if s.Parent().SpanID() == parent.SpanContext().SpanID() {
			out = append(out, s.Name())
		}
	}
	return out
}

func post(t *testing.T, h http.Handler, key, body string) int {
	t.Helper()
	r := httptest.NewRequest("POST", "/orders", strings.NewReader(body))
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code
}

// The middleware's requests are spans with their outcome and key hash;
// the store calls each made, and the handler's own span, are children;
// operations are counted by op, outcome and error class.
func TestMiddlewareOnMemoryStore(t *testing.T) {
	s := newSDK(t)
	hasher, _ := idem.NewKeyHasher([]byte("a secret the fleet shares"))
	store := memStore(idem.Options{Observer: s.obs, KeyHasher: hasher})
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, span := s.tp.Tracer("app").Start(r.Context(), "app.create_order")
		span.End()
		w.WriteHeader(201)
	})
	mw, err := middleware.New(middleware.Options{Store: store, SingleTenant: true, Observer: s.obs, KeyHasher: hasher})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(handler)
	for i, c := range []struct {
		key, body string
		status    int
	}{{"k1", "a", 201}, {"k1", "a", 201}, {"k1", "b", 422}, {"k2", "a", 201}} {
		if got := post(t, h, c.key, c.body); got != c.status {
			t.Fatalf("request %d = %d; want %d", i, got, c.status)
		}
	}

	spans := s.spans.Ended()
	reqs := byName(spans, "idem.request")
	if len(reqs) != 4 {
		t.Fatalf("%d idem.request spans; want 4", len(reqs))
	}
	wantOutcome := []string{"claimed", "duplicate", "duplicate", "claimed"}
	wantChildren := [][]string{
		{"idem.claim", "app.create_order", "idem.confirm"}, // the handler ran between claim and confirm
		{"idem.claim"},
		{"idem.claim"},
		{"idem.claim", "app.create_order", "idem.confirm"},
	}
	for i, r := range reqs {
		if got, _ := attr(r, "idem.outcome"); got != wantOutcome[i] {
			t.Errorf("request %d: idem.outcome = %q; want %q", i, got, wantOutcome[i])
		}
		if got, _ := attr(r, "idem.key_hash"); got == "" || strings.Contains(got, "k1") {
			t.Errorf("request %d: idem.key_hash = %q; want a hash", i, got)
		}
		if r.Parent().IsValid() {
			t.Errorf("request %d has a parent; want a root span", i)
		}
		got := childrenOf(spans, r)
		if strings.Join(got, ",") != strings.Join(wantChildren[i], ",") {
			t.Errorf("request %d: children %v; want %v", i, got, wantChildren[i])
		}
	}
	if et, _ := attr(reqs[2], "error.type"); et != "conflict" {
		t.Errorf("the 422's error.type = %q; want conflict", et)
	}
	if reqs[2].Status().Code == codes.Error {
		t.Error("a 422 (conflict) is an Error span; want an answer, not a fault")
	}
	for _, c := range byName(spans, "idem.claim") {
		if !c.StartTime().Before(c.EndTime()) || c.StartTime().Before(reqStartOf(spans, c)) {
			t.Errorf("claim span %v..%v not within its request", c.StartTime(), c.EndTime())
		}
	}

	for _, c := range []struct {
		attrs map[string]string
		want  int64
	}{
		{map[string]string{"op": "request", "outcome": "claimed", "error_class": ""}, 2},
		{map[string]string{"op": "request", "outcome": "duplicate", "error_class": ""}, 1},
		{map[string]string{"op": "request", "outcome": "duplicate", "error_class": "conflict"}, 1},
		{map[string]string{"op": "claim", "outcome": "claimed"}, 2},
		{map[string]string{"op": "claim", "outcome": "duplicate"}, 2},
		{map[string]string{"op": "confirm", "outcome": "", "error_class": ""}, 2},
	} {
		if got := s.count(t, "idem.operations", c.attrs); got != c.want {
			t.Errorf("idem.operations%v = %d; want %d", c.attrs, got, c.want)
		}
	}
	hist, ok := s.metrics(t)["idem.operation.duration"].(metricdata.Histogram[float64])
	if !ok {
		t.Fatal("no idem.operation.duration histogram")
	}
	var n uint64
	for _, p := range hist.DataPoints {
		if _, hasKey := p.Attributes.Value("idem.key_hash"); hasKey {
			t.Error("a metric carries the key hash; want it on spans only")
		}
		if v, _ := p.Attributes.Value("op"); v.AsString() == "request" {
			n += p.Count
			if len(p.Bounds) != 16 || p.Bounds[0] != 0.0001 || p.Sum <= 0 {
				t.Errorf("request durations: bounds %v, sum %v; want the 16 documented buckets and a positive sum", p.Bounds, p.Sum)
			}
		}
	}
	if n != 4 {
		t.Errorf("%d request durations; want 4", n)
	}
}

// reqStartOf is the start of c's parent.
func reqStartOf(spans []sdktrace.ReadOnlySpan, c sdktrace.ReadOnlySpan) time.Time {
	for _, s := range spans {
		if s.SpanContext().SpanID() == c.Parent().SpanID() {
			return s.StartTime()
		}
	}
	return time.Time{}
}

// A store operation outside any request or message is a span only when
// its context carries a recording span; it is counted either way.
func TestStoreOutsideSpans(t *testing.T) {
	s := newSDK(t)
	store := memStore(idem.Options{Observer: s.obs})
	ctx := context.Background()
	if _, err := store.Claim(ctx, "bare", nil); err != nil {
		t.Fatal(err)
	}
	if n := len(s.spans.Ended()); n != 0 {
		t.Errorf("%d spans for a store call outside any trace; want 0", n)
	}
	ctx, parent := s.tp.Tracer("app").Start(ctx, "app.job")
	if _, err := store.Lookup(ctx, "nothing-here"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatal(err)
	}
	parent.End()
	spans := s.spans.Ended()
	lookups := byName(spans, "idem.lookup")
	if len(lookups) != 1 || lookups[0].Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Fatalf("lookup spans %v; want one, child of the caller's span", lookups)
	}
	if et, _ := attr(lookups[0], "error.type"); et != "not_found" {
		t.Errorf("lookup error.type = %q; want not_found", et)
	}
	if got := s.count(t, "idem.operations", map[string]string{"op": "claim", "outcome": "claimed"}); got != 1 {
		t.Errorf("claims counted %d; want 1", got)
	}
}

// On the real Redis: consumer messages are spans with their store calls as
// children; a late confirm and a lost lease are counted. (Redis cannot
// tell a take-over: an expired claim's key is gone; see
// TestTakeOverOnMemoryStore.)
func TestConsumerOnRedis(t *testing.T) {
	s := newSDK(t)
	c := testRedis(t)
	prefix := fmt.Sprintf("idemotel:%s:%d:", t.Name(), time.Now().UnixNano())
	store, err := idem.NewRedisStore(c, idem.RedisOptions{Prefix: prefix, Observer: s.obs, LeaseTTL: idem.MinLeaseTTL})
	if err != nil {
		t.Fatal(err)
	}
	// The consumer's own calls run on a store of the same records with the
	// default lease: with the shortest lease, a Confirm delayed by a busy machine would
	// be one more late confirm than the one this test makes on purpose.
	patient, err := idem.NewRedisStore(c, idem.RedisOptions{Prefix: prefix, Observer: s.obs})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	// A worker that died holding "crashed": its claim expires.
	if cl, err := store.Claim(ctx, "crashed", nil); err != nil || cl.Outcome != idem.Claimed {
		t.Fatalf("Claim(crashed) = %v, %v", cl.Outcome, err)
	}
	time.Sleep(idem.MinLeaseTTL + 60*time.Millisecond)
	// A worker that stalls past its lease, then confirms late.
	stalled, err := store.Claim(ctx, "stalled", nil)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(idem.MinLeaseTTL + 60*time.Millisecond)
	if _, err := store.Claim(ctx, "stalled", nil); err != nil { // its successor
		t.Fatal(err)
	}
	if err := store.Confirm(ctx, stalled.Lease, nil); err != nil {
		t.Fatal(err)
	}
	if err := store.Renew(ctx, stalled.Lease); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Renew of a taken-over lease = %v; want ErrLeaseLost", err)
	}

	h := consumer.Idempotent(patient, func(k string) string { return k },
		func(context.Context, string) error { return nil }, consumer.Options[string]{Observer: s.obs})
	for _, k := range []string{"crashed", "fresh", "fresh"} {
		if err := h(ctx, k); err != nil {
			t.Fatalf("message %s: %v", k, err)
		}
	}
	spans := s.spans.Ended()
	msgs := byName(spans, "idem.message")
	if len(msgs) != 3 {
		t.Fatalf("%d idem.message spans; want 3", len(msgs))
	}
	if got := strings.Join(childrenOf(spans, msgs[0]), ","); got != "idem.claim,idem.confirm" {
		t.Errorf("first message's children %s; want idem.claim,idem.confirm", got)
	}
	if got := strings.Join(childrenOf(spans, msgs[2]), ","); got != "idem.claim" {
		t.Errorf("duplicate message's children %s; want idem.claim", got)
	}
	if o, _ := attr(msgs[2], "idem.outcome"); o != "duplicate" {
		t.Errorf("duplicate message's idem.outcome = %q", o)
	}

	for _, c := range []struct {
		name  string
		attrs map[string]string
		want  int64
	}{
		{"idem.late_confirms", map[string]string{"op": "confirm"}, 1},
		{"idem.operations", map[string]string{"op": "renew", "error_class": "lease_lost"}, 1},
		{"idem.operations", map[string]string{"op": "message", "outcome": "claimed"}, 2},
		{"idem.operations", map[string]string{"op": "message", "outcome": "duplicate"}, 1},
	} {
		if got := s.count(t, c.name, c.attrs); got != c.want {
			t.Errorf("%s%v = %d; want %d", c.name, c.attrs, got, c.want)
		}
	}
}

// A store failure is an Error span and counted with class store.
func TestStoreFailureOnRedis(t *testing.T) {
	s := newSDK(t)
	c := testRedis(t)
	store := redisStore(t, c, idem.Options{Observer: s.obs})
	ctx, cancel := context.WithCancel(context.Background())
	h := consumer.Idempotent(store, func(k string) string { return k },
		func(context.Context, string) error { return nil }, consumer.Options[string]{Observer: s.obs})
	cancel()
	if err := h(ctx, "k"); err == nil {
		t.Fatal("a message on a cancelled context succeeded")
	}
	if got := s.count(t, "idem.operations", map[string]string{"op": "message", "error_class": "canceled"}); got != 1 {
		t.Errorf("cancelled messages counted %d; want 1", got)
	}
	_ = c.Close() // the store's client is gone: a store failure
	if err := h(context.Background(), "k2"); err == nil {
		t.Fatal("a message on a closed client succeeded")
	}
	msgs := byName(s.spans.Ended(), "idem.message")
	last := msgs[len(msgs)-1]
	if et, _ := attr(last, "error.type"); et != "store" || last.Status().Code != codes.Error {
		t.Errorf("store failure span: error.type %q, status %v; want store, Error", et, last.Status())
	}
	if got := s.count(t, "idem.operations", map[string]string{"op": "claim", "error_class": "store"}); got != 1 {
		t.Errorf("failed claims counted %d; want 1", got)
	}
}

// A claim that replaced an expired one is counted and marked on its span.
func TestTakeOverOnMemoryStore(t *testing.T) {
	s := newSDK(t)
	store := memStore(idem.Options{Observer: s.obs, LeaseTTL: idem.MinLeaseTTL})
	ctx := context.Background()
	if _, err := store.Claim(ctx, "crashed", nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(idem.MinLeaseTTL + 20*time.Millisecond)
	h := consumer.Idempotent(store, func(k string) string { return k },
		func(context.Context, string) error { return nil }, consumer.Options[string]{Observer: s.obs})
	if err := h(ctx, "crashed"); err != nil {
		t.Fatal(err)
	}
	claims := byName(s.spans.Ended(), "idem.claim")
	if len(claims) != 1 {
		t.Fatalf("%d claim spans; want 1 (the first claim ran outside any span)", len(claims))
	}
	if to, _ := attr(claims[0], "idem.take_over"); to != "true" {
		t.Errorf("the take-over claim's idem.take_over = %q; want true", to)
	}
	if got := s.count(t, "idem.takeovers", map[string]string{"op": "claim"}); got != 1 {
		t.Errorf("idem.takeovers = %d; want 1", got)
	}
	// The message's own event is marked too: the wrapper took the key over.
	if got := s.count(t, "idem.takeovers", map[string]string{"op": "message"}); got != 1 {
		t.Errorf("idem.takeovers{op=message} = %d; want 1", got)
	}
}

// Every Op reaches the metrics without a panic, the newest (abandon, from
// Do's failed Reconcile) under its name, and one this release does not
// know under "op".
func TestEveryOpObserved(t *testing.T) {
	s := newSDK(t)
	ctx := context.Background()
	for op := range idem.Op(40) {
		for out := range idem.Outcome(5) {
			s.obs.Observe(ctx, idem.Event{Op: op, Outcome: out, Items: 1})
		}
	}
	store := memStore(idem.Options{Observer: s.obs, LeaseTTL: idem.MinLeaseTTL})
	if _, err := store.Claim(ctx, "crashed", nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(idem.MinLeaseTTL + 20*time.Millisecond)
	errDown := errors.New("ledger unreachable")
	_, err := idem.Do(ctx, store, "crashed", func(context.Context) (int, error) { return 1, nil },
		idem.DoOptions{Reconcile: func(context.Context, *idem.TakeOver) (any, bool, error) { return nil, false, errDown }})
	if !errors.Is(err, errDown) {
		t.Fatalf("Do with a failing Reconcile = %v; want its error", err)
	}
	// 4 events of the loop above (outcome 4 is unknown: "op"), and Do's
	// Abandon.
	if got := s.count(t, "idem.operations", map[string]string{"op": "abandon"}); got != 5 {
		t.Errorf("idem.operations{op=abandon} = %d; want 5", got)
	}
	if got := s.count(t, "idem.operations", map[string]string{"op": "op"}); got == 0 {
		t.Errorf("idem.operations{op=op} = 0; want the unknown Ops counted under \"op\"")
	}
}

// A key quarantined after repeated crashes: the refused Claim and the
// message that made it are counted in idem.quarantines, and in
// idem.operations with error_class quarantined, on their spans too.
func TestQuarantineCounted(t *testing.T) {
	s := newSDK(t)
	store := memStore(idem.Options{Observer: s.obs, LeaseTTL: idem.MinLeaseTTL, MaxTakeOvers: 1})
	ctx := context.Background()
	for range 2 { // the first attempt and one take-over, each crashed
		if _, err := store.Claim(ctx, "poison", nil); err != nil {
			t.Fatal(err)
		}
		time.Sleep(idem.MinLeaseTTL + 20*time.Millisecond)
	}
	h := consumer.Idempotent(store, func(k string) string { return k },
		func(context.Context, string) error { return nil }, consumer.Options[string]{Observer: s.obs})
	if err := h(ctx, "poison"); !errors.Is(err, idem.ErrQuarantined) {
		t.Fatalf("handling a quarantined key = %v; want ErrQuarantined", err)
	}
	for _, op := range []string{"claim", "message"} {
		if got := s.count(t, "idem.quarantines", map[string]string{"op": op}); got != 1 {
			t.Errorf("idem.quarantines{op=%s} = %d; want 1", op, got)
		}
		if got := s.count(t, "idem.operations", map[string]string{"op": op, "error_class": "quarantined"}); got != 1 {
			t.Errorf("idem.operations{op=%s,error_class=quarantined} = %d; want 1", op, got)
		}
	}
	msgs := byName(s.spans.Ended(), "idem.message")
	if et, _ := attr(msgs[len(msgs)-1], "error.type"); et != "quarantined" {
		t.Errorf("the quarantined message's span error.type = %q; want quarantined", et)
	}
}

// The keys an idem.Cache answered and passed on are counted by result,
// each operation once in idem.operations.
func TestCacheHitsAndMisses(t *testing.T) {
	s := newSDK(t)
	store := memStore(idem.Options{Observer: s.obs})
	cache := must(idem.NewCache(store, idem.CacheOptions{Observer: s.obs}))
	ctx := context.Background()
	h := consumer.Idempotent[string](cache, func(k string) string { return k },
		func(context.Context, string) error { return nil }, consumer.Options[string]{Observer: s.obs})
	for _, k := range []string{"a", "a", "a", "a"} {
		if err := h(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cache.ClaimBatch(ctx, []string{"a", "b"}, nil); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		attrs map[string]string
		want  int64
	}{
		// a: claimed (miss), duplicate from the store (miss), then twice
		// from memory; the batch answers a from memory and passes b on.
		{"idem.cache.keys", map[string]string{"op": "claim", "result": "miss"}, 2},
		{"idem.cache.keys", map[string]string{"op": "claim", "result": "hit"}, 2},
		{"idem.cache.keys", map[string]string{"op": "claim_batch", "result": "hit"}, 1},
		{"idem.cache.keys", map[string]string{"op": "claim_batch", "result": "miss"}, 1},
		{"idem.operations", map[string]string{"op": "claim", "outcome": "duplicate"}, 3},
		{"idem.operations", map[string]string{"op": "claim", "outcome": "claimed"}, 1},
	} {
		if got := s.count(t, c.name, c.attrs); got != c.want {
			t.Errorf("%s%v = %d; want %d", c.name, c.attrs, got, c.want)
		}
	}
	claims := byName(s.spans.Ended(), "idem.claim")
	if len(claims) != 4 {
		t.Fatalf("%d claim spans; want 4", len(claims))
	}
	if r, _ := attr(claims[3], "idem.cache"); r != "hit" {
		t.Errorf("last claim span's idem.cache = %q; want hit", r)
	}
}

// memStore is idem.NewMemoryStore for tests, whose options are valid.
func memStore(o idem.Options) *idem.MemoryStore {
	return must(idem.NewMemoryStore(o))
}

// must returns v, or panics with err: for constructors given options a
// test knows are valid.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
