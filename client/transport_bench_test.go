package client

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// stub answers every request with one preallocated 201: what it costs is
// nothing, so allocs/op through it are the transport's own.
type stub struct{ resp http.Response }

func (s *stub) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_ = r.Body.Close()
	}
	return &s.resp, nil
}

// BenchmarkFirstTimeSuccess compares, side by side, a request sent
// straight to the base transport and through Transport, which succeeds at
// the first attempt: with a fresh key (its string, and the request copy
// that carries it: RoundTrip may not modify the caller's) and with the
// caller's key (nothing). "stub" isolates the transport's allocations;
// "loopback" shows them beside a real http.Transport's on a loopback
// server.
func BenchmarkFirstTimeSuccess(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(201)
	}))
	defer srv.Close()
	loop := &http.Transport{}
	defer loop.CloseIdleConnections()
	st := &stub{resp: http.Response{StatusCode: 201, Body: http.NoBody}}
	for _, base := range []struct {
		name string
		rt   http.RoundTripper
	}{{"stub", st}, {"loopback", loop}} {
		tr := mustNew(b, Options{Base: base.rt})
		for _, c := range []struct {
			name string
			rt   http.RoundTripper
			key  string
		}{{"bare", base.rt, ""}, {"fresh-key", tr, ""}, {"caller-key", tr, "order-1234"}} {
			b.Run(base.name+"/"+c.name, func(b *testing.B) {
				b.ReportAllocs()
				req, _ := http.NewRequest("POST", srv.URL, nil)
				req.Header.Set("Content-Type", "application/json")
				if c.key != "" {
					req.Header.Set("Idempotency-Key", c.key)
				}
				body := strings.NewReader(`{"amount":1000}`)
				for b.Loop() {
					body.Reset(`{"amount":1000}`)
					req.Body = io.NopCloser(body)
					resp, err := c.rt.RoundTrip(req)
					if err != nil || resp.StatusCode != 201 {
						b.Fatalf("RoundTrip = %v, %v", resp, err)
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
				}
			})
		}
	}
}
