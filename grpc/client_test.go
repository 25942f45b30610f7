package idemgrpc

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// script is a server that answers each attempt with the next error of its
// list (nil: success), and notes each attempt's key and time.
type script struct {
	mu    sync.Mutex
	errs  []error
	delay []time.Duration // how long each attempt takes, when set
	keys  []string
	at    []time.Time
}

func (s *script) handle(ctx context.Context, method string, req proto.Message) (proto.Message, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	s.mu.Lock()
	n := len(s.keys)
	s.keys = append(s.keys, strings.Join(md.Get(DefaultMetadata), ","))
	s.at = append(s.at, time.Now())
	var err error
	if n < len(s.errs) {
		err = s.errs[n]
	}
	var d time.Duration
	if n < len(s.delay) {
		d = s.delay[n]
	}
	s.mu.Unlock()
	time.Sleep(d)
	if err != nil {
		return nil, err
	}
	return wrapperspb.String("ok"), nil
}

// passThrough is a server interceptor that covers no method the tests call.
var passThrough = ServerOptions{Store: nil, SingleTenant: true, Methods: []string{"/none.None/None"}}

func scripted(t *testing.T, s *script, co ClientOptions) *grpc.ClientConn {
	t.Helper()
	o := passThrough
	o.Store = memStore(t)
	return serve(t, o, s.handle, &co)
}

func TestClientOneKeyPerCall(t *testing.T) {
	s := &script{errs: []error{status.Error(codes.Unavailable, "a"), status.Error(codes.Aborted, "b"), nil}}
	var attempts []Attempt
	cc := scripted(t, s, ClientOptions{InitialWait: time.Millisecond, OnAttempt: func(a Attempt) { attempts = append(attempts, a) }})
	if err := cc.Invoke(context.Background(), methodCreate, wrapperspb.String("x"), new(wrapperspb.StringValue)); err != nil {
		t.Fatalf("Invoke = %v; want success on the third attempt", err)
	}
	if len(s.keys) != 3 || s.keys[0] == "" || s.keys[1] != s.keys[0] || s.keys[2] != s.keys[0] || strings.Contains(s.keys[0], ",") {
		t.Errorf("keys per attempt = %q; want one key, the same on all three", s.keys)
	}
	if len(attempts) != 3 || !attempts[0].Retry || !attempts[1].Retry || attempts[2].Retry || attempts[2].Key != s.keys[0] {
		t.Errorf("attempts = %+v; want two retried and a last one, with the key", attempts)
	}
	// A second call gets a key of its own; a caller's key is kept.
	_ = cc.Invoke(context.Background(), methodCreate, wrapperspb.String("x"), new(wrapperspb.StringValue))
	ctx := metadata.AppendToOutgoingContext(context.Background(), DefaultMetadata, "mine")
	_ = cc.Invoke(ctx, methodCreate, wrapperspb.String("x"), new(wrapperspb.StringValue))
	if len(s.keys) != 5 || s.keys[3] == s.keys[0] || s.keys[4] != "mine" {
		t.Errorf("keys of the next calls = %q; want a new one, then the caller's \"mine\"", s.keys[3:])
	}
}

func TestClientRetriedCodes(t *testing.T) {
	for code := codes.Canceled; code <= codes.Unauthenticated; code++ {
		s := &script{errs: []error{status.Error(code, "first")}}
		cc := scripted(t, s, ClientOptions{InitialWait: time.Millisecond})
		err := cc.Invoke(context.Background(), methodCreate, wrapperspb.String("x"), new(wrapperspb.StringValue))
		want := retried(code)
		if got := len(s.keys) == 2; got != want || (want && err != nil) || (!want && status.Code(err) != code) {
			t.Errorf("first attempt answered %v: attempts %d, Invoke = %v; want retried = %v", code, len(s.keys), err, want)
		}
	}
}

func TestClientHonoursRetryInfo(t *testing.T) {
	st, _ := status.New(codes.Aborted, "in flight").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(300 * time.Millisecond)})
	s := &script{errs: []error{st.Err()}}
	cc := scripted(t, s, ClientOptions{InitialWait: time.Millisecond})
	if err := cc.Invoke(context.Background(), methodCreate, wrapperspb.String("x"), new(wrapperspb.StringValue)); err != nil {
		t.Fatal(err)
	}
	if gap := s.at[1].Sub(s.at[0]); gap < 300*time.Millisecond {
		t.Errorf("wait after RetryInfo 300ms = %v; want at least 300ms", gap)
	}
	// MaxWait caps what the server asks for.
	s = &script{errs: []error{st.Err()}}
	cc = scripted(t, s, ClientOptions{InitialWait: time.Millisecond, MaxWait: 20 * time.Millisecond})
	if err := cc.Invoke(context.Background(), methodCreate, wrapperspb.String("x"), new(wrapperspb.StringValue)); err != nil {
		t.Fatal(err)
	}
	if gap := s.at[1].Sub(s.at[0]); gap > 200*time.Millisecond {
		t.Errorf("wait with MaxWait 20ms = %v; want it capped", gap)
	}
}

func TestClientBounds(t *testing.T) {
	unavailable, _ := status.New(codes.Unavailable, "down").WithDetails(&errdetails.ErrorInfo{Reason: "R"})
	always := make([]error, 100)
	for i := range always {
		always[i] = unavailable.Err()
	}
	var last Attempt
	s := &script{errs: always}
	cc := scripted(t, s, ClientOptions{MaxAttempts: 3, InitialWait: time.Millisecond, OnAttempt: func(a Attempt) { last = a }})
	err := cc.Invoke(context.Background(), methodCreate, wrapperspb.String("x"), new(wrapperspb.StringValue))
	if reason, _ := errorInfo(err); status.Code(err) != codes.Unavailable || reason != "R" || len(s.keys) != 3 || last.Reason != "attempts" {
		t.Errorf("always Unavailable, MaxAttempts 3: %d attempts, Invoke = %v, reason %q; want 3, the last status with its details, reason attempts", len(s.keys), err, last.Reason)
	}
	s = &script{errs: always}
	cc = scripted(t, s, ClientOptions{MaxAttempts: 100, MaxElapsed: 100 * time.Millisecond, InitialWait: 30 * time.Millisecond, MaxWait: 30 * time.Millisecond, OnAttempt: func(a Attempt) { last = a }})
	start := time.Now()
	err = cc.Invoke(context.Background(), methodCreate, wrapperspb.String("x"), new(wrapperspb.StringValue))
	if took := time.Since(start); status.Code(err) != codes.Unavailable || last.Reason != "elapsed" || took > time.Second {
		t.Errorf("MaxElapsed 100ms: Invoke = %v after %v, reason %q; want Unavailable within it, reason elapsed", err, took, last.Reason)
	}
	// Cancelled as the second attempt's wait begins (OnAttempt reports
	// it just before): a timer instead could land mid-attempt on a loaded
	// machine, and the attempt's own Canceled would be the answer.
	s = &script{errs: always}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cc = scripted(t, s, ClientOptions{MaxAttempts: 100, InitialWait: 50 * time.Millisecond, OnAttempt: func(a Attempt) {
		if a.N == 2 && a.Retry {
			cancel()
		}
	}})
	err = cc.Invoke(ctx, methodCreate, wrapperspb.String("x"), new(wrapperspb.StringValue))
	if status.Code(err) != codes.Canceled || !strings.Contains(err.Error(), "down") {
		t.Errorf("context canceled during a wait: Invoke = %v; want Canceled naming the last attempt's error", err)
	}
}

func TestClientAttemptTimeout(t *testing.T) {
	s := &script{delay: []time.Duration{time.Second}}
	var first Attempt
	cc := scripted(t, s, ClientOptions{AttemptTimeout: 50 * time.Millisecond, InitialWait: time.Millisecond, OnAttempt: func(a Attempt) {
		if a.N == 1 {
			first = a
		}
	}})
	start := time.Now()
	if err := cc.Invoke(context.Background(), methodCreate, wrapperspb.String("x"), new(wrapperspb.StringValue)); err != nil {
		t.Fatalf("Invoke = %v; want the second attempt's success", err)
	}
	if took := time.Since(start); took > 900*time.Millisecond || status.Code(first.Err) != codes.DeadlineExceeded || !first.Retry {
		t.Errorf("first attempt = %+v, call took %v; want DeadlineExceeded after 50ms, retried", first, took)
	}
	// A DeadlineExceeded of the call's own deadline is not retried.
	s = &script{delay: []time.Duration{time.Second, time.Second}}
	cc = scripted(t, s, ClientOptions{InitialWait: time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := cc.Invoke(ctx, methodCreate, wrapperspb.String("x"), new(wrapperspb.StringValue)); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("Invoke past the call's deadline = %v; want DeadlineExceeded", err)
	}
	time.Sleep(50 * time.Millisecond)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.keys) != 1 {
		t.Errorf("attempts past the call's deadline = %d; want 1", len(s.keys))
	}
}

func TestClientMethods(t *testing.T) {
	s := &script{errs: []error{status.Error(codes.Unavailable, "a")}}
	cc := scripted(t, s, ClientOptions{Methods: []string{methodCount}, InitialWait: time.Millisecond})
	err := cc.Invoke(context.Background(), methodCreate, wrapperspb.String("x"), new(wrapperspb.StringValue))
	if status.Code(err) != codes.Unavailable || len(s.keys) != 1 || s.keys[0] != "" {
		t.Errorf("a method not covered: Invoke = %v, keys %q; want one attempt without a key", err, s.keys)
	}
}

func TestNewClientRefusesMistakes(t *testing.T) {
	for _, tc := range []struct {
		o    ClientOptions
		want string
	}{
		{ClientOptions{Metadata: "grpc-key"}, `idemgrpc: ClientOptions.Metadata: "grpc-key" is reserved`},
		{ClientOptions{Metadata: "key-bin"}, `idemgrpc: ClientOptions.Metadata: "key-bin" is a binary`},
		{ClientOptions{Metadata: "a key"}, `idemgrpc: ClientOptions.Metadata: "a key" is not a metadata key`},
		{ClientOptions{MaxAttempts: -1}, "idemgrpc: ClientOptions.MaxAttempts: -1 is negative; 0 means the default, 5"},
		{ClientOptions{MaxElapsed: -time.Second}, "idemgrpc: ClientOptions.MaxElapsed: -1s is negative; 0 means the default, "},
		{ClientOptions{AttemptTimeout: -time.Second}, "idemgrpc: ClientOptions.AttemptTimeout: -1s is negative; 0 means the default, none"},
		{ClientOptions{InitialWait: time.Minute}, "idemgrpc: ClientOptions.InitialWait: 1m0s is longer than MaxWait 5s, which caps every wait"},
		{ClientOptions{Methods: []string{"Create"}}, `idemgrpc: ClientOptions.Methods: "Create" is not a full method name`},
		{ClientOptions{Methods: []string{methodCreate, methodCreate}}, "idemgrpc: ClientOptions.Methods: \"" + methodCreate + "\" is listed twice"},
	} {
		_, err := NewClient(tc.o)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) || !badOption.MatchString(err.Error()) {
			t.Errorf("NewClient(%+v) = %v; want an error starting %q", tc.o, err, tc.want)
		}
	}
	if _, err := NewClient(ClientOptions{}); err != nil {
		t.Errorf("NewClient(ClientOptions{}) = %v; want the defaults", err)
	}
}
