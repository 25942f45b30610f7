package idemgrpc

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
)

func TestNewServerRefusesMistakes(t *testing.T) {
	mem := memStore(t)
	small, err := idem.NewMemoryStore(idem.Options{MaxResultBytes: 4 << 10})
	if err != nil {
		t.Fatal(err)
	}
	var nilStore *idem.MemoryStore
	ok := ServerOptions{Store: mem, SingleTenant: true}
	with := func(f func(*ServerOptions)) ServerOptions { o := ok; f(&o); return o }
	for _, tc := range []struct {
		o    ServerOptions
		want string
	}{
		{ServerOptions{SingleTenant: true}, "Store: nil"},
		{ServerOptions{Store: nilStore, SingleTenant: true}, "Store: (*idem.MemoryStore)(nil) is nil"},
		{ServerOptions{Store: mem}, "Scope: nil, and SingleTenant is false"},
		{with(func(o *ServerOptions) { o.Scope = func(context.Context, string) (string, error) { return "", nil } }), "SingleTenant: true, and Scope is set"},
		{with(func(o *ServerOptions) { o.Metadata = "grpc-timeout" }), `Metadata: "grpc-timeout" is reserved by gRPC`},
		{with(func(o *ServerOptions) { o.KeyField = "request-id" }), `KeyField: "request-id" is not a protobuf field name`},
		{with(func(o *ServerOptions) { o.LockTimeout = -1 }), "LockTimeout: -1ns is negative; 0 means the default, 5s"},
		{with(func(o *ServerOptions) { o.RetryDelay = 2 * time.Hour }), "RetryDelay: 2h0m0s is over 1h"},
		{with(func(o *ServerOptions) { o.RecordTimeout = -time.Second }), "RecordTimeout: -1s is negative"},
		{with(func(o *ServerOptions) { o.MaxKeyBytes = -1 }), "MaxKeyBytes: -1 is negative"},
		{with(func(o *ServerOptions) { o.MaxResponseBytes = 2 << 20 }), "MaxResponseBytes: 2097152 exceeds the store's MaxResultBytes 1048576 less RecordOverhead 8192; at most 1040384"},
		{with(func(o *ServerOptions) { o.Store = small }), "Store: its MaxResultBytes 4096 leaves no room"},
		{with(func(o *ServerOptions) { o.ReplayMetadata = []string{"Authorization"} }), `ReplayMetadata: "Authorization" may not be replayed`},
		{with(func(o *ServerOptions) { o.ReplayMetadata = []string{"idempotent-replayed"} }), "the interceptor's own"},
		{with(func(o *ServerOptions) { o.ReplayMetadata = []string{"a", "A"} }), `ReplayMetadata: "A" is listed twice`},
		{with(func(o *ServerOptions) { o.Methods = []string{"/svc/"} }), `Methods: "/svc/" is not a full method name`},
	} {
		_, err := NewServer(tc.o)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewServer(...) = %v; want an error containing %q", err, tc.want)
		}
	}
	if _, err := NewServer(ok); err != nil {
		t.Errorf("NewServer(Store, SingleTenant) = %v; want the defaults", err)
	}
}
