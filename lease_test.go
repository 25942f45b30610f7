package idem

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// flakyStore fails Renew with a transient error while failing is set.
type flakyStore struct {
	Store
	mu      sync.Mutex
	failing bool
	renews  int
	fails   int
}

var errFlaky = errors.New("connection reset")

func (f *flakyStore) Renew(ctx context.Context, l *Lease) error {
	f.mu.Lock()
	failing := f.failing
	if failing {
		f.fails++
	} else {
		f.renews++
	}
	f.mu.Unlock()
	if failing {
		return errFlaky
	}
	return f.Store.Renew(ctx, l)
}

func (f *flakyStore) set(failing bool) {
	f.mu.Lock()
	f.failing = failing
	f.mu.Unlock()
}

func (f *flakyStore) counts() (renews, fails int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.renews, f.fails
}

func TestKeepAliveRetriesTransientErrors(t *testing.T) {
	// A second: a renewal goroutine stalled 200ms by a busy machine lost
	// a 300ms lease.
	const ttl = time.Second
	mem, err := NewMemoryStore(Options{LeaseTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	f := &flakyStore{Store: mem}
	c, err := mem.Claim(t.Context(), "k", nil)
	if err != nil {
		t.Fatal(err)
	}
	work, stop := KeepAlive(t.Context(), f, c.Lease)
	defer stop()
	time.Sleep(ttl / 2)
	// A short outage, well within the lease: retried, not taken for loss.
	// It lasts until a renewal has failed in it: one renewal interval
	// (ttl/3) of outage, timed by the test, held no renewal in one run on
	// a loaded machine.
	f.set(true)
	for deadline := time.Now().Add(ttl / 2); ; time.Sleep(time.Millisecond) {
		if _, fails := f.counts(); fails > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no renewal in %v of outage; want one every %v", ttl/2, ttl/3)
		}
	}
	f.set(false)
	time.Sleep(ttl)
	if err := context.Cause(work); err != nil {
		t.Fatalf("KeepAlive context ended with %v after a short outage; want it alive", err)
	}
	renews, fails := f.counts()
	if fails == 0 || renews < 2 {
		t.Fatalf("renews %d, failed renews %d; want failures during the outage and renewals around it", renews, fails)
	}
	if c2, _ := mem.Claim(t.Context(), "k", nil); c2.Outcome != InProgress {
		t.Fatalf("Claim after the outage = %v; want InProgress: the lease was kept", c2.Outcome)
	}
}

func TestKeepAliveGivesUpWhenTheLeaseRunsOut(t *testing.T) {
	const ttl = MinLeaseTTL
	mem, err := NewMemoryStore(Options{LeaseTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	f := &flakyStore{Store: mem, failing: true}
	c, err := mem.Claim(t.Context(), "k", nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	work, stop := KeepAlive(t.Context(), f, c.Lease)
	defer stop()
	select {
	case <-work.Done():
	case <-time.After(3 * ttl):
		t.Fatalf("KeepAlive still alive %v after its lease ran out with every renewal failing", 3*ttl)
	}
	if took := time.Since(start); took < ttl-50*time.Millisecond {
		t.Errorf("KeepAlive gave up after %v; want it to keep retrying until the lease (%v) ran out", took, ttl)
	}
	cause := context.Cause(work)
	if !errors.Is(cause, ErrLeaseLost) || !errors.Is(cause, errFlaky) {
		t.Errorf("context.Cause = %v; want ErrLeaseLost wrapping the last renewal error", cause)
	}
}

func TestKeepAliveStop(t *testing.T) {
	// The shortest lease: a lease of 30ms (renewed every 10ms) was lost
	// before stop on a loaded machine, where a goroutine can wait that long
	// for a core, and the test then saw ErrLeaseLost, not the stop.
	const ttl = MinLeaseTTL
	mem, err := NewMemoryStore(Options{LeaseTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	f := &flakyStore{Store: mem}
	c, _ := mem.Claim(t.Context(), "k", nil)
	work, stop := KeepAlive(t.Context(), f, c.Lease)
	time.Sleep(ttl / 2) // at least one renewal
	stop()
	stop() // twice is fine
	if !errors.Is(work.Err(), context.Canceled) || errors.Is(context.Cause(work), ErrLeaseLost) {
		t.Fatalf("after stop: Err %v, Cause %v; want Canceled, not ErrLeaseLost", work.Err(), context.Cause(work))
	}
	renews, _ := f.counts()
	time.Sleep(ttl / 2) // at least one renewal interval (ttl/3)
	if after, _ := f.counts(); after != renews {
		t.Fatalf("renewals went on after stop returned (%d then %d); want none", renews, after)
	}
}

func TestKeepAliveMistakesPanicAtOnce(t *testing.T) {
	mem, err := NewMemoryStore(Options{})
	if err != nil {
		t.Fatal(err)
	}
	c, _ := mem.Claim(t.Context(), "k", nil)
	for _, tt := range []struct {
		name string
		s    Store
		l    *Lease
		want string
	}{
		{"nil store", nil, c.Lease, "idem: KeepAlive with a nil Store"},
		{"typed nil store", (*RedisStore)(nil), c.Lease, "idem: KeepAlive with a nil Store"},
		{"nil lease", mem, nil, "idem: KeepAlive with a nil *Lease"},
	} {
		func() {
			defer func() {
				if got := recover(); got != tt.want {
					t.Errorf("KeepAlive(%s) panicked with %v; want %q, in the caller's goroutine", tt.name, got, tt.want)
				}
			}()
			KeepAlive(t.Context(), tt.s, tt.l)
		}()
	}
}

func TestLeaseFrom(t *testing.T) {
	mem, err := NewMemoryStore(Options{})
	if err != nil {
		t.Fatal(err)
	}
	c, _ := mem.Claim(t.Context(), "k", nil)
	if _, ok := LeaseFrom(t.Context()); ok {
		t.Error("LeaseFrom(a plain context) = ok; want false")
	}
	work, stop := KeepAlive(t.Context(), mem, c.Lease)
	defer stop()
	if l, ok := LeaseFrom(work); !ok || l != c.Lease {
		t.Errorf("LeaseFrom(KeepAlive's context) = %v, %v; want the lease kept alive", l, ok)
	}
}

// Renew and Forget of a lease whose Confirm was made say that the work is
// recorded, not that the lease was lost (which reads as if the work were),
// and a renewal racing the Confirm logs no "lease lost" warning; a lease
// that ran out still says what happened to it.
func TestLeaseLostAfterConfirmSaysConfirmed(t *testing.T) {
	var logs bytes.Buffer
	mem, err := NewMemoryStore(Options{LeaseTTL: MinLeaseTTL, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cl, _ := mem.Claim(ctx, "paid", nil)
	if err := mem.Confirm(ctx, cl.Lease, []byte("r")); err != nil {
		t.Fatalf("Confirm = %v", err)
	}
	for op, err := range map[string]error{"Renew": mem.Renew(ctx, cl.Lease), "Forget": mem.Forget(ctx, cl.Lease)} {
		if !errors.Is(err, ErrLeaseLost) || !strings.Contains(err.Error(), "the lease was confirmed: its work is recorded as done") {
			t.Errorf("%s after Confirm = %v; want ErrLeaseLost saying the work is recorded", op, err)
		}
	}
	if strings.Contains(logs.String(), "lease lost") {
		t.Errorf("log = %q; want no lease-lost warning for a confirmed lease", logs.String())
	}
	ran, _ := mem.Claim(ctx, "ran-out", nil)
	time.Sleep(MinLeaseTTL + 20*time.Millisecond)
	if err := mem.Renew(ctx, ran.Lease); !errors.Is(err, ErrLeaseLost) || !strings.Contains(err.Error(), "no live claim of this lease (it ran out, was taken over or forgotten)") {
		t.Errorf("Renew of a lease that ran out = %v; want ErrLeaseLost saying what may have happened", err)
	}
	if !strings.Contains(logs.String(), "lease lost") {
		t.Errorf("log = %q; want the lease-lost warning for the lease that ran out", logs.String())
	}
}
