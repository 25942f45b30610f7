package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/idemgo/idem/internal/backoff"
)

// Transport is an http.RoundTripper that gives each logical request of a
// covered method one idempotency key and retries it with that key (see the
// package documentation). Create it with New; it is safe for concurrent
// use.
type Transport struct {
	c *config
}

// New returns the Transport that Options describe, or an error naming the
// field at fault when they hold a mistake: a negative duration or count, a
// header name or method that is not a token, a method in lower case or
// listed twice, an InitialWait longer than MaxWait.
func New(o Options) (*Transport, error) {
	c, err := o.config()
	if err != nil {
		return nil, err
	}
	return &Transport{c: c}, nil
}

// drainBytes bounds what is read from a retried response's body so that
// its connection can be reused; a longer body closes the connection.
const drainBytes = 64 << 10

// RoundTrip sends req, and again with the same key while the outcome is
// one that is retried and the bounds allow. It returns the last attempt's
// response, whose Request carries the key; or the last attempt's error,
// wrapped to say why no attempt followed; or, when the request's context
// ended during a wait, ctx.Err() joined with the last attempt's error.
// req itself is never modified.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	c := t.c
	if !c.methods[req.Method] {
		return c.Base.RoundTrip(req)
	}
	first := req
	if req.Header.Get(c.Header) == "" {
		first = withKey(req, c.Header, uuid.NewString())
	}
	ctx := req.Context()
	// A body read by an attempt cannot be sent again without GetBody: a
	// retry would carry an empty or partial body under the same key.
	resendable := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
	start := time.Now()
	bo := backoff.Backoff{First: c.InitialWait, Most: c.MaxWait, Growth: 1.5}
	sent := first
	for n := 1; ; n++ {
		resp, err := c.Base.RoundTrip(sent)
		a := Attempt{Request: sent, N: n, Response: resp, Err: err}
		if !retried(resp, err) {
			t.report(a)
			return resp, err
		}
		switch {
		case ctx.Err() != nil:
			a.Reason = "context"
		case !resendable:
			a.Reason = "body"
		case n >= c.MaxAttempts:
			a.Reason = "attempts"
		default:
			a.Wait = min(max(bo.Next(), retryAfter(resp)), c.MaxWait)
			if time.Now().Add(a.Wait).After(c.deadline(ctx, start)) {
				a.Reason, a.Wait = "elapsed", 0
			}
		}
		a.Retry = a.Reason == ""
		t.report(a)
		if !a.Retry {
			if err != nil {
				return nil, fmt.Errorf("client: %s %s: not retried (%s) after %d attempt(s): %w", req.Method, req.URL.Redacted(), a.Reason, n, err)
			}
			return resp, nil
		}
		discard(resp)
		if !backoff.Sleep(ctx, a.Wait) {
			return nil, errors.Join(ctx.Err(), a.Err)
		}
		if sent, err = again(first); err != nil {
			return nil, fmt.Errorf("client: %s %s: GetBody for attempt %d: %w", req.Method, req.URL.Redacted(), n+1, err)
		}
	}
}

func (t *Transport) report(a Attempt) {
	if t.c.OnAttempt != nil {
		t.c.OnAttempt(a)
	}
}

// deadline is when no wait may end past: MaxElapsed from start, or the
// request's deadline when that is sooner.
func (c *config) deadline(ctx context.Context, start time.Time) time.Time {
	d := start.Add(c.MaxElapsed)
	if cd, ok := ctx.Deadline(); ok && cd.Before(d) {
		return cd
	}
	return d
}

// retried reports whether an attempt's outcome is one that is retried with
// the key.
func retried(resp *http.Response, err error) bool {
	if err != nil {
		return !permanent(err)
	}
	switch resp.StatusCode {
	case http.StatusConflict, http.StatusTooManyRequests, http.StatusInternalServerError,
		http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// permanent reports transport errors that no retry fixes: a certificate
// the client does not trust fails the same way every time. Every other
// error leaves the outcome unknown, and the key makes the retry safe.
func permanent(err error) bool {
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
	)
	return errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &hostname) || errors.As(err, &invalid)
}

// retryAfter returns the wait a response's Retry-After asks for (seconds
// or an HTTP date), 0 when it has none.
func retryAfter(resp *http.Response) time.Duration {
	if resp == nil {
		return 0
	}
	v := resp.Header.Get("Retry-After")
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s <= 0 {
			return 0
		}
		return time.Duration(min(s, int64(24*time.Hour/time.Second))) * time.Second
	}
	if at, err := http.ParseTime(v); err == nil {
		return max(time.Until(at), 0)
	}
	return 0
}

// withKey returns a shallow copy of req carrying key in header: RoundTrip
// must not modify the caller's request. The copy and the header's value
// share one allocation.
func withKey(req *http.Request, header, key string) *http.Request {
	k := &struct {
		r http.Request
		v [1]string
	}{r: *req}
	k.v[0] = key
	h := make(http.Header, len(req.Header)+1)
	for name, vs := range req.Header {
		h[name] = vs
	}
	h[header] = k.v[:]
	k.r.Header = h
	return &k.r
}

// again returns the request of a further attempt: first with a fresh body.
func again(first *http.Request) (*http.Request, error) {
	r := *first
	if first.GetBody != nil && first.Body != nil && first.Body != http.NoBody {
		b, err := first.GetBody()
		if err != nil {
			return nil, err
		}
		r.Body = b
	}
	return &r, nil
}

// discard drains and closes a retried response's body, so that its
// connection goes back to the pool.
func discard(resp *http.Response) {
	if resp == nil {
		return
	}
	_, _ = io.CopyN(io.Discard, resp.Body, drainBytes)
	_ = resp.Body.Close()
}
