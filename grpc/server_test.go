package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// create sends one Create call of value with key ("" for none) and returns
// the answer, its header and its trailer.
func create(t *testing.T, cc *grpc.ClientConn, key, value string) (string, metadata.MD, metadata.MD, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, DefaultMetadata, key)
	}
	var header, trailer metadata.MD
	out := new(wrapperspb.StringValue)
	err := cc.Invoke(ctx, methodCreate, wrapperspb.String(value), out, grpc.Header(&header), grpc.Trailer(&trailer))
	return out.GetValue(), header, trailer, err
}

// orders is a handler that counts runs per value, sets a header and a
// trailer, and answers "value run N".
func (c *counter) orders(ctx context.Context, method string, req proto.Message) (proto.Message, error) {
	var v string
	switch r := req.(type) {
	case *wrapperspb.StringValue:
		v = r.GetValue()
	case *wrapperspb.Int64Value:
		v = fmt.Sprint(r.GetValue())
	}
	n := c.count(method + " " + v)
	_ = grpc.SetHeader(ctx, metadata.Pairs("order-id", v, "secret", "s"))
	_ = grpc.SetTrailer(ctx, metadata.Pairs("order-version", fmt.Sprint(n)))
	return wrapperspb.String(fmt.Sprintf("%s run %d", v, n)), nil
}

func TestUnaryReplaysTheFirstAnswer(t *testing.T) {
	c := newCounter()
	cc := serve(t, ServerOptions{Store: memStore(t), SingleTenant: true, ReplayMetadata: []string{"Order-Id", "order-version"}}, c.orders, nil)
	first, h1, _, err := create(t, cc, "k1", "apple")
	if err != nil || first != "apple run 1" {
		t.Fatalf("first Create = %q, %v; want %q", first, err, "apple run 1")
	}
	if got := h1.Get(MetadataReplayed); len(got) != 0 {
		t.Errorf("first Create header %s = %q; want none", MetadataReplayed, got)
	}
	second, h2, tr2, err := create(t, cc, "k1", "apple")
	if err != nil || second != first {
		t.Fatalf("retry of Create = %q, %v; want the first answer %q", second, err, first)
	}
	if n := c.of(methodCreate + " apple"); n != 1 {
		t.Errorf("handler runs = %d; want 1", n)
	}
	for _, kv := range [][2]string{{MetadataReplayed, "true"}, {"order-id", "apple"}} {
		if got := h2.Get(kv[0]); len(got) != 1 || got[0] != kv[1] {
			t.Errorf("replay header %s = %q; want [%q]", kv[0], got, kv[1])
		}
	}
	if got := h2.Get("secret"); len(got) != 0 {
		t.Errorf("replay header secret = %q; want none: it is not in ReplayMetadata", got)
	}
	if got := tr2.Get("order-version"); len(got) != 1 || got[0] != "1" {
		t.Errorf("replay trailer order-version = %q; want [\"1\"]", got)
	}
}

func TestUnaryWithoutKey(t *testing.T) {
	c := newCounter()
	cc := serve(t, ServerOptions{Store: memStore(t), SingleTenant: true}, c.orders, nil)
	for i := range 2 {
		if got, _, _, err := create(t, cc, "", "pear"); err != nil || got != fmt.Sprintf("pear run %d", i+1) {
			t.Fatalf("Create without a key = %q, %v; want run %d: it passes through", got, err, i+1)
		}
	}
	cc = serve(t, ServerOptions{Store: memStore(t), SingleTenant: true, Required: true, Methods: []string{methodCreate}}, c.orders, nil)
	_, _, _, err := create(t, cc, "", "pear")
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Create without a key, Required = %v; want InvalidArgument", err)
	}
	if reason, _ := errorInfo(err); reason != ReasonKeyMissing {
		t.Errorf("ErrorInfo reason = %q; want %q", reason, ReasonKeyMissing)
	}
	// A method not in Methods passes through, Required or not.
	out := new(wrapperspb.StringValue)
	if err := cc.Invoke(context.Background(), methodCount, wrapperspb.Int64(3), out); err != nil {
		t.Errorf("Count (not covered) = %v; want it to pass through", err)
	}
}

func TestUnaryKeyReused(t *testing.T) {
	c := newCounter()
	cc := serve(t, ServerOptions{Store: memStore(t), SingleTenant: true}, c.orders, nil)
	if _, _, _, err := create(t, cc, "k2", "fig"); err != nil {
		t.Fatal(err)
	}
	_, _, _, err := create(t, cc, "k2", "plum")
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Create(k2, another value) = %v; want FailedPrecondition", err)
	}
	if reason, delay := errorInfo(err); reason != ReasonKeyReused || delay != -1 {
		t.Errorf("ErrorInfo reason, RetryInfo = %q, %v; want %q and no RetryInfo", reason, delay, ReasonKeyReused)
	}
	// The same key on another method with the same encoding is another
	// request too: the method is in the fingerprint.
	ctx := metadata.AppendToOutgoingContext(context.Background(), DefaultMetadata, "k3")
	if err := cc.Invoke(ctx, methodCount, wrapperspb.Int64(0), new(wrapperspb.StringValue)); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := create(t, cc, "k3", ""); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("Create(k3) after Count(k3) = %v; want FailedPrecondition", err)
	}
	if n := c.of(methodCreate + " plum"); n != 0 {
		t.Errorf("handler runs of the reused key's request = %d; want 0", n)
	}
}

func TestUnaryInFlight(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	var runs atomic.Int32
	h := func(ctx context.Context, method string, req proto.Message) (proto.Message, error) {
		runs.Add(1)
		started <- struct{}{}
		<-release
		return wrapperspb.String("done"), nil
	}
	cc := serve(t, ServerOptions{Store: memStore(t), SingleTenant: true, LockTimeout: 50 * time.Millisecond, RetryDelay: 1500 * time.Millisecond}, h, nil)
	first := make(chan error, 1)
	go func() {
		_, _, _, err := create(t, cc, "k4", "x")
		first <- err
	}()
	<-started
	_, _, _, err := create(t, cc, "k4", "x")
	if status.Code(err) != codes.Aborted {
		t.Fatalf("Create(k4) while in flight = %v; want Aborted", err)
	}
	if reason, delay := errorInfo(err); reason != ReasonKeyInFlight || delay != 1500*time.Millisecond {
		t.Errorf("ErrorInfo reason, RetryInfo delay = %q, %v; want %q, 1.5s", reason, delay, ReasonKeyInFlight)
	}
	// A call that arrives while the first runs, and the first ends within
	// LockTimeout: the replay.
	second := make(chan string, 1)
	cc2 := serve(t, ServerOptions{Store: memStore(t), SingleTenant: true, LockTimeout: 5 * time.Second}, h, nil)
	go func() { _, _, _, _ = create(t, cc2, "k5", "y") }()
	<-started
	go func() {
		got, _, _, err := create(t, cc2, "k5", "y")
		if err != nil {
			got = err.Error()
		}
		second <- got
	}()
	time.Sleep(50 * time.Millisecond)
	close(release)
	if got := <-second; got != "done" {
		t.Errorf("Create(k5) waiting for the first = %q; want the replay, \"done\"", got)
	}
	if err := <-first; err != nil {
		t.Errorf("first Create(k4) = %v", err)
	}
	if n := runs.Load(); n != 2 {
		t.Errorf("handler runs = %d; want 2 (one per key)", n)
	}
}

// TestUnaryKeep checks, for every code, that an answer is recorded exactly
// when DefaultKeep says so.
func TestUnaryKeep(t *testing.T) {
	for code := codes.OK; code <= codes.Unauthenticated; code++ {
		t.Run(code.String(), func(t *testing.T) {
			var runs atomic.Int32
			h := func(ctx context.Context, method string, req proto.Message) (proto.Message, error) {
				runs.Add(1)
				if code == codes.OK {
					return wrapperspb.String("ok"), nil
				}
				st, _ := status.New(code, "handler says "+code.String()).WithDetails(&errdetails.BadRequest{
					FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "value", Description: "bad"}}})
				return nil, st.Err()
			}
			cc := serve(t, ServerOptions{Store: memStore(t), SingleTenant: true}, h, nil)
			_, _, _, err1 := create(t, cc, "k", "v")
			_, h2, _, err2 := create(t, cc, "k", "v")
			if status.Code(err1) != code || status.Code(err2) != code {
				t.Fatalf("Create twice = %v, %v; want %v both times", err1, err2, code)
			}
			want := int32(2)
			if DefaultKeep(code) {
				want = 1
				if got := h2.Get(MetadataReplayed); len(got) != 1 {
					t.Errorf("replay of %v: header %s = %q; want [true]", code, MetadataReplayed, got)
				}
				if code != codes.OK {
					st, _ := status.FromError(err2)
					if st.Message() != "handler says "+code.String() || len(st.Details()) != 1 {
						t.Errorf("replayed status = %q with %d details; want the handler's message and its one detail", st.Message(), len(st.Details()))
					}
				}
			}
			if n := runs.Load(); n != want {
				t.Errorf("handler runs after two calls answered %v = %d; want %d (DefaultKeep = %v)", code, n, want, DefaultKeep(code))
			}
		})
	}
}

// downStore fails every Claim as an unreachable store would.
type downStore struct{ idem.Store }

func (downStore) Claim(context.Context, string, []byte) (idem.Claim, error) {
	return idem.Claim{}, errors.New("dial tcp: connection refused")
}

func TestUnaryStoreDown(t *testing.T) {
	c := newCounter()
	cc := serve(t, ServerOptions{Store: downStore{memStore(t)}, SingleTenant: true}, c.orders, nil)
	_, _, _, err := create(t, cc, "k6", "kiwi")
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("Create with the store down = %v; want Unavailable", err)
	}
	if reason, delay := errorInfo(err); reason != ReasonStoreUnavailable || delay != DefaultRetryDelay {
		t.Errorf("ErrorInfo reason, RetryInfo delay = %q, %v; want %q, %v", reason, delay, ReasonStoreUnavailable, DefaultRetryDelay)
	}
	if strings.Contains(err.Error(), "refused") {
		t.Errorf("answer %q shows the store's error text", err)
	}
	if n := c.of(methodCreate + " kiwi"); n != 0 {
		t.Errorf("handler runs with the store down = %d; want 0 (fail closed)", n)
	}
}

func TestUnaryBadKeys(t *testing.T) {
	c := newCounter()
	cc := serve(t, ServerOptions{Store: memStore(t), SingleTenant: true, MaxKeyBytes: 8}, c.orders, nil)
	for name, md := range map[string]metadata.MD{
		"empty":    metadata.Pairs(DefaultMetadata, ""),
		"too long": metadata.Pairs(DefaultMetadata, "123456789"),
		"repeated": metadata.Pairs(DefaultMetadata, "a", DefaultMetadata, "b"),
	} {
		ctx := metadata.NewOutgoingContext(context.Background(), md)
		err := cc.Invoke(ctx, methodCreate, wrapperspb.String(name), new(wrapperspb.StringValue))
		if reason, _ := errorInfo(err); status.Code(err) != codes.InvalidArgument || reason != ReasonKeyInvalid {
			t.Errorf("Create with a key %s = %v (reason %q); want InvalidArgument, %q", name, err, reason, ReasonKeyInvalid)
		}
	}
	if n := len(c.runs); n != 0 {
		t.Errorf("handler ran for %d bad keys; want 0", n)
	}
}

func TestUnaryKeyField(t *testing.T) {
	c := newCounter()
	cc := serve(t, ServerOptions{Store: memStore(t), SingleTenant: true, KeyField: "value"}, c.orders, nil)
	// StringValue's value is the key: the same value twice is a replay,
	// with no metadata at all.
	for range 2 {
		if got, _, _, err := create(t, cc, "", "id-1"); err != nil || got != "id-1 run 1" {
			t.Fatalf("Create(value id-1) = %q, %v; want the first run's answer", got, err)
		}
	}
	// Int64Value's value is not a string: a misconfiguration, answered
	// Internal, the handler not run.
	ctx := metadata.AppendToOutgoingContext(context.Background(), DefaultMetadata, "k")
	err := cc.Invoke(ctx, methodCount, wrapperspb.Int64(1), new(wrapperspb.StringValue))
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "KeyField value") {
		t.Errorf("Count with KeyField naming an int64 = %v; want Internal naming KeyField", err)
	}
}

func TestUnaryScope(t *testing.T) {
	c := newCounter()
	type tenant struct{}
	scope := func(ctx context.Context, method string) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx) // a test stand-in for an authenticated principal
		switch v := md.Get("tenant"); {
		case len(v) == 0:
			return "", errors.New("no principal")
		case v[0] == "banned":
			return "", status.Error(codes.PermissionDenied, "banned")
		default:
			return v[0], nil
		}
	}
	cc := serve(t, ServerOptions{Store: memStore(t), Scope: scope}, c.orders, nil)
	call := func(who string) (string, error) {
		ctx := metadata.AppendToOutgoingContext(context.Background(), DefaultMetadata, "shared", "tenant", who)
		out := new(wrapperspb.StringValue)
		err := cc.Invoke(ctx, methodCreate, wrapperspb.String("order"), out)
		return out.GetValue(), err
	}
	a, errA := call("acme")
	b, errB := call("globex")
	if errA != nil || errB != nil || a != "order run 1" || b != "order run 2" {
		t.Errorf("one key, two tenants = %q, %v and %q, %v; want each its own run", a, errA, b, errB)
	}
	if again, err := call("acme"); again != a || err != nil {
		t.Errorf("acme again = %q, %v; want its own replay %q", again, err, a)
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), DefaultMetadata, "k")
	if err := cc.Invoke(ctx, methodCreate, wrapperspb.String("x"), new(wrapperspb.StringValue)); status.Code(err) != codes.Unauthenticated || strings.Contains(err.Error(), "principal") {
		t.Errorf("Create without a principal = %v; want Unauthenticated without the Scope error's text", err)
	}
	if _, err := call("banned"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Create from a tenant the Scope refuses with a status = %v; want that status", err)
	}
	// An empty tenant would be one scope for every call without one.
	if _, err := call(""); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Create whose Scope says \"\" = %v; want Unauthenticated", err)
	}
	_ = tenant{}
}

func TestStreamRefusesAKey(t *testing.T) {
	cc := serve(t, ServerOptions{Store: memStore(t), SingleTenant: true}, newCounter().orders, nil)
	desc := &grpc.StreamDesc{StreamName: "Watch", ServerStreams: true}
	watch := func(ctx context.Context) error {
		st, err := cc.NewStream(ctx, desc, methodWatch)
		if err != nil {
			return err
		}
		if err := st.SendMsg(wrapperspb.String("a")); err != nil {
			return err
		}
		_ = st.CloseSend()
		return st.RecvMsg(new(wrapperspb.StringValue))
	}
	if err := watch(context.Background()); err != nil {
		t.Errorf("Watch without a key = %v; want it to pass through", err)
	}
	err := watch(metadata.AppendToOutgoingContext(context.Background(), DefaultMetadata, "k"))
	if reason, _ := errorInfo(err); status.Code(err) != codes.Unimplemented || reason != ReasonStreamNotCovered {
		t.Errorf("Watch with a key = %v (reason %q); want Unimplemented, %q", err, reason, ReasonStreamNotCovered)
	}
}

func TestUnaryPanicReleasesTheKey(t *testing.T) {
	var runs atomic.Int32
	s, err := NewServer(ServerOptions{Store: memStore(t), SingleTenant: true})
	if err != nil {
		t.Fatal(err)
	}
	h := func(ctx context.Context, req any) (any, error) {
		if runs.Add(1) == 1 {
			panic("handler fails")
		}
		return wrapperspb.String("second run"), nil
	}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(DefaultMetadata, "k"))
	info := &grpc.UnaryServerInfo{FullMethod: methodCreate}
	func() {
		defer func() {
			if r := recover(); r != "handler fails" {
				t.Errorf("recover() = %v; want the handler's panic to go on", r)
			}
		}()
		_, _ = s.Unary(ctx, wrapperspb.String("v"), info, h)
	}()
	resp, err := s.Unary(ctx, wrapperspb.String("v"), info, h)
	if err != nil || resp.(*wrapperspb.StringValue).GetValue() != "second run" {
		t.Errorf("Unary after a panic = %v, %v; want the handler to run again", resp, err)
	}
}

func TestUnaryLeaseInContext(t *testing.T) {
	var token int64
	h := func(ctx context.Context, method string, req proto.Message) (proto.Message, error) {
		l, ok := idem.LeaseFrom(ctx)
		if !ok {
			return nil, status.Error(codes.Internal, "no lease")
		}
		token = l.Token
		// KeepAlive keeps the lease: a handler longer than its TTL still
		// holds it. The TTL leaves each renewal (every TTL/3) more than
		// half a second of slack on a busy machine; a 60ms one lost the
		// lease 2 runs in 30 under load.
		time.Sleep(1300 * time.Millisecond)
		if err := context.Cause(ctx); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		return wrapperspb.String("ok"), nil
	}
	st, err := idem.NewMemoryStore(idem.Options{LeaseTTL: time.Second, Retention: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	cc := serve(t, ServerOptions{Store: st, SingleTenant: true}, h, nil)
	if got, _, _, err := create(t, cc, "k", "v"); err != nil || got != "ok" || token <= 0 {
		t.Errorf("Create = %q, %v with lease token %d; want ok and a positive token", got, err, token)
	}
}

func TestUnaryResponseOverMaxResponseBytes(t *testing.T) {
	c := newCounter()
	big := strings.Repeat("x", 2000)
	h := func(ctx context.Context, method string, req proto.Message) (proto.Message, error) {
		c.count("big")
		return wrapperspb.String(big), nil
	}
	cc := serve(t, ServerOptions{Store: memStore(t), SingleTenant: true, MaxResponseBytes: 1000}, h, nil)
	if got, _, _, err := create(t, cc, "k", "v"); err != nil || got != big {
		t.Fatalf("first Create = %d bytes, %v; want the whole response", len(got), err)
	}
	_, header, _, err := create(t, cc, "k", "v")
	if reason, _ := errorInfo(err); status.Code(err) != codes.AlreadyExists || reason != ReasonResponseNotRecorded {
		t.Errorf("replay of an unrecorded response = %v (reason %q); want AlreadyExists, %q", err, reason, ReasonResponseNotRecorded)
	}
	if got := header.Get(MetadataResponseOmitted); len(got) != 1 {
		t.Errorf("header %s = %q; want [true]", MetadataResponseOmitted, got)
	}
	if n := c.of("big"); n != 1 {
		t.Errorf("handler runs = %d; want 1: the work was done and recorded as done", n)
	}
}

func TestUnaryDamagedRecord(t *testing.T) {
	st := memStore(t)
	ctx := context.Background()
	cl, err := st.Claim(ctx, storeKey("", "k"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Confirm(ctx, cl.Lease, []byte{9, 9, 9}); err != nil {
		t.Fatal(err)
	}
	c := newCounter()
	cc := serve(t, ServerOptions{Store: st, SingleTenant: true}, c.orders, nil)
	_, _, _, err = create(t, cc, "k", "v")
	if reason, _ := errorInfo(err); status.Code(err) != codes.Internal || reason != ReasonRecordDamaged {
		t.Errorf("Create on a damaged record = %v (reason %q); want Internal, %q", err, reason, ReasonRecordDamaged)
	}
	if len(c.runs) != 0 {
		t.Errorf("handler ran on a damaged record; want never a second run")
	}
}

func TestDecodeRecordRejectsDamage(t *testing.T) {
	good := encodeRecord(0, metadata.Pairs("a", "1"), metadata.Pairs("b", "2"), []string{"a", "b"}, "google.protobuf.StringValue", []byte{10, 1, 'x'})
	r, err := decodeRecord(good, []string{"a", "b"})
	if err != nil || r.header.Get("a")[0] != "1" || r.trailer.Get("b")[0] != "2" {
		t.Fatalf("decodeRecord(good) = %+v, %v", r, err)
	}
	m, err := r.message()
	if err != nil || m.(*wrapperspb.StringValue).GetValue() != "x" {
		t.Errorf("message() = %v, %v; want x", m, err)
	}
	for i := range len(good) {
		if _, err := decodeRecord(good[:i], []string{"a"}); err == nil && i < len(good)-3 {
			t.Errorf("decodeRecord(first %d bytes) = nil error; want errRecord", i)
		}
	}
	if _, err := decodeRecord(append([]byte{2}, good[1:]...), nil); !errors.Is(err, errRecord) {
		t.Errorf("decodeRecord(version 2) = %v; want errRecord", err)
	}
}

// events collects Observer events.
type events struct {
	mu  chan struct{}
	all []idem.Event
}

func (e *events) Observe(_ context.Context, ev idem.Event) {
	e.mu <- struct{}{}
	e.all = append(e.all, ev)
	<-e.mu
}

func TestUnaryObserver(t *testing.T) {
	obs := &events{mu: make(chan struct{}, 1)}
	cc := serve(t, ServerOptions{Store: memStore(t), SingleTenant: true, Observer: obs}, newCounter().orders, nil)
	_, _, _, _ = create(t, cc, "k", "v")
	_, _, _, _ = create(t, cc, "k", "v")
	_, _, _, _ = create(t, cc, "k", "w")
	_, _, _, _ = create(t, cc, "", "none")
	want := []struct {
		outcome idem.Outcome
		err     error
	}{{idem.Claimed, nil}, {idem.Duplicate, nil}, {idem.Duplicate, idem.ErrFingerprintMismatch}}
	if len(obs.all) != len(want) {
		t.Fatalf("events = %d; want %d (none for a call without a key)", len(obs.all), len(want))
	}
	for i, w := range want {
		e := obs.all[i]
		if e.Op != idem.OpRequest || e.Outcome != w.outcome || !errors.Is(e.Err, w.err) || (w.err == nil) != (e.Err == nil) {
			t.Errorf("event %d = %v %v %v; want request %v %v", i, e.Op, e.Outcome, e.Err, w.outcome, w.err)
		}
		if e.KeyHash != idem.KeyHash(storeKey("", "k")) {
			t.Errorf("event %d KeyHash = %q; want the hash of the store key", i, e.KeyHash)
		}
	}
}

// lostClaimReply applies every Claim but, like a store client cut off by
// its context mid-command, answers the context's error when the caller's
// context ended meanwhile.
type lostClaimReply struct{ idem.Store }

func (s lostClaimReply) Claim(ctx context.Context, key string, fp []byte) (idem.Claim, error) {
	time.Sleep(50 * time.Millisecond)
	c, err := s.Store.Claim(context.WithoutCancel(ctx), key, fp)
	if ctx.Err() != nil {
		return idem.Claim{}, ctx.Err()
	}
	return c, err
}

// TestUnaryClaimOutlivesTheCaller checks that a caller who hangs up during
// the Claim leaves no claim behind: its retry runs at once, rather than
// meeting an orphaned lease (Aborted) for a whole LeaseTTL.
func TestUnaryClaimOutlivesTheCaller(t *testing.T) {
	s, err := NewServer(ServerOptions{Store: lostClaimReply{memStore(t)}, SingleTenant: true, LockTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	h := func(ctx context.Context, req any) (any, error) {
		runs.Add(1)
		if err := ctx.Err(); err != nil {
			return nil, status.FromContextError(err).Err()
		}
		return wrapperspb.String("ok"), nil
	}
	info := &grpc.UnaryServerInfo{FullMethod: methodCreate}
	md := metadata.Pairs(DefaultMetadata, "k")
	ctx, cancel := context.WithTimeout(metadata.NewIncomingContext(context.Background(), md), 10*time.Millisecond)
	defer cancel()
	_, _ = s.Unary(ctx, wrapperspb.String("v"), info, h)
	resp, err := s.Unary(metadata.NewIncomingContext(context.Background(), md), wrapperspb.String("v"), info, h)
	if err != nil || resp.(*wrapperspb.StringValue).GetValue() != "ok" {
		t.Errorf("retry after a caller hung up during its Claim = %v, %v; want the handler's ok", resp, err)
	}
}
