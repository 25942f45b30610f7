package middleware

import (
	"context"
	"database/sql"
	"errors"
	"net/http"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/backoff"
)

// TxStore is what transactional mode (Options.Tx) needs of a store: one
// that runs a request's work and records its response in one SQL
// transaction. [github.com/idemgo/idem/sqlstore.Store] implements it; its handlers get the
// transaction from [github.com/idemgo/idem/sqlstore.TxFromContext].
type TxStore interface {
	// Run does the work of key once. In one transaction it claims key,
	// calls write with the transaction (and a ctx that carries it),
	// records write's result and commits, then returns the result with
	// replayed false. For a key whose work is recorded it does not call
	// write: it returns the recorded result with replayed true, or an
	// error wrapping idem.ErrFingerprintMismatch when fingerprint differs
	// from the recorded one. A key another Run or a live lease holds is an
	// error wrapping idem.ErrInProgress (after waiting, at the store's
	// discretion). When write returns an error or panics, or its result is
	// over the store's limit (idem.ErrTooLarge), the transaction rolls
	// back and Run returns that error (write's own, as errors.Is sees it)
	// or lets the panic go on.
	Run(ctx context.Context, key string, fingerprint []byte,
		write func(ctx context.Context, tx *sql.Tx) ([]byte, error)) (result []byte, replayed bool, err error)
}

// errNotKept makes Run roll back a response that Keep refused.
var errNotKept = errors.New("middleware: response not kept")

// serveTx is transactional mode: the handler runs inside TxStore.Run, its
// SQL in the transaction that records its response, and the response is
// sent only once that transaction committed (or, for a response not kept,
// rolled back).
func (h *handler) serveTx(w http.ResponseWriter, r *http.Request, key, sk string, fp []byte, body *spool) result {
	poll := backoff.NewPoll(h.c.LockTimeout)
	var rec *recorder
	defer func() {
		if rec != nil { // also when the handler panicked
			_ = rec.body.Close()
		}
	}()
	for {
		out, replayed, err := h.c.Tx.Run(r.Context(), sk, fp, func(ctx context.Context, _ *sql.Tx) ([]byte, error) {
			rec = newRecorder(h.c.MaxResponseBytes)
			h.c.running.Store(sk, true)
			defer h.c.running.Delete(sk)
			h.handlerRuns(r)
			r2 := r.WithContext(ctx)
			r2.Body = spoolBody{body.Reader()}
			h.next.ServeHTTP(rec, r2)
			rec.finish()
			if !h.c.Keep(rec.status) {
				return nil, errNotKept
			}
			return h.encode(h.response(r, rec)), nil
		})
		switch {
		case err == nil && replayed:
			return result{outcome: idem.Duplicate, err: h.replay(w, r, out)}
		case err == nil, errors.Is(err, errNotKept):
			rec.send(w)
			return result{outcome: idem.Claimed}
		case errors.Is(err, idem.ErrFingerprintMismatch):
			h.fail(w, r, keyProblem(kindFingerprintMismatch, key, "", nil))
			return result{err: err}
		case errors.Is(err, idem.ErrInProgress) && rec == nil:
			expired := poll.Expired()
			if expired && h.busy(err, sk) {
				w.Header().Set("Retry-After", h.c.retryAfter)
				h.fail(w, r, problem(kindStoreBusy, "", err))
				return result{err: err}
			}
			if expired {
				h.inProgress(w, r, key)
				return result{outcome: idem.InProgress, err: err}
			}
			if poll.Wait(r.Context()) {
				continue
			}
			return result{outcome: idem.InProgress, err: context.Cause(r.Context())}
		case errors.Is(err, idem.ErrTooLarge) && rec != nil:
			h.fail(w, r, problem(kindResponseTooLarge, "", err))
			return result{outcome: idem.Claimed, err: err}
		default:
			// A failed claim, or a failed commit: either way the work was
			// rolled back, and the client may retry.
			h.storeFailed(w, r, key, err)
			return result{err: err}
		}
	}
}

// busy reports whether err, the store's answer to a Run of sk, is waiting
// for the database rather than for sk: SQLite's single writer held by
// other work (idem.ErrBusy, which sqlstore returns), and no request of
// this middleware running sk's handler. Such a wait is not "this key is in flight" (#17: requests
// with distinct keys got 409 while they queued for SQLite's writer); a
// request of the same key in another process is not visible here, and is
// answered as busy too.
func (h *handler) busy(err error, sk string) bool {
	if !errors.Is(err, idem.ErrBusy) {
		return false
	}
	_, held := h.c.running.Load(sk)
	return !held
}
