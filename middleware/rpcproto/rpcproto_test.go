package rpcproto

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgo/idem/middleware/rpccore"
)

// The key field is a singular string at the message's top level; any
// other field of that name is a misconfiguration, said with its message's
// type, and a message without the field has no key there.
func TestField(t *testing.T) {
	info := &errdetails.ErrorInfo{Reason: "r-1", Metadata: map[string]string{"a": "b"}}
	for _, tc := range []struct {
		m       any
		name    string
		want    string
		wantErr string
	}{
		{info, "reason", "r-1", ""},
		{info, "domain", "", ""},
		{info, "request_id", "", ""},
		{"not a message", "reason", "", ""},
		{info, "metadata", "", "KeyField metadata of google.rpc.ErrorInfo is not a singular string field"},
		{&durationpb.Duration{Seconds: 3}, "seconds", "", "KeyField seconds of google.protobuf.Duration is not a singular string field"},
	} {
		got, err := Proto.Field(tc.m, tc.name)
		if got != tc.want || (err == nil) != (tc.wantErr == "") || (err != nil && err.Error() != tc.wantErr) {
			t.Errorf("Field(%T, %q) = %q, %v; want %q, %q", tc.m, tc.name, got, err, tc.want, tc.wantErr)
		}
	}
}

// A message encoded, described and decoded by its full type name comes
// back equal; a value that is no message, or a name no type is
// registered under, is refused.
func TestRoundTrip(t *testing.T) {
	m := &errdetails.RetryInfo{RetryDelay: durationpb.New(1500)}
	name, size, err := Proto.Describe(m)
	if err != nil || name != "google.rpc.RetryInfo" || size != proto.Size(m) {
		t.Fatalf("Describe = %q, %d, %v; want google.rpc.RetryInfo, %d", name, size, err, proto.Size(m))
	}
	b, err := Proto.Append([]byte("prefix"), m, true)
	if err != nil || !strings.HasPrefix(string(b), "prefix") {
		t.Fatalf("Append = %q, %v; want the encoding after the prefix", b, err)
	}
	got, err := Proto.Decode(name, b[len("prefix"):])
	if err != nil || !proto.Equal(got.(proto.Message), m) {
		t.Errorf("Decode(Append(m)) = %v, %v; want %v", got, err, m)
	}
	if _, err := Proto.Decode("acme.NoSuchType", nil); err == nil {
		t.Error("Decode of an unregistered type succeeded; want an error")
	}
	if _, err := Proto.Append(nil, "text", false); !errors.Is(err, rpccore.ErrNotMessage) {
		t.Errorf("Append(a string) = %v; want ErrNotMessage", err)
	}
	if _, _, err := Proto.Describe(42); !errors.Is(err, rpccore.ErrNotMessage) {
		t.Errorf("Describe(an int) = %v; want ErrNotMessage", err)
	}
}
