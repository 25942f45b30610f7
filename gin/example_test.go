package idemgin_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/idemgo/idem"
	idemgin "github.com/idemgo/idem/gin"
	"github.com/idemgo/idem/middleware"
)

// The middleware on a Gin engine, as the README shows it: a retry of POST
// /orders with the same key gets the recorded answer, and the order is
// created once; a POST without Idempotency-Key passes through with no
// lease (Options.Required would answer it 400).
func ExampleNew() {
	store, err := idem.NewMemoryStore(idem.Options{}) // or idem.NewRedisStore, sqlstore.New
	if err != nil {
		log.Fatal(err)
	}
	gin.SetMode(gin.ReleaseMode)
	// README: gin
	r := gin.New()
	idempotent, err := idemgin.New(middleware.Options{Store: store, SingleTenant: true})
	if err != nil {
		log.Fatal(err)
	}
	r.Use(idempotent) // or r.Group("/api", idempotent), or on one route
	r.POST("/orders", func(c *gin.Context) {
		var token int64 // stays 0 for a POST without Idempotency-Key: it has no lease
		// idem.LeaseFrom(c) works too, with the engine's ContextWithFallback
		if lease, ok := idem.LeaseFrom(c.Request.Context()); ok {
			token = lease.Token // fences downstream writes
		}
		c.JSON(http.StatusCreated, createOrder(c.Request.Context(), token))
	})
	// README end

	for _, key := range []string{"order-7f3a", "order-7f3a", ""} {
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"item":"book"}`))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Header().Get("Idempotent-Replayed"), w.Body.String())
	}
	// Output:
	// 201  {"order":1,"token":1}
	// 201 true {"order":1,"token":1}
	// 201  {"order":2,"token":0}
}

var orders int

// createOrder stands for the application's own write, fenced by token.
func createOrder(ctx context.Context, token int64) gin.H {
	orders++
	return gin.H{"order": orders, "token": token}
}
