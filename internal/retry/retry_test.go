package retry

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemgo/idem"
)

func TestDoRetriesTransientErrors(t *testing.T) {
	calls := 0
	err := Do(t.Context(), func(context.Context) error {
		calls++
		if calls < 3 {
			return errors.New("connection reset")
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("Do = %v after %d calls; want nil after 3", err, calls)
	}
}

func TestDoStopsOnPermanentErrors(t *testing.T) {
	for _, perm := range []error{idem.ErrInvalidKey, idem.ErrTooLarge, idem.ErrDamaged, idem.ErrLeaseLost} {
		calls := 0
		err := Do(t.Context(), func(context.Context) error {
			calls++
			return fmt.Errorf("wrapped: %w", perm)
		})
		if !errors.Is(err, perm) || calls != 1 {
			t.Errorf("Do with %v = %v after %d calls; want it after 1 call", perm, err, calls)
		}
	}
}

func TestDoEndsWithTheContext(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	transient := errors.New("timeout")
	err := Do(ctx, func(context.Context) error { return transient })
	if !errors.Is(err, transient) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Do past its deadline = %v; want the last error joined with DeadlineExceeded", err)
	}
}

func TestDoubling(t *testing.T) {
	const first, most = 50 * time.Millisecond, time.Second
	for _, tc := range []struct {
		n    int
		want time.Duration
	}{{0, first}, {1, 2 * first}, {4, 800 * time.Millisecond}, {5, most}, {1 << 20, most}} {
		if got := Doubling(first, most, tc.n); got != tc.want {
			t.Errorf("Doubling(%v, %v, %d) = %v; want %v", first, most, tc.n, got, tc.want)
		}
	}
}
