package middleware_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/go-chi/chi/v5"
	chimw "github.com/go-chi/chi/v5/middleware"
	"github.com/idemgo/idem"
	"github.com/idemgo/idem/middleware"
	"github.com/idemgo/idem/sqlstore"
	_ "modernc.org/sqlite" // database/sql driver "sqlite"
)

// accountKey is the context key under which authenticate puts the
// caller's account.
type accountKey struct{}

// authenticate stands for the service's own authentication: it puts the
// account that the request's credentials name into its context.
func authenticate(next http.Handler) http.Handler {
	accounts := map[string]string{"Bearer tok_alice": "acct_alice", "Bearer tok_bob": "acct_bob"}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		account, ok := accounts[r.Header.Get("Authorization")]
		if !ok {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), accountKey{}, account)))
	})
}

// tenant is the middleware's Scope: the account that authentication
// found, never anything the client merely states.
func tenant(r *http.Request) (string, error) {
	account, ok := r.Context().Value(accountKey{}).(string)
	if !ok {
		return "", errors.New("no authenticated account")
	}
	return account, nil
}

// send posts body as alice with an Idempotency-Key (none for "") to h and
// prints the answer.
func send(h http.Handler, path, key, body string) {
	sendAs(h, "tok_alice", path, key, body)
}

// sendAs is send with the credentials of token.
func sendAs(h http.Handler, token, path, key, body string) {
	r := httptest.NewRequest("POST", path, strings.NewReader(body))
	r.Header.Set("Authorization", "Bearer "+token)
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Header().Get("Content-Type") == "application/problem+json" {
		// The instance is random: print the members a client acts on.
		var p middleware.Problem
		_ = json.Unmarshal(w.Body.Bytes(), &p)
		fmt.Printf("%d %s retryable=%t idempotency_key=%q instance=urn:uuid:...=%t\n",
			w.Code, p.Type, p.Retryable, p.IdempotencyKey, strings.HasPrefix(p.Instance, "urn:uuid:"))
		return
	}
	fmt.Printf("%d replayed=%q %s\n", w.Code, w.Header().Get(middleware.HeaderReplayed), strings.TrimSpace(w.Body.String()))
}

// The middleware wraps a whole http.ServeMux, behind the service's
// authentication, and Scope names the tenant from the authenticated
// account. A retry replays; a reuse of the key for another order is
// refused; another tenant's request with the same key is its own.
func ExampleNew() {
	store, err := idem.NewMemoryStore(idem.Options{}) // RedisStore in production
	if err != nil {
		log.Fatal(err)
	}
	orders := 0
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		orders++
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", orders))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d}`, orders)
	})
	idempotent, err := middleware.New(middleware.Options{Store: store, Scope: tenant})
	if err != nil {
		panic(err)
	}
	h := authenticate(idempotent(mux))

	send(h, "/orders", "8e03978e", `{"sku":"tea"}`)
	send(h, "/orders", "8e03978e", `{"sku":"tea"}`)              // the client retries
	send(h, "/orders", "8e03978e", `{"sku":"mug"}`)              // the key reused for another order
	sendAs(h, "tok_bob", "/orders", "8e03978e", `{"sku":"tea"}`) // another tenant, the same key
	fmt.Println("orders placed:", orders)
	// Output:
	// 201 replayed="" {"order":1}
	// 201 replayed="true" {"order":1}
	// 422 https://datatracker.ietf.org/doc/html/draft-ietf-httpapi-idempotency-key-header-07#section-2.2 retryable=false idempotency_key="8e03978e" instance=urn:uuid:...=true
	// 201 replayed="" {"order":2}
	// orders placed: 2
}

// In transactional mode the handler's own SQL and the record of its
// response commit in one transaction: the order is stored once however
// often the client retries, and a 5xx would roll both back. A request
// without a key runs without the middleware's transaction: the handler
// opens its own. This service has one tenant, which SingleTenant states.
func ExampleNew_transactional() {
	dir, err := os.MkdirTemp("", "idem-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "shop.db")+"?_pragma=journal_mode(WAL)")
	if err != nil {
		panic(err)
	}
	defer db.Close()
	store, err := sqlstore.New(db, sqlstore.Options{Dialect: sqlstore.SQLite}) // or Postgres
	if err != nil {
		panic(err)
	}
	if err := store.CreateSchema(context.Background()); err != nil { // a migration in production
		panic(err)
	}
	if _, err := db.Exec("CREATE TABLE orders (id INTEGER PRIMARY KEY, sku TEXT)"); err != nil {
		panic(err)
	}

	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		// The transaction that records the response; none without a key,
		// where the request is not idempotent and the handler opens its own.
		tx, ok := sqlstore.TxFromContext(r.Context())
		if !ok {
			own, err := db.BeginTx(r.Context(), nil)
			if err != nil {
				http.Error(w, "the order was not stored", http.StatusInternalServerError)
				return
			}
			defer own.Rollback() // a no-op after the Commit below
			tx = own
		}
		var id int64
		err := tx.QueryRowContext(r.Context(), "INSERT INTO orders (sku) VALUES ('tea') RETURNING id").Scan(&id)
		if err == nil && !ok {
			err = tx.Commit()
		}
		if err != nil {
			http.Error(w, "the order was not stored", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d}`, id)
	})
	idempotent, err := middleware.New(middleware.Options{Tx: store, SingleTenant: true})
	if err != nil {
		panic(err)
	}
	h := idempotent(mux)

	send(h, "/orders", "5f2b9c1e", `{"sku":"tea"}`)
	send(h, "/orders", "5f2b9c1e", `{"sku":"tea"}`) // the client retries
	send(h, "/orders", "", `{"sku":"tea"}`)         // no key: not deduplicated
	var stored int
	if err := db.QueryRow("SELECT count(*) FROM orders").Scan(&stored); err != nil {
		panic(err)
	}
	fmt.Println("orders stored:", stored)
	// Output:
	// 201 replayed="" {"order":1}
	// 201 replayed="true" {"order":1}
	// 201 replayed="" {"order":2}
	// orders stored: 2
}

// With chi, the middleware can sit inside a route (r.With), behind the
// service's authentication.
func ExampleNew_chi() {
	store, err := idem.NewMemoryStore(idem.Options{})
	if err != nil {
		log.Fatal(err)
	}
	idempotent, err := middleware.New(middleware.Options{Store: store, Scope: tenant})
	if err != nil {
		panic(err)
	}
	payments := 0
	r := chi.NewRouter()
	r.Use(authenticate)
	r.With(idempotent).Post("/invoices/{id}/pay", func(w http.ResponseWriter, r *http.Request) {
		payments++
		fmt.Fprintf(w, `{"invoice":%q,"payment":%d}`, chi.URLParam(r, "id"), payments)
	})

	send(r, "/invoices/7/pay", "pay-7", `{}`)
	send(r, "/invoices/7/pay", "pay-7", `{}`)
	fmt.Println("payments:", payments)
	// Output:
	// 200 replayed="" {"invoice":"7","payment":1}
	// 200 replayed="true" {"invoice":"7","payment":1}
	// payments: 1
}

// A webhook delivered twice is handled once: Options.Key takes the key from
// the event id the sender puts in a header. The endpoint has one sender,
// which SingleTenant states.
func ExampleOptions_key() {
	store, err := idem.NewMemoryStore(idem.Options{})
	if err != nil {
		log.Fatal(err)
	}
	idempotent, _ := middleware.New(middleware.Options{
		Store:        store,
		SingleTenant: true,
		Required:     true,
		// The sender may deliver one event to several endpoints: each
		// endpoint records its own.
		Key: func(r *http.Request) (string, error) {
			if id := r.Header.Get("Webhook-Id"); id != "" {
				return r.URL.Path + " " + id, nil
			}
			return "", nil
		},
	})
	handled := 0
	h := idempotent(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handled++
		w.WriteHeader(http.StatusNoContent)
	}))
	for range 2 {
		r := httptest.NewRequest("POST", "/webhooks/billing", strings.NewReader(`{"type":"invoice.paid"}`))
		r.Header.Set("Webhook-Id", "evt_1MqqbKLt4dXK03v5")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Printf("%d replayed=%q\n", w.Code, w.Header().Get(middleware.HeaderReplayed))
	}
	fmt.Println("handled:", handled)
	// Output:
	// 204 replayed=""
	// 204 replayed="true"
	// handled: 1
}

// With chi's own middleware package imported under an alias (both are
// named middleware), the middleware can sit under r.Use, for every route,
// before chi has routed. The record a key maps to does not depend on where
// the middleware sits: the method and the request target are part of the
// fingerprint, so a key reused on another endpoint is refused (422).
func ExampleNew_chiUse() {
	store, err := idem.NewMemoryStore(idem.Options{})
	if err != nil {
		log.Fatal(err)
	}
	idempotent, err := middleware.New(middleware.Options{Store: store, Scope: tenant})
	if err != nil {
		panic(err)
	}
	r := chi.NewRouter()
	r.Use(chimw.RequestID, authenticate, idempotent)
	r.Post("/orders", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{"order":1}`) })
	r.Post("/refunds", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{"refund":1}`) })

	send(r, "/orders", "k-1", `{}`)
	send(r, "/orders", "k-1", `{}`)  // the client retries
	send(r, "/refunds", "k-1", `{}`) // the same key on another endpoint
	// Output:
	// 200 replayed="" {"order":1}
	// 200 replayed="true" {"order":1}
	// 422 https://datatracker.ietf.org/doc/html/draft-ietf-httpapi-idempotency-key-header-07#section-2.2 retryable=false idempotency_key="k-1" instance=urn:uuid:...=true
}

// With http.ServeMux the middleware can also sit inside each route. A key
// names one request wherever it is sent: one key on two invoices, or on
// two endpoints, is refused (422).
func ExampleNew_serveMux() {
	store, err := idem.NewMemoryStore(idem.Options{})
	if err != nil {
		log.Fatal(err)
	}
	idempotent, err := middleware.New(middleware.Options{Store: store, Scope: tenant})
	if err != nil {
		panic(err)
	}
	payments, refunds := 0, 0
	mux := http.NewServeMux()
	mux.Handle("POST /invoices/{id}/pay", idempotent(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		payments++
		fmt.Fprintf(w, `{"invoice":%q,"payment":%d}`, r.PathValue("id"), payments)
	})))
	mux.Handle("POST /invoices/{id}/refund", idempotent(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		refunds++
		fmt.Fprintf(w, `{"invoice":%q,"refund":%d}`, r.PathValue("id"), refunds)
	})))
	h := authenticate(mux)

	send(h, "/invoices/7/pay", "k-7", `{}`)
	send(h, "/invoices/7/pay", "k-7", `{}`)    // the client retries
	send(h, "/invoices/7/refund", "k-7", `{}`) // the same key on another endpoint
	send(h, "/invoices/8/pay", "k-7", `{}`)    // the key reused for another invoice
	send(h, "/invoices/7/refund", "k-8", `{}`) // a refund with its own key
	fmt.Println("payments:", payments, "refunds:", refunds)
	// Output:
	// 200 replayed="" {"invoice":"7","payment":1}
	// 200 replayed="true" {"invoice":"7","payment":1}
	// 422 https://datatracker.ietf.org/doc/html/draft-ietf-httpapi-idempotency-key-header-07#section-2.2 retryable=false idempotency_key="k-7" instance=urn:uuid:...=true
	// 422 https://datatracker.ietf.org/doc/html/draft-ietf-httpapi-idempotency-key-header-07#section-2.2 retryable=false idempotency_key="k-7" instance=urn:uuid:...=true
	// 200 replayed="" {"invoice":"7","refund":1}
	// payments: 1 refunds: 1
}

// A handler that did the work answers 2xx even when a step after it
// failed: a 5xx releases the key, and the client's retry would do the work
// again. Here the receipt e-mail fails after the card was charged: the
// answer is 202 with the failed step in the body, recorded and replayed,
// and the card is charged once however often the client retries.
func ExampleNew_workDone() {
	store, err := idem.NewMemoryStore(idem.Options{})
	if err != nil {
		log.Fatal(err)
	}
	charges := 0
	sendReceipt := func() error { return errors.New("smtp: connection refused") }
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++ // the work: done, and not to be done again
		if err := sendReceipt(); err != nil {
			w.WriteHeader(http.StatusAccepted) // not 500: a 5xx would run this handler again
			fmt.Fprint(w, `{"charged":true,"receipt":"pending"}`)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	idempotent, err := middleware.New(middleware.Options{Store: store, Scope: tenant})
	if err != nil {
		panic(err)
	}
	h := authenticate(idempotent(pay))
	for range 3 { // the client retries, with one key
		send(h, "/pay", "c4f1", `{"amount":1250}`)
	}
	fmt.Println("charges:", charges)
	// Output:
	// 202 replayed="" {"charged":true,"receipt":"pending"}
	// 202 replayed="true" {"charged":true,"receipt":"pending"}
	// 202 replayed="true" {"charged":true,"receipt":"pending"}
	// charges: 1
}
