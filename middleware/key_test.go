package middleware

import (
	"errors"
	"net/http"
	"strings"
	"testing"
)

func TestStoreKeyInjective(t *testing.T) {
	parts := [][2]string{
		{"a:b", "c"},
		{"a", "b:c"},
		{"", "a:bc"},
		{"1:a", "c"},
		{"", "1:a1:c"},
		{"t", "c"},
		{"h2", "k"},
		{"", "h2k"},
	}
	seen := map[string][2]string{}
	for _, p := range parts {
		k := storeKey(p[0], p[1])
		if q, ok := seen[k]; ok {
			t.Errorf("storeKey(%q) = storeKey(%q) = %q; want distinct keys", p, q, k)
		}
		seen[k] = p
	}
	if got, want := storeKey("acme", "abc"), "h24:acme3:abc"; got != want {
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

// The Key option takes the key from elsewhere: a webhook's event id
// deduplicates redeliveries.
func TestKeyOption(t *testing.T) {
	eachStore(t, func(t *testing.T, s *countingStore) {
		var c counter
		h := mustNew(t, Options{SingleTenant: true, Store: s, Key: func(r *http.Request) (string, error) {
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
