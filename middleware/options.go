package middleware

import (
	"cmp"
	"io"
	"log/slog"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/badopt"
	"github.com/idemgo/idem/internal/nilcheck"
)

// Options configure the middleware. The zero value of every field means its
// documented default; exactly one of Store and Tx must be set, and exactly
// one of Scope and SingleTenant. New refuses a mistake in any field with an
// error that names the field.
type Options struct {
	// Store holds the records in lease mode: the handler runs under a
	// lease and its response is confirmed afterwards (see Lease mode in the
	// package documentation). Set Store or Tx, not both. Default: none.
	Store idem.Store
	// Tx holds the records in transactional mode: the handler runs inside
	// Tx.Run and its response is sent after the commit; with an
	// *sqlstore.Store its SQL joins the transaction through
	// sqlstore.TxFromContext(r.Context()); a request without a key runs
	// without one. Set Store or Tx, not both. Default: none.
	Tx TxStore
	// Header names the request header that carries the client's key: a
	// header field name, in any case. Not with Key, which replaces it.
	// Default "Idempotency-Key".
	Header string
	// RequestIDHeader names the request header that identifies a request
	// (X-Request-Id, say): its value, up to 255 bytes, is recorded with the
	// response, and a replay answers Original-Request: <that value>, naming
	// the request that did the work. A header field name, in any case; not
	// the key's header nor one that carries credentials. Default "": none.
	RequestIDHeader string
	// Required answers 400 to a covered request without a key instead of
	// passing it through. Default false.
	Required bool
	// Methods are the request methods the middleware covers, each an
	// upper-case token listed once (method names are case-sensitive:
	// "post" matches no request); others pass through untouched. Default
	// POST and PATCH.
	Methods []string
	// Key takes the client's key from elsewhere than a header, a webhook's
	// event id say: it returns the key, "" for none (then Required
	// decides), or an error (400; the error is never shown). The key is
	// bounded by MaxKeyBytes too. A key names one operation per scope,
	// whichever endpoint receives it: a sender that delivers one event id
	// to several endpoints (as webhook senders do) needs the endpoint in
	// the key, r.URL.Path+" "+id, or each endpoint after the first answers
	// 422. Default: the Header's value, an RFC 8941 string or a bare token.
	Key func(*http.Request) (string, error)
	// Scope names the tenant the request acts for, taken from its
	// authenticated principal (an account id, an API key's id; never from
	// what the client merely claims), so that one tenant's key never
	// replays another's response: the record's key is the scope and the
	// client's key. An error, or an empty scope (which every request
	// without a principal would share), answers 400 unless the Error hook
	// decides otherwise. Set Scope or SingleTenant:
	// New refuses neither and both. Default: none.
	Scope func(*http.Request) (string, error)
	// SingleTenant states that the service has one tenant: every request
	// shares one scope, so that whoever sends a recorded key with the same
	// request receives its recorded response. Only for a service whose
	// callers all act for one party (an internal service, a single
	// account's API). Set Scope or SingleTenant: New refuses neither and
	// both. Default false.
	SingleTenant bool
	// LockTimeout bounds how long a request waits for another request of
	// the same key in flight before answering 409 with Retry-After.
	// Default 5s.
	LockTimeout time.Duration
	// RetryAfter is the Retry-After of a 409 (the key in flight) and a 503
	// (the store unavailable or busy), rounded up to whole seconds. It is
	// a short poll, not the holder's lease end: a request in flight
	// usually finishes long before its lease would run out. At most 1h.
	// Default 1s.
	RetryAfter time.Duration
	// MaxKeyBytes bounds the client's key (from Header or Key), in bytes;
	// a longer one is 400. The store's own MaxKeyBytes bounds the whole
	// record key (scope and client key). Default 255.
	MaxKeyBytes int
	// MaxBodyBytes bounds a covered request's body, read before the
	// handler runs (see Bodies in the package documentation); a longer
	// one is 413. Default 10 MiB.
	MaxBodyBytes int64
	// MaxResponseBytes bounds the response body that is recorded for
	// replay. A longer response is still sent whole and recorded as done,
	// without its body (replays carry Idempotent-Body-Omitted: true). With
	// a store that reports its MaxResultBytes (idem.MemoryStore,
	// idem.RedisStore, sqlstore.Store: a MaxResultBytes() int method), New
	// refuses a MaxResponseBytes that would not fit it with RecordOverhead
	// beside, so that a body of MaxResponseBytes is always recorded whole.
	// Default 512 KiB, or less to fit the store's MaxResultBytes.
	MaxResponseBytes int
	// ReplayHeaders are the response headers recorded and replayed, each
	// a header field name listed once, in any case. Set-Cookie,
	// Authorization, WWW-Authenticate and Proxy-Authenticate may not be
	// listed. Default DefaultReplayHeaders.
	ReplayHeaders []string
	// Keep reports whether a response with this status is recorded. A
	// response not kept releases the key, so that a retry runs the handler
	// again: keep only answers that a retry of the same request cannot
	// change (see Keep rules in the package documentation). Default:
	// DefaultKeep.
	Keep func(status int) bool
	// Fingerprint computes what tells two requests to one endpoint apart,
	// from the request and a fresh reader over its body (the handler still
	// gets the whole body); an error answers 400. The middleware joins it
	// to the method and the request target (SHA-256 over the three), so
	// that a key reused on another endpoint is a 422 whatever it returns.
	// Default: SHA-256 over the method, the request target, the content
	// type and the body (multipart: the fields and the files' names and
	// sizes), as Fingerprint computes it.
	Fingerprint func(r *http.Request, body io.Reader) ([]byte, error)
	// Error writes an error response. It may change everything about it,
	// the status included. Default: WriteProblem.
	Error func(w http.ResponseWriter, r *http.Request, p *Problem)
	// RecordTimeout bounds, in lease mode, the store calls that record
	// (Confirm) or release (Forget) the key after the handler ran, retries
	// included; they run detached from the request's cancellation, and
	// never retry past the lease's end (the last renewal plus the store's
	// LeaseTTL), where the response is sent unrecorded. Default 10s.
	RecordTimeout time.Duration
	// Logger receives one line per problem answered (its instance, type,
	// status and cause; level Error for a 5xx, Info otherwise) and, in
	// lease mode, what the middleware cannot tell the client: a response
	// that could not be recorded, a key that could not be released, work
	// done twice. Keys appear as their KeyHasher hash, never raw. Default:
	// none.
	Logger *slog.Logger
	// Observer receives one idem.Event, Op idem.OpRequest, per request the
	// middleware acts on, after the response is written; an idem.Starter
	// is started first, so that the store's and the handler's spans nest
	// in the request's; ProblemInstance of the ctx it receives names the
	// problem answered. See Observing in the package documentation.
	// Default: none, and nothing is measured.
	Observer idem.Observer
	// KeyHasher hashes keys for the Logger and the Observer. Give it the
	// store's (idem.Options.KeyHasher) so that a request's events and log
	// lines correlate with its store operations. Default: the process's
	// (idem.KeyHash).
	KeyHasher *idem.KeyHasher
}

// Defaults of Options.
const (
	DefaultHeader           = "Idempotency-Key"
	DefaultLockTimeout      = 5 * time.Second
	DefaultRetryAfter       = time.Second
	DefaultMaxKeyBytes      = 255
	DefaultMaxBodyBytes     = 10 << 20
	DefaultMaxResponseBytes = 512 << 10
	DefaultRecordTimeout    = 10 * time.Second
)

// RecordOverhead is the room a recorded response takes besides its body:
// its version, flags and status, the request id, and the replayed
// headers, up to 8 KiB of them. New checks that MaxResponseBytes and
// RecordOverhead fit the store's MaxResultBytes together. A response whose
// replayed headers are larger still is recorded without its body when the
// whole would not fit.
const RecordOverhead = 8 << 10

// DefaultReplayHeaders are the response headers replayed by default: those
// that describe the representation or the created resource, and those a
// status needs to be acted on: Location (201, 3xx), Content-Range (206),
// Accept, Accept-Encoding, Accept-Patch and Accept-Post (415), Allow (405)
// and Retry-After (413, 429, 503), for a Keep that records them.
var DefaultReplayHeaders = []string{
	"Accept", "Accept-Encoding", "Accept-Patch", "Accept-Post", "Allow",
	"Cache-Control", "Content-Disposition", "Content-Encoding", "Content-Language",
	"Content-Location", "Content-Range", "Content-Type", "ETag", "Expires", "Last-Modified",
	"Link", "Location", "Retry-After", "Vary",
}

// neverReplayed are headers that carry credentials or challenges.
var neverReplayed = map[string]bool{
	"Set-Cookie": true, "Authorization": true, "Www-Authenticate": true, "Proxy-Authenticate": true,
}

// config is Options validated, with defaults filled in.
type config struct {
	Options
	methods    map[string]bool
	replay     []string // canonical names
	retryAfter string   // RetryAfter in whole seconds, as sent
	// maxResult is the store's MaxResultBytes, 0 when the store does not
	// report it.
	maxResult int
	// running holds the store keys whose handler runs inside a Run, for
	// telling a busy database from a key in flight (tx.go).
	running sync.Map // string -> bool
}

func (o Options) config() (*config, error) {
	for _, f := range []struct {
		name string
		v    any
	}{{"Store", o.Store}, {"Tx", o.Tx}, {"Observer", o.Observer}} {
		// An interface holding a nil pointer is not == nil: it would pass
		// for set and panic on the first request, far from the mistake.
		if f.v != nil && nilcheck.Nil(f.v) {
			return nil, badopt.Error("middleware", f.name, f.v, "is nil and would panic on the first request")
		}
	}
	switch {
	case o.Store == nil && o.Tx == nil:
		return nil, badopt.Error("middleware", "Store", nil, "while Tx is nil too; set one: Store (lease mode: any idem.Store) or Tx (transactional mode: a TxStore)")
	case o.Store != nil && o.Tx != nil:
		return nil, badopt.Error("middleware", "Tx", o.Tx, "while Store is set too; set one: Store (lease mode) or Tx (transactional mode)")
	}
	switch {
	case o.Scope == nil && !o.SingleTenant:
		// One scope for every request by default would let a client that
		// learns another's key receive its recorded response.
		return nil, badopt.Error("middleware", "Scope", nil, "while SingleTenant is false; set Scope to name each request's tenant from its authenticated principal, or SingleTenant: true when the service has one tenant")
	case o.Scope != nil && o.SingleTenant:
		return nil, badopt.Error("middleware", "SingleTenant", true, "while Scope is set; set one: Scope names each request's tenant, SingleTenant says there is one")
	}
	if o.Header != "" && o.Key != nil {
		return nil, badopt.Error("middleware", "Header", o.Header, "is never read: the Key func supplies the key")
	}
	o.Header = cmp.Or(o.Header, DefaultHeader)
	if !validFieldName(o.Header) {
		return nil, badopt.Error("middleware", "Header", o.Header, "is not a header field name (an RFC 9110 token)")
	}
	o.Header = textproto.CanonicalMIMEHeaderKey(o.Header)
	if err := o.checkRequestID(); err != nil {
		return nil, err
	}
	if o.LockTimeout < 0 {
		return nil, badopt.Default("middleware", "LockTimeout", o.LockTimeout, DefaultLockTimeout, "is negative")
	}
	if o.RecordTimeout < 0 {
		return nil, badopt.Default("middleware", "RecordTimeout", o.RecordTimeout, DefaultRecordTimeout, "is negative")
	}
	if o.RetryAfter < 0 || o.RetryAfter > time.Hour {
		return nil, badopt.Default("middleware", "RetryAfter", o.RetryAfter, DefaultRetryAfter, "is outside 0..1h")
	}
	if o.MaxKeyBytes < 0 {
		return nil, badopt.Default("middleware", "MaxKeyBytes", o.MaxKeyBytes, DefaultMaxKeyBytes, "is negative")
	}
	if o.MaxBodyBytes < 0 {
		return nil, badopt.Default("middleware", "MaxBodyBytes", o.MaxBodyBytes, DefaultMaxBodyBytes, "is negative")
	}
	if o.MaxResponseBytes < 0 {
		return nil, badopt.Default("middleware", "MaxResponseBytes", o.MaxResponseBytes, DefaultMaxResponseBytes, "is negative")
	}
	o.LockTimeout = cmp.Or(o.LockTimeout, DefaultLockTimeout)
	o.RecordTimeout = cmp.Or(o.RecordTimeout, DefaultRecordTimeout)
	o.RetryAfter = cmp.Or(o.RetryAfter, DefaultRetryAfter)
	o.MaxKeyBytes = cmp.Or(o.MaxKeyBytes, DefaultMaxKeyBytes)
	o.MaxBodyBytes = cmp.Or(o.MaxBodyBytes, DefaultMaxBodyBytes)
	maxResult, err := o.fitResponse()
	if err != nil {
		return nil, err
	}
	if o.Keep == nil {
		o.Keep = DefaultKeep
	}
	if o.Error == nil {
		o.Error = WriteProblem
	}
	methods, err := methodSet(o.Methods)
	if err != nil {
		return nil, err
	}
	replay, err := replayList(o.ReplayHeaders)
	if err != nil {
		return nil, err
	}
	secs := (o.RetryAfter + time.Second - 1) / time.Second
	return &config{Options: o, methods: methods, replay: replay, retryAfter: strconv.FormatInt(int64(secs), 10), maxResult: maxResult}, nil
}

// resultLimiter is a store that reports the largest result it records:
// idem.MemoryStore, idem.RedisStore and sqlstore.Store are.
type resultLimiter interface{ MaxResultBytes() int }

// fitResponse sets MaxResponseBytes, when zero, to its default or less,
// so that a body of that size and RecordOverhead fit the store's
// MaxResultBytes, and refuses one set above that. It returns the store's
// MaxResultBytes, 0 when the store does not report it. A response body
// of MaxResponseBytes that the store refused would be replayed without its
// body for no reason the user could see at New.
func (o *Options) fitResponse() (int, error) {
	field, store := "Store", any(o.Store)
	if o.Tx != nil {
		field, store = "Tx", o.Tx
	}
	l, ok := store.(resultLimiter)
	if !ok {
		o.MaxResponseBytes = cmp.Or(o.MaxResponseBytes, DefaultMaxResponseBytes)
		return 0, nil
	}
	maxResult := l.MaxResultBytes()
	room := maxResult - RecordOverhead
	switch {
	case room <= 0:
		return 0, badopt.Error("middleware", field, store, "with MaxResultBytes %d leaves no room for a response body beside RecordOverhead %d (the record's status and headers); give the store a MaxResultBytes above %d", maxResult, RecordOverhead, RecordOverhead)
	case o.MaxResponseBytes == 0:
		o.MaxResponseBytes = min(DefaultMaxResponseBytes, room)
	case o.MaxResponseBytes > room:
		return 0, badopt.Error("middleware", "MaxResponseBytes", o.MaxResponseBytes, "exceeds the store's MaxResultBytes %d less RecordOverhead %d (the record's status and headers); at most %d", maxResult, RecordOverhead, room)
	}
	return maxResult, nil
}

// checkRequestID checks Options.RequestIDHeader and makes it canonical;
// o.Header is already canonical.
func (o *Options) checkRequestID() error {
	if o.RequestIDHeader == "" {
		return nil
	}
	h := o.RequestIDHeader
	if !validFieldName(h) {
		return badopt.Error("middleware", "RequestIDHeader", h, "is not a header field name (an RFC 9110 token)")
	}
	ch := textproto.CanonicalMIMEHeaderKey(h)
	if o.Key == nil && ch == o.Header {
		return badopt.Error("middleware", "RequestIDHeader", h, "is the header of the idempotency key, not of the request's id")
	}
	if ch == "Authorization" || ch == "Proxy-Authorization" || ch == "Cookie" {
		// A replay goes to whoever holds the key.
		return badopt.Error("middleware", "RequestIDHeader", h, "carries credentials, which a replay would show to whoever holds the key")
	}
	o.RequestIDHeader = ch
	return nil
}

// methodSet checks Options.Methods and returns them as a set.
func methodSet(methods []string) (map[string]bool, error) {
	if len(methods) == 0 {
		methods = []string{http.MethodPost, http.MethodPatch}
	}
	set := make(map[string]bool, len(methods))
	for _, m := range methods {
		switch {
		case !validFieldName(m): // a method is a token, as a field name is
			return nil, badopt.Error("middleware", "Methods", m, "is not a method (an RFC 9110 token)")
		case strings.ToUpper(m) != m:
			// net/http compares r.Method as sent, and clients send the
			// standard methods in upper case: "post" would cover nothing.
			return nil, badopt.Error("middleware", "Methods", m, "never matches a request; HTTP methods are case-sensitive, use %q", strings.ToUpper(m))
		case set[m]:
			return nil, badopt.Error("middleware", "Methods", m, "is listed twice")
		}
		set[m] = true
	}
	return set, nil
}

// replayList checks Options.ReplayHeaders and returns their canonical
// names.
func replayList(headers []string) ([]string, error) {
	if len(headers) == 0 {
		headers = DefaultReplayHeaders
	}
	list := make([]string, 0, len(headers))
	for _, h := range headers {
		if !validFieldName(h) {
			return nil, badopt.Error("middleware", "ReplayHeaders", h, "is not a header field name (an RFC 9110 token)")
		}
		ch := textproto.CanonicalMIMEHeaderKey(h)
		if neverReplayed[ch] {
			return nil, badopt.Error("middleware", "ReplayHeaders", h, "may not be replayed: it carries credentials")
		}
		if slices.Contains(list, ch) {
			return nil, badopt.Error("middleware", "ReplayHeaders", h, "is listed twice")
		}
		list = append(list, ch)
	}
	return list, nil
}

// validFieldName reports whether s is an RFC 9110 token.
func validFieldName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isTchar(s[i]) {
			return false
		}
	}
	return true
}

// isTchar reports an RFC 9110 tchar.
func isTchar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
