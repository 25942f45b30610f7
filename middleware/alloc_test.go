package middleware

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testing/testenv"
)

// allocsPerRequest is the allocations of one request through h, new key
// each time when fresh, else a replay of one key.
func allocsPerRequest(t *testing.T, h http.Handler, fresh bool) float64 {
	t.Helper()
	const body = `{"amount":1000,"currency":"eur"}`
	i := 0
	serve := func() {
		i++
		key := "alloc-replay"
		if fresh {
			key = "alloc-" + strconv.Itoa(i)
		}
		r := httptest.NewRequest("POST", "/orders", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != 201 {
			t.Fatalf("status %d", w.Code)
		}
	}
	serve()
	return testing.AllocsPerRun(200, serve)
}

type nopObserver struct{}

func (nopObserver) Observe(context.Context, idem.Event) {}

// With no Observer the middleware allocates what it did before it could
// report events: the figures are those measured before the Observer field
// existed, so any allocation the observing adds on the unobserved path
// fails here. With an Observer, reporting costs a few allocations.
func TestObserverAllocations(t *testing.T) {
	if testing.CoverMode() != "" || testenv.RaceEnabled {
		t.Skip("allocation counts differ under -cover and -race")
	}
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		_, _ = w.Write([]byte(`{"id":"ord_123","status":"created"}`))
	})
	for _, c := range []struct {
		name  string
		fresh bool
		base  float64 // measured before the change
	}{
		{"replay", false, baseReplayAllocs},
		{"first-write", true, baseFirstWriteAllocs},
	} {
		off := allocsPerRequest(t, mustNew(t, Options{SingleTenant: true, Store: memStore(idem.Options{})}, next), c.fresh)
		on := allocsPerRequest(t, mustNew(t, Options{SingleTenant: true, Store: memStore(idem.Options{}), Observer: nopObserver{}}, next), c.fresh)
		t.Logf("%s: %.0f allocs without an Observer (%.0f before the change), %.0f with one", c.name, off, c.base, on)
		if off > c.base {
			t.Errorf("%s: %.0f allocs per request without an Observer; want at most %.0f, as before events existed", c.name, off, c.base)
		}
		// The key's hash, and the request's copy with a context that notes
		// whether the handler ran.
		if on > off+4 {
			t.Errorf("%s: %.0f allocs with a no-op Observer; want at most %.0f", c.name, on, off+4)
		}
	}
}

// Allocations per request on a MemoryStore with no Observer, measured
// (testing.AllocsPerRun, Go 1.26) on the middleware before it reported
// events.
const (
	baseReplayAllocs     = 36
	baseFirstWriteAllocs = 69
)
