package rpccore

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
)

func TestRecordRoundTrip(t *testing.T) {
	// gRPC metadata in lower case, HTTP headers in canonical form: either
	// is recorded under the lower-case name and read back as replay spells it.
	for _, header := range []Metadata{{"x-order": {"o-1", "o-2"}}, {"X-Order": {"o-1", "o-2"}}} {
		b := EncodeRecord(0, header, Metadata{"x-trace": {"t"}, "x-secret": {"s"}}, []string{"x-order", "x-trace"}, "acme.Order", []byte{1, 2})
		for _, spell := range [][]string{{"x-order", "x-trace"}, {"X-Order", "X-Trace"}} {
			r, err := DecodeRecord(b, spell)
			if err != nil || r.Name != "acme.Order" || !bytes.Equal(r.Body, []byte{1, 2}) ||
				len(r.Header[spell[0]]) != 2 || r.Trailer[spell[1]][0] != "t" || len(r.Trailer) != 1 {
				t.Errorf("DecodeRecord(EncodeRecord(%v), %v) = %+v, %v; want the message, both x-order values and x-trace only", header, spell, r, err)
			}
		}
	}
}

// A record or status that does not decode is ErrRecord, never a panic.
func TestDamageIsErrRecord(t *testing.T) {
	st := Status{Code: InvalidArgument, Message: "no", Details: []Detail{errorInfo("R", "d", "k")}}
	good := EncodeRecord(FlagStatus, Metadata{"a": {"1"}}, nil, []string{"a"}, "", st.Encode())
	for i := range good {
		r, err := DecodeRecord(good[:i], []string{"a"})
		if err == nil {
			_, err = ParseStatus(r.Body)
		}
		if err != nil && !errors.Is(err, ErrRecord) {
			t.Errorf("decode of the record cut at %d = %v; want ErrRecord", i, err)
		}
	}
	for _, b := range [][]byte{nil, {2, 0}, {1, 3}, {1, 4}} {
		if _, err := DecodeRecord(b, nil); !errors.Is(err, ErrRecord) {
			t.Errorf("DecodeRecord(%x) = %v; want ErrRecord", b, err)
		}
	}
	if _, err := ParseStatus((&Status{Message: "ok"}).Encode()); !errors.Is(err, ErrRecord) {
		t.Errorf("ParseStatus of code 0 = %v; want ErrRecord: a recorded status is an error's", err)
	}
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add(EncodeRecord(0, Metadata{"a": {"1"}}, nil, []string{"a"}, "x.Y", []byte{8, 1}))
	f.Add(EncodeRecord(FlagStatus, nil, nil, nil, "", (&Status{Code: Internal, Details: []Detail{retryInfo(time.Second)}}).Encode()))
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := DecodeRecord(b, []string{"a"}); err == nil && r.Flags&FlagStatus != 0 {
			if st, err := ParseStatus(r.Body); err == nil {
				RetryDelay(st.Details)
			}
		}
	})
}

func TestStatusRoundTrip(t *testing.T) {
	st := &Status{Code: Aborted, Message: "busy", Details: []Detail{errorInfo(ReasonKeyInFlight, ErrorDomain, "k"), retryInfo(1500 * time.Millisecond)}}
	got, err := ParseStatus(st.Encode())
	if err != nil || got.Code != Aborted || got.Message != "busy" || len(got.Details) != 2 {
		t.Fatalf("ParseStatus(Encode()) = %+v, %v; want the status", got, err)
	}
	if d, ok := RetryDelay(got.Details); !ok || d != 1500*time.Millisecond {
		t.Errorf("RetryDelay = %v, %v; want 1.5s", d, ok)
	}
	if d, ok := RetryDelay([]Detail{retryInfo(0)}); !ok || d != 0 {
		t.Errorf("RetryDelay of a zero RetryInfo = %v, %v; want 0, found", d, ok)
	}
}

func TestNewRefusesMistakes(t *testing.T) {
	st, err := idem.NewMemoryStore(idem.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ok := Config{Frame: Frame{Pkg: "p", Name: func(_, n string) (string, error) { return n, nil }}, Store: st, SingleTenant: true}
	for _, tc := range []struct {
		f    func(*Config)
		want string
	}{
		{func(c *Config) { c.Store = nil }, "p: ServerOptions.Store: nil is not a store"},
		{func(c *Config) { c.SingleTenant = false }, "p: ServerOptions.Scope: nil while SingleTenant is false"},
		{func(c *Config) { c.RetryDelay = 2 * time.Hour }, "p: ServerOptions.RetryDelay: 2h0m0s is over 1h; 0 means the default, 1s"},
		{func(c *Config) { c.Replay = []string{"Cookie"} }, `p: ServerOptions.: "Cookie" may not be replayed`},
		{func(c *Config) { c.MethodsField, c.MethodName, c.Methods = "Methods", "method", []string{"/a/b/c"} }, `p: ServerOptions.Methods: "/a/b/c" is not a method`},
	} {
		c := ok
		tc.f(&c)
		if _, err := New(c); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("New = %v; want %q", err, tc.want)
		}
	}
	if _, err := New(ok); err != nil {
		t.Errorf("New(ok) = %v", err)
	}
}

// The client retries a retried code with one key and stops at
// MaxAttempts; it does not retry another code.
func TestClientRetries(t *testing.T) {
	var got []Attempt
	c, err := NewClient(ClientConfig{Frame: Frame{Pkg: "p", Name: func(_, n string) (string, error) { return n, nil },
		Code:         func(err error) Code { return Code(len(err.Error())) }, // "xxxxxxxxxxxxxx": 14, Unavailable
		Status:       func(error) *Status { return &Status{} },
		ContextError: func(context.Context, error) error { return context.Canceled }},
		MaxAttempts: 3, InitialWait: time.Millisecond, MaxWait: time.Millisecond,
		OnAttempt: func(a Attempt) { got = append(got, a) }})
	if err != nil {
		t.Fatal(err)
	}
	unavailable := errors.New(strings.Repeat("x", int(Unavailable)))
	if err := c.Call(context.Background(), "/a.B/C", "k", func(context.Context) error { return unavailable }); err != unavailable {
		t.Errorf("Call = %v; want the last attempt's error", err)
	}
	if len(got) != 3 || got[2].Reason != "attempts" || got[0].Key != "k" || !got[0].Retry {
		t.Errorf("attempts = %+v; want 3, the last stopped by attempts", got)
	}
	got = nil
	_ = c.Call(context.Background(), "/a.B/C", "k", func(context.Context) error { return errors.New("xxx") }) // InvalidArgument
	if len(got) != 1 || got[0].Retry {
		t.Errorf("attempts of InvalidArgument = %+v; want one, not retried", got)
	}
}
