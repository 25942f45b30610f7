package middleware_test

import (
	"context"
	"errors"
	"log"
	"net/http"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/middleware"
)

// The README's block, compiled (it serves on addr; its parameters are the
// reader's own names); ExampleNew runs the same.
var _ = readmeNew

type account struct{ ID string }

func readmeNew(store idem.Store, accountFrom func(context.Context) (account, bool), addr string, mux *http.ServeMux) {
	// README: middleware
	idempotent, err := middleware.New(middleware.Options{
		Store: store, // or Tx: sqlStore
		// The tenant, from the principal your authentication put in the
		// context: one tenant's key never replays another's response.
		Scope: func(r *http.Request) (string, error) {
			account, ok := accountFrom(r.Context())
			if !ok {
				return "", errors.New("no authenticated account") // 400
			}
			return account.ID, nil
		},
	})
	if err != nil {
		log.Fatal(err) // e.g. middleware: Scope: nil while SingleTenant is false; set Scope ...
	}
	http.ListenAndServe(addr, authenticate(idempotent(mux)))
	// README end
}
