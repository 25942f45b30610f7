// Package backoff is the wait between attempts of idem's retry and poll
// loops: doubling and jittered, so that many callers retrying after one
// outage, or polling one key, do not move in step. It imports nothing of
// idem's, so that package idem itself (Do) can use it.
package backoff

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// Backoff hands out growing delays: the n-th is drawn from [d/2, 3d/2)
// for d = First doubled n times, at most Most. The zero value is not
// usable: set First and Most.
type Backoff struct {
	First, Most time.Duration
	d           time.Duration
}

// Next returns the next delay.
func (b *Backoff) Next() time.Duration {
	if b.d == 0 {
		b.d = b.First
	}
	d := b.d/2 + rand.N(b.d)
	b.d = min(2*b.d, b.Most)
	return d
}

// Sleep waits d, or reports false at once when ctx is done first.
func Sleep(ctx context.Context, d time.Duration) bool {
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
