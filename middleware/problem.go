package middleware

import (
	"encoding/json"
	"net/http"
)

// Problem is an error answer, rendered by Options.Error as an RFC 9457
// problem details object. Type, Title, Status and Detail are safe to show a
// client; Err is the cause, for logs and for the hook, and is never written
// by WriteProblem.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	Err    error  `json:"-"`
}

// The problem types, one per case: stable URIs, documented at these very
// anchors.
const (
	// TypeKeyMissing (400): the request has no key and Options.Required is set.
	TypeKeyMissing = "https://pkg.go.dev/github.com/idemgo/idem/middleware#TypeKeyMissing"
	// TypeKeyInvalid (400): the key is empty, too long, malformed, or sent
	// in more than one header field; or the store refused the whole key.
	TypeKeyInvalid = "https://pkg.go.dev/github.com/idemgo/idem/middleware#TypeKeyInvalid"
	// TypeScopeInvalid (400): Options.Scope returned an error.
	TypeScopeInvalid = "https://pkg.go.dev/github.com/idemgo/idem/middleware#TypeScopeInvalid"
	// TypeBodyTooLarge (413): the body is over Options.MaxBodyBytes.
	TypeBodyTooLarge = "https://pkg.go.dev/github.com/idemgo/idem/middleware#TypeBodyTooLarge"
	// TypeBodyUnreadable (400): the body could not be read to its end.
	TypeBodyUnreadable = "https://pkg.go.dev/github.com/idemgo/idem/middleware#TypeBodyUnreadable"
	// TypeFingerprintMismatch (422): the key was used for a different
	// request (method, route, content type or body). It wins over
	// TypeInProgress.
	TypeFingerprintMismatch = "https://pkg.go.dev/github.com/idemgo/idem/middleware#TypeFingerprintMismatch"
	// TypeInProgress (409, with Retry-After): a request with the key is
	// still being handled after Options.LockTimeout.
	TypeInProgress = "https://pkg.go.dev/github.com/idemgo/idem/middleware#TypeInProgress"
	// TypeStoreUnavailable (503, with Retry-After): the store could not be
	// reached; the handler did not run, or its work was rolled back.
	TypeStoreUnavailable = "https://pkg.go.dev/github.com/idemgo/idem/middleware#TypeStoreUnavailable"
	// TypeRecordDamaged (500): the recorded response does not decode. The
	// work was done; the handler does not run again.
	TypeRecordDamaged = "https://pkg.go.dev/github.com/idemgo/idem/middleware#TypeRecordDamaged"
	// TypeResponseTooLarge (500): in transactional mode, the recorded
	// response did not fit the store's MaxResultBytes, and the work was
	// rolled back.
	TypeResponseTooLarge = "https://pkg.go.dev/github.com/idemgo/idem/middleware#TypeResponseTooLarge"
)

// problems are the answers of each case, before the hook sees them.
var problems = map[string]Problem{
	TypeKeyMissing:          {Status: 400, Title: "Idempotency key missing", Detail: "This endpoint requires an idempotency key."},
	TypeKeyInvalid:          {Status: 400, Title: "Idempotency key invalid"},
	TypeScopeInvalid:        {Status: 400, Title: "Request scope invalid"},
	TypeBodyTooLarge:        {Status: 413, Title: "Request body too large"},
	TypeBodyUnreadable:      {Status: 400, Title: "Request body unreadable"},
	TypeFingerprintMismatch: {Status: 422, Title: "Idempotency key reused", Detail: "The key was used for a different request."},
	TypeInProgress:          {Status: 409, Title: "Request in progress", Detail: "A request with this key is still being handled; retry later."},
	TypeStoreUnavailable:    {Status: 503, Title: "Service unavailable", Detail: "The request was not processed; retry later."},
	TypeRecordDamaged:       {Status: 500, Title: "Recorded response unreadable", Detail: "The request was processed, but its response cannot be replayed."},
	TypeResponseTooLarge:    {Status: 500, Title: "Response too large to record", Detail: "The request was not processed."},
}

// problem returns the Problem of type t, with detail (safe text) and err.
func problem(t, detail string, err error) *Problem {
	p := problems[t]
	p.Type = t
	if detail != "" {
		p.Detail = detail
	}
	p.Err = err
	return &p
}

// WriteProblem writes p as application/problem+json with p.Status, the
// default Options.Error. It never writes p.Err.
func WriteProblem(w http.ResponseWriter, r *http.Request, p *Problem) {
	b, _ := json.Marshal(p) // strings and an int: cannot fail
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	_, _ = w.Write(append(b, '\n'))
}
