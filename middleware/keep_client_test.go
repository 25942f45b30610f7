package middleware_test

import (
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/client"
	"github.com/idemgo/idem/middleware"
)

// handlerTransport serves a client's requests with a handler, in process.
type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	in := r.Clone(r.Context())
	in.RequestURI = r.URL.RequestURI() // as the server sets it
	w := httptest.NewRecorder()
	t.h.ServeHTTP(w, in)
	return w.Result(), nil
}

// #25, deliver 1: a status that the client package's transport retries is
// never kept by default, whatever that set is: were it kept, the retry
// the transport makes with the same key would get the same answer again
// for the whole retention. For every status, a handler answers it once and
// 201 afterwards; where the transport retried, its retry must have reached
// the handler.
func TestClientRetriesAreNotKept(t *testing.T) {
	store, err := idem.NewMemoryStore(idem.Options{})
	if err != nil {
		t.Fatal(err)
	}
	runs := map[string]int{}
	idempotent, err := middleware.New(middleware.Options{Store: store, SingleTenant: true})
	if err != nil {
		t.Fatal(err)
	}
	h := idempotent(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		runs[key]++
		if runs[key] == 1 {
			var status int
			_, _ = fmt.Sscan(r.URL.Query().Get("status"), &status)
			w.WriteHeader(status)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	retried := 0
	for status := 200; status <= 599; status++ {
		var first client.Attempt
		tr, err := client.New(client.Options{
			Base: handlerTransport{h}, MaxAttempts: 2, InitialWait: time.Millisecond, MaxWait: time.Millisecond,
			OnAttempt: func(a client.Attempt) {
				if a.N == 1 {
					first = a
				}
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		r, err := http.NewRequest("POST", fmt.Sprintf("http://api.test/orders?status=%d", status), strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := tr.RoundTrip(r)
		if err != nil {
			t.Fatalf("RoundTrip, first answer %d = %v", status, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if !first.Retry {
			continue
		}
		retried++
		if resp.StatusCode != http.StatusCreated || resp.Header.Get(middleware.HeaderReplayed) != "" {
			t.Errorf("the transport retried a %d, and its retry got %d (replayed %q); want the handler's 201: a retried status must not be kept",
				status, resp.StatusCode, resp.Header.Get(middleware.HeaderReplayed))
		}
		if middleware.DefaultKeep(status) {
			t.Errorf("DefaultKeep(%d) = true; the client transport retries it", status)
		}
	}
	if retried == 0 {
		t.Fatal("the transport retried no status; want at least 409, 429 and 5xx")
	}
}

// A handler that did the work and answers 500 is run once per attempt of
// the client's transport: the docs of both packages say that a 5xx must
// mean nothing was done, and what to answer instead. This shows the harm
// they warn of, and holds the warning in both package docs.
func TestA5xxMeansNothingWasDone(t *testing.T) {
	store, err := idem.NewMemoryStore(idem.Options{})
	if err != nil {
		t.Fatal(err)
	}
	charges := 0
	idempotent, err := middleware.New(middleware.Options{Store: store, SingleTenant: true})
	if err != nil {
		t.Fatal(err)
	}
	h := idempotent(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.WriteHeader(http.StatusInternalServerError) // the receipt failed after the charge
	}))
	rt, err := client.New(client.Options{Base: handlerTransport{h}, MaxAttempts: 5, InitialWait: time.Millisecond, MaxWait: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest("POST", "http://shop/pay", strings.NewReader(`{"amount":1250}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if charges != 5 {
		t.Errorf("a handler answering 500 after the work ran %d times in 5 attempts; want 5, the harm the docs warn of", charges)
	}
	for _, pkg := range []string{".", "../client"} {
		doc := packageDoc(t, pkg)
		for _, says := range []string{"5xx", "nothing was done", "2xx"} {
			if !strings.Contains(doc, says) {
				t.Errorf("package doc of %s does not say %q; it must warn that a 5xx is retried and say what to answer when the work was done", pkg, says)
			}
		}
		if !strings.Contains(doc, "means nothing was done") {
			t.Errorf("package doc of %s has no \"A 5xx means nothing was done\"", pkg)
		}
	}
}

// packageDoc returns the package documentation of the package in dir:
// the comment above the package clause of its doc.go.
func packageDoc(t *testing.T, dir string) string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, "doc.go"), nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil {
		t.Fatal(err)
	}
	if f.Doc == nil {
		t.Fatalf("%s/doc.go has no package documentation", dir)
	}
	return f.Doc.Text()
}
