package middleware_test

import (
	"net/http"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/idemgo/idem/middleware"
	"github.com/idemgo/idem/middleware/middlewaretest"
)

// The scenario suite the framework adapters run, on net/http itself:
// around the handler, and under chi's Use.
func TestScenarios(t *testing.T) {
	t.Run("net/http", func(t *testing.T) {
		middlewaretest.Run(t, func(o middleware.Options, h http.Handler) (http.Handler, error) {
			mw, err := middleware.New(o)
			if err != nil {
				return nil, err
			}
			return mw(h), nil
		})
	})
	t.Run("chi", func(t *testing.T) {
		middlewaretest.Run(t, func(o middleware.Options, h http.Handler) (http.Handler, error) {
			mw, err := middleware.New(o)
			if err != nil {
				return nil, err
			}
			r := chi.NewRouter()
			r.Use(mw)
			r.Handle("/orders", h)
			r.Handle("/orders/{id}", h)
			return r, nil
		})
	})
}
