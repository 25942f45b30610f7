package idemgrpc

import (
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Metadata the interceptor adds to the header of a replay.
const (
	// MetadataReplayed is "true" on every replayed answer.
	MetadataReplayed = "idempotent-replayed"
	// MetadataResponseOmitted is "true" on the replay of a call whose
	// response was over MaxResponseBytes: the work was done once, its
	// response went to the first call only.
	MetadataResponseOmitted = "idempotent-response-omitted"
)

// replay answers cl with a recorded answer, its metadata filtered by
// today's allowlist whatever was recorded.
func (s *Server) replay(cl *call, result []byte) {
	r, err := decodeRecord(result, s.c.replay)
	var m proto.Message
	var st *spb.Status
	if err == nil {
		switch {
		case r.flags&flagStatus != 0:
			st, err = r.status()
		case r.flags&flagOmitted == 0:
			m, err = r.message()
		}
	}
	if err != nil {
		cl.layerErr = errRecordDamaged
		cl.err = s.answer(cl.ctx, codes.Internal, ReasonRecordDamaged, "the call was done, but its recorded answer cannot be read", cl.key, err)
		return
	}
	header := metadata.MD{MetadataReplayed: replayedTrue}
	for k, vs := range r.header {
		header[k] = vs
	}
	if r.flags&flagOmitted != 0 {
		header[MetadataResponseOmitted] = replayedTrue
	}
	// Without a transport stream (the interceptor called directly) there
	// is nowhere to send metadata: the answer itself still stands.
	_ = grpc.SetHeader(cl.ctx, header)
	if len(r.trailer) > 0 {
		_ = grpc.SetTrailer(cl.ctx, r.trailer)
	}
	switch {
	case st != nil:
		cl.err = status.ErrorProto(st)
	case m == nil:
		cl.err = s.answer(cl.ctx, codes.AlreadyExists, ReasonResponseNotRecorded, "the call was done once; its response was over MaxResponseBytes and went to the first call only", cl.key, nil)
	default:
		cl.resp = m
	}
}

var replayedTrue = []string{"true"}
