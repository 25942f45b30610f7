package storetest

import (
	"context"
	"sync"
	"time"

	"github.com/idemgo/idem"
)

func init() {
	register(
		check{"KeepAlive/Renews", keepAliveRenews},
		check{"KeepAlive/CancelsOnLoss", keepAliveCancelsOnLoss},
	)
}

// realTime makes the backend's clock follow real time while KeepAlive, which
// renews on real timers, runs. It returns a function that stops it.
func (s *suite) realTime() func() {
	if !s.controlled() {
		return func() {}
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		last := time.Now()
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case now := <-t.C:
				s.advance(now.Sub(last))
				last = now
			}
		}
	})
	return func() { close(stop); wg.Wait() }
}

func keepAliveRenews(s *suite) {
	// A lease of two seconds, renewed every 667ms: a renewal that a loaded
	// machine delays by a second still comes in time (with one second, a
	// delay of 667ms lost the lease on a machine at load 10).
	a := s.openWith(idem.Options{Worker: "w1", LeaseTTL: 2 * lease, Retention: 2 * lease})
	b := s.open("w2")
	k := s.key("k")
	c := s.claim(a, k, "fp", idem.Claimed)
	defer s.realTime()()
	work, stop := idem.KeepAlive(ctx(s), a, c.Lease)
	defer stop()
	// Well past its TTL, the key is still held and the work goes on.
	for range 4 {
		time.Sleep(lease)
		d := s.claim(b, k, "fp", idem.InProgress)
		checkHolderToken(s, d.Record, c.Lease)
		if err := context.Cause(work); err != nil {
			s.Fatalf("KeepAlive's context ended with %v while the lease was held; want it alive", err)
		}
	}
	stop()
	if err := work.Err(); err == nil {
		s.Errorf("after stop, KeepAlive's context is alive; want it cancelled")
	}
	s.confirm(a, c.Lease, "done")
}

func keepAliveCancelsOnLoss(s *suite) {
	a := s.open("w1")
	k := s.key("k")
	c := s.claim(a, k, "fp", idem.Claimed)
	defer s.realTime()()
	work, stop := idem.KeepAlive(ctx(s), a, c.Lease)
	defer stop()
	// The lease is taken away (here: forgotten behind the worker's back).
	if err := a.Forget(ctx(s), c.Lease); err != nil {
		s.Fatalf("Forget = %v; want nil", err)
	}
	select {
	case <-work.Done():
	case <-time.After(2 * lease):
		s.Fatalf("KeepAlive's context still alive %v after the lease was lost; want it cancelled within TTL/3", 2*lease)
	}
	if err := context.Cause(work); !isErr(err, idem.ErrLeaseLost) {
		s.Errorf("context.Cause after loss = %v; want ErrLeaseLost", err)
	}
}
