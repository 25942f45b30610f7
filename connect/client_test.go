package idemconnect

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// script is a handler that answers each attempt of a value with the next
// of its codes (0: success), and keeps the key every attempt carried.
type script struct {
	mu    sync.Mutex
	codes map[string][]connect.Code
	keys  map[string][]string
	delay time.Duration // RetryInfo delay on Aborted, when set
}

func (s *script) handle(ctx context.Context, proc string, r *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := r.Msg.GetValue()
	s.keys[v] = append(s.keys[v], r.Header().Get(DefaultHeader))
	var code connect.Code
	if cs := s.codes[v]; len(cs) > 0 {
		code, s.codes[v] = cs[0], cs[1:]
	}
	if code == 0 {
		return connect.NewResponse(wrapperspb.String("ok " + v)), nil
	}
	e := connect.NewError(code, errors.New("scripted"))
	if code == connect.CodeAborted && s.delay > 0 {
		d, _ := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(s.delay)})
		e.AddDetail(d)
	}
	return nil, e
}

// The client gives each call one key, sends it with every attempt,
// retries Unavailable, ResourceExhausted and Aborted (after at least the
// server's RetryInfo delay), never another code, and keeps a caller's
// own key; a NO_SIDE_EFFECTS call goes without a key. On each protocol.
func TestClient(t *testing.T) {
	eachProtocol(t, func(t *testing.T, proto []connect.ClientOption) {
		s := &script{keys: map[string][]string{}, delay: 150 * time.Millisecond, codes: map[string][]connect.Code{
			"a": {connect.CodeUnavailable, connect.CodeResourceExhausted, connect.CodeAborted},
			"b": {connect.CodeFailedPrecondition},
			"c": {connect.CodeUnavailable},
			"g": {connect.CodeUnavailable},
			"x": {14, 14, 14, 14, 14, 14},
		}}
		var mu sync.Mutex
		var attempts []Attempt
		co := ClientOptions{InitialWait: time.Millisecond, MaxWait: time.Second, MaxAttempts: 4, OnAttempt: func(a Attempt) {
			mu.Lock()
			attempts = append(attempts, a)
			mu.Unlock()
		}}
		srv := startServer(t, ordersMux(s.handle))
		c, err := NewClient(co)
		if err != nil {
			t.Fatal(err)
		}
		o := newOrders(srv.Client(), srv.URL, append(append([]connect.ClientOption(nil), proto...), connect.WithInterceptors(c))...)
		ctx := context.Background()

		start := time.Now()
		r, err := o.create.CallUnary(ctx, connect.NewRequest(wrapperspb.String("a")))
		if err != nil || r.Msg.GetValue() != "ok a" {
			t.Fatalf("a = %v, %v; want ok after three retries", r, err)
		}
		if took := time.Since(start); took < 150*time.Millisecond {
			t.Errorf("a took %v; want the Aborted's RetryInfo delay, 150ms, waited", took)
		}
		if ks := s.keys["a"]; len(ks) != 4 || ks[0] == "" || ks[1] != ks[0] || ks[2] != ks[0] || ks[3] != ks[0] {
			t.Errorf("keys of a's attempts = %q; want one key, four times", ks)
		}
		_, err = o.create.CallUnary(ctx, connect.NewRequest(wrapperspb.String("b")))
		if connect.CodeOf(err) != connect.CodeFailedPrecondition || len(s.keys["b"]) != 1 {
			t.Errorf("b = %v after %d attempts; want FailedPrecondition, not retried", err, len(s.keys["b"]))
		}
		// One request sent twice is two calls: the key made for the first
		// is not left in its header.
		twice := connect.NewRequest(wrapperspb.String("t"))
		for range 2 {
			if _, err := o.create.CallUnary(ctx, twice); err != nil {
				t.Fatal(err)
			}
		}
		if ks := s.keys["t"]; len(ks) != 2 || ks[0] == "" || ks[1] == "" || ks[0] == ks[1] || twice.Header().Get(DefaultHeader) != "" {
			t.Errorf("keys of one request sent twice = %q, left in its header %q; want two keys, none left", ks, twice.Header().Get(DefaultHeader))
		}
		if _, err := o.create.CallUnary(ctx, keyed(wrapperspb.String("c"), "mine")); err != nil {
			t.Fatal(err)
		}
		if ks := s.keys["c"]; len(ks) != 2 || ks[0] != "mine" || ks[1] != "mine" || s.keys["a"][0] == ks[0] {
			t.Errorf("keys of c = %q; want the caller's, twice", ks)
		}
		if _, err := o.get.CallUnary(ctx, connect.NewRequest(wrapperspb.String("g"))); err != nil {
			t.Fatal(err)
		}
		if ks := s.keys["g"]; len(ks) != 2 || ks[0] != "" || ks[1] != "" {
			t.Errorf("keys of a NO_SIDE_EFFECTS call = %q; want none, retried", ks)
		}
		_, err = o.create.CallUnary(ctx, connect.NewRequest(wrapperspb.String("x")))
		if connect.CodeOf(err) != connect.CodeUnavailable || len(s.keys["x"]) != 4 {
			t.Errorf("x = %v after %d attempts; want Unavailable after MaxAttempts 4", err, len(s.keys["x"]))
		}
		mu.Lock()
		last := attempts[len(attempts)-1]
		mu.Unlock()
		if last.N != 4 || last.Retry || last.Reason != "attempts" || last.Procedure != procCreate || last.Key == "" {
			t.Errorf("last attempt = %+v; want N 4, no retry, reason attempts, the procedure and key", last)
		}
	})
}

// NewServer and NewClient refuse a mistake with an error that names the
// field, before any call.
func TestOptions(t *testing.T) {
	st := memStore(t)
	scope := func(context.Context, connect.AnyRequest) (string, error) { return "t", nil }
	for _, c := range []struct {
		o     ServerOptions
		field string
	}{
		{ServerOptions{SingleTenant: true}, "Store"},
		{ServerOptions{Store: st}, "Scope"},
		{ServerOptions{Store: st, Scope: scope, SingleTenant: true}, "SingleTenant"},
		{ServerOptions{Store: st, SingleTenant: true, Header: "Connect-Timeout-Ms"}, "Header"},
		{ServerOptions{Store: st, SingleTenant: true, Header: "a b"}, "Header"},
		{ServerOptions{Store: st, SingleTenant: true, LockTimeout: -1}, "LockTimeout"},
		{ServerOptions{Store: st, SingleTenant: true, RetryDelay: 2 * time.Hour}, "RetryDelay"},
		{ServerOptions{Store: st, SingleTenant: true, MaxKeyBytes: -1}, "MaxKeyBytes"},
		{ServerOptions{Store: st, SingleTenant: true, MaxResponseBytes: 1 << 30}, "MaxResponseBytes"},
		{ServerOptions{Store: st, SingleTenant: true, ReplayHeaders: []string{"Set-Cookie"}}, "ReplayHeaders"},
		{ServerOptions{Store: st, SingleTenant: true, ReplayHeaders: []string{"X-A", "x-a"}}, "ReplayHeaders"},
		{ServerOptions{Store: st, SingleTenant: true, ReplayHeaders: []string{"Grpc-Status"}}, "ReplayHeaders"},
		{ServerOptions{Store: st, SingleTenant: true, Procedures: []string{"Create"}}, "Procedures"},
		{ServerOptions{Store: st, SingleTenant: true, KeyField: "request-id"}, "KeyField"},
	} {
		if _, err := NewServer(c.o); err == nil || !strings.Contains(err.Error(), "ServerOptions."+c.field+":") {
			t.Errorf("NewServer(%+v) = %v; want an error naming ServerOptions.%s", c.o, err, c.field)
		}
	}
	for _, c := range []struct {
		o     ClientOptions
		field string
	}{
		{ClientOptions{Header: "Content-Type"}, "Header"},
		{ClientOptions{MaxAttempts: -1}, "MaxAttempts"},
		{ClientOptions{MaxElapsed: -1}, "MaxElapsed"},
		{ClientOptions{AttemptTimeout: -1}, "AttemptTimeout"},
		{ClientOptions{InitialWait: 10 * time.Second}, "InitialWait"},
		{ClientOptions{Procedures: []string{"/a.B/C", "/a.B/C"}}, "Procedures"},
	} {
		if _, err := NewClient(c.o); err == nil || !strings.Contains(err.Error(), "ClientOptions."+c.field+":") {
			t.Errorf("NewClient(%+v) = %v; want an error naming ClientOptions.%s", c.o, err, c.field)
		}
	}
	if _, err := NewServer(ServerOptions{Store: st, SingleTenant: true, ReplayHeaders: []string{"X-Order"}, Procedures: []string{procCreate}}); err != nil {
		t.Errorf("NewServer of good options = %v", err)
	}
}
