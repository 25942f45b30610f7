// Package idemgin mounts idem's HTTP middleware
// ([github.com/idemgo/idem/middleware]) on Gin: POST and PATCH endpoints
// that run once per idempotency key and replay their recorded answer to
// every retry.
//
//	idempotent, err := idemgin.New(middleware.Options{
//		Store: store, // any idem.Store
//		Scope: func(r *http.Request) (string, error) {
//			return idemgin.Context(r).GetString("account"), nil // set by the auth middleware
//		},
//	})
//	...
//	r.Use(idempotent) // or on a group, or on one route
//
// The answers, the keep rules, the problems and the records are the
// middleware's, unchanged: see its package documentation. Gin takes no
// net/http middleware as it is; the adapter runs the rest of the chain
// (c.Next) inside the middleware, so that:
//
//   - What the handlers write (c.JSON, c.String, c.AbortWithStatusJSON,
//     c.Status alone) is the answer recorded, or not, under the keep
//     rules.
//   - A replay or a problem answer aborts the chain: no handler after the
//     middleware runs, nothing runs twice.
//   - The answer is what plain Gin sends for the same chain, with one
//     exception: a chain that records errors (c.Error) and neither writes
//     nor sets a status is answered 500 inside the middleware: nothing is
//     recorded and the key is released, so that a retry runs the handler.
//     Gin would send an empty 200, which the middleware would record and
//     replay to every retry, and an error-rendering middleware mounted
//     around it would come too late. Mount such middleware after
//     idemgin's (inside it), so that its answer is the one recorded. A
//     chain that called c.Error and then answered (c.Status(204),
//     c.JSON, c.AbortWithError(400, err)) gets that answer, recorded or
//     not by its status as any other.
//   - The *gin.Context is reachable from the Options funcs (Scope, Key,
//     Fingerprint, Error) by Context, and the handlers' c.Request carries
//     the key's lease (idem.LeaseFrom(c.Request.Context()), or
//     idem.LeaseFrom(c) with the engine's ContextWithFallback);
//     c.Request and c.Writer are Gin's own again once the middleware
//     returns.
//
// A record's identity is the scope and the client's key, and its
// fingerprint holds the request target as the client sent it, so a key is
// one record however the middleware is mounted: r.Use, a group's Use
// (under any prefix), one route's handlers, or the net/http middleware
// around the whole engine. A deploy that changes only the mounting still
// replays what was recorded before it.
//
// A covered handler's response is held until it is recorded (see Bodies
// in the middleware's documentation): c.Writer.Flush sends nothing early,
// c.Stream and Hijack are not available to it.
package idemgin

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/idemgo/idem/middleware"
)

// New returns the Gin middleware that o describes, or the error
// middleware.New returns for them (a mistake in a field, named). See the
// package documentation for what it adds to middleware.New for Gin. The
// middleware is safe for concurrent use, and may be mounted in many
// places: each place is the same records.
func New(o middleware.Options) (gin.HandlerFunc, error) {
	mw, err := middleware.New(o)
	if err != nil {
		return nil, err
	}
	return func(c *gin.Context) {
		outerReq, outerWriter := c.Request, c.Writer
		ran := false
		h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ran = true
			gw := &writer{ResponseWriter: w, outer: outerWriter, size: -1, status: http.StatusOK}
			c.Request, c.Writer = r, gw
			defer func() { c.Request, c.Writer = outerReq, outerWriter }() // a panic too goes on with Gin's own
			errs := len(c.Errors)
			c.Next()
			if !gw.Written() && !gw.statusSet && len(c.Errors) > errs {
				// The chain failed and said nothing: Gin's empty 200
				// would be recorded and replayed to every retry. A
				// status the chain set (c.Status(204) after c.Error)
				// is its answer, as plain Gin sends it: the work was
				// done, and answering 500 would release the key and
				// run it again on every retry.
				gw.WriteHeader(http.StatusInternalServerError)
			}
			gw.WriteHeaderNow() // a status set by c.Status alone
		}))
		h.ServeHTTP(outerWriter, outerReq.WithContext(context.WithValue(outerReq.Context(), contextKey{}, c)))
		if !ran {
			c.Abort() // replayed or refused: the handlers must not run
		}
	}, nil
}

type contextKey struct{}

// Context returns the *gin.Context of a request that New's middleware is
// handling, for the Options funcs (Scope, Key, Fingerprint, Error) that
// read what Gin's middleware put there (c.Get, the authenticated user),
// or nil for a request that did not come through it.
func Context(r *http.Request) *gin.Context {
	c, _ := r.Context().Value(contextKey{}).(*gin.Context)
	return c
}

// writer is the gin.ResponseWriter the chain writes to under the
// middleware: Gin's semantics (a status held until the first write or
// WriteHeaderNow) over the response the middleware holds and records.
type writer struct {
	http.ResponseWriter                    // the middleware's
	outer               gin.ResponseWriter // Gin's own, for CloseNotify
	size, status        int                // size -1: nothing written
	statusSet           bool               // the chain set a status (c.Status, an abort)
}

var errHeld = errors.New("idemgin: the response is held until it is recorded: a covered handler cannot hijack the connection")

func (w *writer) WriteHeader(code int) {
	if code > 0 && !w.Written() {
		w.status, w.statusSet = code, true
	}
}

func (w *writer) WriteHeaderNow() {
	if !w.Written() {
		w.size = 0
		w.ResponseWriter.WriteHeader(w.status)
	}
}

func (w *writer) Write(b []byte) (int, error) {
	w.WriteHeaderNow()
	n, err := w.ResponseWriter.Write(b)
	w.size += n
	return n, err
}

func (w *writer) WriteString(s string) (int, error) {
	w.WriteHeaderNow()
	n, err := io.WriteString(w.ResponseWriter, s)
	w.size += n
	return n, err
}

func (w *writer) Status() int   { return w.status }
func (w *writer) Size() int     { return w.size }
func (w *writer) Written() bool { return w.size != -1 }

// Flush sends the status to the held response; nothing reaches the client
// before the record is written.
func (w *writer) Flush() { w.WriteHeaderNow() }

func (w *writer) Hijack() (net.Conn, *bufio.ReadWriter, error) { return nil, nil, errHeld }

func (w *writer) CloseNotify() <-chan bool { return w.outer.CloseNotify() }

func (w *writer) Pusher() http.Pusher { return nil }
