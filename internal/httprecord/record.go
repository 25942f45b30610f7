// Package httprecord is the middleware's record of an HTTP response and
// its store key, shared with the idem command (inspect --http) so that the
// two never disagree on either. See "Recorded responses" in the middleware
// package's documentation.
package httprecord

import (
	"encoding/binary"
	"errors"
	"net/http"
	"slices"
	"strconv"
)

// Key joins scope and the client's key into the key the store holds:
//
//	"h2" then, for each part, its length in decimal, ':', and its bytes
//
// e.g. "h24:acme3:abc". Both parts are length-prefixed, so the encoding is
// injective: ("a:b", "c") and ("a", "b:c") never meet, and one tenant's key
// never replays another's. The method and the request target are in the
// fingerprint, not here, so that the key a request maps to does not depend
// on how the middleware is mounted (a ServeMux pattern, a path, chi's
// route), and a key reused on another endpoint is a different request
// under the same key (422). "h2" names the encoding's version: no key of
// version 1 (KeyV1) begins with it.
func Key(scope, key string) string {
	b := make([]byte, 0, 2+len(scope)+len(key)+2*4)
	b = append(b, "h2"...)
	for _, p := range [...]string{scope, key} {
		b = strconv.AppendInt(b, int64(len(p)), 10)
		b = append(b, ':')
		b = append(b, p...)
	}
	return string(b)
}

// KeyV1 is the key that earlier versions of the middleware stored: "h1"
// then scope, method, route and the client's key, each length-prefixed as
// in Key, e.g. "h10:4:POST7:/orders3:abc". The middleware no longer reads
// or writes it; idem inspect still finds such records until they expire.
func KeyV1(scope, method, route, key string) string {
	b := make([]byte, 0, 2+len(scope)+len(method)+len(route)+len(key)+4*4)
	b = append(b, "h1"...)
	for _, p := range [...]string{scope, method, route, key} {
		b = strconv.AppendInt(b, int64(len(p)), 10)
		b = append(b, ':')
		b = append(b, p...)
	}
	return string(b)
}

// Response is what the middleware records of a response and replays.
type Response struct {
	Status      int
	Header      http.Header // the allowlisted headers only
	Body        []byte
	BodyOmitted bool   // the body was over MaxResponseBytes and not recorded
	RequestID   string // the RequestIDHeader of the request that did the work; "" for none
}

// LineRequestID is the header line that holds Response.RequestID. A name
// that begins with ':' is never a header field name (HTTP/2 keeps such
// names for pseudo-headers): it cannot meet a response header, and a
// decoder that predates it skips it, as it skips any line that is not in
// its ReplayHeaders, so that records stay version 1 both ways.
const LineRequestID = ":original-request"

// Version begins every encoded response.
const Version = 1

// ErrDamaged: a recorded response does not decode.
var ErrDamaged = errors.New("middleware: recorded response does not decode")

// Encode serializes r, version 1:
//
//	byte     version (1)
//	byte     flags: bit 0 set when the body was omitted; other bits zero
//	uint16   status, big-endian
//	uvarint  number of header lines, then for each line
//	         uvarint length and bytes of the name, uvarint length and bytes of the value
//	uvarint  length and bytes of the body
//
// A line named ":original-request" (LineRequestID) holds the request id,
// when there is one; other names are the response's headers. Lines are in
// name order, each value on its own line, so that one response always
// encodes to the same bytes.
func Encode(r *Response) []byte {
	names := make([]string, 0, len(r.Header))
	lines := 0
	size := 16 + len(r.Body)
	for k, vs := range r.Header {
		names = append(names, k)
		lines += len(vs)
		for _, v := range vs {
			size += len(k) + len(v) + 4
		}
	}
	if r.RequestID != "" {
		lines++
		size += len(LineRequestID) + len(r.RequestID) + 4
	}
	slices.Sort(names) // ':' sorts before every header name
	b := make([]byte, 0, size)
	var flags byte
	if r.BodyOmitted {
		flags |= 1
	}
	b = append(b, Version, flags)
	b = binary.BigEndian.AppendUint16(b, uint16(r.Status))
	b = binary.AppendUvarint(b, uint64(lines))
	if r.RequestID != "" {
		b = appendBytes(b, LineRequestID)
		b = appendBytes(b, r.RequestID)
	}
	for _, k := range names {
		for _, v := range r.Header[k] {
			b = appendBytes(b, k)
			b = appendBytes(b, v)
		}
	}
	b = binary.AppendUvarint(b, uint64(len(r.Body)))
	return append(b, r.Body...)
}

func appendBytes(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// Decode reverses Encode. Anything it cannot have written
// (another version, unknown flags, a status outside 200-999, a length
// past the end, trailing bytes) is ErrDamaged, never a panic.
func Decode(b []byte) (*Response, error) {
	r := &Response{Header: make(http.Header)}
	var err error
	r.Status, r.BodyOmitted, r.Body, err = Walk(b, func(k, v []byte) {
		if string(k) == LineRequestID {
			r.RequestID = string(v)
			return
		}
		r.Header[string(k)] = append(r.Header[string(k)], string(v))
	})
	if err != nil {
		return nil, err
	}
	return r, nil
}

// Walk checks that b is a whole encoded response, then, only if it
// is, calls line for each header line in order and returns the rest. The
// replay path uses it to write headers without building a map first, and
// without writing any when the record is damaged.
func Walk(b []byte, line func(k, v []byte)) (status int, bodyOmitted bool, body []byte, err error) {
	if len(b) < 4 || b[0] != Version || b[1]&^1 != 0 {
		return 0, false, nil, ErrDamaged
	}
	status = int(binary.BigEndian.Uint16(b[2:4]))
	if status < 200 || status > 999 {
		return 0, false, nil, ErrDamaged
	}
	for pass := range 2 {
		d := decoder{b: b[4:]}
		lines := d.uvarint()
		if lines > uint64(len(d.b)/2) { // each line takes two bytes at least
			return 0, false, nil, ErrDamaged
		}
		for range lines {
			k, v := d.bytes(), d.bytes()
			if d.bad {
				return 0, false, nil, ErrDamaged
			}
			if pass == 1 {
				line(k, v)
			}
		}
		body = d.bytes()
		if d.bad || len(d.b) != 0 {
			return 0, false, nil, ErrDamaged
		}
	}
	return status, b[1]&1 != 0, body, nil
}

// decoder reads uvarint-prefixed fields; a short read sets bad.
type decoder struct {
	b   []byte
	bad bool
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.bad = true
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.bad || n > uint64(len(d.b)) {
		d.bad = true
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}
