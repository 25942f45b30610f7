package idemecho_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/idemgo/idem"
	idemecho "github.com/idemgo/idem/echo"
	"github.com/idemgo/idem/middleware"
)

// The middleware on an Echo: a retry of POST /orders with the same key
// gets the recorded answer, and the order is created once.
func ExampleNew() {
	store, err := idem.NewMemoryStore(idem.Options{}) // or idem.NewRedisStore, sqlstore.New
	if err != nil {
		panic(err)
	}
	idempotent, err := idemecho.New(middleware.Options{Store: store, SingleTenant: true})
	if err != nil {
		panic(err)
	}
	e := echo.New()
	e.Use(idempotent)
	created := 0
	e.POST("/orders", func(c echo.Context) error {
		created++
		lease, _ := idem.LeaseFrom(c.Request().Context()) // its Token fences downstream writes
		_ = lease.Token
		return c.JSON(http.StatusCreated, map[string]int{"order": created})
	})

	for range 2 {
		r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"item":"book"}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", "order-7f3a")
		w := httptest.NewRecorder()
		e.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("Idempotent-Replayed"), strings.TrimSpace(w.Body.String()))
	}
	fmt.Println("created", created)
	// Output:
	// 201  {"order":1}
	// 201 true {"order":1}
	// created 1
}
