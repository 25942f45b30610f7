package middleware

import (
	"encoding/binary"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
)

// recorder is the ResponseWriter the handler writes to: it holds the whole
// response (in memory up to MaxResponseBytes, on disk past it) so that the
// response is recorded before a byte of it is sent, and so that a 5xx is
// never half-sent before the key is released.
//
// It does not implement http.Flusher: a flushed byte would be a byte sent
// before the record is written.
type recorder struct {
	header http.Header
	status int
	body   spool
	lease  renewals // in lease mode, the renewals of the handler's lease
}

func newRecorder(memory int) *recorder {
	return &recorder{header: make(http.Header), body: spool{memory: memory}}
}

// Header returns the header map the handler sets.
func (w *recorder) Header() http.Header { return w.header }

// WriteHeader records the status. Informational (1xx) statuses are
// dropped: they cannot be sent ahead of a response that is held back.
func (w *recorder) WriteHeader(code int) {
	if w.status != 0 || code < 200 {
		return
	}
	if code > 999 {
		panic("middleware: invalid WriteHeader code " + strconv.Itoa(code)) // as net/http does
	}
	w.status = code
}

// Write appends to the held body.
func (w *recorder) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	return w.body.Write(p)
}

// finish settles what the handler left open, as net/http would on sending:
// the implicit 200, and a sniffed Content-Type, so that a replay of a
// response recorded without its body still says what it was.
func (w *recorder) finish() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if _, ok := w.header["Content-Type"]; !ok && w.body.size > 0 {
		var head [512]byte
		n, _ := io.ReadFull(w.body.Reader(), head[:])
		w.header.Set("Content-Type", http.DetectContentType(head[:n]))
	}
}

// send writes the held response to dst, every header included.
func (w *recorder) send(dst http.ResponseWriter) {
	h := dst.Header()
	for k, v := range w.header {
		h[k] = v
	}
	dst.WriteHeader(w.status)
	_, _ = io.Copy(dst, w.body.Reader()) // the client may have gone: nothing to do about it
}

// response is what is recorded of a response and replayed.
type response struct {
	status      int
	header      http.Header // the allowlisted headers only
	body        []byte
	bodyOmitted bool   // the body was over MaxResponseBytes and not recorded
	requestID   string // the RequestIDHeader of the request that did the work; "" for none
}

// lineRequestID is the header line that holds response.requestID. A name
// that begins with ':' is never a header field name (HTTP/2 keeps such
// names for pseudo-headers): it cannot meet a response header, and a
// decoder that predates it skips it, as it skips any line that is not in
// its ReplayHeaders, so that records stay version 1 both ways.
const lineRequestID = ":original-request"

// maxRequestID bounds the request id recorded: the client chooses it, and
// must not be able to push the record over the store's limit.
const maxRequestID = 255

// responseVersion begins every encoded response.
const responseVersion = 1

// errDamaged: a recorded response does not decode.
var errDamaged = errors.New("middleware: recorded response does not decode")

// encodeResponse serializes r, version 1:
//
//	byte     version (1)
//	byte     flags: bit 0 set when the body was omitted; other bits zero
//	uint16   status, big-endian
//	uvarint  number of header lines, then for each line
//	         uvarint length and bytes of the name, uvarint length and bytes of the value
//	uvarint  length and bytes of the body
//
// A line named ":original-request" (lineRequestID) holds the request id,
// when there is one; other names are the response's headers. Lines are in
// name order, each value on its own line, so that one response always
// encodes to the same bytes.
func encodeResponse(r *response) []byte {
	names := make([]string, 0, len(r.header))
	lines := 0
	size := 16 + len(r.body)
	for k, vs := range r.header {
		names = append(names, k)
		lines += len(vs)
		for _, v := range vs {
			size += len(k) + len(v) + 4
		}
	}
	if r.requestID != "" {
		lines++
		size += len(lineRequestID) + len(r.requestID) + 4
	}
	slices.Sort(names) // ':' sorts before every header name
	b := make([]byte, 0, size)
	var flags byte
	if r.bodyOmitted {
		flags |= 1
	}
	b = append(b, responseVersion, flags)
	b = binary.BigEndian.AppendUint16(b, uint16(r.status))
	b = binary.AppendUvarint(b, uint64(lines))
	if r.requestID != "" {
		b = appendBytes(b, lineRequestID)
		b = appendBytes(b, r.requestID)
	}
	for _, k := range names {
		for _, v := range r.header[k] {
			b = appendBytes(b, k)
			b = appendBytes(b, v)
		}
	}
	b = binary.AppendUvarint(b, uint64(len(r.body)))
	return append(b, r.body...)
}

func appendBytes(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// decodeResponse reverses encodeResponse. Anything it cannot have written
// (another version, unknown flags, a status outside 200-999, a length
// past the end, trailing bytes) is errDamaged, never a panic.
func decodeResponse(b []byte) (*response, error) {
	r := &response{header: make(http.Header)}
	var err error
	r.status, r.bodyOmitted, r.body, err = walkResponse(b, func(k, v []byte) {
		if string(k) == lineRequestID {
			r.requestID = string(v)
			return
		}
		r.header[string(k)] = append(r.header[string(k)], string(v))
	})
	if err != nil {
		return nil, err
	}
	return r, nil
}

// walkResponse checks that b is a whole encoded response, then, only if it
// is, calls line for each header line in order and returns the rest. The
// replay path uses it to write headers without building a map first, and
// without writing any when the record is damaged.
func walkResponse(b []byte, line func(k, v []byte)) (status int, bodyOmitted bool, body []byte, err error) {
	if len(b) < 4 || b[0] != responseVersion || b[1]&^1 != 0 {
		return 0, false, nil, errDamaged
	}
	status = int(binary.BigEndian.Uint16(b[2:4]))
	if status < 200 || status > 999 {
		return 0, false, nil, errDamaged
	}
	for pass := range 2 {
		d := decoder{b: b[4:]}
		lines := d.uvarint()
		if lines > uint64(len(d.b)/2) { // each line takes two bytes at least
			return 0, false, nil, errDamaged
		}
		for range lines {
			k, v := d.bytes(), d.bytes()
			if d.bad {
				return 0, false, nil, errDamaged
			}
			if pass == 1 {
				line(k, v)
			}
		}
		body = d.bytes()
		if d.bad || len(d.b) != 0 {
			return 0, false, nil, errDamaged
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
