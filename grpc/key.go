package idemgrpc

import (
	"context"
	"crypto/sha256"
	"strconv"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// clientKey returns the call's key ("" for none), or the error answering a
// malformed one.
func (s *Server) clientKey(ctx context.Context, req any) (string, error) {
	c := s.c
	if c.KeyField != "" {
		if m, ok := req.(proto.Message); ok {
			r := m.ProtoReflect()
			if fd := r.Descriptor().Fields().ByName(protoreflect.Name(c.KeyField)); fd != nil {
				if fd.Kind() != protoreflect.StringKind || fd.Cardinality() == protoreflect.Repeated {
					return "", status.Errorf(codes.Internal, "idemgrpc: KeyField %s of %s is not a singular string field", c.KeyField, r.Descriptor().FullName())
				}
				if k := r.Get(fd).String(); k != "" {
					if len(k) > c.MaxKeyBytes {
						return "", s.answer(ctx, codes.InvalidArgument, ReasonKeyInvalid, "the request's "+c.KeyField+" is longer than "+strconv.Itoa(c.MaxKeyBytes)+" bytes", "", nil)
					}
					return k, nil
				}
			}
		}
	}
	md, _ := metadata.FromIncomingContext(ctx)
	vs := md[c.Metadata]
	switch {
	case len(vs) == 0:
		return "", nil
	case len(vs) > 1:
		return "", s.answer(ctx, codes.InvalidArgument, ReasonKeyInvalid, "the call has more than one "+c.Metadata, "", nil)
	case vs[0] == "":
		return "", s.answer(ctx, codes.InvalidArgument, ReasonKeyInvalid, "the call's "+c.Metadata+" is empty", "", nil)
	case len(vs[0]) > c.MaxKeyBytes:
		return "", s.answer(ctx, codes.InvalidArgument, ReasonKeyInvalid, "the call's "+c.Metadata+" is longer than "+strconv.Itoa(c.MaxKeyBytes)+" bytes", "", nil)
	}
	return vs[0], nil
}

// fingerprint is SHA-256 over the full method name, a NUL (never in a
// method name) and the request's deterministic encoding.
func fingerprint(method string, m proto.Message) ([]byte, error) {
	bp := fpBuffers.Get().(*[]byte)
	defer fpBuffers.Put(bp)
	b := append((*bp)[:0], method...)
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
// "g1", then each length-prefixed ("g15:acme3:abc"), so that no two pairs
// share a key, and no gRPC key meets an HTTP middleware's ("h2...") in a
// shared store. The method is not part of it: it is in the fingerprint,
// so that a key reused on another method is a FailedPrecondition.
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
