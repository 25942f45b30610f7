package middleware

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/idemgo/idem"
)

// keptByDefault is the table of the package documentation's Keep rules,
// written out: 2xx, 3xx, and the 4xx that fault the request itself.
func keptByDefault(status int) bool {
	switch {
	case 200 <= status && status < 400:
		return true
	case status == 400, status == 410, status == 413, status == 414, status == 415, status == 422:
		return true
	}
	return false
}

// Statuses that say the work did not happen and may on a later try: never
// recorded by default, or the key is poisoned for the whole retention.
var neverKept = []int{401, 402, 403, 404, 405, 406, 407, 408, 409, 411, 412, 416, 417, 421, 423, 424, 425, 426, 428, 429, 431, 451,
	500, 501, 502, 503, 504, 507, 599}

func TestDefaultKeep(t *testing.T) {
	for status := 100; status <= 999; status++ {
		if got, want := DefaultKeep(status), keptByDefault(status); got != want {
			t.Errorf("DefaultKeep(%d) = %t; want %t", status, got, want)
		}
	}
	for _, status := range neverKept {
		if DefaultKeep(status) {
			t.Errorf("DefaultKeep(%d) = true; want false: a retry may succeed", status)
		}
	}
}

// #25, deliver 1: a handler's 429, 401, 409, a mux's 404 or 405 is not
// replayed: the client's retry with the same key runs the handler again
// and gets its answer of now. Before, every status below 500 was recorded
// and replayed for the whole retention.
func TestTransientAnswersNotRecorded(t *testing.T) {
	eachStore(t, func(t *testing.T, s *countingStore) {
		for _, status := range neverKept {
			t.Run(strconv.Itoa(status), func(t *testing.T) {
				runs := 0
				h := mustNew(t, Options{SingleTenant: true, Store: s}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					runs++
					if runs == 1 {
						w.WriteHeader(status) // rate limited, token expired, ...
						return
					}
					w.WriteHeader(http.StatusCreated)
					fmt.Fprint(w, "done")
				}))
				key := "transient-" + strconv.Itoa(status)
				if w := do(h, req{key: key, body: "{}"}); w.Code != status {
					t.Fatalf("first = %d; want the handler's %d", w.Code, status)
				}
				w := do(h, req{key: key, body: "{}"})
				if w.Code != http.StatusCreated || w.Header().Get(HeaderReplayed) != "" || runs != 2 {
					t.Errorf("retry after %d = %d (replayed %q) after %d runs; want the handler's 201, 2 runs",
						status, w.Code, w.Header().Get(HeaderReplayed), runs)
				}
			})
		}
	})
}

// A mux's own 404 and 405 (a misrouted request, a method the route does
// not serve) are not recorded either: sent again, each is the mux's answer
// of now, the 405 with its Allow, and the key is free for the corrected
// request.
func TestMuxAnswersNotRecorded(t *testing.T) {
	var c counter
	mux := http.NewServeMux()
	mux.Handle("POST /orders", &c)
	mux.Handle("PUT /refunds", &c)
	h := mustNew(t, Options{SingleTenant: true, Store: newCounting()}, mux)
	for _, tc := range []struct {
		q      req
		status int
	}{
		{req{key: "k404", path: "/order", body: "{}"}, 404},
		{req{key: "k405", path: "/refunds", body: "{}"}, 405},
	} {
		for i := range 2 {
			w := do(h, tc.q)
			if w.Code != tc.status || w.Header().Get(HeaderReplayed) != "" {
				t.Errorf("POST %s, time %d = %d (replayed %q); want the mux's %d", tc.q.path, i+1, w.Code, w.Header().Get(HeaderReplayed), tc.status)
			}
			if tc.status == 405 && w.Header().Get("Allow") == "" {
				t.Errorf("POST %s, time %d: no Allow; want the mux's", tc.q.path, i+1)
			}
		}
		q := req{key: tc.q.key, body: "{}"}
		if w := do(h, q); w.Code != 201 || w.Header().Get(HeaderReplayed) != "" {
			t.Errorf("%s, then POST /orders = %d %v; want the handler's 201", tc.q.key, w.Code, w.Header())
		}
	}
}

// #25, deliver 1: a replay carries the headers its status needs
// (Location, Content-Range, Accept-*, Retry-After, and Allow for a Keep
// that records a 405), never a credential or a challenge.
func TestReplayCarriesStatusHeaders(t *testing.T) {
	keepAll := func(status int) bool { return status < 500 }
	for _, tc := range []struct {
		status int
		keep   func(int) bool
		header map[string]string
	}{
		{201, nil, map[string]string{"Location": "/orders/1", "Content-Location": "/orders/1"}},
		{303, nil, map[string]string{"Location": "/orders/1"}},
		{206, nil, map[string]string{"Content-Range": "bytes 0-1/2"}},
		{413, nil, map[string]string{"Retry-After": "30"}},
		{415, nil, map[string]string{"Accept": "application/json", "Accept-Encoding": "gzip", "Accept-Patch": "application/merge-patch+json", "Accept-Post": "application/json"}},
		{405, keepAll, map[string]string{"Allow": "GET, HEAD"}},
		{429, keepAll, map[string]string{"Retry-After": "7"}},
	} {
		t.Run(strconv.Itoa(tc.status), func(t *testing.T) {
			runs := 0
			h := mustNew(t, Options{SingleTenant: true, Store: newCounting(), Keep: tc.keep}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs++
				for k, v := range tc.header {
					w.Header().Set(k, v)
				}
				w.Header().Set("Set-Cookie", "session=s3cret")
				w.Header().Set("WWW-Authenticate", `Bearer realm="x"`)
				w.WriteHeader(tc.status)
			}))
			do(h, req{key: "k", body: "{}"})
			w := do(h, req{key: "k", body: "{}"})
			if w.Code != tc.status || w.Header().Get(HeaderReplayed) != "true" || runs != 1 {
				t.Fatalf("retry = %d (replayed %q) after %d runs; want a replay of %d", w.Code, w.Header().Get(HeaderReplayed), runs, tc.status)
			}
			for k, v := range tc.header {
				if got := w.Header().Get(k); got != v {
					t.Errorf("replay's %s = %q; want %q", k, got, v)
				}
			}
			for _, k := range []string{"Set-Cookie", "Www-Authenticate"} {
				if got, ok := w.Header()[k]; ok {
					t.Errorf("replay's %s = %q; want none", k, got)
				}
			}
		})
	}
}

// A refusal of a header the fingerprint does not cover (428: If-Match
// missing) is not recorded: the retry that adds the header is the same
// request to the middleware, and must run, not get the refusal back.
func TestHeaderRefusalNotReplayed(t *testing.T) {
	store, err := idem.NewMemoryStore(idem.Options{})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := New(Options{Store: store, SingleTenant: true, Methods: []string{"PATCH"}})
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		if r.Header.Get("If-Match") == "" {
			w.WriteHeader(http.StatusPreconditionRequired)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	for i, ifMatch := range []string{"", `"v1"`} {
		r := httptest.NewRequest("PATCH", "/orders/1", strings.NewReader(`{"qty":2}`))
		r.Header.Set(DefaultHeader, "k-1")
		if ifMatch != "" {
			r.Header.Set("If-Match", ifMatch)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if want := []int{428, 200}[i]; w.Code != want || w.Header().Get(HeaderReplayed) != "" {
			t.Errorf("PATCH %d (If-Match %q) = %d, replayed %q; want %d, not replayed", i+1, ifMatch, w.Code, w.Header().Get(HeaderReplayed), want)
		}
	}
	if runs != 2 {
		t.Errorf("handler ran %d times; want 2 (the retry with If-Match runs)", runs)
	}
}
