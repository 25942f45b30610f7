package middleware

import (
	"net/http"
	"strconv"
)

// storeKey joins scope, method, route and the client's key into the key the
// store holds:
//
//	"h1" then, for each part, its length in decimal, ':', and its bytes
//
// e.g. "h10:4:POST7:/orders3:abc". Every part is length-prefixed, so the
// encoding is injective: ("a:b", "c") and ("a", "b:c") never meet, one
// tenant's key never replays another's, and one key used on two endpoints is
// two records. "h1" names the encoding's version, so that a later one cannot
// collide with it.
func storeKey(scope, method, route, key string) string {
	n := 2 + len(scope) + len(method) + len(route) + len(key) + 4*4
	b := make([]byte, 0, n)
	b = append(b, "h1"...)
	for _, p := range [...]string{scope, method, route, key} {
		b = strconv.AppendInt(b, int64(len(p)), 10)
		b = append(b, ':')
		b = append(b, p...)
	}
	return string(b)
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
