package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemgo/idem"
)

// keepAll keeps every lease of a batch alive from one goroutine, with
// idem.KeepAlive's contract for each: renewed every TTL/3; on loss (or once
// the lease has surely run out without a successful renewal) the job's
// context is cancelled with cause idem.ErrLeaseLost; a transient error is
// retried sooner. One goroutine and one timer for the batch instead of one
// per message: with hundreds of messages per batch, per-message KeepAlive
// goroutines cost more CPU than the batch's two round trips.
//
// Jobs whose handler has finished are skipped. The returned stop waits for
// the goroutine, so no Renew is in flight once it returns: call it before
// confirming or forgetting.
func keepAll(ctx context.Context, s idem.Store, jobs []*job) (stop func()) {
	if len(jobs) == 0 {
		return func() {}
	}
	interval := jobs[0].lease.TTL
	for _, j := range jobs {
		interval = min(interval, j.lease.TTL)
	}
	interval /= 3
	if interval <= 0 {
		for k := range jobs {
			jobs[k].cancel(fmt.Errorf("%w: keep-alive needs a lease with a TTL", idem.ErrLeaseLost))
		}
		return func() {}
	}
	retry := max(interval/4, time.Millisecond)
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		deadlines := make([]time.Time, len(jobs))
		for k, j := range jobs {
			deadlines[k] = j.lease.Expires
		}
		timer := time.NewTimer(interval)
		defer timer.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-quit:
				return
			case <-timer.C:
			}
			failed := false
			for k, j := range jobs {
				if j.finished.Load() || j.work.Err() != nil {
					continue
				}
				sent := time.Now()
				// A renewal must not outlive the lease it tries to save.
				rctx, cancel := context.WithDeadline(ctx, deadlines[k])
				err := s.Renew(rctx, j.lease)
				cancel()
				switch {
				case err == nil:
					deadlines[k] = sent.Add(j.lease.TTL)
				case errors.Is(err, idem.ErrLeaseLost):
					j.cancel(err)
				case ctx.Err() != nil:
					return
				case !time.Now().Before(deadlines[k]):
					j.cancel(fmt.Errorf("%w: no renewal succeeded before the lease ran out: %w", idem.ErrLeaseLost, err))
				default:
					failed = true
				}
			}
			if failed {
				timer.Reset(retry)
			} else {
				timer.Reset(interval)
			}
		}
	}()
	return func() {
		close(quit)
		<-done
	}
}
