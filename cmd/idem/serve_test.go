package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/idem/internal/metrics"
	"github.com/idemgo/idem/middleware"
)

func post(t *testing.T, h http.Handler, key, body string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest("POST", "/payments", strings.NewReader(body))
	r.Header.Set("Idempotency-Key", key)
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// The tour that serve prints: a replay, a 409 while the first request is in
// flight, a 422 for a key reused with another body, and one charge per key.
func TestServeReplayConflictMismatch(t *testing.T) {
	t.Parallel()
	h, err := newPaymentsAPI(memStore(idem.Options{}), 300*time.Millisecond, 50*time.Millisecond, nil)
	if err != nil {
		t.Fatalf("newPaymentsAPI = %v", err)
	}
	const eur, usd = `{"amount":1000,"currency":"EUR"}`, `{"amount":5000,"currency":"USD"}`

	first := post(t, h, "pay-1", eur)
	if first.Code != http.StatusCreated || first.Header().Get("Location") != "/payments/pay_1" {
		t.Fatalf("POST pay-1 = %d Location %q; want 201 /payments/pay_1", first.Code, first.Header().Get("Location"))
	}
	replay := post(t, h, "pay-1", eur)
	if replay.Code != http.StatusCreated || replay.Header().Get(middleware.HeaderReplayed) != "true" || replay.Body.String() != first.Body.String() {
		t.Errorf("retry of pay-1 = %d replayed=%q %q; want 201 replayed=true %q",
			replay.Code, replay.Header().Get(middleware.HeaderReplayed), replay.Body, first.Body)
	}

	var wg sync.WaitGroup
	var inFlight *httptest.ResponseRecorder
	wg.Go(func() { inFlight = post(t, h, "pay-2", eur) })
	time.Sleep(100 * time.Millisecond) // the first pay-2 is charging (300ms)
	conflict := post(t, h, "pay-2", eur)
	wg.Wait()
	if conflict.Code != http.StatusConflict || conflict.Header().Get("Retry-After") == "" {
		t.Errorf("pay-2 while in flight = %d Retry-After %q; want 409 with Retry-After", conflict.Code, conflict.Header().Get("Retry-After"))
	}
	if inFlight.Code != http.StatusCreated {
		t.Errorf("first pay-2 = %d; want 201", inFlight.Code)
	}

	if w := post(t, h, "pay-1", usd); w.Code != http.StatusUnprocessableEntity {
		t.Errorf("pay-1 with another body = %d; want 422", w.Code)
	}

	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/payments", nil))
	var list struct{ Charges int }
	if err := json.Unmarshal(w.Body.Bytes(), &list); err != nil || list.Charges != 2 {
		t.Errorf("GET /payments = %q, %v; want 2 charges, one per key", w.Body, err)
	}
}

// A bad payment is answered 400, and the answer is recorded like any other.
func TestServeBadPayment(t *testing.T) {
	t.Parallel()
	h, err := newPaymentsAPI(memStore(idem.Options{}), 0, time.Second, nil)
	if err != nil {
		t.Fatalf("newPaymentsAPI = %v", err)
	}
	if w := post(t, h, "bad", `{"amount":-1}`); w.Code != http.StatusBadRequest {
		t.Errorf("POST negative amount = %d; want 400", w.Code)
	}
	if w := post(t, h, "bad", `{"amount":-1}`); w.Header().Get(middleware.HeaderReplayed) != "true" {
		t.Errorf("retry of a 400 replayed=%q; want true", w.Header().Get(middleware.HeaderReplayed))
	}
}

// The printed curl commands show the tour: two keys, the 409's concurrent
// pair, the 422's other body.
func TestServeCurlHelp(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	writeCurlHelp(&b, "http://127.0.0.1:8080", "ab12")
	out := b.String()
	for _, want := range []string{
		"curl -si http://127.0.0.1:8080/payments -H 'Idempotency-Key: pay-ab12-1'",
		"Idempotency-Key: pay-ab12-2' -H 'Content-Type: application/json' -d '{\"amount\":1000,\"currency\":\"EUR\"}' >/dev/null & sleep 0.3;",
		"Idempotency-Key: pay-ab12-1' -H 'Content-Type: application/json' -d '{\"amount\":5000,\"currency\":\"USD\"}'",
		"409", "422", "Idempotent-Replayed: true",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("curl help lacks %q:\n%s", want, out)
		}
	}
}

// GET /metrics shows the requests and the store operations in Prometheus
// text format.
func TestServeMetrics(t *testing.T) {
	t.Parallel()
	reg := &metrics.Registry{}
	h, err := newPaymentsAPI(memStore(idem.Options{Observer: reg}), 0, 50*time.Millisecond, reg)
	if err != nil {
		t.Fatalf("newPaymentsAPI = %v", err)
	}
	const eur = `{"amount":1000,"currency":"EUR"}`
	post(t, h, "m-1", eur)
	post(t, h, "m-1", eur)
	post(t, h, "m-1", `{"amount":1,"currency":"EUR"}`)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	if w.Code != 200 || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain; version=0.0.4") {
		t.Fatalf("GET /metrics = %d %q; want 200 Prometheus text", w.Code, w.Header().Get("Content-Type"))
	}
	for _, want := range []string{
		`idem_operations_total{op="request",outcome="claimed"} 1`,
		`idem_operations_total{op="request",outcome="duplicate"} 1`,
		`idem_operations_total{op="request",outcome="duplicate",error_class="conflict"} 1`,
		`idem_operations_total{op="claim",outcome="claimed"} 1`,
		`idem_operations_total{op="confirm"} 1`,
		`idem_operation_duration_seconds_count{op="request"} 3`,
	} {
		if !strings.Contains(w.Body.String(), want+"\n") {
			t.Errorf("GET /metrics lacks %q:\n%s", want, w.Body)
		}
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
