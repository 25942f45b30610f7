package idemgin_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/idemgo/idem"
	idemgin "github.com/idemgo/idem/gin"
	"github.com/idemgo/idem/middleware"
)

// The middleware on a Gin engine: a retry of POST /orders with the same
// key gets the recorded answer, and the order is created once.
func ExampleNew() {
	store, err := idem.NewMemoryStore(idem.Options{}) // or idem.NewRedisStore, sqlstore.New
	if err != nil {
		panic(err)
	}
	idempotent, err := idemgin.New(middleware.Options{Store: store, SingleTenant: true})
	if err != nil {
		panic(err)
	}
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(idempotent)
	created := 0
	r.POST("/orders", func(c *gin.Context) {
		created++
		lease, _ := idem.LeaseFrom(c.Request.Context()) // its Token fences downstream writes
		_ = lease.Token
		c.JSON(http.StatusCreated, gin.H{"order": created})
	})

	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"item":"book"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "order-7f3a")
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Header().Get("Idempotent-Replayed"), w.Body.String())
	}
	fmt.Println("created", created)
	// Output:
	// 201  {"order":1}
	// 201 true {"order":1}
	// created 1
}
