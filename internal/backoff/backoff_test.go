package backoff

import (
	"context"
	"testing"
	"time"
)

func TestNextDoublesWithinJitter(t *testing.T) {
	b := Backoff{First: 10 * time.Millisecond, Most: 80 * time.Millisecond}
	for i, d := range []time.Duration{10, 20, 40, 80, 80} {
		d *= time.Millisecond
		if got := b.Next(); got < d/2 || got > d*3/2 {
			t.Errorf("Next() #%d = %v; want within [%v, %v]", i, got, d/2, d*3/2)
		}
	}
}

// The cap falls on the centre, not on the drawn delay: a centre that would
// pass Most is Most, and the delay is drawn around it.
func TestNextGrowsByGrowthUpToMost(t *testing.T) {
	b := Backoff{First: 100 * time.Millisecond, Most: 300 * time.Millisecond, Growth: 1.5}
	for i, d := range []time.Duration{100, 150, 225, 300, 300} {
		d *= time.Millisecond
		if got := b.Next(); got < d/2 || got > d*3/2 {
			t.Errorf("Next() #%d = %v; want within [%v, %v]", i, got, d/2, d*3/2)
		}
	}
}

// The jitter spreads over the whole of [d/2, 3d/2]: callers that start
// together do not stay together.
func TestNextSpreadsOverTheJitter(t *testing.T) {
	const d = time.Millisecond
	lo, hi := time.Duration(1<<62), time.Duration(0)
	for range 10000 {
		b := Backoff{First: d, Most: d}
		got := b.Next()
		if got < d/2 || got > d*3/2 {
			t.Fatalf("Next() = %v; want within [%v, %v]", got, d/2, d*3/2)
		}
		lo, hi = min(lo, got), max(hi, got)
	}
	if lo > d/2+d/20 || hi < d*3/2-d/20 {
		t.Errorf("10000 first delays of %v spread over [%v, %v]; want within %v of [%v, %v] at both ends", d, lo, hi, d/20, d/2, d*3/2)
	}
}

func TestResetStartsOver(t *testing.T) {
	b := Backoff{First: 10 * time.Millisecond, Most: time.Second}
	for range 5 {
		b.Next()
	}
	b.Reset()
	if got := b.Next(); got < 5*time.Millisecond || got > 15*time.Millisecond {
		t.Errorf("Next() after Reset = %v; want within [5ms, 15ms], a first delay", got)
	}
}

func TestSleepWaitsD(t *testing.T) {
	const d = 20 * time.Millisecond
	start := time.Now()
	if ok := Sleep(context.Background(), d); !ok || time.Since(start) < d {
		t.Errorf("Sleep(live, %v) = %v after %v; want true after %v", d, ok, time.Since(start), d)
	}
}

func TestSleepEndsWithCtx(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(10*time.Millisecond, cancel)
	start := time.Now()
	if ok := Sleep(ctx, time.Hour); ok || time.Since(start) > 5*time.Second {
		t.Errorf("Sleep(cancelled after 10ms, 1h) = %v after %v; want false once cancelled", ok, time.Since(start))
	}
	for _, d := range []time.Duration{time.Hour, time.Millisecond, 0, -time.Second} {
		start := time.Now()
		if ok := Sleep(ctx, d); ok || time.Since(start) > time.Second {
			t.Errorf("Sleep(cancelled, %v) = %v after %v; want false at once", d, ok, time.Since(start))
		}
	}
}

func TestSleepZeroDoesNotWait(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Second} {
		if !Sleep(context.Background(), d) {
			t.Errorf("Sleep(live, %v) = false; want true", d)
		}
	}
}

func TestPollWaitsUntilTheDeadline(t *testing.T) {
	const wait = 100 * time.Millisecond
	start := time.Now()
	p := NewPoll(wait)
	n := 0
	for !p.Expired() {
		if !p.Wait(context.Background()) {
			t.Fatalf("Wait(live) = false; want true")
		}
		n++
	}
	// Delays from 10ms, doubling: at least 3 before 100ms.
	if took := time.Since(start); n < 3 || took < wait {
		t.Errorf("NewPoll(%v): %d waits over %v; want at least 3, until the deadline", wait, n, took)
	}
}

// A delay that would pass the deadline ends at it: the caller answers
// when its wait is up, not up to 3/2 of 250ms later.
func TestPollCutsTheDelayAtTheDeadline(t *testing.T) {
	p := NewPoll(20 * time.Millisecond)
	for range 6 {
		p.b.Next() // centre 250ms: the next delay is at least 125ms
	}
	start := time.Now()
	if !p.Wait(context.Background()) {
		t.Fatalf("Wait(live) = false; want true")
	}
	if took := time.Since(start); took > 100*time.Millisecond || !p.Expired() {
		t.Errorf("Wait 20ms before the deadline, its delay from 125ms: took %v, expired %v; want about 20ms, expired", took, p.Expired())
	}
}

func TestPollWaitEndsWithCtx(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p := NewPoll(time.Hour)
	if p.Expired() {
		t.Errorf("NewPoll(1h).Expired() = true; want false")
	}
	if p.Wait(ctx) {
		t.Errorf("Wait(cancelled) = true; want false")
	}
}
