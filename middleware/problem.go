package middleware

import (
	"context"
	"encoding/json"
	"net/http"
)

// Problem is an error answer, rendered by Options.Error as an RFC 9457
// problem details object. Every field but Err is safe to show a client; Err
// is the cause, for logs and for the hook, and is never written by
// WriteProblem.
type Problem struct {
	// Type is the case, one of the Type constants: the draft's section
	// where draft-ietf-httpapi-idempotency-key-header defines the case,
	// ours elsewhere.
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Instance names this occurrence, "urn:uuid:" and a random UUID. The
	// same value is in the Logger's line for it and, for the Observer, in
	// ProblemInstance of the event's context: a client that reports it
	// leads an operator to the occurrence.
	Instance string `json:"instance,omitempty"`
	// Retryable reports whether the same request, sent again unchanged
	// (same key), may succeed: true for 409 and 503, false otherwise.
	Retryable bool `json:"retryable"`
	// IdempotencyKey is the client's key, on the key's errors (400
	// TypeKeyInvalid, 409, 422, 423) when it is well-formed: printable ASCII, as
	// a header key always is. On those errors the idempotency_key member is
	// always written, "" for a key that is empty or not shown (malformed,
	// too long, repeated); on other problems it is written only when not
	// empty.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	Err            error  `json:"-"`
	// keyMember makes the idempotency_key member written even when empty:
	// a client told its key is invalid reads which key was meant.
	keyMember bool
}

// MarshalJSON writes p as the problem details object WriteProblem sends:
// its members as tagged, and idempotency_key also when empty on the key's
// errors.
func (p Problem) MarshalJSON() ([]byte, error) {
	type plain Problem // without this method
	if p.IdempotencyKey != "" || !p.keyMember {
		return json.Marshal(plain(p))
	}
	return json.Marshal(struct {
		plain
		IdempotencyKey string `json:"idempotency_key"` // shallower: wins over plain's
	}{plain: plain(p)})
}

// draft is the IETF draft that defines the Idempotency-Key header; its
// sections name the cases it defines.
const draft = "https://datatracker.ietf.org/doc/html/draft-ietf-httpapi-idempotency-key-header-07"

// The problem types: the draft's sections for the cases it defines (several
// constants may share one), stable URIs of ours, documented at these very
// anchors, for the rest.
const (
	// TypeKeyMissing (400): the request has no key and Options.Required is
	// set. The draft's section 2.1, as TypeKeyInvalid.
	TypeKeyMissing = draft + "#section-2.1"
	// TypeKeyInvalid (400): the key is empty, too long, malformed, or sent
	// in more than one header field; or the store refused the whole key.
	TypeKeyInvalid = draft + "#section-2.1"
	// TypeScopeInvalid (400): Options.Scope returned an error.
	TypeScopeInvalid = "https://pkg.go.dev/github.com/idemgo/idem/middleware#TypeScopeInvalid"
	// TypeBodyTooLarge (413): the body is over Options.MaxBodyBytes.
	TypeBodyTooLarge = "https://pkg.go.dev/github.com/idemgo/idem/middleware#TypeBodyTooLarge"
	// TypeBodyUnreadable (400): the body could not be read to its end.
	TypeBodyUnreadable = "https://pkg.go.dev/github.com/idemgo/idem/middleware#TypeBodyUnreadable"
	// TypeFingerprintMismatch (422): the key was used for a different
	// request (method, request target, content type or body). It wins over
	// TypeInProgress. The draft's section 2.2.
	TypeFingerprintMismatch = draft + "#section-2.2"
	// TypeInProgress (409, with Retry-After): a request with the key is
	// still being processed after Options.LockTimeout. The draft's
	// section 2.6.
	TypeInProgress = draft + "#section-2.6"
	// TypeStoreUnavailable (503, with Retry-After): the store could not be
	// reached, or its database was busy with other requests' writes; the
	// handler did not run, or its work was rolled back.
	TypeStoreUnavailable = "https://pkg.go.dev/github.com/idemgo/idem/middleware#TypeStoreUnavailable"
	// TypeRecordDamaged (500): the recorded response does not decode. The
	// work was done; the handler does not run again.
	TypeRecordDamaged = "https://pkg.go.dev/github.com/idemgo/idem/middleware#TypeRecordDamaged"
	// TypeQuarantined (423 Locked, not retryable): the key's requests
	// crashed the server more times in a row than the store's
	// MaxTakeOvers (each took the key over from one whose lease ran out
	// unconfirmed), so the store quarantined it: the handler does not run
	// for it again until an operator settles it (idem resolve: run it
	// again, or record it as done). A retry with the key gets the same
	// answer; the client should report it, not resend it. 423, not a 5xx
	// or 409: clients (this module's client.Transport among them) retry
	// those by themselves.
	TypeQuarantined = "https://pkg.go.dev/github.com/idemgo/idem/middleware#TypeQuarantined"
	// TypeResponseTooLarge (500): in transactional mode, the recorded
	// response did not fit the store's MaxResultBytes, and the work was
	// rolled back.
	TypeResponseTooLarge = "https://pkg.go.dev/github.com/idemgo/idem/middleware#TypeResponseTooLarge"
)

// kind is a case of Problem: the types alone do not tell them apart, since
// the draft's sections are shared.
type kind int

const (
	kindKeyMissing kind = iota
	kindKeyInvalid
	kindScopeInvalid
	kindBodyTooLarge
	kindBodyUnreadable
	kindFingerprintMismatch
	kindInProgress
	kindStoreUnavailable
	kindStoreBusy
	kindRecordDamaged
	kindResponseTooLarge
	kindQuarantined
)

// problems are the answers of each case, before the hook sees them.
var problems = [...]Problem{
	kindKeyMissing:          {Type: TypeKeyMissing, Status: 400, Title: "Idempotency key missing", Detail: "This endpoint requires an idempotency key."},
	kindKeyInvalid:          {Type: TypeKeyInvalid, Status: 400, Title: "Idempotency key invalid"},
	kindScopeInvalid:        {Type: TypeScopeInvalid, Status: 400, Title: "Request scope invalid"},
	kindBodyTooLarge:        {Type: TypeBodyTooLarge, Status: 413, Title: "Request body too large"},
	kindBodyUnreadable:      {Type: TypeBodyUnreadable, Status: 400, Title: "Request body unreadable"},
	kindFingerprintMismatch: {Type: TypeFingerprintMismatch, Status: 422, Title: "Idempotency key reused", Detail: "The key was used for a different request."},
	kindInProgress:          {Type: TypeInProgress, Status: 409, Retryable: true, Title: "Request in progress", Detail: "A request with this key is being processed; retry later."},
	kindStoreUnavailable:    {Type: TypeStoreUnavailable, Status: 503, Retryable: true, Title: "Service unavailable", Detail: "The request was not processed; retry later."},
	kindStoreBusy:           {Type: TypeStoreUnavailable, Status: 503, Retryable: true, Title: "Service unavailable", Detail: "The database is busy with other requests; the request was not processed; retry later."},
	kindRecordDamaged:       {Type: TypeRecordDamaged, Status: 500, Title: "Recorded response unreadable", Detail: "The request was processed, but its response cannot be replayed."},
	kindResponseTooLarge:    {Type: TypeResponseTooLarge, Status: 500, Title: "Response too large to record", Detail: "The request was not processed."},
	kindQuarantined: {Type: TypeQuarantined, Status: 423, Title: "Idempotency key quarantined",
		Detail: "Earlier attempts of the request with this key failed repeatedly without completing; it will not be processed again until an operator settles it. Do not retry: report the key."},
}

// problem returns the Problem of case k, with detail (safe text) and err.
func problem(k kind, detail string, err error) *Problem {
	p := problems[k]
	if detail != "" {
		p.Detail = detail
	}
	p.Err = err
	return &p
}

// keyProblem is problem for a case about the client's key, which it
// carries when it is well-formed ("" otherwise).
func keyProblem(k kind, key, detail string, err error) *Problem {
	p := problem(k, detail, err)
	p.keyMember = true
	if printable(key) {
		p.IdempotencyKey = key
	}
	return p
}

// printable reports whether s is non-empty printable ASCII: a key that is
// safe to show back, in a log viewer too.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return s != ""
}

// observation is what an observed request's context carries for the
// Observer: whether the handler ran, and the instance of the problem it
// was answered with.
type observation struct {
	handlerRan bool
	instance   string
}

type observationKey struct{}

// ProblemInstance returns the Instance of the Problem the middleware
// answered a request with, given the context of that request's event
// (the ctx the Observer's Observe receives); "" when the request was
// answered without a problem, or ctx is not such a context.
func ProblemInstance(ctx context.Context) string {
	if o, ok := ctx.Value(observationKey{}).(*observation); ok {
		return o.instance
	}
	return ""
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
