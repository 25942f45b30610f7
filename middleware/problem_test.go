package middleware

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
)

// answer is what a client acts on in an error response: the status, the
// headers named (the value "" means absent) and the problem's members.
type answer struct {
	status    int
	header    map[string]string
	typ       string
	retryable bool
	key       string // idempotency_key; "" means absent, unless keyEmpty
	keyEmpty  bool   // idempotency_key is present and ""
	detail    string // a substring of detail, when set
}

// step is one request of a sequence. A held request is sent in the
// background and its handler blocks until the sequence ends.
type step struct {
	q    req
	hold bool
	want *answer // nil: not an error
	code int     // the status of an answer that is not an error, when set
}

// holdHeader marks a request whose handler blocks until released.
const holdHeader = "X-Test-Hold"

// holding answers 201 after blocking the requests that carry holdHeader
// until release is closed.
type holding struct {
	started chan struct{}
	release chan struct{}
}

func (h *holding) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get(holdHeader) != "" {
		h.started <- struct{}{}
		<-h.release
	}
	w.WriteHeader(http.StatusCreated)
}

// runSequence sends steps through the middleware New(o) makes over a
// holding handler and checks each answer.
func runSequence(t *testing.T, o Options, steps []step) {
	t.Helper()
	hd := &holding{started: make(chan struct{}, len(steps)), release: make(chan struct{})}
	h := mustNew(t, o, hd)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(hd.release)
	for i, s := range steps {
		if s.hold {
			if s.q.header == nil {
				s.q.header = map[string]string{}
			}
			s.q.header[holdHeader] = "1"
			wg.Go(func() { do(h, s.q) })
			<-hd.started
			continue
		}
		w := do(h, s.q)
		if s.want != nil {
			checkAnswer(t, i, w, *s.want)
		} else if s.code != 0 && w.Code != s.code {
			t.Errorf("request %d = %d %s; want %d", i, w.Code, w.Body, s.code)
		}
	}
}

// checkAnswer checks w against want, and that its problem names its
// occurrence and shows no internal error text.
func checkAnswer(t *testing.T, i int, w *httptest.ResponseRecorder, want answer) {
	t.Helper()
	wantProblem(t, w, want.status, want.typ)
	for k, v := range want.header {
		if got := w.Header().Get(k); got != v {
			t.Errorf("request %d: %s = %q; want %q", i, k, got, v)
		}
	}
	var p struct {
		Type      string
		Status    int
		Detail    string
		Instance  string
		Retryable *bool
		Key       *string `json:"idempotency_key"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("request %d: problem %q does not decode: %v", i, w.Body, err)
	}
	if !isUUIDURN(p.Instance) {
		t.Errorf("request %d: instance = %q; want urn:uuid:<random UUID>", i, p.Instance)
	}
	if p.Retryable == nil || *p.Retryable != want.retryable {
		t.Errorf("request %d: retryable = %v; want %v (status %d)", i, p.Retryable, want.retryable, want.status)
	}
	switch {
	case want.keyEmpty && (p.Key == nil || *p.Key != ""):
		t.Errorf("request %d: idempotency_key = %v; want \"\"", i, p.Key)
	case want.keyEmpty:
	case want.key == "" && p.Key != nil:
		t.Errorf("request %d: idempotency_key = %q; want it absent", i, *p.Key)
	case want.key != "" && (p.Key == nil || *p.Key != want.key):
		t.Errorf("request %d: idempotency_key = %v; want %q", i, p.Key, want.key)
	}
	if !strings.Contains(p.Detail, want.detail) {
		t.Errorf("request %d: detail = %q; want it to say %q", i, p.Detail, want.detail)
	}
}

// isUUIDURN reports whether s is urn:uuid: and a version 4 UUID.
func isUUIDURN(s string) bool {
	u, ok := strings.CutPrefix(s, "urn:uuid:")
	if !ok || len(u) != 36 || u[14] != '4' {
		return false
	}
	for i, c := range u {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !strings.ContainsRune("0123456789abcdef", c) {
				return false
			}
		}
	}
	return true
}

// #17, deliver 1 and 2: every error answer a client can act on, per case:
// the draft's section where it defines the case, retryable, the client's
// well-formed key on the key's errors, a short Retry-After on 409 and 503.
func TestProblemAnswers(t *testing.T) {
	const (
		sec21 = "https://datatracker.ietf.org/doc/html/draft-ietf-httpapi-idempotency-key-header-07#section-2.1"
		sec22 = "https://datatracker.ietf.org/doc/html/draft-ietf-httpapi-idempotency-key-header-07#section-2.2"
		sec26 = "https://datatracker.ietf.org/doc/html/draft-ietf-httpapi-idempotency-key-header-07#section-2.6"
	)
	longScope := func(*http.Request) (string, error) { return strings.Repeat("t", 2000), nil }
	for _, c := range []struct {
		name  string
		opts  Options // Store is set per backend
		down  bool    // every Claim fails
		steps []step
	}{
		{name: "key missing", opts: Options{Required: true}, steps: []step{
			{q: req{body: `{}`}, want: &answer{status: 400, typ: sec21}},
		}},
		{name: "key malformed", steps: []step{
			{q: req{key: "a b", body: `{}`}, want: &answer{status: 400, typ: sec21, keyEmpty: true}},
		}},
		{name: "key repeated", steps: []step{
			{q: req{keys: []string{"a", "b"}, body: `{}`}, want: &answer{status: 400, typ: sec21, keyEmpty: true}},
		}},
		// The last of the public idempot.dev scenarios: the 400 for an
		// empty key names the key too, as the empty string.
		{name: "key empty", steps: []step{
			{q: req{keys: []string{""}, body: `{}`}, want: &answer{status: 400, typ: sec21, keyEmpty: true, detail: "empty"}},
			{q: req{keys: []string{`""`}, body: `{}`}, want: &answer{status: 400, typ: sec21, keyEmpty: true, detail: "empty"}},
		}},
		{name: "key refused by the store", opts: Options{Scope: longScope}, steps: []step{
			{q: req{key: "k-1", body: `{}`}, want: &answer{status: 400, typ: sec21, key: "k-1"}},
		}},
		{name: "scope refused", opts: Options{Scope: func(*http.Request) (string, error) { return "", errStoreDown }}, steps: []step{
			{q: req{key: "k-1", body: `{}`}, want: &answer{status: 400, typ: TypeScopeInvalid}},
		}},
		// A Scope that finds no principal and says "" would put every such
		// request in one scope, replaying each other's responses.
		{name: "empty scope", opts: Options{Scope: func(*http.Request) (string, error) { return "", nil }}, steps: []step{
			{q: req{key: "k-1", body: `{}`}, want: &answer{status: 400, typ: TypeScopeInvalid}},
			{q: req{key: "k-1", body: `{}`}, want: &answer{status: 400, typ: TypeScopeInvalid}},
		}},
		{name: "body too large", opts: Options{MaxBodyBytes: 4}, steps: []step{
			{q: req{key: "k-1", body: `{"a":1}`}, want: &answer{status: 413, typ: TypeBodyTooLarge}},
		}},
		{name: "key reused, done", steps: []step{
			{q: req{key: `"k-1"`, body: `{"a":1}`}},
			{q: req{key: `"k-1"`, body: `{"a":2}`}, want: &answer{status: 422, typ: sec22, key: "k-1"}},
		}},
		{name: "key reused, in flight", steps: []step{
			{q: req{key: "k-1", body: `{"a":1}`}, hold: true},
			{q: req{key: "k-1", body: `{"a":2}`}, want: &answer{status: 422, typ: sec22, key: "k-1"}},
		}},
		{name: "in flight", opts: Options{LockTimeout: 50 * time.Millisecond}, steps: []step{
			{q: req{key: "k-1", body: `{}`}, hold: true},
			{q: req{key: "k-1", body: `{}`}, want: &answer{status: 409, typ: sec26, retryable: true, key: "k-1",
				header: map[string]string{"Retry-After": "1"}, detail: "being processed"}},
		}},
		{name: "in flight, RetryAfter rounded up", opts: Options{LockTimeout: 50 * time.Millisecond, RetryAfter: 1500 * time.Millisecond}, steps: []step{
			{q: req{key: "k-1", body: `{}`}, hold: true},
			{q: req{key: "k-1", body: `{}`}, want: &answer{status: 409, typ: sec26, retryable: true, key: "k-1",
				header: map[string]string{"Retry-After": "2"}}},
		}},
		{name: "store unavailable", down: true, opts: Options{RetryAfter: 3 * time.Second}, steps: []step{
			{q: req{key: "k-1", body: `{}`}, want: &answer{status: 503, typ: TypeStoreUnavailable, retryable: true,
				header: map[string]string{"Retry-After": "3"}}},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			eachStore(t, func(t *testing.T, s *countingStore) {
				if c.down {
					s.claimErr = errStoreDown
				}
				o := c.opts
				o.Store = s
				o.SingleTenant = o.Scope == nil
				runSequence(t, o, c.steps)
			})
		})
	}
}

// #17: a damaged record is ours, not retryable: the work was done.
func TestProblemRecordDamaged(t *testing.T) {
	mem := memStore(idem.Options{})
	ctx := context.Background()
	h := mustNew(t, Options{SingleTenant: true, Store: mem}, &counter{})
	do(h, req{key: "k", body: "{}"})
	key := storeKey("", "k")
	rec, err := mem.Lookup(ctx, key)
	if err != nil {
		t.Fatalf("Lookup(%q) = %v", key, err)
	}
	mem2 := memStore(idem.Options{})
	cl, _ := mem2.Claim(ctx, key, rec.Fingerprint)
	_ = mem2.Confirm(ctx, cl.Lease, []byte{1, 0, 0})
	runSequence(t, Options{SingleTenant: true, Store: mem2}, []step{
		{q: req{key: "k", body: "{}"}, want: &answer{status: 500, typ: TypeRecordDamaged}},
	})
}

// #17: the instance of a problem is new for each occurrence, and the same
// in the body, the Error hook's Problem, the Logger's line and the
// Observer's event context.
func TestProblemInstanceCorrelates(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	var observed, hooked []string
	obs := observerFunc(func(ctx context.Context, e idem.Event) {
		mu.Lock()
		defer mu.Unlock()
		observed = append(observed, ProblemInstance(ctx))
	})
	s := newCounting()
	s.claimErr = errStoreDown
	h := mustNew(t, Options{
		Store:        s,
		SingleTenant: true,
		Logger:       slog.New(slog.NewJSONHandler(&logs, nil)),
		Observer:     obs,
		Error: func(w http.ResponseWriter, r *http.Request, p *Problem) {
			hooked = append(hooked, p.Instance)
			WriteProblem(w, r, p)
		},
	}, &counter{})
	var bodies []string
	for range 2 {
		w := do(h, req{key: "k", body: "{}"})
		var p Problem
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
			t.Fatalf("problem %q does not decode: %v", w.Body, err)
		}
		bodies = append(bodies, p.Instance)
	}
	if bodies[0] == bodies[1] || !isUUIDURN(bodies[0]) {
		t.Errorf("instances %q; want two distinct urn:uuid: values", bodies)
	}
	var lines []struct {
		Level, Msg, Instance, Type, Err string
		Status                          int
	}
	for l := range strings.Lines(logs.String()) {
		var v struct {
			Level, Msg, Instance, Type, Err string
			Status                          int
		}
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatalf("log line %q does not decode: %v", l, err)
		}
		lines = append(lines, v)
	}
	if len(lines) != 2 || len(observed) != 2 || len(hooked) != 2 {
		t.Fatalf("%d log lines, %d events, %d hook calls; want 2 of each", len(lines), len(observed), len(hooked))
	}
	for i := range 2 {
		if lines[i].Instance != bodies[i] || observed[i] != bodies[i] || hooked[i] != bodies[i] {
			t.Errorf("request %d: instance in body %q, log %q, event %q, hook %q; want one value", i, bodies[i], lines[i].Instance, observed[i], hooked[i])
		}
		if lines[i].Level != "ERROR" || lines[i].Status != 503 || lines[i].Type != TypeStoreUnavailable || !strings.Contains(lines[i].Err, "connection refused") {
			t.Errorf("log line %+v; want level ERROR, status 503, the type, and the cause for the operator", lines[i])
		}
	}
	// A request answered without a problem has no instance.
	s.claimErr = nil
	do(h, req{key: "k2", body: "{}"})
	if got := observed[len(observed)-1]; got != "" {
		t.Errorf("ProblemInstance of a 201's event = %q; want \"\"", got)
	}
}

type observerFunc func(context.Context, idem.Event)

func (f observerFunc) Observe(ctx context.Context, e idem.Event) { f(ctx, e) }
