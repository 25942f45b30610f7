// Package middleware makes POST and PATCH endpoints safe to retry: a
// net/http middleware for the Idempotency-Key header, following
// draft-ietf-httpapi-idempotency-key-header and Stripe's behaviour.
//
// A client sends a unique key with a request that changes something. The
// first request with that key runs the handler; its response is recorded
// and sent. A retry with the same key and the same request gets the
// recorded response, with Idempotent-Replayed: true, and the handler does
// not run again, on any process that shares the store.
//
//	idempotent, err := middleware.New(middleware.Options{
//		Store: store,
//		Scope: func(r *http.Request) (string, error) { // the tenant, from the authenticated principal
//			return accountFrom(r.Context())
//		},
//	})
//	...
//	http.ListenAndServe(addr, authenticate(idempotent(mux)))
//
// New asks for a decision on tenants: a Scope, or SingleTenant: true for a
// service with one. A recorded response goes only to the tenant it
// belongs to: a client that learns another tenant's key (from a proxy
// log, a shared trace) and sends the same request gets its own answer,
// never the other's receipt.
//
// # Answers
//
//	situation                                          answer
//	covered method (POST, PATCH) without the header    pass through; 400 when Options.Required
//	header malformed, empty, repeated, over 255 bytes  400, before any store call
//	first request                                      the handler runs; its response is recorded, then sent
//	same key, same request, done                       the recorded response, Idempotent-Replayed: true
//	same key, different request (done or in flight)    422; this wins over 409
//	same key while the first is in flight              wait up to LockTimeout, then replay, or 409 + Retry-After
//	handler answers what a retry may change            nothing recorded, key released (see Keep rules)
//	handler answers 5xx, or panics                     nothing recorded, key released: a retry runs the handler
//	store unavailable                                  503; the handler does not run (fail closed)
//	the key's earlier requests crashed the server      423 TypeQuarantined; the handler does not run until an
//	  more than MaxTakeOvers times in a row              operator settles the key (idem resolve)
//	a request that took the key over from a crashed    the handler runs with the take-over in its context
//	  one (its lease ran out unconfirmed)                (idem.TakeOverFrom): ask whether its effect landed
//	body over MaxBodyBytes                             413, before any store call
//
// # A 5xx means nothing was done
//
// A 5xx releases the key, and the client package's transport retries a
// 500, 502, 503 or 504 with the same key: the retry runs the handler
// again. So a handler answers 5xx only when nothing was done, or what was
// done is undone (transactional mode rolls its SQL back). A handler that
// did the work (charged the card) and then failed at something after it
// (a receipt e-mail, a template) must not answer 5xx, or every retry does
// the work again: five attempts, five charges. It answers what the work
// came to, a 2xx (200, 201, or 202 Accepted while a later step is
// pending) with the step that failed in its body, which is recorded and
// replayed to every retry.
//
// # Problems
//
// Errors are application/problem+json (RFC 9457), written by Options.Error
// (default WriteProblem), and never carry internal error text. Each has a
// type, title, status and detail; instance, "urn:uuid:" and a random UUID
// that the Logger's line and the Observer (ProblemInstance) carry too, so
// that an operator finds the occurrence a client reports; retryable, true
// when the same request sent again may succeed; and, on the key's errors,
// idempotency_key, the client's key when it is well-formed. Where
// draft-ietf-httpapi-idempotency-key-header defines the case, type is the
// draft's section:
//
//	status  type                                retryable  key             case
//	400     draft 2.1, TypeKeyMissing           false      -               no key, with Options.Required
//	400     draft 2.1, TypeKeyInvalid           false      always          empty, malformed, repeated, too long, or refused by the store
//	400     TypeScopeInvalid                    false      -               Options.Scope returned an error
//	400     TypeBodyUnreadable                  false      -               the body could not be read
//	413     TypeBodyTooLarge                    false      -               the body is over MaxBodyBytes
//	422     draft 2.2, TypeFingerprintMismatch  false      yes             the key was used for another request
//	409     draft 2.6, TypeInProgress           true       yes             the key is being processed; Retry-After: RetryAfter
//	503     TypeStoreUnavailable                true       -               the store is down, or its database busy; Retry-After: RetryAfter
//	500     TypeRecordDamaged                   false      -               the work was done; its record does not decode
//	500     TypeResponseTooLarge                false      -               transactional mode: the response did not fit; rolled back
//	423     TypeQuarantined                     false      yes             the key is quarantined after repeated crashes: a person must settle it
//
// "draft 2.1" is the URI of section 2.1 of the draft
// (https://datatracker.ietf.org/doc/html/draft-ietf-httpapi-idempotency-key-header-07#section-2.1);
// "key" is the idempotency_key member: the client's key when it is
// well-formed, and "" where the table says always and the key is empty or
// not shown (malformed, too long, repeated).
//
// Two choices differ, deliberately, from some other implementations. Two
// different keys are two operations, even with the same body: never a 409,
// since two identical payments can both be meant. And a replay says so with
// Stripe's Idempotent-Replayed: true. As Stripe's, a replay names the
// request that did the work, Original-Request: its request id, with
// Options.RequestIDHeader.
//
// # Keys, scopes and fingerprints
//
// The header's value is an RFC 8941 string ("...") or, for Stripe-style
// clients, a bare run of RFC 8941 token characters; "abc" and abc are the
// same key. The record's key joins the scope (Options.Scope: the tenant;
// "" with SingleTenant) and the client's key, in an injective,
// length-prefixed encoding, so that tenants never share a record.
//
// The record's key holds nothing of the route: one key from one tenant
// maps to one record however the middleware is mounted, around a
// ServeMux, around a wrapper of it, inside each route, under
// http.StripPrefix, under chi's Use or With. A retry that spans a deploy
// which changed only the wrapping is answered with the recorded response,
// never run twice.
//
// The fingerprint tells a retry from a different request reusing the key:
// SHA-256 over the method, the request target as the client sent it
// (r.RequestURI: path and query), the content type and the body. The
// method and the target make a key reused on another endpoint, or on
// another resource (/orders/2 after /orders/1), a 422, as Stripe answers.
// They are read the same in every mounting, which a route pattern is not:
// a ServeMux's pattern is known inside the route and around the mux, not
// around a wrapper of it; chi's is "" under Use; http.StripPrefix changes
// r.URL.Path but not r.RequestURI. A retry sends the same target, so it
// has the same fingerprint wherever the middleware sits. A multipart body
// counts by its fields and its files' names and sizes, so a retried upload
// with a new boundary is still a retry. [Fingerprint] computes the same
// for a handler that calls the SQL store's Run itself; Options.Fingerprint
// replaces what is computed of the content type and body, never the method
// and target.
//
// Records written by earlier versions, whose key also held the method and
// a route, are not read: they need no migration and expire with their
// retention. A retry that spans the upgrade finds no record and runs the
// handler again, as one whose record expired would: clients retry within
// seconds or minutes, so upgrade when few requests are in flight.
//
// # Keep rules
//
// A response is recorded, and replayed to every retry of its key for the
// store's retention, only when a retry of the same request could not
// change it (DefaultKeep, Options.Keep). An answer that says the work did
// not happen, and may happen on a later try, releases the key instead: the
// retry runs the handler. Recording it would poison the key: the client's
// retry (which the client package's transport makes for 409 and 429) would
// get the same refusal for the whole retention.
//
//	status                   kept  why
//	2xx                      yes   the work was done: its answer is the one to replay
//	3xx                      yes   the answer says where the result is (Location)
//	400 410 413 414 415 422  yes   what the fingerprint covers is at fault (malformed, too large,
//	                               gone for good, unprocessable): the same request gets the same answer
//	406 411 417 428 431      no    a header the fingerprint does not cover is at fault (Accept,
//	                               Content-Length, Expect, If-Match, their size): the retry that
//	                               fixes it is the same request to the middleware, and runs
//	401 403 407              no    credentials: the client may sign in again, or be granted access
//	404 405 421              no    the request reached no endpoint that acts (a router's answer, a
//	                               resource that may exist later): nothing was done
//	408 425 429              no    timing: too slow, too early, too fast; the same request may
//	                               succeed later (the client transport retries 429)
//	409 423                  no    the resource is busy or in a conflicting state
//	                               (the client transport retries 409)
//	402 412 416 424 426 451  no    something besides the request decides (a payment, the resource's
//	                               version or length, another request, the protocol, the law)
//	other 4xx, 1xx, 600-999  no    a meaning the middleware does not know
//	5xx                      no    the server failed: a retry runs the handler
//
// A replay carries the recorded status, the headers of
// Options.ReplayHeaders, among them those a kept status needs (Location,
// Content-Location, Content-Range, Accept-*, Retry-After, Allow for a Keep
// that records a 405), and the body. A Keep of one's own may record more:
// a 402 card decline, say, to answer a retry of the payment with it.
//
// # Bodies
//
// The body must be read before the handler runs (the fingerprint needs it)
// and given back whole. It is copied once, bounded by MaxBodyBytes, into a
// spool: the first 64 KiB in memory, the rest in a temporary file removed
// when the request ends. The fingerprint and then the handler read the
// spool from its start. An upload therefore never sits whole in memory, a
// small JSON body never touches the disk, and the network is read once.
//
// Responses are held the same way (in memory up to MaxResponseBytes, on
// disk past it) and sent after the record is written: in transactional mode
// after the commit. A response over MaxResponseBytes is sent whole and
// recorded as done with its status and allowlisted headers but no body; its
// replays say so with Idempotent-Body-Omitted: true. A completed write is
// never run again for want of room. Because responses are held, a covered
// handler cannot stream (there is no http.Flusher).
//
// Replays carry only the headers of Options.ReplayHeaders; Set-Cookie,
// Authorization, WWW-Authenticate and Proxy-Authenticate are never replayed
// (New refuses them): a replay goes to whoever holds the key in the scope,
// and credentials must not go with it.
//
// A record must fit the store's MaxResultBytes: New checks that
// MaxResponseBytes and RecordOverhead (8 KiB for the status, the request id
// and the replayed headers) fit it together, and lowers the default
// MaxResponseBytes to fit, so that a body of MaxResponseBytes is always
// recorded whole. A response whose replayed headers are over
// RecordOverhead is recorded without its body when the whole would not
// fit.
//
// # Lease mode
//
// With Options.Store, the request claims its key under a lease
// (idem.Store.Claim), the handler runs with the lease renewed by
// idem.KeepAlive and available from idem.LeaseFrom (its Token is a fencing
// token), and the response is confirmed. Confirm and Forget run on a
// context detached from the request, with their own timeout and retries: a
// client that hangs up after the work is done must not leave the key
// claimed. They retry until RecordTimeout or the lease's end, whichever
// comes first: past it the key is no longer this request's to record. If
// the record cannot be written by then, the client still gets the
// handler's response (the work was done; the Logger is told), and a retry
// after the lease runs out runs the handler again.
//
// Replays are where a local cache pays: with Options.Store an idem.Cache
// around the store (idem.NewCache(store, idem.CacheOptions{})), a replay
// of a recorded response is answered from the process's memory without a
// round trip: ~5× the replays a second of the store alone (automatic
// pipelining on) on Redis at 64 goroutines (docs/BENCHMARKS.md). The cache
// is off unless wrapped: a record deleted by hand is still replayed for up
// to its MaxAge (1s by default), and safe by default comes before fast.
//
// # Transactional mode
//
// With Options.Tx, a [TxStore] such as [github.com/idemgo/idem/sqlstore.Store], the request runs
// in its Run: the claim, the handler's own SQL and the record commit in one
// transaction, and the response is sent after the commit. The handler gets
// the transaction from the store's context helper, for a *sqlstore.Store
// [github.com/idemgo/idem/sqlstore.TxFromContext]:
//
//	tx, ok := sqlstore.TxFromContext(r.Context())
//
// A request without a key (Options.Required false) passes through, as one
// of a method not covered does: the handler runs without a transaction and
// nothing is recorded. TxFromContext then reports false, and the handler
// opens its own transaction (see ExampleNew_transactional), or set
// Options.Required to answer such requests 400:
//
//	tx, ok := sqlstore.TxFromContext(r.Context())
//	if !ok { // no key: not idempotent, no transaction of the middleware's
//		own, err := db.BeginTx(r.Context(), nil)
//		...
//		defer own.Rollback() // a no-op after own.Commit()
//		tx = own
//	}
//	... // the handler's SQL on tx; then, when !ok, tx.Commit()
//
// A 5xx or a panic rolls back both. A request that meets another of
// its key in flight waits for it in the database (for the SQL store's
// LockTimeout per attempt, retried up to Options.LockTimeout) and then
// replays it. The in-flight request's fingerprint is not visible before
// its commit, so there a different request waits as a retry would before
// its 422.
//
// On SQLite a Run holds the database's single writer, so requests of other
// keys wait for it too. One that still waits at Options.LockTimeout is
// answered 503 (TypeStoreUnavailable, "the database is busy", Retry-After),
// not 409: no request of its key is in flight. 409 is for a key that a
// request of this middleware is running; a request of the same key in
// another process cannot be told from other work there, and gets the 503.
//
// # Observing
//
// Options.Observer receives one idem.Event, with Op idem.OpRequest, per
// request the middleware acts on (a covered method with a key, or without
// one when Options.Required), after the response is written:
//
//   - Outcome is the outcome of the request's claim: Claimed, the handler
//     ran; Duplicate, a replay; InProgress, another request held the key,
//     and this one answered 409 or its client left while waiting.
//   - Took is the whole request, handler included.
//   - KeyHash is the hash of the key as stored (scope and client key), by
//     Options.KeyHasher.
//   - Err is the idempotency layer's answer, not the handler's: nil when it
//     did its part, even for a 5xx the handler answered; idem.ErrInvalidKey
//     or idem.ErrTooLarge (Class invalid) for a request refused before any
//     store call; idem.ErrFingerprintMismatch or idem.ErrInProgress (Class
//     conflict) for a 422 or a 409; the store's error for a 503 or for a
//     response that could not be recorded.
//
// When the Observer is an idem.Starter, it is started before the first
// store call, and its context is the handler's and the store calls'
// context, so that spans nest. Give the store the same Observer to see the
// store operations of each request too. With no Observer nothing is
// measured and nothing is allocated for it.
//
// # Recorded responses
//
// A response is stored as the store's result bytes, version 1:
//
//	byte     version (1)
//	byte     flags: bit 0 set when the body was omitted; other bits zero
//	uint16   status, big-endian
//	uvarint  number of header lines, then for each line
//	         uvarint length and bytes of the name, uvarint length and bytes of the value
//	uvarint  length and bytes of the body
//
// A line whose name begins with ':', never a header field name, is the
// middleware's own: ":original-request" holds the Options.RequestIDHeader
// value of the request that did the work, replayed as Original-Request.
// Records written before it (without such a line) replay as they did, and
// a version that predates it skips the line, as any line not in its
// ReplayHeaders.
//
// A record that does not decode is answered 500 (TypeRecordDamaged),
// never a panic and never a second run.
package middleware
