package middleware

import (
	"github.com/idemgo/idem/internal/httprecord"
)

// storeKey joins scope and the client's key into the key the store holds
// (httprecord.Key, shared with idem inspect --http). Neither the method
// nor the endpoint is part of it: the method and the request target are
// in the fingerprint, so that the record a key maps to is the same however
// the middleware is mounted.
func storeKey(scope, key string) string {
	return httprecord.Key(scope, key)
}
