package client_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/client"
	"github.com/idemgo/idem/middleware"
)

// A POST whose first attempt fails with 503 after the server did nothing
// is retried with the same key; the server behind the middleware creates
// the order once.
func ExampleNew() {
	var calls atomic.Int64
	orders := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			http.Error(w, "busy", http.StatusServiceUnavailable) // not recorded: a retry runs again
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "order created")
	})
	store, err := idem.NewMemoryStore(idem.Options{}) // a RedisStore in production
	if err != nil {
		log.Fatal(err)
	}
	idempotent, err := middleware.New(middleware.Options{Store: store, SingleTenant: true})
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(idempotent(orders))
	defer srv.Close()

	tr, err := client.New(client.Options{OnAttempt: func(a client.Attempt) {
		fmt.Printf("attempt %d: %d, retry %v\n", a.N, a.Response.StatusCode, a.Retry)
	}})
	if err != nil {
		log.Fatal(err)
	}
	hc := &http.Client{Transport: tr}
	resp, err := hc.Post(srv.URL, "application/json", strings.NewReader(`{"amount":1000}`))
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Printf("%d %s, key sent: %v\n", resp.StatusCode, body, resp.Request.Header.Get("Idempotency-Key") != "")
	// Output:
	// attempt 1: 503, retry true
	// attempt 2: 201, retry false
	// 201 order created, key sent: true
}
