package middleware

import (
	"cmp"
	"fmt"
	"net/http"
	"net/textproto"
	"slices"
	"strings"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/httprecord"
)

// StoreKey is the key under which the middleware keeps the record of a
// client's Idempotency-Key in a tenant's scope (Options.Scope's answer, ""
// without one): the key to give idem.Resolver.Resolve, Lookup and idem
// inspect. Neither the method nor the route is part of it: they are in the
// fingerprint.
func StoreKey(scope, key string) string { return storeKey(scope, key) }

// Resolution builds the idem.Resolution by which an operator settles a
// key of the middleware's (quarantined after repeated crashes: see
// idem.Resolver) with the response that every retry of the request is then
// answered with: status, header and body, in the form the middleware
// records and replays (what idem resolve --http-status writes too). Pass it, with
// StoreKey's key, to the store's Resolve.
//
// o gives the rules of the middleware that serves the key: its Keep,
// ReplayHeaders and MaxResponseBytes (a zero field is its default; the
// other fields are not read). Resolution refuses, with an error naming
// what is at fault, what that middleware would not replay as given: a
// status Keep does not record (a 5xx, a 409: a retry would be told the
// work happened with an answer that says it did not), a header not in
// ReplayHeaders (a replay drops it) or whose value is not a valid field
// value, a body over MaxResponseBytes (a replay would omit it).
func Resolution(status int, header http.Header, body []byte, o Options) (idem.Resolution, error) {
	keep := o.Keep
	if keep == nil {
		keep = DefaultKeep
	}
	if status < 200 || status > 999 {
		return idem.Resolution{}, fmt.Errorf("middleware: Resolution: status %d is not a final HTTP status (200-999)", status)
	}
	if !keep(status) {
		return idem.Resolution{}, fmt.Errorf("middleware: Resolution: status %d is not one Options.Keep records: the middleware would never replay it (a retry runs the work again); give the status the work's own answer has (2xx, 3xx, or a 4xx Keep records)", status)
	}
	replay, err := replayList(o.ReplayHeaders)
	if err != nil {
		return idem.Resolution{}, err
	}
	resp := &httprecord.Response{Status: status, Header: make(http.Header, len(header)), Body: body}
	for k, vs := range header {
		ck := textproto.CanonicalMIMEHeaderKey(k)
		if !slices.Contains(replay, ck) {
			return idem.Resolution{}, fmt.Errorf("middleware: Resolution: header %q is not one the middleware replays (Options.ReplayHeaders: %s)", k, strings.Join(replay, ", "))
		}
		for _, v := range vs {
			if strings.ContainsAny(v, "\r\n\x00") {
				return idem.Resolution{}, fmt.Errorf("middleware: Resolution: header %s: value %q holds a CR, LF or NUL, which no HTTP field value may", ck, v)
			}
		}
		resp.Header[ck] = append(resp.Header[ck], vs...)
	}
	if limit := cmp.Or(o.MaxResponseBytes, DefaultMaxResponseBytes); len(body) > limit {
		return idem.Resolution{}, fmt.Errorf("middleware: Resolution: a body of %d bytes is over MaxResponseBytes (%d): the middleware would replay it without its body", len(body), limit)
	}
	return idem.Resolution{Confirm: true, Result: httprecord.Encode(resp)}, nil
}
