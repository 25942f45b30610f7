package idemgrpc

import (
	"bytes"
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/middleware/rpccore"
)

// An operator settles a key the interceptor quarantined with Resolution,
// through the store's Resolve: the next call of the key is answered with
// exactly that message, marked replayed, with its metadata, and the
// handler does not run.
func TestResolutionSettlesAQuarantinedKey(t *testing.T) {
	const lease = idem.MinLeaseTTL
	base, err := idem.NewMemoryStore(idem.Options{LeaseTTL: lease, MaxTakeOvers: 1})
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	server := func(worker string, dies bool) func() (string, metadata.MD, error) {
		shared, err := base.Share(idem.Options{Worker: worker, LeaseTTL: lease, MaxTakeOvers: 1})
		if err != nil {
			t.Fatal(err)
		}
		st := &dyingStore{Store: shared}
		cc := serve(t, ServerOptions{Store: st, SingleTenant: true, RecordTimeout: lease, ReplayMetadata: []string{"x-order"}},
			func(ctx context.Context, _ string, req proto.Message) (proto.Message, error) {
				runs++
				st.dead.Store(dies)
				return wrapperspb.String("ran"), nil
			}, nil)
		return func() (string, metadata.MD, error) {
			got, header, _, err := create(t, cc, "k", "v")
			return got, header, err
		}
	}
	_, _, _ = server("a", true)()
	time.Sleep(2 * lease)
	_, _, _ = server("b", true)()
	time.Sleep(2 * lease)
	next := server("c", false)
	if _, _, err := next(); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("call of a key crashed twice = %v; want FailedPrecondition (quarantined)", err)
	}

	res, err := Resolution(wrapperspb.String("settled by hand"), metadata.Pairs("X-Order", "o-7"), nil)
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
	got, header, err := next()
	if err != nil || got != "settled by hand" {
		t.Fatalf("call of the settled key = %q, %v; want the operator's message", got, err)
	}
	if header.Get(MetadataReplayed)[0] != "true" || len(header.Get("x-order")) != 1 || header.Get("x-order")[0] != "o-7" {
		t.Errorf("header = %v; want %s: true and x-order: o-7", header, MetadataReplayed)
	}
	if runs != 2 {
		t.Errorf("handler runs = %d; want 2 (none after the quarantine)", runs)
	}
}

func TestResolutionRefusesWhatCannotReplay(t *testing.T) {
	for _, name := range []string{"", "StringValue.", "a..b", "google.protobuf.String-Value"} {
		if _, err := rpccore.Resolution(name, nil, nil, nil); err == nil {
			t.Errorf("rpccore.Resolution(%q) = nil error; want one: no replay could decode it", name)
		}
	}
	for _, m := range []proto.Message{nil, (*wrapperspb.StringValue)(nil)} {
		if _, err := Resolution(m, nil, nil); err == nil {
			t.Errorf("Resolution(%#v) = nil error; want one: a nil message is a mistake, not an answer", m)
		}
	}
}
