package storetest

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/idemgo/idem"
)

func init() {
	register(
		check{"Claim/Fresh", claimFresh},
		check{"Claim/InProgressSameWorker", claimInProgressSameWorker},
		check{"Claim/InProgressOtherWorker", claimInProgressOtherWorker},
		check{"Claim/OneWinnerOf64", claimOneWinnerOf64},
		check{"Claim/TakeOverOnlyAfterExpiry", claimTakeOverOnlyAfterExpiry},
		check{"Claim/AgainAfterRetention", claimAgainAfterRetention},
		check{"Claim/TokensIncrease", claimTokensIncrease},
		check{"Claim/CancelledContext", claimCancelledContext},
		check{"Lookup", lookup},
	)
}

func claimFresh(s *suite) {
	st := s.open("w1")
	k := s.key("k")
	set := s.mark()
	c := s.claim(st, k, "fp", idem.Claimed)
	l := c.Lease
	if l.Key != k || l.Owner != "w1" || l.Token <= 0 || !bytes.Equal(l.Fingerprint, []byte("fp")) {
		s.Errorf("Claim(%q).Lease = %+v; want key %q, owner w1, a positive token, fingerprint fp", k, l, k)
	}
	if l.TTL != lease {
		s.Errorf("Claim(%q).Lease.TTL = %v; want the LeaseTTL %v", k, l.TTL, lease)
	}
	// Expires is a conservative local estimate: never later than the
	// store's own expiry, which is at most TTL after the call returned.
	s.expires("Lease", l.Expires, set, lease)
}

func claimInProgressSameWorker(s *suite) {
	// A broker may redeliver to the same process while the first delivery
	// is still being handled: the second must not run the work too.
	st := s.open("w1")
	k := s.key("k")
	first := s.claim(st, k, "fp", idem.Claimed)
	c := s.claim(st, k, "fp", idem.InProgress)
	checkHolder(s, c.Record, first.Lease)
}

func claimInProgressOtherWorker(s *suite) {
	a, b := s.open("w1"), s.open("w2")
	k := s.key("k")
	first := s.claim(a, k, "fp", idem.Claimed)
	c := s.claim(b, k, "fp", idem.InProgress)
	checkHolder(s, c.Record, first.Lease)
}

// checkHolder checks that an InProgress record describes the holder's lease:
// its fingerprint (so a caller can answer 422 rather than 409), token and
// expiry (so it can compute Retry-After).
func checkHolder(s *suite, r *idem.Record, l *idem.Lease) {
	s.Helper()
	if r.Confirmed || r.Token != l.Token || r.Owner != l.Owner || !bytes.Equal(r.Fingerprint, l.Fingerprint) {
		s.Errorf("InProgress record = %+v; want the holder's: token %d, owner %q, fingerprint %q, not confirmed",
			r, l.Token, l.Owner, l.Fingerprint)
	}
	if len(r.Result) != 0 {
		s.Errorf("InProgress record has result %q; want none", r.Result)
	}
	s.near("InProgress record", r.Expires, l.Expires)
}

func claimOneWinnerOf64(s *suite) {
	// Several handles over the same records, as several processes would
	// be, all racing for one key, under a lease no race outlasts: on a
	// busy machine one of 64 claims can run a second after the first
	// (seen on Postgres), a rightful take-over of a lapsed one-second
	// lease, not a second winner.
	stores := s.raceStores()
	k := s.key("k")
	var (
		wg     sync.WaitGroup
		start  = make(chan struct{})
		claims = make([]idem.Claim, 64)
		errs   = make([]error, 64)
	)
	for i := range claims {
		wg.Go(func() {
			<-start
			claims[i], errs[i] = stores[i%len(stores)].Claim(ctx(s), k, []byte("fp"))
		})
	}
	close(start)
	wg.Wait()
	var winner *idem.Lease
	for i, c := range claims {
		if errs[i] != nil {
			s.Fatalf("racing Claim(%q) #%d = %v; want no error", k, i, errs[i])
		}
		switch c.Outcome {
		case idem.Claimed:
			if winner != nil {
				s.Fatalf("two of 64 racing claims got Claimed (tokens %d and %d); want exactly one: the work would run twice",
					winner.Token, c.Lease.Token)
			}
			winner = c.Lease
		case idem.InProgress:
		default:
			s.Fatalf("racing Claim(%q) #%d = %v; want Claimed or InProgress", k, i, c.Outcome)
		}
	}
	if winner == nil {
		s.Fatalf("none of 64 racing claims got Claimed; want exactly one")
	}
	for i, c := range claims {
		if c.Outcome == idem.InProgress && c.Record.Token != winner.Token {
			s.Errorf("racing Claim #%d saw holder token %d; want the winner's %d", i, c.Record.Token, winner.Token)
		}
	}
}

// raceStores opens four stores, as four processes over the same records,
// whose leases outlast any race of the suite (a minute).
func (s *suite) raceStores() []idem.Store {
	s.Helper()
	var out []idem.Store
	for _, w := range []string{"w1", "w2", "w3", "w4"} {
		out = append(out, s.openWith(idem.Options{Worker: w, LeaseTTL: time.Minute, Retention: 2 * time.Minute}))
	}
	return out
}

func claimTakeOverOnlyAfterExpiry(s *suite) {
	a, b := s.open("w1"), s.open("w2")
	k := s.key("k")
	set := s.mark()
	first := s.claim(a, k, "fp", idem.Claimed)
	// Just before the lease ends (its last millisecond where the suite
	// moves the clock) the holder still holds it: a take-over there runs
	// the work twice.
	before := lease - time.Millisecond
	if !s.controlled() {
		before = lease - realSlack
	}
	// The lease began by the end of the call that claimed it.
	granted := s.mark()
	s.waitUntil(set, before)
	var second idem.Claim
	if at := s.mark(); at-set < lease {
		c, err := s.claimCall(b, k, "fp")
		switch end := s.mark(); {
		case err != nil:
			s.Fatalf("Claim(%q) = %v; want outcome %v", k, err, idem.InProgress)
		case c.Outcome == idem.Claimed && end-set >= lease:
			// Sent before the lease's end, answered after it: the
			// machine was too slow to tell which side of the end the
			// store saw it on. It is the take-over checked below.
			s.Logf("the machine was too slow to claim %v before the lease's end (the call took %v); checked the take-over only", lease-before, s.took)
			second = c
		case c.Outcome != idem.InProgress || c.Record == nil:
			s.Fatalf("Claim(%q) %v before the lease's end = %v (lease %v, record %+v); want %v",
				k, lease-(end-set), c.Outcome, c.Lease, c.Record, idem.InProgress)
		default:
			checkHolderToken(s, c.Record, first.Lease)
			s.expires("holder near its end", c.Record.Expires, set, lease)
		}
	} else {
		s.Logf("the machine was too slow to claim %v before the lease's end; skipped that claim", lease-before)
	}
	if second.Lease == nil {
		// The holder crashed: after its lease the key is taken over.
		// Counted from the end of the call that granted it, so that a
		// slow call is not taken for a store that kept the lease too
		// long.
		s.waitUntil(granted, s.afterExpiry(lease))
		second = s.claim(b, k, "fp", idem.Claimed)
	}
	if second.Lease.Token <= first.Lease.Token {
		s.Errorf("take-over token %d <= expired lease's %d; want strictly greater (fencing)", second.Lease.Token, first.Lease.Token)
	}
	s.claim(a, k, "fp", idem.InProgress)
}

func claimAgainAfterRetention(s *suite) {
	st := s.open("w1")
	k := s.key("k")
	first := s.claim(st, k, "fp", idem.Claimed)
	s.confirm(st, first.Lease, "r1")
	s.wait(retention - slack)
	s.claim(st, k, "fp", idem.Duplicate)
	s.wait(slack + slack)
	// Retention is the window in which duplicates are expected; after it
	// the key is new again.
	again := s.claim(st, k, "fp", idem.Claimed)
	if again.Lease.Token <= first.Lease.Token {
		s.Errorf("token after retention %d <= first token %d; want strictly greater", again.Lease.Token, first.Lease.Token)
	}
}

func claimTokensIncrease(s *suite) {
	// Every way a key changes hands must give a greater token: forget,
	// take-over after expiry, reclaim after retention.
	a, b := s.open("w1"), s.open("w2")
	k := s.key("k")
	var tokens []int64
	c := s.claim(a, k, "", idem.Claimed)
	tokens = append(tokens, c.Lease.Token)
	if err := a.Forget(ctx(s), c.Lease); err != nil {
		s.Fatalf("Forget = %v; want nil", err)
	}
	c = s.claim(b, k, "", idem.Claimed) // at once: the same clock tick, maybe
	tokens = append(tokens, c.Lease.Token)
	s.wait(lease + slack)
	c = s.claim(a, k, "", idem.Claimed) // take-over
	tokens = append(tokens, c.Lease.Token)
	s.confirm(a, c.Lease, "")
	s.wait(retention + slack)
	c = s.claim(b, k, "", idem.Claimed) // after retention
	tokens = append(tokens, c.Lease.Token)
	if err := b.Forget(ctx(s), c.Lease); err != nil {
		s.Fatalf("Forget = %v; want nil", err)
	}
	c = s.claim(b, k, "", idem.Claimed)
	tokens = append(tokens, c.Lease.Token)
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			s.Errorf("tokens %v: #%d does not exceed #%d; want strictly increasing (forget, forget-reclaim, take-over, retention, forget-reclaim)",
				tokens, i, i-1)
		}
	}
}

func claimCancelledContext(s *suite) {
	st := s.open("w1")
	k := s.key("k")
	c, cancel := context.WithCancel(ctx(s))
	cancel()
	if _, err := st.Claim(c, k, nil); !isErr(err, context.Canceled) {
		s.Errorf("Claim with a cancelled context = %v; want context.Canceled", err)
	}
	s.claim(st, k, "", idem.Claimed)
}

func lookup(s *suite) {
	st := s.open("w1")
	k := s.key("k")
	if _, err := st.Lookup(ctx(s), k); !isErr(err, idem.ErrNotFound) {
		s.Errorf("Lookup(%q) of a new key = %v; want ErrNotFound", k, err)
	}
	c := s.claim(st, k, "fp", idem.Claimed)
	r, err := st.Lookup(ctx(s), k)
	if err != nil {
		s.Fatalf("Lookup(%q) of a claim = %v; want the claim", k, err)
	}
	checkHolder(s, r, c.Lease)
	s.confirm(st, c.Lease, "done")
	r, err = st.Lookup(ctx(s), k)
	if err != nil {
		s.Fatalf("Lookup(%q) of a confirmation = %v; want it", k, err)
	}
	checkConfirmation(s, r, c.Lease, "done")
	if err := st.Forget(ctx(s), c.Lease); !isErr(err, idem.ErrLeaseLost) {
		s.Errorf("Forget after Confirm = %v; want ErrLeaseLost", err)
	}
	other := s.claim(st, s.key("other"), "", idem.Claimed)
	if err := st.Forget(ctx(s), other.Lease); err != nil {
		s.Fatalf("Forget = %v; want nil", err)
	}
	if _, err := st.Lookup(ctx(s), other.Lease.Key); !isErr(err, idem.ErrNotFound) {
		s.Errorf("Lookup of a forgotten key = %v; want ErrNotFound", err)
	}
}

// checkConfirmation checks a confirmed record against the lease that
// confirmed it and the result it gave.
func checkConfirmation(s *suite, r *idem.Record, l *idem.Lease, result string) {
	s.Helper()
	if !r.Confirmed || r.Owner != "" || r.Token != l.Token {
		s.Errorf("confirmed record = %+v; want confirmed, no owner, token %d", r, l.Token)
	}
	if string(r.Result) != result || !bytes.Equal(r.Fingerprint, l.Fingerprint) {
		s.Errorf("confirmed record has result %q and fingerprint %q; want %q and %q (what duplicates are answered with)",
			r.Result, r.Fingerprint, result, l.Fingerprint)
	}
}

func init() { register(check{"Claim/OneWinnerPerRound", claimOneWinnerPerRound}) }

func claimOneWinnerPerRound(s *suite) {
	// Separate stores race for a fresh key, round after round: on a
	// backend where a store answers a live key from a read before its
	// write, only such a race reaches the write's own guard against
	// overwriting a live claim.
	stores := s.raceStores()
	for round := range 100 {
		k := s.key(fmt.Sprintf("r%d", round))
		var (
			wg     sync.WaitGroup
			start  = make(chan struct{})
			claims = make([]idem.Claim, len(stores))
			errs   = make([]error, len(stores))
		)
		for i, st := range stores {
			wg.Go(func() {
				<-start
				claims[i], errs[i] = st.Claim(ctx(s), k, []byte("fp"))
			})
		}
		close(start)
		wg.Wait()
		winners := 0
		for i, c := range claims {
			if errs[i] != nil {
				s.Fatalf("round %d: racing Claim(%q) by w%d = %v; want no error", round, k, i+1, errs[i])
			}
			if c.Outcome == idem.Claimed {
				winners++
			}
		}
		if winners != 1 {
			s.Fatalf("round %d: %d of %d racing stores got Claimed; want exactly one: the work would run %d times", round, winners, len(stores), winners)
		}
	}
}
