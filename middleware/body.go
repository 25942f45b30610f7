package middleware

import (
	"bytes"
	"cmp"
	"errors"
	"io"
	"net/http"
	"os"
	"sync"
)

// spoolMemory is how much of a body a spool keeps in memory before it
// spills to a temporary file. Small JSON bodies, the common case, never
// touch the disk; a large upload never sits whole in memory.
const spoolMemory = 64 << 10

// spool is a bounded, re-readable copy of a body: the first spoolMemory
// bytes in memory, the rest in a temporary file, removed by Close. The
// fingerprint reads it, then the handler reads it again from the start:
// that is how the body is given back intact without holding an upload in
// memory or reading the network twice.
type spool struct {
	memory int // bytes held in memory before spilling; 0 means spoolMemory
	mem    bytes.Buffer
	file   *os.File
	size   int64
	// removed is set when the file was unlinked on creation.
	removed bool
	// limit is readBody's reader, kept here so that bounding a body does
	// not cost an allocation of its own.
	limit io.LimitedReader
}

// Write appends p, spilling to a temporary file past spoolMemory.
func (s *spool) Write(p []byte) (int, error) {
	n := len(p)
	if s.file == nil {
		room := cmp.Or(s.memory, spoolMemory) - s.mem.Len()
		if len(p) <= room {
			s.mem.Write(p)
			s.size += int64(n)
			return n, nil
		}
		s.mem.Write(p[:room])
		p = p[room:]
		f, err := os.CreateTemp("", "idem-spool-*")
		if err != nil {
			return n - len(p), err
		}
		s.file = f
		// Unlinked at once where the system allows it (not Windows): the
		// open file stays readable, and a body whose Close is never
		// called (Fingerprint's, in a handler that does not close r.Body)
		// or a process that dies leaves nothing on disk.
		s.removed = os.Remove(f.Name()) == nil
	}
	m, err := s.file.Write(p)
	s.size += int64(m) + int64(n-len(p))
	if err != nil {
		return n - len(p) + m, err
	}
	return n, nil
}

// Reader returns a new reader of everything written so far, from the
// start. Readers are independent of each other.
func (s *spool) Reader() io.Reader {
	mem := bytes.NewReader(s.mem.Bytes())
	if s.file == nil {
		return mem
	}
	return io.MultiReader(mem, io.NewSectionReader(s.file, 0, s.size-int64(s.mem.Len())))
}

// Close closes and removes the temporary file, if any.
func (s *spool) Close() error {
	if s.file == nil {
		return nil
	}
	f := s.file
	s.file = nil
	if s.removed {
		return f.Close()
	}
	return errors.Join(f.Close(), os.Remove(f.Name()))
}

// copyBuffers hold the buffers readBody copies through: io.Copy would
// allocate 32 KiB per request.
var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

var errBodyTooLarge = errors.New("the request body exceeds MaxBodyBytes")

// readBody copies body into a new spool, at most limit bytes: a longer
// body is errBodyTooLarge. The caller closes the spool.
func readBody(body io.Reader, limit int64) (*spool, error) {
	s := &spool{}
	if body == nil || body == http.NoBody {
		return s, nil
	}
	buf := copyBuffers.Get().(*[]byte)
	s.limit = io.LimitedReader{R: body, N: limit + 1}
	n, err := io.CopyBuffer(s, &s.limit, *buf)
	s.limit.R = nil // the spool outlives the request's body
	copyBuffers.Put(buf)
	if err == nil && n > limit {
		err = errBodyTooLarge
	}
	if err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

// spoolBody is a request body read back from a spool.
type spoolBody struct{ io.Reader }

func (spoolBody) Close() error { return nil }
