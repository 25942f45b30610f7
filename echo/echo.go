// Package idemecho mounts idem's HTTP middleware
// ([github.com/idemgo/idem/middleware]) on Echo v4: POST and PATCH
// endpoints that run once per idempotency key and replay their recorded
// answer to every retry.
//
//	idempotent, err := idemecho.New(middleware.Options{
//		Store: store, // any idem.Store
//		Scope: func(r *http.Request) (string, error) {
//			return idemecho.Context(r).Get("account").(string), nil // set by the auth middleware
//		},
//	})
//	...
//	e.Use(idempotent) // or on a group, or on one route
//
// The answers, the keep rules, the problems and the records are the
// middleware's, unchanged: see its package documentation. The adapter
// does what Echo's own echo.WrapMiddleware does not:
//
//   - An error the handler returns is answered inside the middleware, by
//     the Echo's HTTPErrorHandler, so that its answer is the one recorded
//     (or not, by its status, under the keep rules) and replayed.
//     echo.WrapMiddleware lets it out, so the middleware would record an
//     empty 200 and replay that to every retry. The error is still
//     returned, for the middleware around (a logger sees it); Echo then
//     calls its HTTPErrorHandler again on a committed response, which
//     Echo's default handler, like any handler of one's own should,
//     leaves alone.
//   - A replay never reaches the handler, and returns no error: nothing
//     runs twice, whatever the error handling around.
//   - The echo.Context of the request is reachable from the Options funcs
//     (Scope, Key, Fingerprint, Error) by Context, and the handler's
//     c.Request() carries the key's lease (idem.LeaseFrom, its fencing
//     token); c.Request() and c.Response() are the outer ones again once
//     the middleware returns.
//
// A record's identity is the scope and the client's key, and its
// fingerprint holds the request target as the client sent it, so a key is
// one record however the middleware is mounted: e.Use, a group's Use
// (under any prefix), one route's middleware, or the net/http middleware
// around the whole Echo. A deploy that changes only the mounting still
// replays what was recorded before it.
//
// A covered handler's response is held until it is recorded (see Bodies
// in the middleware's documentation): c.Response().Flush, and so
// streaming, is not available to it.
package idemecho

import (
	"context"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idemgo/idem/middleware"
)

// New returns the Echo middleware that o describes, or the error
// middleware.New returns for them (a mistake in a field, named). See the
// package documentation for what it adds to middleware.New for Echo. The
// middleware is safe for concurrent use, and may be mounted in many
// places: each place is the same records.
func New(o middleware.Options) (echo.MiddlewareFunc, error) {
	mw, err := middleware.New(o)
	if err != nil {
		return nil, err
	}
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			outerReq, outerRes := c.Request(), c.Response()
			var handlerErr error
			h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				// The handler writes to the response the middleware holds
				// and records, and sees the request that carries the lease.
				c.SetRequest(r)
				c.SetResponse(echo.NewResponse(w, c.Echo()))
				defer c.SetResponse(outerRes) // a panic too goes on with Echo's response
				if handlerErr = next(c); handlerErr != nil {
					// Echo answers an error after the chain returns, past
					// the middleware: answered here, it is recorded as
					// any other answer, so that a retry replays it (or
					// runs again, under the keep rules).
					c.Error(handlerErr)
				}
			}))
			defer c.SetRequest(outerReq) // the lease's context ends with the middleware
			h.ServeHTTP(outerRes, outerReq.WithContext(context.WithValue(outerReq.Context(), contextKey{}, c)))
			return handlerErr
		}
	}, nil
}

type contextKey struct{}

// Context returns the echo.Context of a request that New's middleware is
// handling, for the Options funcs (Scope, Key, Fingerprint, Error) that
// read what Echo's middleware put there (c.Get, the authenticated user),
// or nil for a request that did not come through it.
func Context(r *http.Request) echo.Context {
	c, _ := r.Context().Value(contextKey{}).(echo.Context)
	return c
}
