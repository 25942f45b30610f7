package idemconnect

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/idemgo/idem"
)

// encode encodes cl's answer for the store; without the response message
// when omit is set, when it is over MaxResponseBytes, or when the whole
// would be over the store's MaxResultBytes. It reports false for an answer
// it cannot record: a response that is not a protobuf message.
func (s *Server) encode(cl *call, omit bool) ([]byte, bool) {
	if cl.err != nil {
		ce := new(connect.Error)
		if !errors.As(cl.err, &ce) {
			ce = connect.NewError(connect.CodeOf(cl.err), cl.err)
		}
		b := encodeRecord(flagStatus, cl.header, cl.trailer, s.c.replay, "", encodeStatus(ce.Code(), ce.Message(), ce.Details()))
		if s.c.maxResult > 0 && len(b) > s.c.maxResult {
			// Details too large to record: the code and message still
			// say what the same request will be answered.
			b = encodeRecord(flagStatus, cl.header, cl.trailer, s.c.replay, "", encodeStatus(ce.Code(), ce.Message(), nil))
		}
		return b, true
	}
	if cl.resp == nil {
		return nil, false
	}
	m, ok := cl.resp.Any().(proto.Message)
	if !ok {
		s.log(cl.ctx, "idemconnect: the handler's response is not a protobuf message; not recorded, the key released", cl.storeKey, fmt.Errorf("%T", cl.resp.Any()))
		return nil, false
	}
	header, trailer := cl.header, cl.trailer
	name := m.ProtoReflect().Descriptor().FullName()
	if !omit && proto.Size(m) <= s.c.MaxResponseBytes {
		if body, err := proto.Marshal(m); err == nil {
			b := encodeRecord(0, header, trailer, s.c.replay, name, body)
			if s.c.maxResult == 0 || len(b) <= s.c.maxResult {
				return b, true
			}
		}
	}
	return encodeRecord(flagOmitted, header, trailer, s.c.replay, name, nil), true
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

// confirm records rec as l's result, on a context detached from the call,
// retrying within RecordTimeout and the lease, which ends at end. A
// result the store finds too large is recorded again without the
// message: the work is done, and must be recorded as done whatever its
// size. It returns the last error when no Confirm succeeded.
func (s *Server) confirm(cl *call, l *idem.Lease, end time.Time, rec []byte) error {
	err := s.record(cl.ctx, end, func(ctx context.Context) error {
		err := s.c.Store.Confirm(ctx, l, rec)
		if errors.Is(err, idem.ErrTooLarge) && cl.err == nil && rec[1]&flagOmitted == 0 {
			rec, _ = s.encode(cl, true)
			err = s.c.Store.Confirm(ctx, l, rec)
		}
		return err
	})
	if errors.Is(err, idem.ErrAlreadyConfirmed) {
		// Another call's answer is the one replayed from now on; this one
		// did the work too, which an operator must hear of, but it is done
		// and its client gets its own answer.
		s.log(cl.ctx, "idemconnect: the work was done twice: another call under the key was recorded first", l.Key, err)
		return nil
	}
	if err != nil {
		// The answer still goes out: the work was done, and a client told
		// otherwise would retry it once the lease runs out.
		s.log(cl.ctx, "idemconnect: the answer could not be recorded; a retry after the lease may run the handler again", l.Key, err)
	}
	return err
}

// forget releases l on a context detached from the call, retrying within
// RecordTimeout and the lease, which ends at end.
func (s *Server) forget(ctx context.Context, l *idem.Lease, end time.Time) {
	err := s.record(ctx, end, func(ctx context.Context) error { return s.c.Store.Forget(ctx, l) })
	if err != nil && !errors.Is(err, idem.ErrLeaseLost) {
		s.log(ctx, "idemconnect: the key could not be released; retries wait for the lease to run out", l.Key, err)
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
	wait := 5 * time.Millisecond
	for {
		err := op(ctx)
		if err == nil || over || permanent(err) {
			return err
		}
		if !sleep(ctx, wait/2+rand.N(wait)) {
			return errors.Join(err, ctx.Err())
		}
		wait = min(2*wait, 250*time.Millisecond)
	}
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
