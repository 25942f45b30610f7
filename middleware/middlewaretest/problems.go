package middlewaretest

// The problem+json answers: what a client acts on in each error (the
// draft's types, retryable, the key, Retry-After), checked by wantProblem
// in every scenario, and the Problems scenario, the public idempot.dev
// cases among its sequences.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem/middleware"
)

// Problem types the draft defines.
const (
	draft = "https://datatracker.ietf.org/doc/html/draft-ietf-httpapi-idempotency-key-header-07"
	sec21 = draft + "#section-2.1"
	sec22 = draft + "#section-2.2"
	sec26 = draft + "#section-2.6"
)

// problem is what a client acts on in an error answer.
type problem struct {
	status    int
	typ       string
	retryable bool
	key       string // idempotency_key; "" means absent, unless keyEmpty
	keyEmpty  bool   // idempotency_key is present and ""
	header    map[string]string
	detail    string // a substring of detail, when set
}

// wantProblem checks that w is the problem+json want describes, that it
// names its occurrence and shows no internal error text.
func wantProblem(t *testing.T, w *httptest.ResponseRecorder, want problem) {
	t.Helper()
	if w.Code != want.status {
		t.Errorf("status = %d; want %d (body %s)", w.Code, want.status, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type = %q; want application/problem+json", ct)
	}
	for k, v := range want.header {
		if got := w.Header().Get(k); got != v {
			t.Errorf("%s = %q; want %q", k, got, v)
		}
	}
	var p struct {
		Type, Title, Detail, Instance string
		Status                        int
		Retryable                     *bool
		Key                           *string `json:"idempotency_key"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem %q does not decode: %v", w.Body, err)
	}
	if p.Type != want.typ || p.Status != want.status || p.Title == "" {
		t.Errorf("problem = %+v; want type %s, status %d and a title", p, want.typ, want.status)
	}
	if !strings.HasPrefix(p.Instance, "urn:uuid:") || len(p.Instance) != len("urn:uuid:")+36 {
		t.Errorf("instance = %q; want urn:uuid:<UUID>", p.Instance)
	}
	if p.Retryable == nil || *p.Retryable != want.retryable {
		t.Errorf("retryable = %v; want %v", p.Retryable, want.retryable)
	}
	switch {
	case want.keyEmpty && (p.Key == nil || *p.Key != ""):
		t.Errorf("idempotency_key = %v; want \"\"", p.Key)
	case want.keyEmpty:
	case want.key == "" && p.Key != nil:
		t.Errorf("idempotency_key = %q; want it absent", *p.Key)
	case want.key != "" && (p.Key == nil || *p.Key != want.key):
		t.Errorf("idempotency_key = %v; want %q", p.Key, want.key)
	}
	if !strings.Contains(p.Detail, want.detail) {
		t.Errorf("detail = %q; want it to say %q", p.Detail, want.detail)
	}
	if body := w.Body.String(); strings.Contains(body, "secret") || strings.Contains(body, "idem:") {
		t.Errorf("problem %q shows internal error text", body)
	}
}

// step is one request of a problem sequence; a held one is sent in the
// background and blocks until the sequence ends.
type step struct {
	q    req
	hold bool
	want *problem // nil: not an error
}

// problems: every error answer a client acts on, with the draft's type
// where it defines the case, retryable, the client's well-formed key on
// the key's errors, a short Retry-After on 409 and 503; the public
// idempot.dev scenarios among them. None makes a store call before the
// request is known to be well-formed, and none runs the handler.
func problems(t *testing.T, mount Mount) {
	longScope := func(*http.Request) (string, error) { return strings.Repeat("t", 2000), nil }
	for _, c := range []struct {
		name   string
		opts   middleware.Options
		down   bool
		claims bool // the store is asked before the answer
		steps  []step
	}{
		{name: "key missing", opts: middleware.Options{Required: true}, steps: []step{
			{q: req{body: `{}`}, want: &problem{status: 400, typ: sec21}},
		}},
		{name: "key malformed", steps: []step{
			{q: req{key: "a b", body: `{}`}, want: &problem{status: 400, typ: sec21, keyEmpty: true}},
		}},
		{name: "key repeated", steps: []step{
			{q: req{keys: []string{"a", "b"}, body: `{}`}, want: &problem{status: 400, typ: sec21, keyEmpty: true}},
		}},
		{name: "key empty", steps: []step{
			{q: req{keys: []string{""}, body: `{}`}, want: &problem{status: 400, typ: sec21, keyEmpty: true, detail: "empty"}},
			{q: req{keys: []string{`""`}, body: `{}`}, want: &problem{status: 400, typ: sec21, keyEmpty: true, detail: "empty"}},
		}},
		{name: "key too long", steps: []step{
			{q: req{key: strings.Repeat("k", 256), body: `{}`}, want: &problem{status: 400, typ: sec21, keyEmpty: true}},
		}},
		{name: "key refused by the store", claims: true, opts: middleware.Options{Scope: longScope}, steps: []step{
			{q: req{key: "k-1", body: `{}`}, want: &problem{status: 400, typ: sec21, key: "k-1"}},
		}},
		{name: "scope refused", opts: middleware.Options{Scope: func(*http.Request) (string, error) { return "", errDown }}, steps: []step{
			{q: req{key: "k-1", body: `{}`}, want: &problem{status: 400, typ: middleware.TypeScopeInvalid}},
		}},
		{name: "empty scope", opts: middleware.Options{Scope: func(*http.Request) (string, error) { return "", nil }}, steps: []step{
			{q: req{key: "k-1", body: `{}`}, want: &problem{status: 400, typ: middleware.TypeScopeInvalid}},
		}},
		{name: "body too large", opts: middleware.Options{MaxBodyBytes: 4}, steps: []step{
			{q: req{key: "k-1", body: `{"a":1}`}, want: &problem{status: 413, typ: middleware.TypeBodyTooLarge}},
		}},
		{name: "key reused, done", steps: []step{
			{q: req{key: `"k-1"`, body: `{"a":1}`}},
			{q: req{key: `"k-1"`, body: `{"a":2}`}, want: &problem{status: 422, typ: sec22, key: "k-1"}},
		}},
		{name: "key reused, in flight", steps: []step{
			{q: req{key: "k-1", body: `{"a":1}`}, hold: true},
			{q: req{key: "k-1", body: `{"a":2}`}, want: &problem{status: 422, typ: sec22, key: "k-1"}},
		}},
		{name: "in flight", opts: middleware.Options{LockTimeout: 50 * time.Millisecond}, steps: []step{
			{q: req{key: "k-1", body: `{}`}, hold: true},
			{q: req{key: "k-1", body: `{}`}, want: &problem{status: 409, typ: sec26, retryable: true, key: "k-1",
				header: map[string]string{"Retry-After": "1"}, detail: "being processed"}},
		}},
		{name: "in flight, RetryAfter rounded up", opts: middleware.Options{LockTimeout: 50 * time.Millisecond, RetryAfter: 1500 * time.Millisecond}, steps: []step{
			{q: req{key: "k-1", body: `{}`}, hold: true},
			{q: req{key: "k-1", body: `{}`}, want: &problem{status: 409, typ: sec26, retryable: true, key: "k-1",
				header: map[string]string{"Retry-After": "2"}}},
		}},
		{name: "store unavailable", down: true, steps: []step{
			{q: req{key: "k-1", body: `{}`}, want: &problem{status: 503, typ: middleware.TypeStoreUnavailable, retryable: true,
				header: map[string]string{"Retry-After": "1"}}},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newService(t, mount, c.opts)
			s.store.down.Store(c.down)
			runs := int64(0)
			for i, st := range c.steps {
				if st.hold {
					s.hold(st.q)
					runs = -1 // the held handler counts once released
					continue
				}
				calls := s.store.calls.Load()
				w := s.do(st.q)
				if st.want == nil {
					if w.Code >= 400 {
						t.Fatalf("request %d = %d %s; want success", i, w.Code, w.Body)
					}
					runs++
					continue
				}
				t.Run(fmt.Sprint("request ", i), func(t *testing.T) { wantProblem(t, w, *st.want) })
				if (st.want.status == 400 || st.want.status == 413) && !c.claims && s.store.calls.Load() != calls {
					t.Errorf("request %d: %d store calls before its %d; want none", i, s.store.calls.Load()-calls, st.want.status)
				}
			}
			if runs >= 0 {
				s.wantRuns(runs)
			}
		})
	}
}
