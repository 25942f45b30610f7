package idemgrpc

import (
	"context"
	"strings"
	"sync"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/middleware/rpccore"
	"github.com/idemgo/idem/middleware/rpcproto"
)

// Server is the server interceptor: its Unary method is a
// grpc.UnaryServerInterceptor, its Stream method a
// grpc.StreamServerInterceptor that refuses keyed streams. Create it with
// NewServer; it is safe for concurrent use.
type Server struct {
	core     *rpccore.Server
	scope    func(ctx context.Context, fullMethod string) (string, error)
	metadata string // lower case
}

// NewServer returns the interceptor that ServerOptions describe, or an
// error when they hold a mistake: the error names the field at fault and
// the value given (a nil Store, a negative duration or size, a metadata key
// that is reserved, binary or not a key, a credential in ReplayMetadata, a
// method name that is not /package.Service/Method, a MaxResponseBytes the
// store cannot record), and Scope when neither Scope nor SingleTenant is
// set, or both.
func NewServer(o ServerOptions) (*Server, error) {
	core, err := rpccore.New(o.core())
	if err != nil {
		return nil, err
	}
	return &Server{core: core, scope: o.Scope, metadata: core.KeyName()}, nil
}

// frame is gRPC as the RPC core sees it: the words of this package's
// messages and options, gRPC's statuses, and protobuf's runtime.
var frame = rpccore.Frame{
	Pkg: "idemgrpc", KeyOption: "Metadata", DefaultKey: DefaultMetadata, KeyWhere: "%s metadata", Name: metadataName,
	Noun: "method", MethodsField: "Methods", MethodName: "full method name", ReplayField: "ReplayMetadata",
	Error: func(st *rpccore.Status) error {
		p := &spb.Status{Code: int32(st.Code), Message: st.Message}
		for _, d := range st.Details {
			p.Details = append(p.Details, &anypb.Any{TypeUrl: d.TypeURL, Value: d.Value})
		}
		return status.ErrorProto(p)
	},
	Status: func(err error) *rpccore.Status {
		st, _ := status.FromError(err)
		s := &rpccore.Status{Code: rpccore.Code(st.Code()), Message: st.Message()}
		for _, d := range st.Proto().GetDetails() {
			s.Details = append(s.Details, rpccore.Detail{TypeURL: d.GetTypeUrl(), Value: d.GetValue()})
		}
		return s
	},
	Code:     func(err error) rpccore.Code { return rpccore.Code(status.Code(err)) },
	IsAnswer: func(err error) bool { _, ok := status.FromError(err); return ok },
	ContextError: func(ctx context.Context, cause error) error {
		return status.Error(status.FromContextError(ctx.Err()).Code(), cause.Error())
	},
	CodeName: func(c rpccore.Code) string { return codes.Code(c).String() },
	Proto:    rpcproto.Proto,
}

// Unary handles one unary call: with a key, the first call of the key runs
// the handler and its answer is recorded (per Keep); a retry of the same
// request gets the recorded answer with MetadataReplayed: true. See the
// package documentation for every answer.
func (s *Server) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if !s.core.Covers(info.FullMethod) {
		return handler(ctx, req)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	key, keyErr := s.core.Key(ctx, req, md[s.metadata])
	if s.core.Passes(key, keyErr) {
		return handler(ctx, req)
	}
	cl := &call{s: s, method: info.FullMethod, req: req, handler: handler}
	if err := s.core.Serve(ctx, info.FullMethod, key, keyErr, cl); err != nil {
		return nil, err
	}
	return cl.resp, cl.err
}

// Stream passes a streaming call through unless it carries a key in
// ServerOptions.Metadata (and its method is covered): such a call is
// answered Unimplemented (ReasonStreamNotCovered), since a stream's
// messages cannot be recorded and replayed as one answer, and running it
// unprotected would break the promise its key makes.
func (s *Server) Stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	md, _ := metadata.FromIncomingContext(ss.Context())
	if !s.core.Covers(info.FullMethod) || len(md[s.metadata]) == 0 {
		return handler(srv, ss)
	}
	return s.core.Answer(ss.Context(), rpccore.Unimplemented, ReasonStreamNotCovered, "streaming calls are not covered by the idempotency interceptor; send this call without "+s.metadata, "", nil)
}

// call is one covered unary call: the RPC core's rpccore.Handler.
type call struct {
	s       *Server
	method  string
	req     any
	handler grpc.UnaryHandler
	cp      capture // what the handler set

	resp any   // the call's answer
	err  error // the call's error answer
}

func (cl *call) Scope(ctx context.Context) (string, error) { return cl.s.scope(ctx, cl.method) }

func (cl *call) Request() any { return cl.req }

func (cl *call) Handle(ctx context.Context) error {
	cl.cp.ServerTransportStream, cl.cp.method = grpc.ServerTransportStreamFromContext(ctx), cl.method
	cl.resp, cl.err = cl.handler(grpc.NewContextWithServerTransportStream(ctx, &cl.cp), cl.req)
	return cl.err
}

func (cl *call) Answered() rpccore.Answered {
	header, trailer := cl.cp.kept()
	return rpccore.Answered{Header: rpccore.Metadata(header), Trailer: rpccore.Metadata(trailer), Message: cl.resp}
}

// Metadata the interceptor adds to the header of a replay.
const (
	// MetadataReplayed is "true" on every replayed answer.
	MetadataReplayed = "idempotent-replayed"
	// MetadataResponseOmitted is "true" on the replay of a call whose
	// response was over MaxResponseBytes: the work was done once, its
	// response went to the first call only.
	MetadataResponseOmitted = "idempotent-response-omitted"
)

var replayedTrue = []string{"true"}

func (cl *call) Replay(ctx context.Context, r *rpccore.Record, m any, answer error) {
	cl.resp, cl.err = m, answer
	header := metadata.MD{MetadataReplayed: replayedTrue}
	for k, vs := range r.Header {
		header[k] = vs
	}
	if r.Flags&rpccore.FlagOmitted != 0 {
		header[MetadataResponseOmitted] = replayedTrue
	}
	// Without a transport stream (the interceptor called directly) there
	// is nowhere to send metadata: the answer itself still stands.
	_ = grpc.SetHeader(ctx, header)
	if len(r.Trailer) > 0 {
		_ = grpc.SetTrailer(ctx, metadata.MD(r.Trailer))
	}
}

// Resolution is how an operator settles, as done, a key this interceptor
// quarantined: rpccore.Resolution of the answer m, with the header and
// trailer metadata given (nil for none; replayed where ReplayMetadata
// lists them, with MetadataReplayed: true), for the store key
// rpccore.StoreKey names.
func Resolution(m proto.Message, header, trailer metadata.MD) (idem.Resolution, error) {
	return frame.Resolution(m, rpccore.Metadata(header), rpccore.Metadata(trailer))
}

// capture is the grpc.ServerTransportStream a covered handler runs with:
// it passes each call on to the call's own stream and keeps a copy of the
// metadata the handler sets, for the record.
type capture struct {
	grpc.ServerTransportStream // the call's own; nil when the interceptor is called without one
	method                     string

	mu              sync.Mutex // a handler may set metadata from goroutines of its own
	header, trailer metadata.MD
}

// kept returns the metadata the handler set.
func (c *capture) kept() (header, trailer metadata.MD) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.header, c.trailer
}

// Method returns the call's full method name.
func (c *capture) Method() string { return c.method }

// SetHeader keeps md and passes it on.
func (c *capture) SetHeader(md metadata.MD) error {
	return c.keep(&c.header, md, grpc.ServerTransportStream.SetHeader)
}

// SendHeader keeps md and passes it on.
func (c *capture) SendHeader(md metadata.MD) error {
	return c.keep(&c.header, md, grpc.ServerTransportStream.SendHeader)
}

// SetTrailer keeps md and passes it on.
func (c *capture) SetTrailer(md metadata.MD) error {
	return c.keep(&c.trailer, md, grpc.ServerTransportStream.SetTrailer)
}

// keep appends md's values to dst's, keys in lower case as gRPC sends
// them, and passes md on by send.
func (c *capture) keep(dst *metadata.MD, md metadata.MD, send func(grpc.ServerTransportStream, metadata.MD) error) error {
	c.mu.Lock()
	if *dst == nil {
		*dst = metadata.MD{}
	}
	for k, vs := range md {
		k = strings.ToLower(k)
		(*dst)[k] = append((*dst)[k], vs...)
	}
	c.mu.Unlock()
	if c.ServerTransportStream == nil {
		return nil
	}
	return send(c.ServerTransportStream, md)
}

// ErrorDomain is the Domain of the errdetails.ErrorInfo in every error the
// interceptor answers with; its Reason is one of the Reason constants,
// the RPC core's, where each is documented with its code.
const ErrorDomain = rpccore.ErrorDomain

// Reasons of the errdetails.ErrorInfo of the interceptor's answers.
const (
	ReasonKeyMissing          = rpccore.ReasonKeyMissing
	ReasonKeyInvalid          = rpccore.ReasonKeyInvalid
	ReasonKeyReused           = rpccore.ReasonKeyReused
	ReasonKeyInFlight         = rpccore.ReasonKeyInFlight
	ReasonStoreUnavailable    = rpccore.ReasonStoreUnavailable
	ReasonRecordDamaged       = rpccore.ReasonRecordDamaged
	ReasonResponseNotRecorded = rpccore.ReasonResponseNotRecorded
	ReasonKeyQuarantined      = rpccore.ReasonKeyQuarantined
	ReasonStreamNotCovered    = rpccore.ReasonStreamNotCovered
)
