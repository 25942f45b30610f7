package idemgrpc

import (
	"context"
	"testing"

	"github.com/idemgo/idem"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// createOrderRequest is an AIP-155 request, built at run time (no protoc
// here): message CreateOrderRequest { string request_id = 1; string item = 2; }.
func createOrderRequest(t *testing.T) protoreflect.MessageDescriptor {
	t.Helper()
	str := descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum()
	opt := descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()
	fd, err := protodesc.NewFile(&descriptorpb.FileDescriptorProto{
		Name:    proto.String("idemtest/orders.proto"),
		Package: proto.String("idemtest"),
		Syntax:  proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{{
			Name: proto.String("CreateOrderRequest"),
			Field: []*descriptorpb.FieldDescriptorProto{
				{Name: proto.String("request_id"), Number: proto.Int32(1), Type: str, Label: opt, JsonName: proto.String("requestId")},
				{Name: proto.String("item"), Number: proto.Int32(2), Type: str, Label: opt, JsonName: proto.String("item")},
			},
		}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return fd.Messages().Get(0)
}

func TestUnaryRequestIDField(t *testing.T) {
	md := createOrderRequest(t)
	s, err := NewServer(ServerOptions{Store: memStore(t), SingleTenant: true, KeyField: "request_id"})
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	h := func(ctx context.Context, req any) (any, error) {
		runs++
		if _, ok := idem.LeaseFrom(ctx); !ok {
			t.Error("the handler's context carries no lease")
		}
		return wrapperspb.String("created " + req.(proto.Message).ProtoReflect().Get(md.Fields().ByName("item")).String()), nil
	}
	req := func(id, item string) proto.Message {
		m := dynamicpb.NewMessage(md)
		m.Set(md.Fields().ByName("request_id"), protoreflect.ValueOfString(id))
		m.Set(md.Fields().ByName("item"), protoreflect.ValueOfString(item))
		return m
	}
	info := &grpc.UnaryServerInfo{FullMethod: "/idemtest.Orders/CreateOrder"}
	// The metadata key differs on each call, as a client interceptor
	// would send it: the field wins.
	for i, key := range []string{"m1", "m2"} {
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(DefaultMetadata, key))
		resp, err := s.Unary(ctx, req("6f1c2a", "book"), info, h)
		if err != nil || resp.(*wrapperspb.StringValue).GetValue() != "created book" {
			t.Fatalf("call %d = %v, %v; want created book", i+1, resp, err)
		}
	}
	if runs != 1 {
		t.Errorf("handler runs for one request_id = %d; want 1", runs)
	}
	// Without request_id the metadata key is read.
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(DefaultMetadata, "m3"))
	for range 2 {
		if _, err := s.Unary(ctx, req("", "pen"), info, h); err != nil {
			t.Fatal(err)
		}
	}
	if runs != 2 {
		t.Errorf("handler runs after two calls with metadata key m3 = %d; want 2", runs)
	}
}
