// Package client is the client half of a safe retry: an [http.RoundTripper]
// that sends one Idempotency-Key per logical request and retries it, with
// that key, through lost responses, resets, timeouts and overload.
//
// It is for servers that honour Idempotency-Key (the idem middleware, Stripe
// and the other APIs that follow draft-ietf-httpapi-idempotency-key-header).
// Against a server that ignores the header, a retried POST is a second POST:
// the transport would repeat the very effect it is meant to make safe. Use
// it only in front of servers that deduplicate by the key.
//
// # The model
//
// A client that sent a request and never got an answer cannot tell a
// request lost on the way out from one whose response was lost on the way
// back. Retrying is the only way to learn the outcome, and the key is what
// makes the retry safe: the server runs the first request that reaches it
// and replays its response to every retry of the same key.
//
// For each RoundTrip of a covered method (POST and PATCH by default) the
// transport:
//
//   - keeps the caller's key when the request has one, or sets a fresh
//     random one (a UUID), once, and sends the same key on every attempt;
//   - retries, with that key, what may be retried: a transport error (a
//     refused connection, a reset, EOF, a timeout after the request was
//     written: the outcome is unknown), 409 (the first attempt is still
//     running), 429, 500, 502, 503 and 504;
//   - never retries another status: a 4xx such as 400, 413 or 422 says the
//     request itself is wrong, and sending it again cannot fix it;
//   - waits between attempts with jittered exponential backoff, or the
//     response's Retry-After when that says longer, never more than
//     Options.MaxWait;
//   - stops after Options.MaxAttempts attempts, before a wait that would
//     end past Options.MaxElapsed or the request's deadline, and at once
//     when the request's context ends;
//   - drains and closes the body of every response it retries, so that its
//     connection is reused.
//
// A 5xx is retried because the server says, by it, that nothing was done:
// the idem middleware releases the key on a 5xx so that the retry runs
// the handler again. A handler behind it that did the work and then
// answers 500 does the work once per attempt. Servers this transport
// calls answer 5xx only when nothing was done, and a 2xx that names the
// step that failed when the work was done (see package middleware, "A 5xx
// means nothing was done").
//
// The response returned is the last attempt's; its Request carries the key
// that was sent (resp.Request.Header.Get("Idempotency-Key")), to log or to
// retry with later.
//
// # Bodies
//
// A request whose body cannot be read again (Body set, GetBody nil) is sent
// once: a second attempt would send an empty or partial body under the same
// key, which the server rejects (422) at best. [http.NewRequest] sets
// GetBody for the usual in-memory bodies (*bytes.Buffer, *bytes.Reader,
// *strings.Reader).
//
// # Observing
//
// Options.OnAttempt is called after every attempt with its number, its
// status or error, and the wait before the next one. An [http.Transport]
// base may resend a request carrying Idempotency-Key once by itself, when
// a reused connection closes before any response; that resend is part of
// one attempt here.
//
// Methods the transport does not cover pass through to the base transport
// untouched: no key, no retry.
package client
