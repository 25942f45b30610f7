package idemecho_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/idemgo/idem"
	idemecho "github.com/idemgo/idem/echo"
	"github.com/idemgo/idem/middleware"
)

// The middleware on an Echo, as the README shows it: a retry of POST
// /orders with the same key gets the recorded answer, and the order is
// created once; a POST without Idempotency-Key passes through with no
// lease (Options.Required would answer it 400).
func ExampleNew() {
	store, err := idem.NewMemoryStore(idem.Options{}) // or idem.NewRedisStore, sqlstore.New
	if err != nil {
		log.Fatal(err)
	}
	// README: echo
	e := echo.New()
	idempotent, err := idemecho.New(middleware.Options{Store: store, SingleTenant: true})
	if err != nil {
		log.Fatal(err)
	}
	e.Use(idempotent) // or e.Group("/api", idempotent), or on one route
	e.POST("/orders", func(c echo.Context) error {
		var token int64 // stays 0 for a POST without Idempotency-Key: it has no lease
		if lease, ok := idem.LeaseFrom(c.Request().Context()); ok {
			token = lease.Token // fences downstream writes
		}
		return c.JSON(http.StatusCreated, createOrder(c.Request().Context(), token))
	})
	// README end

	for _, key := range []string{"order-7f3a", "order-7f3a", ""} {
		r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"item":"book"}`))
		r.Header.Set("Content-Type", "application/json")
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		e.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("Idempotent-Replayed"), strings.TrimSpace(w.Body.String()))
	}
	// Output:
	// 201  {"order":1,"token":1}
	// 201 true {"order":1,"token":1}
	// 201  {"order":2,"token":0}
}

var orders int

// createOrder stands for the application's own write, fenced by token.
func createOrder(ctx context.Context, token int64) map[string]any {
	orders++
	return map[string]any{"order": orders, "token": token}
}
