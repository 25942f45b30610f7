package rpccore

import (
	"context"
	"log/slog"
	"strconv"

	"github.com/idemgo/idem"
)

// ErrorDomain is the Domain of the google.rpc.ErrorInfo in every error the
// interceptors answer with; its Reason is one of the Reason constants.
const ErrorDomain = "idem"

// Reasons of the google.rpc.ErrorInfo of the interceptors' answers. Every
// answer carries one; those about a well-formed key also carry it, in
// Metadata["idempotency_key"].
const (
	// ReasonKeyMissing: InvalidArgument, a covered call without a key
	// under ServerOptions.Required.
	ReasonKeyMissing = "IDEMPOTENCY_KEY_MISSING"
	// ReasonKeyInvalid: InvalidArgument, a key empty, repeated, too long,
	// or refused by the store; Unauthenticated, a scope refused.
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
	// run for it until an operator settles it (idem resolve; Resolution).
	// As gRPC says of FailedPrecondition, the client should not retry
	// until the system's state is fixed; clients do not retry it by
	// themselves.
	ReasonKeyQuarantined = "IDEMPOTENCY_KEY_QUARANTINED"
	// ReasonStreamNotCovered: Unimplemented, a streaming call carrying a
	// key: streams are not covered, and doing the work without the key's
	// protection would break the promise the key makes.
	ReasonStreamNotCovered = "IDEMPOTENCY_STREAM_NOT_COVERED"
)

// Answer builds an error answer of the interceptor, as the framework's
// error: code, a message after the front door's name that never carries
// internal error text, a google.rpc.ErrorInfo (reason, ErrorDomain, and
// key in its Metadata when given), extra, and for Aborted and Unavailable
// a google.rpc.RetryInfo of RetryDelay. It logs it with cause: level Error
// for Unavailable and Internal, Info otherwise.
func (s *Server) Answer(ctx context.Context, code Code, reason, msg, key string, cause error, extra ...Detail) error {
	st := &Status{Code: code, Message: s.c.Pkg + ": " + msg, Details: append([]Detail{errorInfo(reason, ErrorDomain, key)}, extra...)}
	if code == Aborted || code == Unavailable {
		st.Details = append(st.Details, retryInfo(s.c.RetryDelay))
	}
	if s.c.Logger != nil {
		// A client error is routine; the operator's attention goes to the
		// service's own failures.
		level := slog.LevelInfo
		if code == Unavailable || code == Internal {
			level = slog.LevelError
		}
		attrs := []slog.Attr{slog.String("code", s.c.CodeName(code)), slog.String("reason", reason)}
		if cause != nil {
			attrs = append(attrs, slog.Any("err", cause))
		}
		s.c.Logger.LogAttrs(ctx, level, s.c.Pkg+": answered "+s.c.CodeName(code), attrs...)
	}
	return s.c.Error(st)
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
	pf := preconditionFailure(ReasonKeyQuarantined, "idempotency_key", "the calls with this key crashed the server "+
		strconv.Itoa(n+1)+" times in a row; it is not run again until an operator settles it (idem resolve)")
	return s.Answer(cl.ctx, FailedPrecondition, ReasonKeyQuarantined,
		"the idempotency key is quarantined after repeated crashes; an operator must settle it before the call can run; do not retry",
		cl.key, idem.ErrQuarantined, pf)
}
