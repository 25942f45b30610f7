package middleware_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
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
