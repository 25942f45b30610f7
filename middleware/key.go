package middleware

import (
	"net/http"

	"github.com/idemgo/idem/internal/httprecord"
)

// storeKey joins scope, method, route and the client's key into the key the
// store holds (httprecord.Key, shared with idem inspect --http).
func storeKey(scope, method, route, key string) string {
	return httprecord.Key(scope, method, route, key)
}

// route names the endpoint of r, per Options.Route.
func (c *config) route(r *http.Request, mux *http.ServeMux) string {
	if c.Route != nil {
		// chi's RoutePattern is "" under r.Use, before routing: one key
		// space for every endpoint would make a key reused on another
		// endpoint a 422 (#17), so the path names the endpoint instead.
		if p := c.Route(r); p != "" {
			return p
		}
		return r.URL.Path
	}
	if r.Pattern != "" {
		return r.Pattern
	}
	if mux != nil {
		// The pattern the mux will pick: it is what the middleware inside
		// the route would have seen as r.Pattern.
		if _, p := mux.Handler(r); p != "" {
			return p
		}
	}
	return r.URL.Path
}
