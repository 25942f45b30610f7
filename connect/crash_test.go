package idemconnect

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/idemgo/idem"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
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

// A server that dies mid-handler leaves the key's claim to run out; the
// next server's handler is told of the take-over in its context. When
// that one dies too (MaxTakeOvers 1), the key is quarantined: the call is
// answered FailedPrecondition with ReasonKeyQuarantined and a
// PreconditionFailure, no RetryInfo, and the handler does not run. On
// each protocol.
func TestQuarantinedAfterCrashes(t *testing.T) {
	eachProtocol(t, func(t *testing.T, proto []connect.ClientOption) {
		const lease = idem.MinLeaseTTL
		base, err := idem.NewMemoryStore(idem.Options{LeaseTTL: lease, MaxTakeOvers: 1})
		if err != nil {
			t.Fatal(err)
		}
		obs := &events{}
		var mu sync.Mutex
		var seen []*idem.TakeOver
		call := func(worker string, dies bool) error {
			shared, err := base.Share(idem.Options{Worker: worker, LeaseTTL: lease, MaxTakeOvers: 1})
			if err != nil {
				t.Fatal(err)
			}
			st := &dyingStore{Store: shared}
			o := serve(t, ServerOptions{Store: st, SingleTenant: true, Observer: obs, RecordTimeout: lease},
				func(ctx context.Context, _ string, _ *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error) {
					tk, _ := idem.TakeOverFrom(ctx)
					mu.Lock()
					seen = append(seen, tk)
					mu.Unlock()
					if dies {
						st.dead.Store(true)
					}
					return connect.NewResponse(wrapperspb.String("done")), nil
				}, proto, nil)
			_, err = o.create.CallUnary(context.Background(), keyed(wrapperspb.String("v"), "k"))
			return err
		}
		last := func() idem.Event {
			obs.mu.Lock()
			defer obs.mu.Unlock()
			return obs.all[len(obs.all)-1]
		}
		_ = call("a", true)
		time.Sleep(2 * lease)
		_ = call("b", true)
		if e := last(); !e.TakeOver || e.Outcome != idem.Claimed {
			t.Errorf("the second call's event = %+v; want Claimed with TakeOver", e)
		}
		mu.Lock()
		if len(seen) != 2 || seen[0] != nil || seen[1] == nil || seen[1].Prior.Owner != "a" || seen[1].TakeOvers != 1 {
			t.Errorf("take-overs seen by the handlers = %+v; want none, then the first server's attempt (owner a)", seen)
		}
		mu.Unlock()
		time.Sleep(2 * lease)
		err = call("c", false)
		wantCode(t, err, connect.CodeFailedPrecondition, ReasonKeyQuarantined)
		if _, d := errorInfo(err); d != -1 {
			t.Errorf("RetryInfo delay = %v; want none", d)
		}
		var ce *connect.Error
		var pf *errdetails.PreconditionFailure
		if errors.As(err, &ce) {
			for _, d := range ce.Details() {
				if v, err := d.Value(); err == nil {
					if p, ok := v.(*errdetails.PreconditionFailure); ok {
						pf = p
					}
				}
			}
		}
		if pf == nil || len(pf.GetViolations()) != 1 || pf.GetViolations()[0].GetType() != ReasonKeyQuarantined {
			t.Errorf("PreconditionFailure = %v; want one violation of type %s", pf, ReasonKeyQuarantined)
		}
		mu.Lock()
		if len(seen) != 2 {
			t.Errorf("handler ran %d times; want 2 (not for the quarantined key)", len(seen))
		}
		mu.Unlock()
		if e := last(); e.Class() != idem.ClassQuarantined {
			t.Errorf("the quarantined call's event = %+v; want class quarantined", e)
		}
	})
}
