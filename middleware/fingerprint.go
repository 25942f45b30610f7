package middleware

import (
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"io"
	"math"
	"mime"
	"mime/multipart"
	"net/http"
	"slices"
	"strings"
	"sync"
)

// Fingerprint returns r's fingerprint as the middleware computes it by
// default (no Options.Fingerprint), for a handler that calls the SQL
// store's Run itself: SHA-256 over the method, the request target as the
// client sent it (path and query), the content type and the body; a
// multipart body by its fields and its files' names and sizes, so that a
// retried upload with a new boundary has the same fingerprint. It is the
// same wherever it is computed: in a handler, inside a route, or around a
// whole router (see Keys, scopes and fingerprints in the package
// documentation).
//
// Fingerprint reads r.Body to its end and gives it back intact: r.Body is
// replaced by a reader of the same bytes from the start, so the handler
// reads it as if untouched (the server still closes the original). The
// body is copied once, its first 64 KiB in memory and the rest in a
// temporary file, released when r.Body is closed; it is not bounded here
// (bound it first with http.MaxBytesReader). An error reading it is
// returned, with r.Body consumed in part.
func Fingerprint(r *http.Request) ([]byte, error) {
	body, err := readBody(r.Body, math.MaxInt64-1)
	if err != nil {
		return nil, err
	}
	fp, err := fingerprint(r, body.Reader)
	if err != nil {
		_ = body.Close()
		return nil, err
	}
	r.Body = &spoolReadCloser{Reader: body.Reader(), spool: body}
	return fp, nil
}

// target is r's request target as the client sent it: r.RequestURI,
// which no handler in between rewrites (http.StripPrefix changes r.URL,
// not it), or, for a request built by hand without one, r.URL's path and
// query. A retry sends the same target wherever the middleware sits.
func target(r *http.Request) string {
	if r.RequestURI != "" {
		return r.RequestURI
	}
	return r.URL.RequestURI()
}

// spoolReadCloser is a body given back by Fingerprint: its Close removes
// the spool's temporary file.
type spoolReadCloser struct {
	io.Reader
	spool *spool
}

func (b *spoolReadCloser) Close() error { return b.spool.Close() }

// fingerprint is the default Options.Fingerprint: SHA-256 over the
// method, the request target (path and query, as sent), the content type
// and the body. Each part but the last (the body) is length-prefixed, so
// no two requests share the input.
//
// The method and the target are what tells one endpoint from another: the
// store key holds only the scope and the client's key, so a key reused on
// another endpoint, or on another resource of one (/orders/2 after
// /orders/1), is a different request (422), not a replay of the first. No
// route pattern is part of it: a ServeMux pattern is known inside the
// route and around the mux, not around a wrapper of it, nor under chi's
// Use, and the same request must have the same fingerprint in each.
//
// The content type is its media type and parameters in a canonical form
// (lower-case, parameters sorted), so that a retry whose client spells the
// header differently is still a retry. A multipart body is fingerprinted
// by its parts: each part's field name, file name, and, for a file, its
// size, for a field, its value. A retried upload carries a new boundary and
// often new part headers; what it means is the same, and the file bytes
// are not read into memory. A multipart body that does not parse is
// fingerprinted as bytes.
func fingerprint(r *http.Request, open func() io.Reader) ([]byte, error) {
	f := fingerprinters.Get().(*fingerprinter)
	h := f.h
	h.Reset()
	// The head is built in one buffer and written once: a string written
	// to a hash.Hash interface is copied to the heap each time.
	head := f.head[:0]
	defer func() {
		if cap(head) <= maxPooledHead { // a huge URL's buffer is not kept
			f.head = head[:0]
		}
		fingerprinters.Put(f)
	}()
	head = appendField(head, r.Method)
	head = appendField(head, target(r))
	ct := r.Header.Get("Content-Type")
	if simpleMediaType(ct) {
		// The common case, "application/json": ParseMediaType would
		// return it lower-cased with no parameters, after building a map.
		h.Write(appendField(head, strings.ToLower(ct)))
		return sum(h, open())
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil {
		h.Write(appendField(head, ct))
		return sum(h, open())
	}
	if boundary := params["boundary"]; strings.HasPrefix(mt, "multipart/") && boundary != "" {
		delete(params, "boundary")
		h.Write(appendField(head, canonicalType(mt, params)))
		if fp, ok := multipartFingerprint(h, open(), boundary); ok {
			return fp, nil
		}
		h.Reset()
		h.Write(appendField(head, ct))
		return sum(h, open())
	}
	if len(params) == 0 {
		ct = mt // already canonical: lower case, no parameters
	} else {
		ct = canonicalType(mt, params)
	}
	h.Write(appendField(head, ct))
	return sum(h, open())
}

// fingerprinter is what fingerprint needs besides the request: a SHA-256
// state and a buffer for the head. Both are pooled: made per request, each
// would be an allocation on every covered request, replays included.
type fingerprinter struct {
	h    hash.Hash
	head []byte
}

var fingerprinters = sync.Pool{New: func() any {
	return &fingerprinter{h: sha256.New(), head: make([]byte, 0, 128)}
}}

// maxPooledHead bounds the head buffer a pooled fingerprinter keeps.
const maxPooledHead = 4 << 10

// simpleMediaType reports whether ct is type/subtype of RFC 9110 token
// characters and nothing else: no parameters, no spaces. For such a value
// mime.ParseMediaType returns exactly strings.ToLower(ct) and no
// parameters.
func simpleMediaType(ct string) bool {
	typ, sub, ok := strings.Cut(ct, "/")
	return ok && validFieldName(typ) && validFieldName(sub)
}

// appendField appends s to b, length first.
func appendField(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// canonicalType writes a parsed content type back in one spelling: lower
// case, parameters sorted, a value quoted (with '"' and '\' escaped) unless
// it is a token. Quoting keeps the spelling injective: unquoted, the values
// `a="1;b=2"` and `a=1; b=2` would both read ";a=1;b=2", and `a="b c"`
// would read like the unparsable type "...;a=b c", whose bytes are
// fingerprinted as they are.
func canonicalType(mt string, params map[string]string) string {
	keys := make([]string, 0, len(params))
	for k := range params {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	b.WriteString(mt)
	for _, k := range keys {
		b.WriteString(";" + k + "=")
		v := params[k]
		if isMIMEToken(v) {
			b.WriteString(v)
			continue
		}
		b.WriteByte('"')
		for i := 0; i < len(v); i++ {
			if v[i] == '"' || v[i] == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(v[i])
		}
		b.WriteByte('"')
	}
	return b.String()
}

// isMIMEToken reports an RFC 2045 token: a parameter value that needs no
// quotes.
func isMIMEToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || strings.IndexByte(`()<>@,;:\"/[]?=`, c) >= 0 {
			return false
		}
	}
	return true
}

func sum(h hash.Hash, body io.Reader) ([]byte, error) {
	if _, err := io.Copy(h, body); err != nil {
		return nil, err
	}
	return h.Sum(nil), nil
}

// field writes s to h, length first.
func field(h hash.Hash, s string) {
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
	h.Write([]byte(s))
}

// multipartFingerprint hashes each part into h, streaming: a file part is
// counted, never held. ok is false when the body does not parse.
func multipartFingerprint(h hash.Hash, body io.Reader, boundary string) ([]byte, bool) {
	mr := multipart.NewReader(body, boundary)
	for {
		p, err := mr.NextRawPart()
		if err == io.EOF {
			return h.Sum(nil), true
		}
		if err != nil {
			return nil, false
		}
		field(h, "part")
		field(h, p.FormName())
		name := p.FileName()
		if name != "" {
			field(h, "file")
			field(h, name)
			n, err := io.Copy(io.Discard, p)
			if err != nil {
				return nil, false
			}
			var b [8]byte
			binary.BigEndian.PutUint64(b[:], uint64(n))
			h.Write(b[:])
			continue
		}
		field(h, "value")
		v := sha256.New()
		if _, err := io.Copy(v, p); err != nil {
			return nil, false
		}
		h.Write(v.Sum(nil))
	}
}

// withEndpoint is the fingerprint of r from fp, what Options.Fingerprint
// returned: SHA-256 over the method, the request target and fp, so that a
// custom fingerprint that reads only the body still tells one endpoint
// from another (a key reused on another endpoint is a 422, never a replay
// of this one's response).
func withEndpoint(r *http.Request, fp []byte) []byte {
	h := sha256.New()
	var b []byte
	b = appendField(b, r.Method)
	b = appendField(b, target(r))
	h.Write(b)
	h.Write(fp)
	return h.Sum(nil)
}
