package idemconnect

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strconv"
	"sync"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// clientKey returns the call's key ("" for none), or the error answering a
// malformed one.
func (s *Server) clientKey(ctx context.Context, req connect.AnyRequest) (string, error) {
	c := s.c
	if c.KeyField != "" {
		if m, ok := req.Any().(proto.Message); ok {
			r := m.ProtoReflect()
			if fd := r.Descriptor().Fields().ByName(protoreflect.Name(c.KeyField)); fd != nil {
				if fd.Kind() != protoreflect.StringKind || fd.Cardinality() == protoreflect.Repeated {
					return "", connect.NewError(connect.CodeInternal, fmt.Errorf("idemconnect: KeyField %s of %s is not a singular string field", c.KeyField, r.Descriptor().FullName()))
				}
				if k := r.Get(fd).String(); k != "" {
					if len(k) > c.MaxKeyBytes {
						return "", s.answer(ctx, connect.CodeInvalidArgument, ReasonKeyInvalid, "the request's "+c.KeyField+" is longer than "+strconv.Itoa(c.MaxKeyBytes)+" bytes", "", nil)
					}
					return k, nil
				}
			}
		}
	}
	vs := req.Header().Values(c.Header)
	switch {
	case len(vs) == 0:
		return "", nil
	case len(vs) > 1:
		return "", s.answer(ctx, connect.CodeInvalidArgument, ReasonKeyInvalid, "the call has more than one "+c.Header, "", nil)
	case vs[0] == "":
		return "", s.answer(ctx, connect.CodeInvalidArgument, ReasonKeyInvalid, "the call's "+c.Header+" is empty", "", nil)
	case len(vs[0]) > c.MaxKeyBytes:
		return "", s.answer(ctx, connect.CodeInvalidArgument, ReasonKeyInvalid, "the call's "+c.Header+" is longer than "+strconv.Itoa(c.MaxKeyBytes)+" bytes", "", nil)
	}
	return vs[0], nil
}

// fingerprint is SHA-256 over the procedure, a NUL (never in a procedure
// name) and the request's deterministic encoding: the gRPC module's, whose
// full method names are Connect's procedures.
func fingerprint(procedure string, m proto.Message) ([]byte, error) {
	bp := fpBuffers.Get().(*[]byte)
	defer fpBuffers.Put(bp)
	b := append((*bp)[:0], procedure...)
	b = append(b, 0)
	b, err := proto.MarshalOptions{Deterministic: true}.MarshalAppend(b, m)
	if err != nil {
		return nil, err
	}
	if cap(b) <= 64<<10 {
		*bp = b // a huge request's buffer is not kept
	}
	sum := sha256.Sum256(b)
	return sum[:], nil
}

var fpBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// storeKey joins scope and the client's key into the key the store holds:
// "g1", then each length-prefixed ("g15:acme3:abc"), as the gRPC module
// does, so that a service moving between grpc-go and Connect keeps its
// records, and no key meets an HTTP middleware's ("h2...") in a shared
// store. The procedure is not part of it: it is in the fingerprint, so
// that a key reused on another procedure is a FailedPrecondition.
func storeKey(scope, key string) string {
	b := make([]byte, 0, 2+len(scope)+len(key)+2*4)
	b = append(b, "g1"...)
	for _, p := range [...]string{scope, key} {
		b = strconv.AppendInt(b, int64(len(p)), 10)
		b = append(b, ':')
		b = append(b, p...)
	}
	return string(b)
}
