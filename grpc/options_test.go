package idemgrpc

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
)

// badOption is the shape of every message refusing an option, as in the
// root module's packages: "<pkg>: <Field>: <value> <rule>", the field
// qualified by its struct, ServerOptions or ClientOptions, which share
// field names.
var badOption = regexp.MustCompile(`^idemgrpc: (ServerOptions|ClientOptions)\.[A-Z]\w*: (nil|true|"[^"]*"|\(\*?[\w.]+\)\(nil\)|\*[\w.]+|-?[\w.µ]+) [a-z]`)

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
		{ServerOptions{SingleTenant: true}, "idemgrpc: ServerOptions.Store: nil is not a store; set an idem.Store (idem.NewRedisStore, sqlstore.New, idem.NewMemoryStore)"},
		{ServerOptions{Store: nilStore, SingleTenant: true}, "idemgrpc: ServerOptions.Store: (*idem.MemoryStore)(nil) is nil and would panic on the first call"},
		{ServerOptions{Store: mem}, "idemgrpc: ServerOptions.Scope: nil while SingleTenant is false; set Scope"},
		{with(func(o *ServerOptions) { o.Scope = func(context.Context, string) (string, error) { return "", nil } }), "idemgrpc: ServerOptions.SingleTenant: true while Scope is set; set one"},
		{with(func(o *ServerOptions) { o.Metadata = "grpc-timeout" }), `idemgrpc: ServerOptions.Metadata: "grpc-timeout" is reserved by gRPC (grpc-*)`},
		{with(func(o *ServerOptions) { o.KeyField = "request-id" }), `idemgrpc: ServerOptions.KeyField: "request-id" is not a protobuf field name`},
		{with(func(o *ServerOptions) { o.LockTimeout = -1 }), "idemgrpc: ServerOptions.LockTimeout: -1ns is negative; 0 means the default, 5s"},
		{with(func(o *ServerOptions) { o.RetryDelay = 2 * time.Hour }), "idemgrpc: ServerOptions.RetryDelay: 2h0m0s is over 1h; 0 means the default, 1s"},
		{with(func(o *ServerOptions) { o.RecordTimeout = -time.Second }), "idemgrpc: ServerOptions.RecordTimeout: -1s is negative; 0 means the default, 10s"},
		{with(func(o *ServerOptions) { o.MaxKeyBytes = -1 }), "idemgrpc: ServerOptions.MaxKeyBytes: -1 is negative; 0 means the default, 255"},
		{with(func(o *ServerOptions) { o.MaxResponseBytes = 2 << 20 }), "idemgrpc: ServerOptions.MaxResponseBytes: 2097152 exceeds the store's MaxResultBytes 1048576 less RecordOverhead 8192; at most 1040384"},
		{with(func(o *ServerOptions) { o.Store = small }), "idemgrpc: ServerOptions.Store: *idem.MemoryStore with MaxResultBytes 4096 leaves no room"},
		{with(func(o *ServerOptions) { o.ReplayMetadata = []string{"Authorization"} }), `idemgrpc: ServerOptions.ReplayMetadata: "Authorization" may not be replayed`},
		{with(func(o *ServerOptions) { o.ReplayMetadata = []string{"idempotent-replayed"} }), `idemgrpc: ServerOptions.ReplayMetadata: "idempotent-replayed" is the interceptor's own`},
		{with(func(o *ServerOptions) { o.ReplayMetadata = []string{"a", "A"} }), `idemgrpc: ServerOptions.ReplayMetadata: "A" is listed twice`},
		{with(func(o *ServerOptions) { o.Methods = []string{"/svc/"} }), `idemgrpc: ServerOptions.Methods: "/svc/" is not a full method name, /package.Service/Method`},
	} {
		_, err := NewServer(tc.o)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) || !badOption.MatchString(err.Error()) {
			t.Errorf("NewServer(...) = %v; want an error starting %q", err, tc.want)
		}
	}
	if _, err := NewServer(ok); err != nil {
		t.Errorf("NewServer(Store, SingleTenant) = %v; want the defaults", err)
	}
}
