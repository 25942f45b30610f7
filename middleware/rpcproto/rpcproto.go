// Package rpcproto is the protobuf half of idem's RPC core
// ([github.com/idemgo/idem/middleware/rpccore]), which imports no protobuf
// package: Proto, protobuf's runtime as the core uses it, which the gRPC
// and Connect modules' interceptors both hand to the core. It is a module
// of its own, requiring only idem, protobuf and the google.rpc error
// details, so that both modules share it while a user of one framework
// downloads nothing of the other, and the root module stays without
// protobuf.
package rpcproto

import (
	"fmt"

	_ "google.golang.org/genproto/googleapis/rpc/errdetails" // the core's answers' details, registered for the frameworks' Details
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idemgo/idem/middleware/rpccore"
)

// Proto is protobuf's runtime as rpccore.Proto: messages are
// proto.Message values; a recorded message is decoded into a new message
// of its type from protoregistry.GlobalTypes, where generated code
// registers every type; the key field is read by protoreflect, so that
// no generated code of idem's is needed. The adapters copy it into their
// rpccore.Frame when their package is initialized.
var Proto = rpccore.Proto{Append: appendMessage, Describe: describe, Decode: decode, Field: field}

// appendMessage appends v's encoding to b, deterministic when asked (the
// fingerprint's), or refuses a v that is no message.
func appendMessage(b []byte, v any, deterministic bool) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, rpccore.ErrNotMessage
	}
	return proto.MarshalOptions{Deterministic: deterministic}.MarshalAppend(b, m)
}

// describe returns v's full type name and the size of its encoding.
func describe(v any) (string, int, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return "", 0, rpccore.ErrNotMessage
	}
	return string(m.ProtoReflect().Descriptor().FullName()), proto.Size(m), nil
}

// decode decodes body as a new message of the type registered under name.
func decode(name string, body []byte) (any, error) {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(name))
	if err != nil {
		return nil, err
	}
	m := mt.New().Interface()
	return m, proto.Unmarshal(body, m)
}

// field returns the value of v's field name, "" when v is no protobuf
// message, has no such field or leaves it empty, or an error when the
// field is no singular string.
func field(v any, name string) (string, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return "", nil
	}
	r := m.ProtoReflect()
	fd := r.Descriptor().Fields().ByName(protoreflect.Name(name))
	if fd == nil {
		return "", nil
	}
	if fd.Kind() != protoreflect.StringKind || fd.IsList() {
		return "", fmt.Errorf("KeyField %s of %s is not a singular string field", name, r.Descriptor().FullName())
	}
	return r.Get(fd).String(), nil
}
