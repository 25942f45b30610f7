package idemgrpc

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/idemgo/idem"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

// ErrorDomain is the Domain of the errdetails.ErrorInfo in every error the
// interceptor answers with; its Reason is one of the Reason constants.
const ErrorDomain = "idem"

// Reasons of the errdetails.ErrorInfo of the interceptor's answers. Every
// answer carries one; those about a well-formed key also carry it, in
// Metadata["idempotency_key"].
const (
	// ReasonKeyMissing: InvalidArgument, a covered call without a key
	// under ServerOptions.Required.
	ReasonKeyMissing = "IDEMPOTENCY_KEY_MISSING"
	// ReasonKeyInvalid: InvalidArgument, a key empty, repeated, too long,
	// or refused by the store.
	ReasonKeyInvalid = "IDEMPOTENCY_KEY_INVALID"
	// ReasonKeyReused: FailedPrecondition, the key was used for another
	// request (another method or another message), done or in flight.
	ReasonKeyReused = "IDEMPOTENCY_KEY_REUSED"
	// ReasonKeyInFlight: Aborted with RetryInfo, a call of the same key is
	// running and did not finish within LockTimeout.
	ReasonKeyInFlight = "IDEMPOTENCY_KEY_IN_FLIGHT"
	// ReasonStoreUnavailable: Unavailable with RetryInfo, the store failed;
	// the handler did not run.
	ReasonStoreUnavailable = "IDEMPOTENCY_STORE_UNAVAILABLE"
	// ReasonRecordDamaged: Internal, the work was done but its record does
	// not decode.
	ReasonRecordDamaged = "IDEMPOTENCY_RECORD_DAMAGED"
	// ReasonResponseNotRecorded: AlreadyExists, on the replay of a call
	// whose response was over MaxResponseBytes: the work was done once.
	ReasonResponseNotRecorded = "IDEMPOTENCY_RESPONSE_NOT_RECORDED"
	// ReasonKeyQuarantined: FailedPrecondition, with a PreconditionFailure
	// (its Violation's Type this reason, Subject "idempotency_key"): the
	// key's calls crashed the server more times in a row than the store's
	// MaxTakeOvers, so the store quarantined it, and the handler does not
	// run for it until an operator settles it (idem resolve). As gRPC
	// says of FailedPrecondition, the client should not retry until the
	// system's state is fixed; clients do not retry it by themselves.
	ReasonKeyQuarantined = "IDEMPOTENCY_KEY_QUARANTINED"
	// ReasonStreamNotCovered: Unimplemented, a streaming call carrying a
	// key: streams are not covered, and doing the work without the key's
	// protection would break the promise the key makes.
	ReasonStreamNotCovered = "IDEMPOTENCY_STREAM_NOT_COVERED"
)

// answer builds the interceptor's error answer: code, a message that never
// carries internal error text, and an ErrorInfo (the key in its Metadata
// when given) and, for a retryable code, a RetryInfo. It logs it with
// cause.
func (s *Server) answer(ctx context.Context, code codes.Code, reason, msg, key string, cause error, extra ...protoadapt.MessageV1) error {
	info := &errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain}
	if key != "" {
		info.Metadata = map[string]string{"idempotency_key": key}
	}
	details := append([]protoadapt.MessageV1{info}, extra...)
	if code == codes.Aborted || code == codes.Unavailable {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(s.c.RetryDelay)})
	}
	st := status.New(code, "idemgrpc: "+msg)
	if withDetails, err := st.WithDetails(details...); err == nil {
		st = withDetails
	}
	if s.c.Logger != nil {
		// A client error is routine; the operator's attention goes to the
		// service's own failures.
		level := slog.LevelInfo
		if code == codes.Unavailable || code == codes.Internal {
			level = slog.LevelError
		}
		attrs := []slog.Attr{slog.String("code", code.String()), slog.String("reason", reason)}
		if cause != nil {
			attrs = append(attrs, slog.Any("err", cause))
		}
		s.c.Logger.LogAttrs(ctx, level, "idemgrpc: answered "+code.String(), attrs...)
	}
	return st.Err()
}

func (s *Server) log(ctx context.Context, msg, key string, err error) {
	if s.c.Logger != nil {
		s.c.Logger.ErrorContext(ctx, msg, "key_hash", s.c.KeyHasher.Hash(key), "err", err)
	}
}

// quarantined answers a Claim refused because the key is quarantined:
// FailedPrecondition, ReasonKeyQuarantined, and a PreconditionFailure that
// says a person must settle the key.
func (s *Server) quarantined(cl *call, claim idem.Claim) error {
	n := 0
	if claim.Record != nil {
		n = claim.Record.TakeOvers
	}
	pf := &errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{{
		Type:    ReasonKeyQuarantined,
		Subject: "idempotency_key",
		Description: fmt.Sprintf("the calls with this key crashed the server %d times in a row; "+
			"it is not run again until an operator settles it (idem resolve)", n+1),
	}}}
	return s.answer(cl.ctx, codes.FailedPrecondition, ReasonKeyQuarantined,
		"the idempotency key is quarantined after repeated crashes; an operator must settle it before the call can run; do not retry",
		cl.key, idem.ErrQuarantined, pf)
}
