package consumer

// A batch's calls to the store: its claims, in one ClaimBatch when the
// store is a Batcher (one by one otherwise, or when one bad item fails the
// whole call before any I/O), and its confirms, retried with backoff, only
// the items another attempt may mend sent again.

import (
	"context"
	"errors"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/batch"
	"github.com/idemgo/idem/internal/retry"
)

// claimAll claims keys, in one call when the store is a Batcher. It returns
// one claim per key and, when some failed, one error per key (nil for those
// that did not).
func claimAll(ctx context.Context, s idem.Store, b idem.Batcher, keys []string, fps [][]byte) ([]idem.Claim, []error) {
	if len(keys) == 0 {
		return nil, nil
	}
	if b != nil {
		cs, err := b.ClaimBatch(ctx, keys, fps)
		if err == nil {
			return cs, nil
		}
		var be *idem.BatchError
		if errors.As(err, &be) && len(be.Errs) == len(keys) && len(cs) == len(keys) {
			return cs, be.Errs
		}
		if retry.Permanent(err) {
			// One bad item (an oversized key or fingerprint) fails a batch call
			// before any I/O; claimed one by one, only that item fails instead
			// of every message of the batch being dead-lettered with it.
			return claimAll(ctx, s, nil, keys, fps)
		}
		// The whole call failed: nothing was claimed.
		errs := make([]error, len(keys))
		for i := range errs {
			errs[i] = err
		}
		return make([]idem.Claim, len(keys)), errs
	}
	cs := make([]idem.Claim, len(keys))
	var errs []error
	for i, k := range keys {
		var err error
		if cs[i], err = s.Claim(ctx, k, batch.Item(fps, i)); err != nil {
			if errs == nil {
				errs = make([]error, len(keys))
			}
			errs[i] = err
		}
	}
	return cs, errs
}

// confirmAll confirms the leases, retrying the failed ones with backoff
// within the budget on a context detached from ctx's cancellation, in one
// call per attempt when the store is a Batcher. It returns one error per
// lease: nil once it is confirmed, else its last error.
func (c *config) confirmAll(ctx context.Context, s idem.Store, b idem.Batcher, leases []*idem.Lease) []error {
	errs := make([]error, len(leases))
	if len(leases) == 0 {
		return errs
	}
	cctx, cancel := detached(ctx, c.budget(leases[0]))
	defer cancel()
	if b == nil {
		for i, l := range leases {
			errs[i] = retry.Do(cctx, func(ctx context.Context) error { return s.Confirm(ctx, l, nil) })
		}
		return errs
	}
	pending := make([]int, len(leases)) // pending[k]: the lease sent as item k
	for i := range pending {
		pending[i] = i
	}
	batch := leases
	_ = retry.Do(cctx, func(ctx context.Context) error {
		err := b.ConfirmBatch(ctx, batch, nil)
		if pending = again(err, pending, errs); len(pending) == 0 {
			return nil
		}
		batch = make([]*idem.Lease, len(pending))
		for k, i := range pending {
			batch[k] = leases[i]
		}
		// Not err: a *BatchError matches every item's error, and one item
		// confirmed by another lease would make it Permanent and end the
		// retries of the items that may still succeed.
		return errs[pending[0]]
	})
	if cctx.Err() != nil {
		for _, i := range pending {
			errs[i] = errors.Join(errs[i], cctx.Err())
		}
	}
	return errs
}

// again records in errs the answer err of a ConfirmBatch of the leases
// pending, and returns those to send again: the items that failed for a
// reason another attempt may mend (only those when err is a *BatchError).
func again(err error, pending []int, errs []error) []int {
	var be *idem.BatchError
	if err != nil && errors.As(err, &be) && len(be.Errs) == len(pending) {
		var still []int
		for k, e := range be.Errs {
			errs[pending[k]] = e
			if e != nil && !retry.Permanent(e) {
				still = append(still, pending[k])
			}
		}
		return still
	}
	for _, i := range pending {
		errs[i] = err
	}
	if err == nil || retry.Permanent(err) {
		return nil
	}
	return pending
}
