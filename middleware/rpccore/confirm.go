package rpccore

import (
	"context"
	"errors"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/backoff"
)

// encode encodes a's answer for the store; without the response message
// when omit is set, when it is over MaxResponseBytes, or when the whole
// would be over the store's MaxResultBytes.
func (s *Server) encode(cl *call, a *Answered, omit bool) []byte {
	if a.Status != nil {
		body := a.Status.Encode()
		b := append(encodeRecord(FlagStatus, a.Header, a.Trailer, s.lower, s.canon, "", len(body)), body...)
		if s.maxResult > 0 && len(b) > s.maxResult {
			// Details too large to record: the code and message still
			// say what the same request will be answered.
			st := Status{Code: a.Status.Code, Message: a.Status.Message}
			b = append(encodeRecord(FlagStatus, a.Header, a.Trailer, s.lower, s.canon, "", 0), st.Encode()...)
		}
		return b
	}
	if !omit && a.Size <= s.c.MaxResponse {
		b := encodeRecord(0, a.Header, a.Trailer, s.lower, s.canon, a.Name, a.Size)
		if b, err := s.c.Proto.Append(b, a.Message, false); err == nil && (s.maxResult == 0 || len(b) <= s.maxResult) {
			return b
		}
	}
	return encodeRecord(FlagOmitted, a.Header, a.Trailer, s.lower, s.canon, a.Name, 0)
}

// confirm records a as l's result, on a context detached from the call,
// retrying within RecordTimeout and the lease, which ends at end. A
// result the store finds too large is recorded again without the
// message: the work is done, and must be recorded as done whatever its
// size. It returns the last error when no Confirm succeeded.
func (s *Server) confirm(cl *call, l *idem.Lease, end time.Time, a *Answered) error {
	rec := s.encode(cl, a, false)
	err := s.record(cl.ctx, end, func(ctx context.Context) error {
		err := s.c.Store.Confirm(ctx, l, rec)
		if errors.Is(err, idem.ErrTooLarge) && rec[1] == 0 {
			rec = s.encode(cl, a, true)
			err = s.c.Store.Confirm(ctx, l, rec)
		}
		return err
	})
	if errors.Is(err, idem.ErrAlreadyConfirmed) {
		// Another call's answer is the one replayed from now on; this one
		// did the work too, which an operator must hear of, but it is done
		// and its client gets its own answer.
		s.log(cl.ctx, s.c.Pkg+": the work was done twice: another call under the key was recorded first", l.Key, err)
		return nil
	}
	if err != nil {
		// The answer still goes out: the work was done, and a client told
		// otherwise would retry it once the lease runs out.
		s.log(cl.ctx, s.c.Pkg+": the answer could not be recorded; a retry after the lease may run the handler again", l.Key, err)
	}
	return err
}

// forget releases l on a context detached from the call, retrying within
// RecordTimeout and the lease, which ends at end.
func (s *Server) forget(ctx context.Context, l *idem.Lease, end time.Time) {
	err := s.record(ctx, end, func(ctx context.Context) error { return s.c.Store.Forget(ctx, l) })
	if err != nil && !errors.Is(err, idem.ErrLeaseLost) {
		s.log(ctx, s.c.Pkg+": the key could not be released; retries wait for the lease to run out", l.Key, err)
	}
}

// record runs op, a Confirm or Forget of a lease that ends at end, on a
// context detached from the call, retrying until RecordTimeout or the
// lease's end, whichever is first: past the lease's end a retry can only
// find the lease lost, or another call's. A lease already over gets one
// attempt.
func (s *Server) record(ctx context.Context, end time.Time, op func(context.Context) error) error {
	now := time.Now()
	over := !end.After(now)
	deadline := now.Add(s.c.RecordTimeout)
	if !over && end.Before(deadline) {
		deadline = end
	}
	ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	return backoff.Retry(ctx, op, func(err error) bool { return over || permanent(err) })
}

// permanent reports store errors that no retry fixes.
func permanent(err error) bool {
	for _, p := range [...]error{idem.ErrInvalidKey, idem.ErrTooLarge, idem.ErrInvalidLease, idem.ErrDamaged,
		idem.ErrLeaseLost, idem.ErrFingerprintMismatch, idem.ErrAlreadyConfirmed} {
		if errors.Is(err, p) {
			return true
		}
	}
	return false
}
