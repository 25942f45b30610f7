package lincheck

// A store's answers read into the model's Outputs, as the workload records
// each call.

import (
	"context"
	"errors"

	"github.com/idemgo/idem"
)

// claimOutput describes Claim's answer: the record found comes with a
// fingerprint mismatch.
func claimOutput(c idem.Claim, err error) Output {
	if errors.Is(err, idem.ErrQuarantined) {
		return Output{Malformed: "a quarantine, though no lease ran out"}
	}
	if c.TakeOver || c.Prior != nil || c.TakeOvers != 0 || c.Checkpoint != nil {
		return Output{Malformed: "a take-over, though no lease ran out"}
	}
	if err != nil {
		o := errOutput(err)
		if o.Err != Mismatch {
			return o
		}
		if c.Record == nil || c.Outcome == idem.Claimed {
			return Output{Malformed: "a fingerprint mismatch without the record found"}
		}
		o = claimOutput(c, nil)
		o.Err = Mismatch
		return o
	}
	switch c.Outcome {
	case idem.Claimed:
		l := c.Lease
		if l == nil {
			return Output{Malformed: "Claimed without a lease"}
		}
		return Output{Outcome: idem.Claimed, Key: l.Key, Token: l.Token, Owner: l.Owner, Fingerprint: string(l.Fingerprint)}
	case idem.Duplicate, idem.InProgress:
		if c.Record == nil {
			return Output{Malformed: c.Outcome.String() + " without a record"}
		}
		o := recordOutput(c.Record)
		o.Outcome = c.Outcome
		return o
	}
	return Output{Malformed: "outcome " + c.Outcome.String()}
}

func recordOutput(r *idem.Record) Output {
	if r == nil {
		return Output{Malformed: "nil record"}
	}
	if r.Quarantined || r.TakeOvers != 0 || r.Prior != nil {
		return Output{Malformed: "a record of take-overs, though no lease ran out"}
	}
	return Output{Key: r.Key, Confirmed: r.Confirmed, Token: r.Token, Owner: r.Owner,
		Fingerprint: string(r.Fingerprint), Result: string(r.Result), Checkpoint: string(r.Checkpoint)}
}

// errOutput classifies err. An error that wraps the context's is an
// unknown outcome even if it also wraps a sentinel: the store gave up
// waiting, it did not find the answer. So is any error but the sentinels.
func errOutput(err error) Output {
	switch {
	case err == nil:
		return Output{}
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return Output{Err: Unknown}
	case errors.Is(err, idem.ErrLeaseLost):
		return Output{Err: LeaseLost}
	case errors.Is(err, idem.ErrNotFound):
		return Output{Err: NotFound}
	case errors.Is(err, idem.ErrFingerprintMismatch):
		return Output{Err: Mismatch}
	case errors.Is(err, idem.ErrAlreadyConfirmed):
		return Output{Err: NotKept}
	}
	return Output{Err: Unknown}
}
