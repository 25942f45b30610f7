package consumer

import (
	"context"
	"fmt"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/renew"
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
	leases := make([]renew.Lease, len(jobs))
	for k, j := range jobs {
		leases[k] = renew.Lease{TTL: j.lease.TTL, Expires: j.lease.Expires}
		if j.lease.TTL <= 0 {
			j.cancel(fmt.Errorf("%w: keep-alive needs a lease with a TTL", idem.ErrLeaseLost))
		}
	}
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		renew.Run(ctx, quit, leases, renew.Funcs{
			Renew:    func(ctx context.Context, k int) error { return s.Renew(ctx, jobs[k].lease) },
			Lost:     func(k int, cause error) { jobs[k].cancel(cause) },
			Finished: func(k int) bool { return jobs[k].finished.Load() || jobs[k].work.Err() != nil },
		}, idem.ErrLeaseLost)
	}()
	return func() {
		close(quit)
		<-done
	}
}
