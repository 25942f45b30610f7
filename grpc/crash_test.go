package idemgrpc

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// dyingStore is a server process's store: once dead, it renews, confirms
// and forgets nothing, as a process that died mid-handler.
type dyingStore struct {
	idem.Store
	dead atomic.Bool
}

var errDied = errors.New("test: the server died")

func (s *dyingStore) Renew(ctx context.Context, l *idem.Lease) error {
	if s.dead.Load() {
		return errDied
	}
	return s.Store.Renew(ctx, l)
}

func (s *dyingStore) Confirm(ctx context.Context, l *idem.Lease, r []byte) error {
	if s.dead.Load() {
		return errDied
	}
	return s.Store.Confirm(ctx, l, r)
}

func (s *dyingStore) Forget(ctx context.Context, l *idem.Lease) error {
	if s.dead.Load() {
		return errDied
	}
	return s.Store.Forget(ctx, l)
}

// last returns the last event observed.
func (e *events) last() idem.Event {
	e.mu <- struct{}{}
	defer func() { <-e.mu }()
	return e.all[len(e.all)-1]
}

// A server that dies mid-handler leaves the key's claim to run out; the
// next server's handler is told of the take-over in its context. When
// that one dies too (MaxTakeOvers 1), the key is quarantined: the call is
// answered FailedPrecondition with ReasonKeyQuarantined and a
// PreconditionFailure, no RetryInfo, and the handler does not run.
func TestQuarantinedAfterCrashes(t *testing.T) {
	const lease = idem.MinLeaseTTL
	base, err := idem.NewMemoryStore(idem.Options{LeaseTTL: lease, MaxTakeOvers: 1})
	if err != nil {
		t.Fatal(err)
	}
	obs := &events{mu: make(chan struct{}, 1)}
	var mu sync.Mutex
	var seen []*idem.TakeOver
	server := func(worker string, dies bool) func(string) error {
		shared, err := base.Share(idem.Options{Worker: worker, LeaseTTL: lease, MaxTakeOvers: 1})
		if err != nil {
			t.Fatal(err)
		}
		st := &dyingStore{Store: shared}
		cc := serve(t, ServerOptions{Store: st, SingleTenant: true, Observer: obs, RecordTimeout: lease},
			func(ctx context.Context, _ string, req proto.Message) (proto.Message, error) {
				tk, _ := idem.TakeOverFrom(ctx)
				mu.Lock()
				seen = append(seen, tk)
				mu.Unlock()
				if dies {
					st.dead.Store(true)
				}
				return wrapperspb.String("done"), nil
			}, nil)
		return func(key string) error {
			_, _, _, err := create(t, cc, key, "v")
			return err
		}
	}
	_ = server("a", true)("k")
	time.Sleep(2 * lease)
	_ = server("b", true)("k")
	if e := obs.last(); !e.TakeOver || e.Outcome != idem.Claimed {
		t.Errorf("the second call's event = %+v; want Claimed with TakeOver", e)
	}
	mu.Lock()
	if len(seen) != 2 || seen[0] != nil || seen[1] == nil || seen[1].Prior.Owner != "a" || seen[1].TakeOvers != 1 {
		t.Errorf("take-overs seen by the handlers = %+v; want none, then the first server's attempt (owner a)", seen)
	}
	mu.Unlock()
	time.Sleep(2 * lease)
	err = server("c", false)("k")
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("call of a quarantined key = %v; want FailedPrecondition", err)
	}
	if reason, delay := errorInfo(err); reason != ReasonKeyQuarantined || delay != -1 {
		t.Errorf("ErrorInfo reason, RetryInfo = %q, %v; want %q and no RetryInfo", reason, delay, ReasonKeyQuarantined)
	}
	st, _ := status.FromError(err)
	var pf *errdetails.PreconditionFailure
	for _, d := range st.Details() {
		if p, ok := d.(*errdetails.PreconditionFailure); ok {
			pf = p
		}
	}
	if pf == nil || len(pf.GetViolations()) != 1 || pf.GetViolations()[0].GetType() != ReasonKeyQuarantined ||
		pf.GetViolations()[0].GetSubject() != "idempotency_key" {
		t.Errorf("PreconditionFailure = %v; want one violation of type %s on idempotency_key", pf, ReasonKeyQuarantined)
	}
	mu.Lock()
	if len(seen) != 2 {
		t.Errorf("handler ran %d times; want 2 (not for the quarantined key)", len(seen))
	}
	mu.Unlock()
	if e := obs.last(); e.Class() != idem.ClassQuarantined {
		t.Errorf("the quarantined call's event = %+v; want class quarantined", e)
	}
}
