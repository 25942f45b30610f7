package idemconnect

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemgo/idem"
)

// events collects Observer events, and counts the calls Started.
type events struct {
	mu      sync.Mutex
	all     []idem.Event
	started int
}

func (e *events) Observe(_ context.Context, ev idem.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.all = append(e.all, ev)
}

func (e *events) Start(ctx context.Context, op idem.Op) context.Context {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.started++
	return ctx
}

// The Observer gets one event per keyed call, after it, started first:
// the claim's outcome, the store key's hash, the idempotency layer's
// error and not the handler's; none for a call without a key. The Logger
// hears of the store's failure, which the client is not shown.
func TestObserverAndLogger(t *testing.T) {
	obs := &events{}
	c := newCounter()
	ctx := context.Background()
	o := serve(t, ServerOptions{Store: memStore(t), SingleTenant: true, Observer: obs}, orderHandler(c, nil, nil), nil, nil)
	_, _ = o.create.CallUnary(ctx, keyed(wrapperspb.String("v"), "k"))
	_, _ = o.create.CallUnary(ctx, keyed(wrapperspb.String("v"), "k"))
	_, _ = o.create.CallUnary(ctx, keyed(wrapperspb.String("w"), "k"))
	_, _ = o.create.CallUnary(ctx, keyed(wrapperspb.String("err:13"), "k2")) // Internal: the handler's failure
	_, _ = o.create.CallUnary(ctx, keyed(wrapperspb.String("none"), ""))
	want := []struct {
		outcome idem.Outcome
		err     error
		key     string
	}{{idem.Claimed, nil, "k"}, {idem.Duplicate, nil, "k"}, {idem.Duplicate, idem.ErrFingerprintMismatch, "k"}, {idem.Claimed, nil, "k2"}}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.all) != len(want) || obs.started != len(want) {
		t.Fatalf("events = %d, started %d; want %d of each (none for a call without a key)", len(obs.all), obs.started, len(want))
	}
	for i, w := range want {
		e := obs.all[i]
		if e.Op != idem.OpRequest || e.Outcome != w.outcome || !errors.Is(e.Err, w.err) || (w.err == nil) != (e.Err == nil) {
			t.Errorf("event %d = %v %v %v; want request %v %v", i, e.Op, e.Outcome, e.Err, w.outcome, w.err)
		}
		if e.KeyHash != idem.KeyHash(storeKey("", w.key)) {
			t.Errorf("event %d KeyHash = %q; want the hash of the store key", i, e.KeyHash)
		}
	}

	var logs bytes.Buffer
	down := serve(t, ServerOptions{Store: failingStore{memStore(t)}, SingleTenant: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))}, orderHandler(c, nil, nil), nil, nil)
	_, err := down.create.CallUnary(ctx, keyed(wrapperspb.String("v"), "k"))
	if strings.Contains(err.Error(), "10.0.0.7") || !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "10.0.0.7") {
		t.Errorf("client error %q, log %q; want the store's error in an ERROR line, not in the answer", err, logs.String())
	}
}

// A response over MaxResponseBytes is sent whole and recorded as done
// without it: its replay is AlreadyExists, never a second run.
func TestResponseOverMaxResponseBytes(t *testing.T) {
	eachProtocol(t, func(t *testing.T, proto []connect.ClientOption) {
		var runs atomic.Int32
		big := strings.Repeat("x", 2000)
		h := func(ctx context.Context, proc string, r *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error) {
			runs.Add(1)
			return connect.NewResponse(wrapperspb.String(big)), nil
		}
		o := serve(t, ServerOptions{Store: memStore(t), SingleTenant: true, MaxResponseBytes: 1000}, h, proto, nil)
		ctx := context.Background()
		if r, err := o.create.CallUnary(ctx, keyed(wrapperspb.String("v"), "k")); err != nil || r.Msg.GetValue() != big {
			t.Fatalf("first = %v; want the whole response", err)
		}
		_, err := o.create.CallUnary(ctx, keyed(wrapperspb.String("v"), "k"))
		wantCode(t, err, connect.CodeAlreadyExists, ReasonResponseNotRecorded)
		if ce := new(connect.Error); !errors.As(err, &ce) || ce.Meta().Get(HeaderResponseOmitted) != "true" || ce.Meta().Get(HeaderReplayed) != "true" {
			t.Errorf("replay = %v; want %s and %s true", err, HeaderResponseOmitted, HeaderReplayed)
		}
		if n := runs.Load(); n != 1 {
			t.Errorf("handler runs = %d; want 1", n)
		}
	})
}

// A record that does not decode is Internal, never a second run.
func TestDamagedRecord(t *testing.T) {
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
	o := serve(t, ServerOptions{Store: st, SingleTenant: true}, orderHandler(c, nil, nil), nil, nil)
	_, err = o.create.CallUnary(ctx, keyed(wrapperspb.String("v"), "k"))
	wantCode(t, err, connect.CodeInternal, ReasonRecordDamaged)
	if n := c.of("v"); n != 0 {
		t.Errorf("handler ran %d times on a damaged record; want never", n)
	}
}
