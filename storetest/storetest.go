// Package storetest is the conformance suite every idem.Store passes: the
// contract of package idem, checked rule by rule, as testing/slogtest checks
// a slog.Handler.
//
// A store's own tests call Run with a function that opens the backend:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) storetest.Backend {
//			m := miniredis.RunT(t)
//			c := redis.NewClient(&redis.Options{Addr: m.Addr()})
//			return storetest.Backend{
//				Open: func(o idem.Options) (idem.Store, error) {
//					return idem.NewRedisStore(c, idem.RedisOptions{
//						Worker: o.Worker, LeaseTTL: o.LeaseTTL, Retention: o.Retention,
//						MaxKeyBytes: o.MaxKeyBytes, MaxResultBytes: o.MaxResultBytes,
//						Observer: o.Observer,
//					})
//				},
//				Advance: m.FastForward,
//			}
//		})
//	}
//
// Each check runs as its own subtest, in parallel, on a backend of its own.
// A violation says what was expected and why it matters.
//
// A program runs the same checks without package testing with Check, which
// returns a Result per check: how `idem check` certifies a user's server.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/regrant"
)

// Backend is a store implementation under test.
type Backend struct {
	// Open returns a store with the given options (Observer included:
	// checks read its events) over the backend's records. Stores opened
	// from one Backend MUST share their records, as processes sharing one
	// Redis or one database do (most checks open two workers and fail
	// without it); each has its own options (Worker,
	// LeaseTTL, ...). For a MemoryStore that means Share of one store, not
	// a NewMemoryStore per call: see MemoryBackend.
	Open func(o idem.Options) (idem.Store, error)
	// Advance moves the backend's clock forward by d: miniredis's
	// FastForward, a MemoryStore's injected clock. Nil: the suite waits in
	// real time, with leases of one second.
	Advance func(d time.Duration)
	// Now is the clock by which the store's Lease.Expires and Record.Expires
	// are reckoned. Default time.Now.
	Now func() time.Time
	// PlantForgotten, when set, writes for key the record that a Forget of
	// a lease with the given token leaves behind, as a store of this
	// backend writes it (on RedisStore "1F<token>", living for a lease),
	// for a token far ahead of the store's clock. The suite then checks
	// that the next claim's token exceeds it: a Forget and a Claim within
	// one tick of a clock-derived token, or a clock stepped back, look the
	// same to the store. Nil: the check is skipped, as on a store whose
	// tokens come from a counter.
	PlantForgotten func(key string, token int64) error
	// LoseReply, when set, makes the reply to the next Claim of key be lost
	// after the store ran it, and the store's clock move advance before the
	// client retries (a reply lost on the network, go-redis's retry). The
	// suite then checks that the retry's Lease.Expires counts from the
	// first execution: a conservative estimate. Nil: the check is skipped.
	LoseReply func(key string, advance time.Duration)
}

// Run runs the suite. newBackend is called once per check, with that check's
// t, and must return a backend whose records no other check sees (a fresh
// server, a fresh key prefix, a fresh table).
func Run(t *testing.T, newBackend func(t *testing.T) Backend) {
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := newBackend(t)
			if b.Open == nil {
				t.Fatal("storetest: Backend.Open is nil")
			}
			c.run(&suite{tb: t, b: b, epoch: time.Now()})
		})
	}
}

type check struct {
	name string
	run  func(s *suite)
}

var checks []check

// register adds checks to the suite; each file of the suite registers its own.
func register(cs ...check) { checks = append(checks, cs...) }

// Durations the checks use. They are short enough to wait for in real time
// and long enough that a slow machine under -race does not see a lease run
// out before the check looks at it.
const (
	lease     = time.Second
	retention = 1500 * time.Millisecond
	// slack bounds what a store may round or what the machine may delay.
	slack = 400 * time.Millisecond
	// lag bounds the real time one call takes: on a backend whose clock the
	// suite controls, an expiry is exact but for it (a store reckons
	// Expires from the start of the call that read the TTL).
	lag = 50 * time.Millisecond
	// realSlack bounds an expiry on a backend whose clock runs by itself:
	// the time of the call that set it and of the call that reported it.
	// Tight enough that a lease renewed from its old expiry (a third of
	// a lease off) or taken over 10% early fails.
	realSlack = 150 * time.Millisecond
)

// tb is what a check needs of its *testing.T: Run gives it the subtest's,
// Check a runner of its own (see result).
type tb interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
	Skip(args ...any)
	Skipf(format string, args ...any)
	Name() string
	Context() context.Context
	Failed() bool
}

// suite is one check's view of its backend.
type suite struct {
	tb
	b Backend

	mu     sync.Mutex
	donors int // leases forge has taken
	// lastClaim is when the last claim call started, sinceClaim the time
	// from the one before it: on a clock that stands still, what separates
	// the expiries two claims report.
	lastClaim  time.Time
	sinceClaim time.Duration
	// setTook is how long the last call that set an expiry (claim,
	// confirm, renew) took: the store set it as late as that call's end.
	setTook time.Duration
	virtual time.Duration // the advances so far, on a backend whose clock the suite controls
	epoch   time.Time     // the check's start, on one whose clock runs by itself
	took    time.Duration // the real time of the last call made through claim or lookup
	ended   time.Time     // when that call returned
	claims  []claimSpan   // the claim calls made through claimCall, in order
}

// open opens a store with the suite's lease and retention and the given
// worker name, failing the check if it cannot.
func (s *suite) open(worker string) idem.Store {
	s.Helper()
	return s.openWith(idem.Options{Worker: worker})
}

func (s *suite) openWith(o idem.Options) idem.Store {
	s.Helper()
	if o.LeaseTTL == 0 {
		o.LeaseTTL = lease
	}
	if o.Retention == 0 {
		o.Retention = retention
	}
	st, err := s.b.Open(o)
	if err != nil {
		s.Fatalf("Open(%+v) = %v; want a store", o, err)
	}
	return st
}

// wait lets d pass on the backend's clock.
func (s *suite) wait(d time.Duration) {
	if d <= 0 {
		return
	}
	if s.controlled() {
		s.advance(d)
		return
	}
	time.Sleep(d)
}

// controlled reports whether the suite moves the backend's clock
// (Backend.Advance), so that expiries can be checked exactly.
func (s *suite) controlled() bool { return s.b.Advance != nil }

func (s *suite) advance(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.virtual += d
	s.b.Advance(d)
}

// mark is an instant of the backend's clock, as an offset from the check's
// start: the advances so far, or the real time since the start.
func (s *suite) mark() time.Duration {
	if s.controlled() {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.virtual
	}
	return time.Since(s.epoch)
}

// waitUntil lets the backend's clock reach d after the instant m.
func (s *suite) waitUntil(m, d time.Duration) { s.wait(m + d - s.mark()) }

func (s *suite) now() time.Time {
	if s.b.Now != nil {
		return s.b.Now()
	}
	return time.Now()
}

func ctx(s *suite) context.Context { return s.Context() }

// key returns a key unique to this check.
func (s *suite) key(suffix string) string { return s.Name() + "/" + suffix }

// forge returns a lease that st's backend granted, for a key of the
// suite's own, regranted as key, token and owner: a lease of this backend
// that no Claim of key returned, so that the store's own answer to it is
// checked, not the local check of a lease made by hand or changed after
// its grant (Lease/Altered checks that one).
func (s *suite) forge(st idem.Store, key string, token int64, owner string) *idem.Lease {
	s.Helper()
	s.mu.Lock()
	s.donors++
	n := s.donors
	s.mu.Unlock()
	// Short, as a store with a small MaxKeyBytes needs; the backend is
	// the check's own.
	l := s.claim(st, fmt.Sprintf("donor-%d", n), "", idem.Claimed).Lease
	return regrant.Lease(l, key, token, owner).(*idem.Lease)
}

// timed records the real time of a call that began at t0 and has just
// returned: what an expiry it reported may be off by (see expires).
func (s *suite) timed(t0 time.Time) {
	s.ended = time.Now()
	s.took = s.ended.Sub(t0)
}

// claimSpan is one claim call: when it began by the backend's clock
// (s.now), and how long it took in real time.
type claimSpan struct {
	at   time.Time
	took time.Duration
}

// since bounds how long after at (an instant of s.now taken before a
// claim call) the store can have run that call: the time to the start of
// the first claim call from at, by the backend's clock, and that call's
// own time. A check stalled before the call, or a call slow on a loaded
// machine, so widens a tolerance instead of failing it.
func (s *suite) since(at time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.claims {
		if !c.at.Before(at) {
			return c.at.Sub(at) + c.took
		}
	}
	return s.took
}

// claimCall calls Claim, timed as expires needs it, and returns what it
// returned.
func (s *suite) claimCall(st idem.Store, key string, fp string) (idem.Claim, error) {
	at := s.now()
	t0 := time.Now()
	c, err := st.Claim(ctx(s), key, []byte(fp))
	s.timed(t0)
	s.mu.Lock()
	s.claims = append(s.claims, claimSpan{at: at, took: s.took})
	s.setTook = s.took
	if !s.lastClaim.IsZero() {
		s.sinceClaim = t0.Sub(s.lastClaim)
	}
	s.lastClaim = t0
	s.mu.Unlock()
	return c, err
}

// claim calls Claim and fails the check on an error or an unexpected outcome.
func (s *suite) claim(st idem.Store, key string, fp string, want idem.Outcome) idem.Claim {
	s.Helper()
	c, err := s.claimCall(st, key, fp)
	if err != nil {
		s.Fatalf("Claim(%q) = %v; want outcome %v", key, err, want)
	}
	if c.Outcome != want {
		s.Fatalf("Claim(%q) = %v (record %+v); want %v", key, c.Outcome, c.Record, want)
	}
	switch want {
	case idem.Claimed:
		if c.Lease == nil || c.Record != nil {
			s.Fatalf("Claim(%q) = Claimed with lease %v and record %v; want a lease and no record", key, c.Lease, c.Record)
		}
	default:
		if c.Lease != nil || c.Record == nil {
			s.Fatalf("Claim(%q) = %v with lease %v and record %v; want a record and no lease", key, c.Outcome, c.Lease, c.Record)
		}
		if c.Record.Key != key {
			s.Fatalf("Claim(%q).Record.Key = %q; want the key claimed", key, c.Record.Key)
		}
	}
	return c
}

func (s *suite) confirm(st idem.Store, l *idem.Lease, result string) {
	s.Helper()
	t0 := time.Now()
	if err := st.Confirm(ctx(s), l, []byte(result)); err != nil {
		s.Fatalf("Confirm(%q, %q) = %v; want nil", l.Key, result, err)
	}
	s.mu.Lock()
	s.setTook = time.Since(t0)
	s.mu.Unlock()
}

// renew renews l in st, which must succeed, keeping how long it took.
func (s *suite) renew(st idem.Store, l *idem.Lease, what string) {
	s.Helper()
	t0 := time.Now()
	if err := st.Renew(ctx(s), l); err != nil {
		s.Fatalf("%s = %v; want nil", what, err)
	}
	s.mu.Lock()
	s.setTook = time.Since(t0)
	s.mu.Unlock()
}

// expires checks that t, an expiry the store reported, is d after the
// instant set (a mark taken just before the call that set it). On a
// backend whose clock the suite controls the check is exact up to the real
// time of a call (lag); elsewhere it allows realSlack either way. An
// expiry may be early by the time the call that reported it took (a store
// reckons it from the call's start): a conservative estimate.
func (s *suite) expires(what string, t time.Time, set, d time.Duration) {
	s.Helper()
	// got and want from one reading of the clock: a loaded machine can
	// stall the check for hundreds of milliseconds between two readings,
	// which would count against the store. Where the suite moves the
	// clock, real time matters only to a store that reckons expiries by
	// it (Redis on miniredis: the call's start plus what the server says
	// remains): read at the end of the call that reported t, the error is
	// the call's own time (s.took), not the check's stalls after it.
	var now time.Time
	var at time.Duration
	switch {
	case s.controlled() && s.b.Now != nil:
		now, at = s.now(), s.mark()
	case s.controlled():
		now, at = s.ended, s.mark()
	default:
		r := time.Now()
		now, at = r, r.Sub(s.epoch)
		if s.b.Now != nil {
			now = s.b.Now()
		}
	}
	got := t.Sub(now)
	want := set + d - at
	// The store set the expiry during the call after set: as late as its
	// end, which on a loaded machine (a Postgres commit under -race) can
	// be well after the mark.
	s.mu.Lock()
	setter := max(s.took, s.setTook)
	s.mu.Unlock()
	lo, hi := realSlack+s.took, realSlack+setter
	if s.controlled() {
		lo, hi = lag+s.took, time.Millisecond
	}
	if got < want-lo || got > want+hi {
		s.Errorf("%s expires in %v; want %v (-%v/+%v): a lease that lives longer than granted blocks the key, a shorter one lets a second worker in",
			what, got.Round(time.Millisecond), want.Round(time.Millisecond), lo, hi)
	}
}

// near checks that the expiry t is the instant want, which the store
// reported for the same lease in another call.
func (s *suite) near(what string, t, want time.Time) {
	s.Helper()
	tol := realSlack
	if s.controlled() {
		tol = lag
	}
	hi := tol
	if s.controlled() {
		// The clock stands still, so the later call's expiry is later by
		// the real time between the two calls: at most the time from the
		// start of the claim before the last claim to the end of the
		// last call (a Lookup after the last claim included, and
		// whatever stalled the check between them).
		s.mu.Lock()
		hi += s.sinceClaim + s.ended.Sub(s.lastClaim)
		s.mu.Unlock()
	}
	if d := t.Sub(want); d < -tol-s.took || d > hi {
		s.Errorf("%s expires %v from the lease's own Expires; want within ±%v", what, d.Round(time.Millisecond), tol)
	}
}

func isErr(err, target error) bool { return errors.Is(err, target) }
