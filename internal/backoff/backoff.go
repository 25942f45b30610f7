// Package backoff is the wait between attempts of idem's retry and poll
// loops: growing and jittered, so that many callers retrying after one
// outage, or polling one key, do not move in step. Its one engine is
// cenkalti/backoff's ExponentialBackOff; its one sleep is Sleep. It imports
// nothing of idem's, so that package idem itself (Do) can use it.
package backoff

import (
	"cmp"
	"context"
	"errors"
	"time"

	cenkalti "github.com/cenkalti/backoff/v5"
)

// Backoff hands out growing delays: the n-th is drawn from [d/2, 3d/2] for
// d = First grown n times by Growth, at most Most; Most caps d, not the
// drawn delay, which may reach 3/2 Most. The zero value is not usable: set
// First and Most. A Backoff is not safe for concurrent use.
type Backoff struct {
	// First is the centre of the first delay.
	First time.Duration
	// Most caps the centre of every delay.
	Most time.Duration
	// Growth multiplies the centre after each delay. Default 2.
	Growth float64

	e cenkalti.ExponentialBackOff
}

// Next returns the next delay.
func (b *Backoff) Next() time.Duration {
	if b.e.InitialInterval == 0 {
		b.e = cenkalti.ExponentialBackOff{InitialInterval: b.First, RandomizationFactor: 0.5,
			Multiplier: cmp.Or(b.Growth, 2), MaxInterval: b.Most}
	}
	return b.e.NextBackOff()
}

// Reset makes the next delay a first one again, after the work the delays
// were waiting on succeeded.
func (b *Backoff) Reset() {
	b.e = cenkalti.ExponentialBackOff{}
}

// Sleep waits d and reports true, or reports false as soon as ctx is done
// first. A d of zero or less does not wait: Sleep reports whether ctx is
// still alive.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Retry calls f until it succeeds, fails with an error final reports
// true for, or ctx ends, waiting a Backoff from 5ms up to 250ms between
// calls. It returns f's last error, joined with ctx's when ctx ended
// first.
func Retry(ctx context.Context, f func(context.Context) error, final func(error) bool) error {
	b := Backoff{First: 5 * time.Millisecond, Most: 250 * time.Millisecond}
	for {
		err := f(ctx)
		if err == nil || final(err) {
			return err
		}
		if !Sleep(ctx, b.Next()) {
			return errors.Join(err, ctx.Err())
		}
	}
}

// Poll is the wait of a caller that finds a key's work in flight elsewhere
// and asks again until it is over: a Backoff from 10ms up to 250ms, each
// delay cut short at a deadline. A Poll is not safe for concurrent use.
type Poll struct {
	deadline time.Time
	b        Backoff
}

// The Backoff of a Poll: short at first, since the work in flight is most
// often about to end, and never so long that its result waits long unseen.
const (
	pollFirst = 10 * time.Millisecond
	pollMost  = 250 * time.Millisecond
)

// NewPoll returns the Poll of a caller that waits at most wait from now.
func NewPoll(wait time.Duration) Poll {
	return Poll{deadline: time.Now().Add(wait), b: Backoff{First: pollFirst, Most: pollMost}}
}

// Expired reports whether the deadline has come: the caller stops asking.
func (p *Poll) Expired() bool {
	return !time.Now().Before(p.deadline)
}

// Wait sleeps the next delay, at most until the deadline, and reports true;
// or reports false as soon as ctx is done first.
func (p *Poll) Wait(ctx context.Context) bool {
	return Sleep(ctx, min(p.b.Next(), time.Until(p.deadline)))
}
