package consumer_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
)

// crashLease is the lease of the crash tests: short, so that a crashed
// delivery's claim runs out within the test.
const crashLease = idem.MinLeaseTTL

// crashed claims key on s and abandons the lease, as a consumer that dies
// mid-handler: no Confirm, no Forget. It returns once the lease ran out.
func crashed(t *testing.T, s idem.Store, key string) *idem.Lease {
	t.Helper()
	c, err := s.Claim(t.Context(), key, nil)
	if err != nil || c.Outcome != idem.Claimed {
		t.Fatalf("Claim(%q) = %v, %v; want Claimed", key, c.Outcome, err)
	}
	time.Sleep(crashLease + 30*time.Millisecond)
	return c.Lease
}

// hookLog records a Hook's events by kind.
type hookLog struct {
	mu sync.Mutex
	ev []consumer.Event
}

func (h *hookLog) hook(_ context.Context, e consumer.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ev = append(h.ev, e)
}

func (h *hookLog) of(k consumer.Kind) []consumer.Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []consumer.Event
	for _, e := range h.ev {
		if e.Kind == k {
			out = append(out, e)
		}
	}
	return out
}

// eventLog records an Observer's events.
type eventLog struct {
	mu sync.Mutex
	ev []idem.Event
}

func (o *eventLog) Observe(_ context.Context, e idem.Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ev = append(o.ev, e)
}

func (o *eventLog) takeOvers() (n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, e := range o.ev {
		if e.TakeOver {
			n++
		}
	}
	return n
}

func (o *eventLog) quarantined() (n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, e := range o.ev {
		if e.Class() == idem.ClassQuarantined {
			n++
		}
	}
	return n
}

// wrappers are Idempotent and Batch as one shape: handle one message.
var wrappers = []struct {
	name string
	wrap func(s idem.Store, h func(context.Context, string) error, o consumer.Options[string]) func(context.Context, string) error
}{
	{"Idempotent", func(s idem.Store, h func(context.Context, string) error, o consumer.Options[string]) func(context.Context, string) error {
		return consumer.Idempotent(s, func(m string) string { return m }, h, o)
	}},
	{"Batch", func(s idem.Store, h func(context.Context, string) error, o consumer.Options[string]) func(context.Context, string) error {
		b := consumer.Batch(s, func(m string) string { return m }, h, o)
		return func(ctx context.Context, m string) error { return b(ctx, []string{m})[0] }
	}},
}

// A delivery that takes over a crashed one's key runs its handler with the
// take-over in its context, and may checkpoint through it; the Hook and
// the Observer hear of the take-over.
func TestHandlerSeesTheTakeOver(t *testing.T) {
	for _, w := range wrappers {
		t.Run(w.name, func(t *testing.T) {
			base := memStore(idem.Options{LeaseTTL: crashLease})
			a, _ := base.Share(idem.Options{Worker: "a", LeaseTTL: crashLease})
			b, _ := base.Share(idem.Options{Worker: "b", LeaseTTL: crashLease})
			lost := crashed(t, a, "m1")
			var hl hookLog
			var ol eventLog
			var seen *idem.TakeOver
			h := w.wrap(b, func(ctx context.Context, m string) error {
				seen, _ = idem.TakeOverFrom(ctx)
				return idem.Checkpoint(ctx, []byte("step-1"))
			}, consumer.Options[string]{Hook: hl.hook, Observer: &ol})
			if err := h(t.Context(), "m1"); err != nil {
				t.Fatalf("handling m1 after a crash = %v; want nil", err)
			}
			if seen == nil || seen.Prior.Token != lost.Token || seen.Prior.Owner != "a" || seen.TakeOvers != 1 {
				t.Errorf("TakeOverFrom(handler's context) = %+v; want the crashed attempt (owner a, token %d), 1 take-over", seen, lost.Token)
			}
			if n := len(hl.of(consumer.TakeOver)); n != 1 {
				t.Errorf("Hook heard %d TakeOver events; want 1", n)
			}
			if n := ol.takeOvers(); n != 1 {
				t.Errorf("Observer saw %d events with TakeOver; want 1 (the message's)", n)
			}
			// A fresh key carries none.
			seen = &idem.TakeOver{}
			if err := h(t.Context(), "m2"); err != nil || seen != nil {
				t.Errorf("handling a fresh key = %v, take-over %+v; want nil, none", err, seen)
			}
		})
	}
}

// The checkpoint a crashed delivery's handler recorded through its context
// reaches the next delivery's handler.
func TestCheckpointReachesTheNextDelivery(t *testing.T) {
	for _, w := range wrappers {
		t.Run(w.name, func(t *testing.T) {
			base := memStore(idem.Options{LeaseTTL: crashLease})
			a, _ := base.Share(idem.Options{Worker: "a", LeaseTTL: crashLease})
			b, _ := base.Share(idem.Options{Worker: "b", LeaseTTL: crashLease})
			crash := w.wrap(a, func(ctx context.Context, m string) error {
				if err := idem.Checkpoint(ctx, []byte("charged")); err != nil {
					t.Errorf("Checkpoint(handler's context) = %v; want nil", err)
				}
				runtime.Goexit() // the process dies: no Confirm, no Forget
				return nil
			}, consumer.Options[string]{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				_ = crash(t.Context(), "m1")
			}()
			<-done
			time.Sleep(crashLease + 30*time.Millisecond)
			var cp []byte
			h := w.wrap(b, func(ctx context.Context, m string) error {
				if tk, ok := idem.TakeOverFrom(ctx); ok {
					cp = tk.Checkpoint
				}
				return nil
			}, consumer.Options[string]{})
			if err := h(t.Context(), "m1"); err != nil || string(cp) != "charged" {
				t.Errorf("next delivery = %v, checkpoint %q; want nil, %q", err, cp, "charged")
			}
		})
	}
}

// A message whose deliveries crash more than MaxTakeOvers times in a row
// is quarantined: the handler does not run, the wrapper's error says
// dead-letter, and the Hook and Observer hear of it.
func TestQuarantinedMessageIsDeadLettered(t *testing.T) {
	for _, w := range wrappers {
		t.Run(w.name, func(t *testing.T) {
			base := memStore(idem.Options{LeaseTTL: crashLease})
			s, _ := base.Share(idem.Options{LeaseTTL: crashLease, MaxTakeOvers: 2})
			for range 3 { // the first attempt and two take-overs, each crashed
				crashed(t, s, "poison")
			}
			var hl hookLog
			var ol eventLog
			ran := false
			h := w.wrap(s, func(context.Context, string) error { ran = true; return nil },
				consumer.Options[string]{Hook: hl.hook, Observer: &ol})
			err := h(t.Context(), "poison")
			if !errors.Is(err, idem.ErrQuarantined) || ran {
				t.Fatalf("handling a quarantined message = %v (handler ran: %v); want ErrQuarantined, not run", err, ran)
			}
			if a := consumer.ActionFor(err); a != consumer.DeadLetter {
				t.Errorf("ActionFor(%v) = %v; want dead_letter", err, a)
			}
			if q := hl.of(consumer.Quarantined); len(q) != 1 || !errors.Is(q[0].Err, idem.ErrQuarantined) || q[0].Token == 0 {
				t.Errorf("Hook heard %+v; want one Quarantined event with the last attempt's token and the error", q)
			}
			if n := ol.quarantined(); n != 1 {
				t.Errorf("Observer saw %d events of class quarantined; want 1", n)
			}
		})
	}
}
