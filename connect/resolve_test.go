package idemconnect

import (
	"bytes"
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/middleware/rpccore"
)

// An operator settles a key the interceptor quarantined with Resolution,
// through the store's Resolve: the next call of the key is answered with
// exactly that message, marked replayed, with its headers, and the
// handler does not run. On each protocol.
func TestResolutionSettlesAQuarantinedKey(t *testing.T) {
	eachProtocol(t, func(t *testing.T, protocol []connect.ClientOption) {
		const lease = idem.MinLeaseTTL
		base, err := idem.NewMemoryStore(idem.Options{LeaseTTL: lease, MaxTakeOvers: 1})
		if err != nil {
			t.Fatal(err)
		}
		var runs atomic.Int32
		server := func(worker string, dies bool) func() (*connect.Response[wrapperspb.StringValue], error) {
			shared, err := base.Share(idem.Options{Worker: worker, LeaseTTL: lease, MaxTakeOvers: 1})
			if err != nil {
				t.Fatal(err)
			}
			st := &dyingStore{Store: shared}
			o := serve(t, ServerOptions{Store: st, SingleTenant: true, RecordTimeout: lease, ReplayHeaders: []string{"X-Order"}},
				func(ctx context.Context, _ string, _ *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error) {
					runs.Add(1)
					st.dead.Store(dies)
					return connect.NewResponse(wrapperspb.String("ran")), nil
				}, protocol, nil)
			return func() (*connect.Response[wrapperspb.StringValue], error) {
				return o.create.CallUnary(context.Background(), keyed(wrapperspb.String("v"), "k"))
			}
		}
		_, _ = server("a", true)()
		time.Sleep(2 * lease)
		_, _ = server("b", true)()
		time.Sleep(2 * lease)
		next := server("c", false)
		if _, err := next(); connect.CodeOf(err) != connect.CodeFailedPrecondition {
			t.Fatalf("call of a key crashed twice = %v; want FailedPrecondition (quarantined)", err)
		}

		res, err := Resolution(wrapperspb.String("settled by hand"), http.Header{"X-Order": {"o-7"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := proto.Marshal(wrapperspb.String("settled by hand"))
		fromBytes, err := rpccore.Resolution("google.protobuf.StringValue", body, rpccore.Metadata{"x-order": {"o-7"}}, nil)
		if err != nil || !bytes.Equal(fromBytes.Result, res.Result) || !fromBytes.Confirm {
			t.Errorf("rpccore.Resolution of the message's bytes = %x, %v; want Resolution's %x", fromBytes.Result, err, res.Result)
		}
		if err := base.Resolve(context.Background(), rpccore.StoreKey("", "k"), res); err != nil {
			t.Fatalf("Resolve = %v", err)
		}
		resp, err := next()
		if err != nil || resp.Msg.GetValue() != "settled by hand" {
			t.Fatalf("call of the settled key = %v, %v; want the operator's message", resp, err)
		}
		if resp.Header().Get(HeaderReplayed) != "true" || resp.Header().Get("X-Order") != "o-7" {
			t.Errorf("header = %v; want %s: true and X-Order: o-7", resp.Header(), HeaderReplayed)
		}
		if n := runs.Load(); n != 2 {
			t.Errorf("handler runs = %d; want 2 (none after the quarantine)", n)
		}
	})
}
