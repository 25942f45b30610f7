package idemconnect

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemgo/idem"
)

// orderHandler counts its runs per request value and answers what the
// value asks: "err:N" an error of code N with an ErrorInfo detail,
// "panic" a panic; else "<value> run <n> token <t>", with the header
// X-Order, the trailer X-Trace and a Set-Cookie. hold, when not nil,
// blocks every run until it is closed.
func orderHandler(c *counter, hold chan struct{}, started chan<- struct{}) handlerFunc {
	return func(ctx context.Context, proc string, r *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error) {
		v := r.Msg.GetValue()
		if started != nil {
			started <- struct{}{}
		}
		if hold != nil {
			<-hold
		}
		n := c.count(v)
		if code, ok := strings.CutPrefix(v, "err:"); ok {
			k, _ := strconv.Atoi(code)
			e := connect.NewError(connect.Code(k), fmt.Errorf("refused, run %d", n))
			if d, err := connect.NewErrorDetail(&errdetails.ErrorInfo{Reason: "DECLINED", Domain: "test"}); err == nil {
				e.AddDetail(d)
			}
			e.Meta().Set("X-Order", "refused")
			return nil, e
		}
		if v == "panic" {
			panic("the handler panics")
		}
		var token int64
		if l, ok := idem.LeaseFrom(ctx); ok {
			token = l.Token
		}
		resp := connect.NewResponse(wrapperspb.String(fmt.Sprintf("%s %s run %d token %d", proc, v, n, token)))
		resp.Header().Set("X-Order", "o-"+v)
		resp.Header().Set("Set-Cookie", "session=s3cret")
		resp.Trailer().Set("X-Trace", "t-"+v)
		if info, ok := connect.CallInfoForHandlerContext(ctx); ok {
			info.ResponseHeader().Set("X-Via-Context", "c-"+v) // the simple handler API's way
		}
		return resp, nil
	}
}

func wantCode(t *testing.T, err error, code connect.Code, reason string) {
	t.Helper()
	if got := connect.CodeOf(err); err == nil || got != code {
		t.Fatalf("err = %v; want code %v", err, code)
	}
	if reason != "" {
		if got, _ := errorInfo(err); got != reason {
			t.Errorf("ErrorInfo reason = %q; want %q (err %v)", got, reason, err)
		}
	}
	if strings.Contains(err.Error(), "secret") {
		t.Errorf("err = %v shows internal error text", err)
	}
}

// The first call runs and is recorded; a retry gets the recorded message,
// the replayed header and trailer, and Idempotent-Replayed: true; the
// handler runs once. On each protocol.
func TestFirstThenReplay(t *testing.T) {
	eachProtocol(t, func(t *testing.T, proto []connect.ClientOption) {
		c := newCounter()
		o := serve(t, ServerOptions{Store: memStore(t), SingleTenant: true, ReplayHeaders: []string{"X-Order", "x-trace", "X-Via-Context"}}, orderHandler(c, nil, nil), proto, nil)
		ctx := context.Background()
		first, err := o.create.CallUnary(ctx, keyed(wrapperspb.String("a"), "k1"))
		if err != nil {
			t.Fatal(err)
		}
		if first.Header().Get(HeaderReplayed) != "" || first.Header().Get("Set-Cookie") == "" || !strings.Contains(first.Msg.GetValue(), "run 1 token ") || strings.HasSuffix(first.Msg.GetValue(), "token 0") {
			t.Fatalf("first = %q %v; want run 1 with a lease token, not replayed", first.Msg.GetValue(), first.Header())
		}
		for range 2 {
			again, err := o.create.CallUnary(ctx, keyed(wrapperspb.String("a"), "k1"))
			if err != nil {
				t.Fatal(err)
			}
			if again.Msg.GetValue() != first.Msg.GetValue() || again.Header().Get(HeaderReplayed) != "true" {
				t.Errorf("retry = %q %v; want %q replayed", again.Msg.GetValue(), again.Header(), first.Msg.GetValue())
			}
			if again.Header().Get("X-Order") != "o-a" || again.Trailer().Get("X-Trace") != "t-a" || again.Header().Get("X-Via-Context") != "c-a" || again.Header().Get("Set-Cookie") != "" {
				t.Errorf("retry header %v, trailer %v; want X-Order, X-Via-Context and X-Trace replayed, no Set-Cookie", again.Header(), again.Trailer())
			}
		}
		if n := c.of("a"); n != 1 {
			t.Errorf("handler ran %d times; want 1", n)
		}
	})
}

// The same key with another message, or on another procedure, is
// FailedPrecondition, and the handler does not run.
func TestKeyReused(t *testing.T) {
	eachProtocol(t, func(t *testing.T, proto []connect.ClientOption) {
		c := newCounter()
		o := serve(t, ServerOptions{Store: memStore(t), SingleTenant: true}, orderHandler(c, nil, nil), proto, nil)
		ctx := context.Background()
		if _, err := o.create.CallUnary(ctx, keyed(wrapperspb.String("a"), "k1")); err != nil {
			t.Fatal(err)
		}
		_, err := o.create.CallUnary(ctx, keyed(wrapperspb.String("b"), "k1"))
		wantCode(t, err, connect.CodeFailedPrecondition, ReasonKeyReused)
		_, err = o.count.CallUnary(ctx, keyed(wrapperspb.Int64(1), "k1"))
		wantCode(t, err, connect.CodeFailedPrecondition, ReasonKeyReused)
		if _, d := errorInfo(err); d != -1 {
			t.Errorf("RetryInfo on FailedPrecondition = %v; want none: no retry succeeds", d)
		}
		if c.of("b") != 0 || c.of("count") != 0 {
			t.Errorf("handler ran for the reused key")
		}
	})
}

// While the first call runs, a retry waits LockTimeout and gets Aborted
// with RetryInfo; another message gets FailedPrecondition at once; a retry
// still waiting when the first ends gets its replay.
func TestInFlight(t *testing.T) {
	eachProtocol(t, func(t *testing.T, proto []connect.ClientOption) {
		c := newCounter()
		hold, started := make(chan struct{}), make(chan struct{}, 4)
		store := memStore(t)
		h := orderHandler(c, hold, started)
		o := serve(t, ServerOptions{Store: store, SingleTenant: true, LockTimeout: 150 * time.Millisecond, RetryDelay: 2 * time.Second}, h, proto, nil)
		ctx := context.Background()
		first := make(chan error, 1)
		var firstMsg string
		go func() {
			r, err := o.create.CallUnary(ctx, keyed(wrapperspb.String("a"), "k1"))
			if err == nil {
				firstMsg = r.Msg.GetValue()
			}
			first <- err
		}()
		<-started
		start := time.Now()
		_, err := o.create.CallUnary(ctx, keyed(wrapperspb.String("a"), "k1"))
		wantCode(t, err, connect.CodeAborted, ReasonKeyInFlight)
		if took := time.Since(start); took < 150*time.Millisecond {
			t.Errorf("Aborted came after %v; want a wait of LockTimeout first", took)
		}
		if _, d := errorInfo(err); d != 2*time.Second {
			t.Errorf("RetryInfo delay = %v; want RetryDelay 2s", d)
		}
		_, err = o.create.CallUnary(ctx, keyed(wrapperspb.String("b"), "k1"))
		wantCode(t, err, connect.CodeFailedPrecondition, ReasonKeyReused)

		waiting := serve(t, ServerOptions{Store: store, SingleTenant: true, LockTimeout: 10 * time.Second}, h, proto, nil)
		waiter := make(chan *connect.Response[wrapperspb.StringValue], 1)
		go func() {
			r, err := waiting.create.CallUnary(ctx, keyed(wrapperspb.String("a"), "k1"))
			if err != nil {
				t.Errorf("waiter = %v; want the replay", err)
			}
			waiter <- r
		}()
		time.Sleep(50 * time.Millisecond)
		close(hold)
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		if r := <-waiter; r == nil || r.Msg.GetValue() != firstMsg || r.Header().Get(HeaderReplayed) != "true" {
			t.Errorf("waiter = %v; want %q replayed", r, firstMsg)
		}
		if n := c.of("a"); n != 1 {
			t.Errorf("handler ran %d times; want 1", n)
		}
	})
}

// A store that fails answers Unavailable with RetryInfo, the handler does
// not run, and the store's error text is not shown.
func TestStoreDown(t *testing.T) {
	eachProtocol(t, func(t *testing.T, proto []connect.ClientOption) {
		c := newCounter()
		o := serve(t, ServerOptions{Store: failingStore{memStore(t)}, SingleTenant: true}, orderHandler(c, nil, nil), proto, nil)
		_, err := o.create.CallUnary(context.Background(), keyed(wrapperspb.String("a"), "k1"))
		wantCode(t, err, connect.CodeUnavailable, ReasonStoreUnavailable)
		if _, d := errorInfo(err); d != DefaultRetryDelay {
			t.Errorf("RetryInfo delay = %v; want %v", d, DefaultRetryDelay)
		}
		if n := c.of("a"); n != 0 {
			t.Errorf("handler ran %d times; want 0 (fail closed)", n)
		}
	})
}

// The keep rules: InvalidArgument is recorded and replayed, code,
// message, details and replayed Meta alike; a code a retry may change
// releases the key, and the retry runs the handler. A panic releases the
// key too.
func TestKeepRules(t *testing.T) {
	eachProtocol(t, func(t *testing.T, proto []connect.ClientOption) {
		c := newCounter()
		o := serve(t, ServerOptions{Store: memStore(t), SingleTenant: true, ReplayHeaders: []string{"X-Order"}}, orderHandler(c, nil, nil), proto, nil)
		ctx := context.Background()
		for _, code := range []connect.Code{connect.CodeInvalidArgument, connect.CodeInternal, connect.CodeUnknown, connect.CodeNotFound,
			connect.CodeAlreadyExists, connect.CodeFailedPrecondition, connect.CodePermissionDenied, connect.CodeUnavailable} {
			v := fmt.Sprintf("err:%d", code)
			_, first := o.create.CallUnary(ctx, keyed(wrapperspb.String(v), "k-"+v))
			_, again := o.create.CallUnary(ctx, keyed(wrapperspb.String(v), "k-"+v))
			ce1, ce2 := new(connect.Error), new(connect.Error)
			if !errors.As(first, &ce1) || !errors.As(again, &ce2) || ce1.Code() != code || ce2.Code() != code {
				t.Fatalf("%v: first %v, retry %v; want both %v", code, first, again, code)
			}
			if DefaultKeep(code) {
				if ce2.Message() != ce1.Message() || ce2.Meta().Get(HeaderReplayed) != "true" || ce2.Meta().Get("X-Order") != "refused" {
					t.Errorf("%v: retry = %q %v; want %q replayed with X-Order", code, ce2.Message(), ce2.Meta(), ce1.Message())
				}
				if r, _ := errorInfo(again); r != "DECLINED" {
					t.Errorf("%v: retry's details reason %q; want the handler's DECLINED", code, r)
				}
				if n := c.of(v); n != 1 {
					t.Errorf("%v: handler ran %d times; want 1", code, n)
				}
				continue
			}
			if ce2.Meta().Get(HeaderReplayed) != "" || !strings.Contains(ce2.Message(), "run 2") {
				t.Errorf("%v: retry = %q %v; want the handler run again", code, ce2.Message(), ce2.Meta())
			}
		}
		_, err := o.create.CallUnary(ctx, keyed(wrapperspb.String("panic"), "k-panic"))
		if err == nil {
			t.Fatal("a panicking handler answered nil")
		}
		_, err = o.create.CallUnary(ctx, keyed(wrapperspb.String("panic"), "k-panic"))
		if err == nil || connect.CodeOf(err) == connect.CodeAborted || c.of("panic") != 2 {
			t.Errorf("retry after a panic = %v, handler runs %d; want it run again (the key released)", err, c.of("panic"))
		}
	})
}

// Calls without a key pass through, unless Required; a NO_SIDE_EFFECTS
// procedure passes through even with Required and a key, without a store
// call; a stream carrying a key is Unimplemented, one without passes.
func TestCoverage(t *testing.T) {
	eachProtocol(t, func(t *testing.T, proto []connect.ClientOption) {
		c := newCounter()
		ctx := context.Background()
		o := serve(t, ServerOptions{Store: memStore(t), SingleTenant: true}, orderHandler(c, nil, nil), proto, nil)
		for range 2 {
			if _, err := o.create.CallUnary(ctx, keyed(wrapperspb.String("a"), "")); err != nil {
				t.Fatal(err)
			}
		}
		if n := c.of("a"); n != 2 {
			t.Errorf("calls without a key ran %d times; want 2", n)
		}
		req := o.watch
		st, err := req.CallServerStream(ctx, keyed(wrapperspb.String("w"), "k-stream"))
		if err == nil {
			for st.Receive() {
			}
			err = st.Err()
		}
		wantCode(t, err, connect.CodeUnimplemented, ReasonStreamNotCovered)
		if st, err = req.CallServerStream(ctx, keyed(wrapperspb.String("w"), "")); err != nil {
			t.Fatal(err)
		}
		if !st.Receive() || st.Msg().GetValue() != "watching w" {
			t.Errorf("stream without a key = %v; want it served", st.Err())
		}
		_ = st.Close()

		store := &countingStore{Store: memStore(t)}
		r := serve(t, ServerOptions{Store: store, SingleTenant: true, Required: true}, orderHandler(c, nil, nil), proto, nil)
		_, err = r.create.CallUnary(ctx, keyed(wrapperspb.String("b"), ""))
		wantCode(t, err, connect.CodeInvalidArgument, ReasonKeyMissing)
		for range 2 {
			if _, err := r.get.CallUnary(ctx, keyed(wrapperspb.String("g"), "k-get")); err != nil {
				t.Fatalf("NO_SIDE_EFFECTS call = %v; want it passed through", err)
			}
		}
		if n := c.of("g"); n != 2 || store.claims != 0 {
			t.Errorf("NO_SIDE_EFFECTS: handler ran %d times, %d claims; want 2 and 0", n, store.claims)
		}
	})
}

// countingStore counts the claims it is asked for.
type countingStore struct {
	idem.Store
	claims int
}

func (s *countingStore) Claim(ctx context.Context, key string, fp []byte) (idem.Claim, error) {
	s.claims++
	return s.Store.Claim(ctx, key, fp)
}

// Malformed keys are InvalidArgument before any store call; a Scope
// error is Unauthenticated unless it is a *connect.Error; tenants never
// share a record; KeyField reads the key from the request.
func TestKeysAndScopes(t *testing.T) {
	eachProtocol(t, func(t *testing.T, proto []connect.ClientOption) {
		ctx := context.Background()
		c := newCounter()
		store := &countingStore{Store: memStore(t)}
		scope := func(ctx context.Context, req connect.AnyRequest) (string, error) {
			switch t := req.Header().Get("X-Tenant"); t {
			case "":
				return "", errors.New("no principal (secret internals)")
			case "banned":
				return "", connect.NewError(connect.CodePermissionDenied, errors.New("banned"))
			default:
				return t, nil
			}
		}
		o := serve(t, ServerOptions{Store: store, Scope: scope}, orderHandler(c, nil, nil), proto, nil)
		tenant := func(r *connect.Request[wrapperspb.StringValue], tn string) *connect.Request[wrapperspb.StringValue] {
			r.Header().Set("X-Tenant", tn)
			return r
		}
		long := tenant(keyed(wrapperspb.String("a"), strings.Repeat("k", 256)), "acme")
		_, err := o.create.CallUnary(ctx, long)
		wantCode(t, err, connect.CodeInvalidArgument, ReasonKeyInvalid)
		two := tenant(keyed(wrapperspb.String("a"), "k1"), "acme")
		two.Header().Add(DefaultHeader, "k2")
		_, err = o.create.CallUnary(ctx, two)
		wantCode(t, err, connect.CodeInvalidArgument, ReasonKeyInvalid)
		_, err = o.create.CallUnary(ctx, keyed(wrapperspb.String("a"), "k1"))
		wantCode(t, err, connect.CodeUnauthenticated, ReasonKeyInvalid)
		_, err = o.create.CallUnary(ctx, tenant(keyed(wrapperspb.String("a"), "k1"), "banned"))
		wantCode(t, err, connect.CodePermissionDenied, "")
		if store.claims != 0 || c.of("a") != 0 {
			t.Errorf("%d claims, %d runs before the key and scope were known good; want 0, 0", store.claims, c.of("a"))
		}
		a, err := o.create.CallUnary(ctx, tenant(keyed(wrapperspb.String("a"), "k1"), "acme"))
		if err != nil {
			t.Fatal(err)
		}
		g, err := o.create.CallUnary(ctx, tenant(keyed(wrapperspb.String("a"), "k1"), "globex"))
		if err != nil || g.Msg.GetValue() == a.Msg.GetValue() || g.Header().Get(HeaderReplayed) != "" {
			t.Errorf("another tenant, same key and request = %v %v; want its own run", g, err)
		}

		f := serve(t, ServerOptions{Store: memStore(t), SingleTenant: true, KeyField: "value"}, orderHandler(c, nil, nil), proto, nil)
		first, err := f.create.CallUnary(ctx, keyed(wrapperspb.String("by-field"), ""))
		if err != nil {
			t.Fatal(err)
		}
		again, err := f.create.CallUnary(ctx, keyed(wrapperspb.String("by-field"), ""))
		if err != nil || again.Header().Get(HeaderReplayed) != "true" || again.Msg.GetValue() != first.Msg.GetValue() {
			t.Errorf("KeyField: retry = %v %v; want the replay, keyed by the request's field", again, err)
		}
	})
}
