package middleware

import (
	"io"
	"net/http"
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
