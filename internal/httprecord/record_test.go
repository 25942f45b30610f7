package httprecord

import (
	"bytes"
	"net/http"
	"reflect"
	"testing"
)

func TestResponseRoundTrip(t *testing.T) {
	for _, r := range []*Response{
		{Status: 201, Header: http.Header{"Location": {"/a"}, "Link": {"<a>", "<b>"}}, Body: []byte("hello")},
		{Status: 204, Header: http.Header{}},
		{Status: 200, Header: http.Header{"Content-Type": {"text/plain"}}, BodyOmitted: true},
		{Status: 999, Header: http.Header{"X": {""}}, Body: bytes.Repeat([]byte{0}, 300)},
		{Status: 201, Header: http.Header{"Location": {"/a"}}, Body: []byte("hi"), RequestID: "req-1"},
	} {
		b := Encode(r)
		if !bytes.Equal(b, Encode(r)) {
			t.Errorf("Encode(%+v) is not deterministic", r)
		}
		got, err := Decode(b)
		if err != nil {
			t.Fatalf("Decode(Encode(%+v)) = %v", r, err)
		}
		if got.Status != r.Status || got.BodyOmitted != r.BodyOmitted || !bytes.Equal(got.Body, r.Body) || !reflect.DeepEqual(got.Header, r.Header) || got.RequestID != r.RequestID {
			t.Errorf("round trip of %+v = %+v", r, got)
		}
	}
}

func TestDecodeDamaged(t *testing.T) {
	good := Encode(&Response{Status: 201, Header: http.Header{"Location": {"/a"}}, Body: []byte("hi")})
	for name, b := range map[string][]byte{
		"empty":          nil,
		"short":          good[:3],
		"version 2":      append([]byte{2}, good[1:]...),
		"unknown flag":   append([]byte{1, 2}, good[2:]...),
		"status 99":      append([]byte{1, 0, 0, 99}, good[4:]...),
		"truncated":      good[:len(good)-1],
		"trailing bytes": append(append([]byte{}, good...), 0),
		"huge count":     {1, 0, 0, 200, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"bad varint":     {1, 0, 0, 200, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
	} {
		if _, err := Decode(b); err != ErrDamaged {
			t.Errorf("Decode(%s %x) = %v; want ErrDamaged", name, b, err)
		}
	}
}

func FuzzDecodeResponse(f *testing.F) {
	f.Add(Encode(&Response{Status: 201, Header: http.Header{"Location": {"/a"}}, Body: []byte("hi")}))
	f.Add([]byte{1, 1, 0, 200, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := Decode(b)
		if err != nil {
			return
		}
		// What decodes re-encodes to itself when its header lines were in
		// order; either way it must re-decode to the same response.
		again, err := Decode(Encode(r))
		if err != nil || again.Status != r.Status || !bytes.Equal(again.Body, r.Body) || again.BodyOmitted != r.BodyOmitted {
			t.Errorf("re-decoding %+v gave %+v, %v", r, again, err)
		}
	})
}
