package middleware

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/idemgo/idem"
)

// multipartBody builds a form with one field and one file of size bytes,
// under the given boundary.
func multipartBody(t *testing.T, boundary, note string, size int) (string, []byte) {
	t.Helper()
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	if err := mw.SetBoundary(boundary); err != nil {
		t.Fatal(err)
	}
	_ = mw.WriteField("note", note)
	f, _ := mw.CreateFormFile("upload", "scan.pdf")
	_, _ = f.Write(bytes.Repeat([]byte{'x'}, size))
	_ = mw.Close()
	return mw.FormDataContentType(), b.Bytes()
}

// uploadHandler answers with the note, the file's size and the SHA-256 of
// the whole body it was given.
type uploadHandler struct{ counter }

func (u *uploadHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.runs.Add(1)
	raw, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(raw))
	if err := r.ParseMultipartForm(1 << 20); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	_, fh, _ := r.FormFile("upload")
	sum := sha256.Sum256(raw)
	fmt.Fprintf(w, "%s %d %s", r.FormValue("note"), fh.Size, hex.EncodeToString(sum[:]))
}

// A retried upload with a new boundary is the same request; a different
// file size or field is another. The handler gets the body intact, also
// when it spills to disk.
func TestMultipart(t *testing.T) {
	s := newCounting()
	var u uploadHandler
	h := mustNew(t, Options{SingleTenant: true, Store: s}, &u)
	send := func(boundary, note string, size int) *httptest.ResponseRecorder {
		ct, body := multipartBody(t, boundary, note, size)
		r := httptest.NewRequest("POST", "/uploads", bytes.NewReader(body))
		r.Header.Set("Content-Type", ct)
		r.Header.Set("Idempotency-Key", "up-1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code == 200 && w.Header().Get(HeaderReplayed) == "" {
			sum := sha256.Sum256(body)
			if !strings.HasSuffix(w.Body.String(), hex.EncodeToString(sum[:])) {
				t.Errorf("handler saw a body with another hash: %q", w.Body)
			}
		}
		return w
	}
	size := 3 * spoolMemory // past the memory part of the spool
	first := send("boundary-one", "hello", size)
	if first.Code != 200 || !strings.HasPrefix(first.Body.String(), fmt.Sprintf("hello %d ", size)) {
		t.Fatalf("first upload = %d %q; want 200 with the note and size", first.Code, first.Body)
	}
	if w := send("boundary-two", "hello", size); w.Code != 200 || w.Header().Get(HeaderReplayed) != "true" || w.Body.String() != first.Body.String() {
		t.Errorf("retry with a new boundary = %d %q; want a replay of the first", w.Code, w.Body)
	}
	wantProblem(t, send("boundary-three", "hello", size+1), 422, TypeFingerprintMismatch)
	wantProblem(t, send("boundary-four", "hullo", size), 422, TypeFingerprintMismatch)
	if u.runs.Load() != 1 {
		t.Errorf("handler ran %d times; want 1", u.runs.Load())
	}
}

// A body over MaxBodyBytes is 413 before any store call; one at the limit
// passes whole.
func TestBodyLimit(t *testing.T) {
	s := newCounting()
	var c counter
	h := mustNew(t, Options{SingleTenant: true, Store: s, MaxBodyBytes: 10}, &c)
	wantProblem(t, do(h, req{key: "k", body: "12345678901"}), 413, TypeBodyTooLarge)
	if s.calls.Load() != 0 || c.runs.Load() != 0 {
		t.Errorf("store calls %d, runs %d after a 413; want 0 and 0", s.calls.Load(), c.runs.Load())
	}
	if w := do(h, req{key: "k", body: "1234567890"}); w.Code != 201 || !strings.Contains(w.Body.String(), `"body":"1234567890"`) {
		t.Errorf("body at the limit = %d %q; want 201 echoing the whole body", w.Code, w.Body)
	}
}

// The spool gives back what it was given, from memory and from disk, to
// any number of readers, and removes its file.
func TestSpool(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789"), spoolMemory/5) // two memories
	s, err := readBody(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	if s.file == nil {
		t.Fatalf("a body of %d bytes did not spill to disk", len(data))
	}
	name := s.file.Name()
	for i := range 2 {
		got, _ := io.ReadAll(s.Reader())
		if !bytes.Equal(got, data) {
			t.Errorf("read %d gave %d bytes; want the %d written", i, len(got), len(data))
		}
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
	if _, err := readBody(bytes.NewReader(data), int64(len(data))-1); err != errBodyTooLarge {
		t.Errorf("readBody over the limit = %v; want errBodyTooLarge", err)
	}
	if f, err := http.Dir("/").Open(name); err == nil {
		_ = f.Close()
		t.Errorf("spool file %s remains after Close", name)
	}
}

// The content type counts as its meaning, not its spelling.
func TestFingerprintContentType(t *testing.T) {
	fp := func(ct string) string {
		r := httptest.NewRequest("POST", "/x", nil)
		r.Header.Set("Content-Type", ct)
		b, err := fingerprint(r, func() io.Reader { return strings.NewReader("{}") })
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if fp("application/json; charset=utf-8") != fp(`Application/JSON;Charset="utf-8"`) {
		t.Errorf("two spellings of one content type fingerprint differently")
	}
	if fp("application/json") == fp("text/plain") {
		t.Errorf("two content types fingerprint alike")
	}
}

// Options.Fingerprint replaces the default: here only the "amount" matters,
// so a retry whose JSON is spelled differently replays; a long fingerprint
// is hashed to fit the store; and the method and target still count, so
// the key reused on another endpoint is a 422.
func TestFingerprintOption(t *testing.T) {
	s := newCounting()
	var c counter
	h := mustNew(t, Options{SingleTenant: true, Store: s, Fingerprint: func(r *http.Request, body io.Reader) ([]byte, error) {
		var v struct{ Amount int }
		if err := json.NewDecoder(body).Decode(&v); err != nil {
			return nil, err
		}
		return []byte(strings.Repeat(strconv.Itoa(v.Amount), 2000)), nil
	}}, &c)
	do(h, req{key: "k", body: `{"amount":5}`})
	if w := do(h, req{key: "k", body: `{ "amount": 5, "note": "retry" }`}); w.Code != 201 || w.Header().Get(HeaderReplayed) != "true" {
		t.Errorf("same amount = %d %v; want a replay", w.Code, w.Header())
	}
	wantProblem(t, do(h, req{key: "k", body: `{"amount":6}`}), 422, TypeFingerprintMismatch)
	wantProblem(t, do(h, req{key: "k", path: "/refunds", body: `{"amount":5}`}), 422, TypeFingerprintMismatch)
	wantProblem(t, do(h, req{key: "k2", body: `not json`}), 400, TypeBodyUnreadable)
	if c.runs.Load() != 1 {
		t.Errorf("handler ran %d times; want 1", c.runs.Load())
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("connection reset: secret") }

// A body that cannot be read to its end is 400, before any store call.
func TestBodyUnreadable(t *testing.T) {
	s := newCounting()
	var c counter
	h := mustNew(t, Options{SingleTenant: true, Store: s}, &c)
	r := httptest.NewRequest("POST", "/orders", io.MultiReader(strings.NewReader("{"), failingReader{}))
	r.Header.Set("Idempotency-Key", "k")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	wantProblem(t, w, 400, TypeBodyUnreadable)
	if s.calls.Load() != 0 || c.runs.Load() != 0 {
		t.Errorf("store calls %d, runs %d; want 0 and 0", s.calls.Load(), c.runs.Load())
	}
}

// The fast path for a content type without parameters must canonicalize
// exactly as mime.ParseMediaType does, or one request would fingerprint two
// ways across versions.
func TestSimpleMediaType(t *testing.T) {
	for _, ct := range []string{
		"application/json", "Application/JSON", "text/plain", "application/vnd.api+json",
		"a/b", "x-custom/y_z", "application/json;charset=utf-8", "application/json ", " text/plain",
		"text", "/json", "text/", "text/plain/x", "text/pla{n", "", "a/b c", "ä/b",
	} {
		if !simpleMediaType(ct) {
			continue
		}
		mt, params, err := mime.ParseMediaType(ct)
		if err != nil || len(params) != 0 || mt != strings.ToLower(ct) {
			t.Errorf("simpleMediaType(%q) = true, but ParseMediaType = %q, %v, %v", ct, mt, params, err)
		}
	}
	for ct, want := range map[string]bool{"application/json": true, "Text/Plain": true, "text/plain; charset=utf-8": false, "text": false, "text/": false, "a/b/c": false} {
		if got := simpleMediaType(ct); got != want {
			t.Errorf("simpleMediaType(%q) = %v; want %v", ct, got, want)
		}
	}
}

// Fingerprint, for handlers that call the SQL store's Run themselves, is
// the fingerprint the middleware stores for the same request, inside a
// ServeMux route and wrapping the whole mux; a multipart body counts by its
// fields (a new boundary is the same request), and the handler reads the
// whole body after it, also one spilled to disk.
func TestFingerprintExported(t *testing.T) {
	const pattern = "POST /uploads/{id}"
	type sent struct {
		fp   []byte
		body []byte // as the handler read it after Fingerprint
	}
	got := make(chan sent, 1)
	own := http.NewServeMux() // no middleware: the handler fingerprints
	own.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		fp, err := Fingerprint(r)
		if err != nil {
			t.Errorf("Fingerprint = %v", err)
		}
		b, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("reading the body after Fingerprint = %v", err)
		}
		if err := r.Body.Close(); err != nil {
			t.Errorf("closing the body after Fingerprint = %v", err)
		}
		got <- sent{fp, b}
	})
	ct, upload := multipartBody(t, "boundary-one", "hello", 3*spoolMemory)
	ct2, upload2 := multipartBody(t, "boundary-two", "hello", 3*spoolMemory)
	for _, tc := range []struct {
		name, ct string
		body     []byte
	}{
		{"json", "application/json", []byte(`{"amount":5}`)},
		{"empty", "application/json", nil},
		{"multipart", ct, upload},
	} {
		newReq := func() *http.Request {
			r := httptest.NewRequest("POST", "/uploads/7?dry=1", bytes.NewReader(tc.body))
			r.Header.Set("Content-Type", tc.ct)
			r.Header.Set("Idempotency-Key", "fp-"+tc.name)
			return r
		}
		own.ServeHTTP(httptest.NewRecorder(), newReq())
		s := <-got
		if !bytes.Equal(s.body, tc.body) {
			t.Errorf("%s: the handler read %d bytes after Fingerprint; want the %d sent", tc.name, len(s.body), len(tc.body))
		}
		inside, wrapping := http.NewServeMux(), http.NewServeMux()
		for _, m := range []struct {
			name string
			h    http.Handler
			mux  *http.ServeMux
		}{
			{"inside the route", inside, inside},
			{"wrapping the mux", nil, wrapping},
		} {
			store := memStore(idem.Options{})
			mw, err := New(Options{SingleTenant: true, Store: store})
			if err != nil {
				t.Fatal(err)
			}
			var seen sent
			handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				// Inside the middleware too: it is given back intact.
				seen.fp, _ = Fingerprint(r)
				seen.body, _ = io.ReadAll(r.Body)
			})
			h := m.h
			if h == nil {
				m.mux.Handle(pattern, handler)
				h = mw(m.mux)
			} else {
				m.mux.Handle(pattern, mw(handler))
			}
			h.ServeHTTP(httptest.NewRecorder(), newReq())
			rec, err := store.Lookup(context.Background(), storeKey("", "fp-"+tc.name))
			if err != nil {
				t.Fatalf("%s, %s: Lookup = %v", tc.name, m.name, err)
			}
			if !bytes.Equal(rec.Fingerprint, s.fp) {
				t.Errorf("%s, %s: the middleware stored fingerprint %x; Fingerprint = %x", tc.name, m.name, rec.Fingerprint, s.fp)
			}
			if !bytes.Equal(seen.fp, s.fp) || !bytes.Equal(seen.body, tc.body) {
				t.Errorf("%s, %s: under the middleware Fingerprint = %x and the body %d bytes; want %x and %d", tc.name, m.name, seen.fp, len(seen.body), s.fp, len(tc.body))
			}
		}
	}
	r := httptest.NewRequest("POST", "/uploads/7?dry=1", bytes.NewReader(upload2))
	r.Header.Set("Content-Type", ct2)
	own.ServeHTTP(httptest.NewRecorder(), r)
	retry := <-got
	r = httptest.NewRequest("POST", "/uploads/7?dry=1", bytes.NewReader(upload))
	r.Header.Set("Content-Type", ct)
	own.ServeHTTP(httptest.NewRecorder(), r)
	if first := <-got; !bytes.Equal(retry.fp, first.fp) {
		t.Errorf("Fingerprint of an upload under another boundary = %x; want %x, the first's", retry.fp, first.fp)
	}
}

// A body Fingerprint cannot read is its error.
func TestFingerprintUnreadable(t *testing.T) {
	r := httptest.NewRequest("POST", "/orders", io.MultiReader(strings.NewReader("{"), iotest.ErrReader(errUnreadable)))
	if _, err := Fingerprint(r); !errors.Is(err, errUnreadable) {
		t.Errorf("Fingerprint of an unreadable body = %v; want %v", err, errUnreadable)
	}
}

var errUnreadable = errors.New("connection reset")
