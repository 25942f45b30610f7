package idemconnect

import (
	"context"
	"errors"
	"net/http"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/middleware/rpccore"
	"github.com/idemgo/idem/middleware/rpcproto"
)

// Server is the server interceptor, a connect.Interceptor: give it to a
// handler with connect.WithInterceptors. Its unary calls are covered; a
// streaming call carrying a key is refused; a client's calls pass
// through. Create it with NewServer; it is safe for concurrent use.
type Server struct {
	core   *rpccore.Server
	scope  func(ctx context.Context, req connect.AnyRequest) (string, error)
	header string // canonical
}

var _ connect.Interceptor = (*Server)(nil)

// NewServer returns the interceptor that ServerOptions describe, or an
// error when they hold a mistake: the error names the field at fault and
// the value given (a nil Store, a negative duration or size, a header
// that is the protocols' own or not a token, a credential in
// ReplayHeaders, a procedure that is not /package.Service/Method, a
// MaxResponseBytes the store cannot record), and Scope when neither Scope
// nor SingleTenant is set, or both.
func NewServer(o ServerOptions) (*Server, error) {
	core, err := rpccore.New(o.core())
	if err != nil {
		return nil, err
	}
	return &Server{core: core, scope: o.Scope, header: core.KeyName()}, nil
}

// frame is Connect as the RPC core sees it: the words of this package's
// messages and options, Connect's errors, and protobuf's runtime.
var frame = rpccore.Frame{
	Pkg: "idemconnect", KeyOption: "Header", DefaultKey: DefaultHeader, KeyWhere: "its %s header", Name: headerName,
	Noun: "procedure", MethodsField: "Procedures", MethodName: "procedure", ReplayField: "ReplayHeaders",
	Error: func(st *rpccore.Status) error {
		e := connect.NewError(connect.Code(st.Code), errors.New(st.Message))
		for _, d := range st.Details {
			if ed, err := connect.NewErrorDetail(&anypb.Any{TypeUrl: d.TypeURL, Value: d.Value}); err == nil {
				e.AddDetail(ed)
			}
		}
		return e
	},
	Status: func(err error) *rpccore.Status {
		ce := new(connect.Error)
		if !errors.As(err, &ce) {
			ce = connect.NewError(connect.CodeOf(err), err)
		}
		s := &rpccore.Status{Code: rpccore.Code(ce.Code()), Message: ce.Message()}
		for _, d := range ce.Details() {
			s.Details = append(s.Details, rpccore.Detail{TypeURL: rpccore.TypeURLPrefix + d.Type(), Value: d.Bytes()})
		}
		return s
	},
	Code:     func(err error) rpccore.Code { return rpccore.Code(connect.CodeOf(err)) },
	IsAnswer: func(err error) bool { ce := (*connect.Error)(nil); return errors.As(err, &ce) },
	ContextError: func(ctx context.Context, cause error) error {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return connect.NewError(connect.CodeDeadlineExceeded, cause)
		}
		return connect.NewError(connect.CodeCanceled, cause)
	},
	CodeName: func(c rpccore.Code) string { return connect.Code(c).String() },
	// An error the server did not send is the transport's: connect-go
	// reports a connection reset by the peer as Canceled, a response cut
	// short as Unknown ("unexpected EOF"); the call's outcome is unknown,
	// as for a lost connection.
	Transport: func(err error) bool { return !connect.IsWireError(err) },
	Proto:     rpcproto.Proto,
}

// WrapUnary handles one unary call: with a key, the first call of the key
// runs the handler and its answer is recorded (per Keep); a retry of the
// same request gets the recorded answer with HeaderReplayed: true. See
// the package documentation for every answer.
func (s *Server) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		spec := req.Spec()
		// A NO_SIDE_EFFECTS procedure changes nothing: a retry of it needs
		// no key.
		if spec.IsClient || spec.StreamType != connect.StreamTypeUnary ||
			spec.IdempotencyLevel == connect.IdempotencyNoSideEffects || !s.core.Covers(spec.Procedure) {
			return next(ctx, req)
		}
		key, keyErr := s.core.Key(ctx, req.Any(), req.Header().Values(s.header))
		if s.core.Passes(key, keyErr) {
			return next(ctx, req)
		}
		cl := &call{s: s, req: req, next: next}
		if err := s.core.Serve(ctx, spec.Procedure, key, keyErr, cl); err != nil {
			return nil, err
		}
		if cl.err != nil {
			return nil, cl.err
		}
		return cl.resp, nil
	}
}

// WrapStreamingClient passes a client's streams through: the interceptor
// covers handlers.
func (s *Server) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler passes a streaming call through unless it carries
// a key in ServerOptions.Header (and its procedure is listed, when
// Procedures are): such a call is answered Unimplemented
// (ReasonStreamNotCovered), since a stream's messages cannot be recorded
// and replayed as one answer, and running it unprotected would break the
// promise its key makes.
func (s *Server) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if !s.core.Covers(conn.Spec().Procedure) || len(conn.RequestHeader().Values(s.header)) == 0 {
			return next(ctx, conn)
		}
		return s.core.Answer(ctx, rpccore.Unimplemented, ReasonStreamNotCovered, "streaming calls are not covered by the idempotency interceptor; send this call without "+s.header, "", nil)
	}
}

// call is one covered unary call: the RPC core's rpccore.Handler.
type call struct {
	s    *Server
	req  connect.AnyRequest
	next connect.UnaryFunc
	work context.Context // the handler's

	resp connect.AnyResponse
	err  error
}

func (cl *call) Scope(ctx context.Context) (string, error) { return cl.s.scope(ctx, cl.req) }

func (cl *call) Request() any { return cl.req.Any() }

func (cl *call) Handle(ctx context.Context) error {
	cl.work = ctx
	cl.resp, cl.err = cl.next(ctx, cl.req)
	return cl.err
}

func (cl *call) Answered() rpccore.Answered {
	header, trailer := answered(cl.work, cl.resp, cl.err)
	a := rpccore.Answered{Header: rpccore.Metadata(header), Trailer: rpccore.Metadata(trailer)}
	if cl.err == nil && cl.resp != nil {
		a.Message = cl.resp.Any()
	}
	return a
}

// answered returns the headers and trailers a handler answered with, by
// every means Connect gives it: the response's (or, for an error, its
// Meta), and the handler context's call info (connect.CallInfoForHandlerContext,
// which the simple handler API writes to).
func answered(ctx context.Context, resp connect.AnyResponse, err error) (header, trailer http.Header) {
	header, trailer = http.Header{}, http.Header{}
	if info, ok := connect.CallInfoForHandlerContext(ctx); ok {
		add(header, info.ResponseHeader())
		add(trailer, info.ResponseTrailer())
	}
	if ce := new(connect.Error); errors.As(err, &ce) {
		add(header, ce.Meta())
	} else if err == nil && resp != nil {
		add(header, resp.Header())
		add(trailer, resp.Trailer())
	}
	return header, trailer
}

func add(dst, src http.Header) {
	for k, vs := range src {
		dst[k] = append(dst[k], vs...)
	}
}

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

func (cl *call) Replay(ctx context.Context, r *rpccore.Record, m any, answer error) {
	var header, trailer http.Header
	if ce, ok := answer.(*connect.Error); ok { // frame.Error's
		cl.err, header, trailer = ce, ce.Meta(), ce.Meta()
		if r.Flags&rpccore.FlagOmitted != 0 {
			header.Set(HeaderResponseOmitted, "true")
		}
	} else {
		resp := connect.NewResponse(&replayed{m.(proto.Message)})
		cl.resp, header, trailer = resp, resp.Header(), resp.Trailer()
	}
	header.Set(HeaderReplayed, "true")
	for k, vs := range r.Header {
		header[k] = append(header[k], vs...)
	}
	for k, vs := range r.Trailer {
		trailer[k] = append(trailer[k], vs...)
	}
}

// Resolution is how an operator settles, as done, a key this interceptor
// quarantined: rpccore.Resolution of the answer m, with the headers and
// trailers given (nil for none; replayed where ReplayHeaders lists them,
// with Idempotent-Replayed: true), for the store key rpccore.StoreKey
// names.
func Resolution(m proto.Message, header, trailer http.Header) (idem.Resolution, error) {
	return frame.Resolution(m, rpccore.Metadata(header), rpccore.Metadata(trailer))
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
