package middleware

import (
	"bytes"
	"io"
	"maps"
	"mime"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"
	"testing"
)

// fingerprintOf is the default fingerprint of a POST to /x with content
// type ct and body.
func fingerprintOf(t *testing.T, ct string, body []byte) []byte {
	t.Helper()
	r := &http.Request{Method: "POST", URL: &url.URL{Path: "/x"}, Header: http.Header{}}
	if ct != "" {
		r.Header.Set("Content-Type", ct)
	}
	fp, err := fingerprint(r, func() io.Reader { return bytes.NewReader(body) })
	if err != nil {
		t.Fatalf("fingerprint(%q, %q) = %v; want no error from an in-memory body", ct, body, err)
	}
	return fp
}

// FuzzFingerprint: for any method, target, content type and body the
// fingerprint never panics and is the same on every call.
func FuzzFingerprint(f *testing.F) {
	f.Add("POST", "/x", "a=1", "application/json", []byte(`{}`))
	f.Add("PATCH", "/x/y", "", `text/plain; charset="utf-8"`, []byte("hi"))
	f.Add("POST", "/", "", "multipart/form-data; boundary=b", []byte("--b\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1\r\n--b--\r\n"))
	f.Add("POST", "/", "", "multipart/form-data; boundary=b", []byte("--b\r\nContent-Disposition: form-data; name=\"f\"; filename=\"x\"\r\n\r\nxyz\r\n--b"))
	f.Add("POST", "/", "", "multipart/mixed; boundary=\"a b\"", []byte("--a b\r\n\r\n\r\n--a b--"))
	f.Add("POST", "/", "", "multipart/form-data", []byte("--b--"))
	f.Add("POST", "/", "", ";;;", []byte{0xff})
	f.Fuzz(func(t *testing.T, method, path, query, ct string, body []byte) {
		r := &http.Request{Method: method, URL: &url.URL{Path: path, RawQuery: query}, Header: http.Header{"Content-Type": {ct}}}
		open := func() io.Reader { return bytes.NewReader(body) }
		a, errA := fingerprint(r, open)
		b, errB := fingerprint(r, open)
		if errA != nil || errB != nil || len(a) != 32 || !bytes.Equal(a, b) {
			t.Fatalf("fingerprint(%q %q %q) = %x, %v then %x, %v; want one 32-byte fingerprint", method, path, ct, a, errA, b, errB)
		}
	})
}

// mediaMeaning is what a content type means to the fingerprint: its
// media type and parameters when it parses, else its bytes.
func mediaMeaning(ct string) (mt string, params map[string]string, parsed bool) {
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil {
		return ct, nil, false
	}
	return mt, params, true
}

// FuzzFingerprintContentType: two requests with one body and two content
// types fingerprint alike exactly when the types mean the same: the same
// media type and parameters, however spelled (multipart types, whose
// boundary does not count, are FuzzMultipartFingerprint's).
func FuzzFingerprintContentType(f *testing.F) {
	f.Add("application/json; charset=utf-8", `Application/JSON;Charset="utf-8"`, []byte("{}"))
	f.Add("application/json", "text/plain", []byte("{}"))
	f.Add(`text/plain; a="1;b=2"`, "text/plain; a=1; b=2", []byte("x"))
	f.Add(`text/plain; a="b c"`, "text/plain;a=b c", []byte("x"))
	f.Add(`text/plain; a=""`, "text/plain;a=", []byte(""))
	f.Add(`text/plain; a="x\"y"`, `text/plain; a=x"y`, []byte(""))
	f.Add("text/plain; a=1", "text/plain ; A=1 ", []byte("x"))
	f.Fuzz(func(t *testing.T, ct1, ct2 string, body []byte) {
		mt1, p1, ok1 := mediaMeaning(ct1)
		mt2, p2, ok2 := mediaMeaning(ct2)
		if strings.HasPrefix(mt1, "multipart/") || strings.HasPrefix(mt2, "multipart/") {
			return
		}
		same := ok1 == ok2 && mt1 == mt2 && maps.Equal(p1, p2)
		// Header.Get reads the field as sent: an empty one is no content type.
		if strings.TrimSpace(ct1) == "" || strings.TrimSpace(ct2) == "" {
			return
		}
		fp1, fp2 := fingerprintOf(t, ct1, body), fingerprintOf(t, ct2, body)
		if same != bytes.Equal(fp1, fp2) {
			t.Fatalf("content types %q (%q %v) and %q (%q %v): fingerprints equal = %v; want %v",
				ct1, mt1, p1, ct2, mt2, p2, !same, same)
		}
	})
}

// form is a multipart form of one field and one file, written by
// mime/multipart.
type form struct {
	boundary       string
	field, value   string
	partType       bool // the field part carries a Content-Type header
	file, fileName string
	fileSize       int
	fileByte       byte
}

// build returns the form's content type and body, or ok false when
// mime/multipart cannot write it so that it reads back the same (a
// boundary it refuses; a name it cannot escape; a file name that is empty
// or not its own base name).
func (f form) build() (ct string, body []byte, ok bool) {
	if f.fileName == "" {
		// filename="" reads as no file name: the part is a field, whose
		// bytes count (a browser sends it for an empty file input).
		return "", nil, false
	}
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	if w.SetBoundary(f.boundary) != nil {
		return "", nil, false
	}
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", mime.FormatMediaType("form-data", map[string]string{"name": f.field}))
	if f.partType {
		h.Set("Content-Type", "text/plain; charset=utf-8")
	}
	p, err := w.CreatePart(h)
	if err != nil {
		return "", nil, false
	}
	_, _ = io.WriteString(p, f.value)
	fp, err := w.CreateFormFile(f.file, f.fileName)
	if err != nil {
		return "", nil, false
	}
	_, _ = fp.Write(bytes.Repeat([]byte{f.fileByte}, f.fileSize))
	if w.Close() != nil {
		return "", nil, false
	}
	// Read it back as the fingerprint will.
	r := multipart.NewReader(bytes.NewReader(b.Bytes()), f.boundary)
	p1, err := r.NextRawPart()
	if err != nil || p1.FormName() != f.field || p1.FileName() != "" {
		return "", nil, false
	}
	if v, err := io.ReadAll(p1); err != nil || string(v) != f.value {
		return "", nil, false
	}
	p2, err := r.NextRawPart()
	if err != nil || p2.FormName() != f.file || p2.FileName() != f.fileName {
		return "", nil, false
	}
	if n, err := io.Copy(io.Discard, p2); err != nil || n != int64(f.fileSize) {
		return "", nil, false
	}
	if _, err := r.NextRawPart(); err != io.EOF {
		return "", nil, false
	}
	return w.FormDataContentType(), b.Bytes(), true
}

// FuzzMultipartFingerprint: a multipart form fingerprints by what it
// means. A new boundary, part headers other than the disposition, and file
// bytes of the same size leave it as it is; a changed field name, field
// value, file field, file name or file size changes it.
func FuzzMultipartFingerprint(f *testing.F) {
	f.Add("b1", "b2", "note", "hello", "upload", "scan.pdf", uint16(10), false)
	f.Add("XyZ", "abc'()+_,-./:=?", "a\"b", "", "f", "x y.txt", uint16(0), true)
	f.Add("a b", "b", "", "v", "", "n", uint16(300), false)
	f.Add("--", "---", "é", "\r\n--b1\r\n", "file", "f", uint16(1), true)
	f.Fuzz(func(t *testing.T, b1, b2, field, value, file, fileName string, size uint16, partType bool) {
		base := form{boundary: b1, field: field, value: value, file: file, fileName: fileName, fileSize: int(size) % 4096, fileByte: 'x'}
		ct, body, ok := base.build()
		if !ok {
			return
		}
		want := fingerprintOf(t, ct, body)
		if again := fingerprintOf(t, ct, body); !bytes.Equal(want, again) {
			t.Fatalf("fingerprint of one form changed between calls: %x then %x", want, again)
		}
		retry := base
		retry.boundary, retry.partType, retry.fileByte = b2, partType, 'y'
		if ct2, body2, ok := retry.build(); ok {
			if got := fingerprintOf(t, ct2, body2); !bytes.Equal(got, want) {
				t.Fatalf("form %+v and its retry %+v fingerprint differently; want alike", base, retry)
			}
		}
		for what, change := range map[string]func(*form){
			"field name":  func(f *form) { f.field += "x" },
			"field value": func(f *form) { f.value += "x" },
			"file field":  func(f *form) { f.file += "x" },
			"file name":   func(f *form) { f.fileName += "x" },
			"file size":   func(f *form) { f.fileSize++ },
		} {
			other := base
			change(&other)
			if ct2, body2, ok := other.build(); ok {
				if got := fingerprintOf(t, ct2, body2); bytes.Equal(got, want) {
					t.Fatalf("forms %+v and %+v differ in their %s but fingerprint alike", base, other, what)
				}
			}
		}
	})
}
