package middleware

import (
	"errors"
	"net/http"
	"strings"
	"testing"
)

func TestStoreKeyInjective(t *testing.T) {
	parts := [][4]string{
		{"a:b", "POST", "/x", "c"},
		{"a", "POST", "/x", "b:c"},
		{"", "POST", "/x", "a:bc"},
		{"a", "POST", "/x:", "bc"},
		{"1:a", "POST", "/x", "c"},
		{"", "POST1:", "/x", "c"},
		{"t", "POST", "/x", "c"},
		{"t", "PATCH", "/x", "c"},
		{"t", "POST", "/y", "c"},
		{"h1", "", "", "k"},
		{"", "", "", "h1k"},
	}
	seen := map[string][4]string{}
	for _, p := range parts {
		k := storeKey(p[0], p[1], p[2], p[3])
		if q, ok := seen[k]; ok {
			t.Errorf("storeKey(%q) = storeKey(%q) = %q; want distinct keys", p, q, k)
		}
		seen[k] = p
	}
	if got, want := storeKey("", "POST", "/orders", "abc"), "h10:4:POST7:/orders3:abc"; got != want {
		t.Errorf("storeKey = %q; want %q (the documented encoding)", got, want)
	}
}

// Two tenants sending one key get independent results; a Scope error is
// 400 unless the hook says otherwise.
func TestScopeSeparatesTenants(t *testing.T) {
	s := newCounting()
	var c counter
	scope := func(r *http.Request) (string, error) {
		if t := r.Header.Get("X-Tenant"); t != "" {
			return t, nil
		}
		return "", errors.New("no tenant: secret internals")
	}
	h := mustNew(t, Options{Store: s, Scope: scope}, &c)
	a := do(h, req{key: "k", body: "{}", header: map[string]string{"X-Tenant": "a"}})
	b := do(h, req{key: "k", body: "{}", header: map[string]string{"X-Tenant": "b"}})
	if runOf(t, a.Body.String()) != 1 || runOf(t, b.Body.String()) != 2 || b.Header().Get(HeaderReplayed) != "" {
		t.Errorf("tenant b got %q %v after a's %q; want its own run, not a's replay", b.Body, b.Header(), a.Body)
	}
	wantProblem(t, do(h, req{key: "k", body: "{}"}), 400, TypeScopeInvalid)

	hooked := mustNew(t, Options{Store: s, Scope: scope, Error: func(w http.ResponseWriter, r *http.Request, p *Problem) {
		if p.Type == TypeScopeInvalid {
			p.Status = http.StatusUnauthorized
		}
		WriteProblem(w, r, p)
	}}, &c)
	if w := do(hooked, req{key: "k", body: "{}"}); w.Code != 401 || strings.Contains(w.Body.String(), "secret") {
		t.Errorf("hooked scope error = %d %q; want the hook's 401, no internal text", w.Code, w.Body)
	}
}

// Wrapping a whole ServeMux: the route is the mux's pattern, so one key on
// two endpoints is two records, and one key on two resources of one
// endpoint is a different request (422).
func TestRouteFromWrappedMux(t *testing.T) {
	s := newCounting()
	var c counter
	mux := http.NewServeMux()
	mux.Handle("POST /orders/{id}", &c)
	mux.Handle("POST /refunds/{id}", &c)
	h := mustNew(t, Options{Store: s}, mux)

	if w := do(h, req{key: "k", path: "/orders/1", body: "{}"}); w.Code != 201 {
		t.Fatalf("POST /orders/1 = %d; want 201", w.Code)
	}
	if w := do(h, req{key: "k", path: "/refunds/1", body: "{}"}); w.Code != 201 || w.Header().Get(HeaderReplayed) != "" {
		t.Errorf("POST /refunds/1 = %d %v; want its own 201, not a replay", w.Code, w.Header())
	}
	wantProblem(t, do(h, req{key: "k", path: "/orders/2", body: "{}"}), 422, TypeFingerprintMismatch)
	keys := s.claimedKeys()
	if len(keys) != 3 || !strings.Contains(keys[0], "POST /orders/{id}") || !strings.Contains(keys[1], "POST /refunds/{id}") {
		t.Errorf("store keys = %q; want the mux's patterns in them", keys)
	}
	if c.runs.Load() != 2 {
		t.Errorf("handler ran %d times; want 2", c.runs.Load())
	}
}

// Inside a ServeMux route the middleware sees r.Pattern; a Route option
// wins over it; without either the path names the route.
func TestRouteSources(t *testing.T) {
	for name, tc := range map[string]struct {
		route func(*http.Request) string
		inMux bool
		mux   bool // the middleware wraps a handler that calls the mux
		want  string
	}{
		"r.Pattern":    {inMux: true, want: "POST /items/{id}"},
		"Route option": {inMux: true, route: func(*http.Request) string { return "custom" }, want: "6:custom"},
		"path":         {want: "/items/9"},
		"empty Route":  {route: func(*http.Request) string { return "" }, want: "8:/items/9"}, // chi under r.Use (#17)
		"Mux option":   {mux: true, want: "POST /items/{id}"},
	} {
		t.Run(name, func(t *testing.T) {
			s := newCounting()
			o := Options{Store: s, Route: tc.route}
			var h http.Handler = &counter{}
			if tc.mux {
				mux := http.NewServeMux()
				mux.Handle("POST /items/{id}", h)
				o.Mux = mux
				h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { mux.ServeHTTP(w, r) })
			}
			mw, err := New(o)
			if err != nil {
				t.Fatal(err)
			}
			h = mw(h)
			if tc.inMux {
				mux := http.NewServeMux()
				mux.Handle("POST /items/{id}", h)
				h = mux
			}
			do(h, req{key: "k", path: "/items/9", body: "{}"})
			if keys := s.claimedKeys(); len(keys) != 1 || !strings.Contains(keys[0], tc.want) {
				t.Errorf("store keys = %q; want one holding %q", keys, tc.want)
			}
		})
	}
}

// The Key option takes the key from elsewhere: a webhook's event id
// deduplicates redeliveries.
func TestKeyOption(t *testing.T) {
	eachStore(t, func(t *testing.T, s *countingStore) {
		var c counter
		h := mustNew(t, Options{Store: s, Key: func(r *http.Request) (string, error) {
			id := r.Header.Get("Webhook-Id")
			if strings.ContainsRune(id, ' ') {
				return "", errors.New("secret: bad id")
			}
			return id, nil
		}}, &c)
		event := req{body: `{"type":"paid"}`, header: map[string]string{"Webhook-Id": "evt_1"}}
		first, second := do(h, event), do(h, event)
		if first.Code != 201 || second.Code != 201 || second.Header().Get(HeaderReplayed) != "true" || c.runs.Load() != 1 {
			t.Errorf("deliveries = %d, %d (replayed %q) after %d runs; want 201, a 201 replay, 1 run",
				first.Code, second.Code, second.Header().Get(HeaderReplayed), c.runs.Load())
		}
		wantProblem(t, do(h, req{body: "{}", header: map[string]string{"Webhook-Id": "a b"}}), 400, TypeKeyInvalid)
		wantProblem(t, do(h, req{body: "{}", header: map[string]string{"Webhook-Id": strings.Repeat("x", 256)}}), 400, TypeKeyInvalid)
		if w := do(h, req{body: "{}"}); w.Code != 201 || c.runs.Load() != 2 {
			t.Errorf("no event id = %d after %d runs; want a pass-through", w.Code, c.runs.Load())
		}
	})
}
