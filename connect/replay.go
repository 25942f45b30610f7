package idemconnect

import (
	"net/http"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
)

// Headers the interceptor adds to a replay, the gRPC module's metadata.
const (
	// HeaderReplayed is "true" on every replayed answer.
	HeaderReplayed = "Idempotent-Replayed"
	// HeaderResponseOmitted is "true" on the replay of a call whose
	// response was over MaxResponseBytes: the work was done once, its
	// response went to the first call only.
	HeaderResponseOmitted = "Idempotent-Response-Omitted"
)

// replayed is a recorded response message as a handler's response: the
// message of the recorded type, which the protocols' codecs encode as
// they would the handler's own (it is a proto.Message by the one it
// holds).
type replayed struct{ proto.Message }

// replay answers cl with a recorded answer, its headers filtered by
// today's allowlist whatever was recorded.
func (s *Server) replay(cl *call, result []byte) {
	r, err := decodeRecord(result, s.c.replay)
	var (
		m  proto.Message
		ce *connect.Error
	)
	if err == nil {
		switch {
		case r.flags&flagStatus != 0:
			ce, err = r.status()
		case r.flags&flagOmitted == 0:
			m, err = r.message()
		}
	}
	if err != nil {
		cl.layerErr = errRecordDamaged
		cl.err = s.answer(cl.ctx, connect.CodeInternal, ReasonRecordDamaged, "the call was done, but its recorded answer cannot be read", cl.key, err)
		return
	}
	var header, trailer http.Header
	switch {
	case ce != nil:
		cl.err = ce
		header, trailer = ce.Meta(), ce.Meta()
	case m == nil:
		ae := s.answer(cl.ctx, connect.CodeAlreadyExists, ReasonResponseNotRecorded, "the call was done once; its response was over MaxResponseBytes and went to the first call only", cl.key, nil)
		ae.Meta().Set(HeaderResponseOmitted, "true")
		cl.err = ae
		header, trailer = ae.Meta(), ae.Meta()
	default:
		resp := connect.NewResponse(&replayed{m})
		cl.resp = resp
		header, trailer = resp.Header(), resp.Trailer()
	}
	header.Set(HeaderReplayed, "true")
	for k, vs := range r.header {
		header[k] = append(header[k], vs...)
	}
	for k, vs := range r.trailer {
		trailer[k] = append(trailer[k], vs...)
	}
}
