package storetest

import (
	"strings"
	"time"

	"github.com/idemgo/idem"
)

// Settled by an operator (DESIGN 3.7): what an operator's Resolve does and
// never does, what a quarantine reports, and that a quarantined key's last
// attempt, awake again, is no one's lease.

func init() {
	register(
		check{"Resolve/OnlyAQuarantinedKey", resolveOnlyQuarantined},
		check{"Resolve/ConfirmKeepsFingerprintForRetention", resolveConfirmKept},
		check{"Resolve/ForceClearsAnyKeyButALiveClaim", resolveForce},
		check{"Quarantine/ListedUpToTheLimit", quarantinedLimit},
		check{"Quarantine/ExpiresAtItsEnd", quarantineExpires},
		check{"Quarantine/LastAttemptHoldsNoLease", quarantineLastAttempt},
		check{"Inspect/ShowsALapsedAttempt", inspectLapsed},
	)
}

// widen lets the next expires allow for d, the real time of the call
// that set the expiry, when that call was not the last one timed.
func (s *suite) widen(d time.Duration) {
	s.mu.Lock()
	s.setTook = max(s.setTook, d)
	s.mu.Unlock()
}

// resolver returns st as an idem.Resolver, or skips the check.
func (s *suite) resolver(st idem.Store) idem.Resolver {
	s.Helper()
	rs, ok := st.(idem.Resolver)
	if !ok {
		s.Skipf("%T does not implement idem.Resolver", st)
	}
	return rs
}

// quarantinedRecord claims k, which must be quarantined, and returns its
// record.
func (s *suite) quarantinedRecord(st idem.Store, k string) *idem.Record {
	s.Helper()
	c, err := s.claimCall(st, k, "fp")
	if !isErr(err, idem.ErrQuarantined) || c.Record == nil {
		s.Fatalf("Claim(%q) = %v, %v; want ErrQuarantined with the record", k, c.Outcome, err)
	}
	return c.Record
}

// An operator's Resolve settles a quarantined key and nothing else: a
// live claim is someone's work in progress (settling it would answer
// duplicates with a result the work never gave, or run the work twice at
// once), and a confirmation is the work's own answer.
func resolveOnlyQuarantined(s *suite) {
	a := s.openWith(crashOpts("w1", 1))
	rs := s.resolver(a)
	k := s.key("live")
	c := s.claim(a, k, "fp", idem.Claimed)
	for _, r := range []idem.Resolution{{Confirm: true, Result: []byte("r")}, {}} {
		if err := rs.Resolve(ctx(s), k, r); !isErr(err, idem.ErrNotFound) {
			s.Errorf("Resolve(%q, Confirm %v) of a live claim = %v; want ErrNotFound, the claim left to its holder", k, r.Confirm, err)
		}
	}
	if err := a.Renew(ctx(s), c.Lease); err != nil {
		s.Errorf("Renew of a live claim after an operator's Resolve was refused = %v; want nil: the claim is its holder's still", err)
	}
	if r := s.lookup(a, k); r.Confirmed || r.Token != c.Lease.Token {
		s.Errorf("Lookup(%q) after a refused Resolve = %+v; want the live claim of token %d", k, r, c.Lease.Token)
	}
	s.confirm(a, c.Lease, "work")
	if err := rs.Resolve(ctx(s), k, idem.Resolution{Confirm: true, Result: []byte("op")}); !isErr(err, idem.ErrNotFound) {
		s.Errorf("Resolve(%q, Confirm) of a confirmed key = %v; want ErrNotFound, the work's own result kept", k, err)
	}
	if c := s.claim(a, k, "fp", idem.Duplicate); string(c.Record.Result) != "work" || c.Record.Resolved {
		s.Errorf("Claim(%q) after a refused Resolve = result %q, Resolved %v; want %q, not Resolved", k, c.Record.Result, c.Record.Resolved, "work")
	}
}

// An operator's confirmation is a confirmation: the quarantined attempts'
// fingerprint still guards it (another input under the key is refused, not
// answered with this result), it lives for the store's Retention, not a
// lease, and it is marked Resolved, so that a front door reads its plain
// result.
func resolveConfirmKept(s *suite) {
	a, b := s.openWith(crashOpts("w1", 1)), s.openWith(crashOpts("w2", 1))
	rs := s.resolver(a)
	k := s.key("k")
	s.quarantine([]idem.Store{a, b}, k, 1)
	s.quarantinedRecord(b, k)
	set := s.mark()
	r0 := time.Now()
	if err := rs.Resolve(ctx(s), k, idem.Resolution{Confirm: true, Result: []byte("settled")}); err != nil {
		s.Fatalf("Resolve(%q, Confirm) = %v; want nil", k, err)
	}
	s.widen(time.Since(r0))
	c := s.claim(b, k, "fp", idem.Duplicate)
	if string(c.Record.Result) != "settled" || !c.Record.Resolved || !c.Record.Confirmed {
		s.Errorf("Claim(%q) after Resolve(Confirm) = result %q, Confirmed %v, Resolved %v; want %q, confirmed, Resolved: a front door must tell an operator's plain result from its own record",
			k, c.Record.Result, c.Record.Confirmed, c.Record.Resolved, "settled")
	}
	s.expires("an operator's confirmation", c.Record.Expires, set, crashOpts("", 0).Retention)
	if r := s.lookup(a, k); !r.Resolved || !r.Confirmed {
		s.Errorf("Lookup(%q) after Resolve(Confirm) = %+v; want a confirmation marked Resolved", k, r)
	}
	if m := s.mismatch(a, k, "other", idem.Duplicate); string(m.Record.Fingerprint) != "fp" {
		s.Errorf("Claim(%q, other input).Record.Fingerprint = %q; want %q, the quarantined attempts'", k, m.Record.Fingerprint, "fp")
	}
	// Past a lease, within the retention: still done.
	s.wait(s.afterExpiry(lease))
	if c := s.claim(a, k, "fp", idem.Duplicate); string(c.Record.Result) != "settled" {
		s.Errorf("Claim(%q) a lease after Resolve(Confirm) = result %q; want %q: an operator's confirmation lives for the Retention, or the work runs again", k, c.Record.Result, "settled")
	}
	// The work's own confirmation is not marked.
	k2 := s.key("own")
	s.confirm(a, s.claim(a, k2, "fp", idem.Claimed).Lease, "own")
	if c := s.claim(b, k2, "fp", idem.Duplicate); c.Record.Resolved {
		s.Errorf("Claim(%q) of a key its work confirmed: Resolved true; want false", k2)
	}
}

// Resolve with Force clears any key but one in flight: a confirmation (an
// operator's too), a quarantine, a lapsed claim; the next claim then runs
// the work as new, under a greater token.
func resolveForce(s *suite) {
	a, b := s.openWith(crashOpts("w1", 1)), s.openWith(crashOpts("w2", 1))
	rs := s.resolver(a)
	force := idem.Resolution{Force: true}
	if err := rs.Resolve(ctx(s), s.key("none"), force); !isErr(err, idem.ErrNotFound) {
		s.Errorf("Resolve(Force) of a key without a record = %v; want ErrNotFound", err)
	}
	if err := rs.Resolve(ctx(s), s.key("none"), idem.Resolution{Confirm: true, Force: true}); err == nil {
		s.Errorf("Resolve(Confirm and Force) = nil; want an error: Force goes with a forget")
	}

	live := s.key("live")
	c := s.claim(a, live, "fp", idem.Claimed)
	if err := rs.Resolve(ctx(s), live, force); !isErr(err, idem.ErrInProgress) {
		s.Errorf("Resolve(%q, Force) of a live claim = %v; want ErrInProgress: its holder is at work", live, err)
	}
	if err := a.Renew(ctx(s), c.Lease); err != nil {
		s.Errorf("Renew after a refused Resolve(Force) = %v; want nil, the claim left as it was", err)
	}

	done := s.key("done")
	dl := s.claim(a, done, "fp", idem.Claimed).Lease
	s.confirm(a, dl, "r")
	lapsed := s.key("lapsed")
	ll := s.claim(a, lapsed, "fp", idem.Claimed).Lease
	quar := s.key("quarantined")
	leases := s.quarantine([]idem.Store{a, b}, quar, 1)
	s.quarantinedRecord(b, quar)
	byOp := s.key("resolved")
	s.quarantine([]idem.Store{a, b}, byOp, 1)
	s.quarantinedRecord(b, byOp)
	if err := rs.Resolve(ctx(s), byOp, idem.Resolution{Confirm: true, Result: []byte("op")}); err != nil {
		s.Fatalf("Resolve(%q, Confirm) = %v; want nil", byOp, err)
	}
	for _, x := range []struct {
		key   string
		token int64
	}{{done, dl.Token}, {lapsed, ll.Token}, {quar, leases[len(leases)-1].Token}, {byOp, 0}} {
		if err := rs.Resolve(ctx(s), x.key, force); err != nil {
			s.Errorf("Resolve(%q, Force) = %v; want nil, the record cleared", x.key, err)
			continue
		}
		again := s.claim(b, x.key, "fp", idem.Claimed)
		noTakeOver(s, again, "after an operator's Resolve (Force)")
		if again.Lease.Token <= x.token {
			s.Errorf("Claim(%q) after Resolve(Force): token %d <= %d of the record cleared; want greater (fencing)", x.key, again.Lease.Token, x.token)
		}
	}
}

// Quarantined(limit) returns at most limit records: an operator's page,
// and a console's, must not grow past what it asked for.
func quarantinedLimit(s *suite) {
	a, b := s.openWith(crashOpts("w1", 1)), s.openWith(crashOpts("w2", 1))
	rs := s.resolver(a)
	keys := []string{s.key("a"), s.key("b"), s.key("c")}
	// The three keys' attempts lapse together, one wait per round.
	for round := range 2 {
		st := []idem.Store{a, b}[round]
		for _, k := range keys {
			s.claim(st, k, "fp", idem.Claimed)
		}
		s.lapse(s.mark())
	}
	for _, k := range keys {
		s.quarantinedRecord(a, k)
	}
	for _, limit := range []int{1, 2} {
		qs, err := rs.Quarantined(ctx(s), limit)
		if err != nil && strings.Contains(err.Error(), "NOPERM") {
			s.Logf("Quarantined(%d) = %v: this user may not list quarantined keys; an operator's user can", limit, err)
			return
		}
		if err != nil || len(qs) != limit {
			s.Errorf("Quarantined(%d) with 3 keys quarantined = %d records, %v; want %d", limit, len(qs), err, limit)
		}
	}
	if qs, err := rs.Quarantined(ctx(s), 0); err != nil || len(qs) != len(keys) {
		s.Errorf("Quarantined(0) with 3 keys quarantined = %d records, %v; want all 3", len(qs), err)
	}
}

// A quarantined record's Expires is the quarantine's end, a Retention
// after the claim that quarantined it: what an operator reads to know how
// long the key stays stopped.
func quarantineExpires(s *suite) {
	a, b := s.openWith(crashOpts("w1", 1)), s.openWith(crashOpts("w2", 1))
	k := s.key("k")
	s.quarantine([]idem.Store{a, b}, k, 1)
	set := s.mark()
	c0 := time.Now()
	r := s.quarantinedRecord(a, k)
	s.widen(time.Since(c0))
	ret := crashOpts("", 0).Retention
	s.expires("a quarantine (Claim's record)", r.Expires, set, ret)
	l := s.lookup(b, k)
	s.widen(time.Since(c0))
	if !l.Quarantined {
		s.Fatalf("Lookup(%q) of a quarantined key = %+v; want Quarantined", k, l)
	}
	s.expires("a quarantine (Lookup's record)", l.Expires, set, ret)
}

// The last attempt of a quarantined key, stalled rather than crashed,
// wakes up holding a lease that is no longer a claim: its Renew would cut
// the quarantine down to a lease, its Forget delete it, and either starts
// the crash loop again. Both are ErrLeaseLost (its Confirm still records:
// the work happened).
func quarantineLastAttempt(s *suite) {
	a, b := s.openWith(crashOpts("w1", 1)), s.openWith(crashOpts("w2", 1))
	k := s.key("k")
	leases := s.quarantine([]idem.Store{a, b}, k, 1)
	s.quarantinedRecord(a, k)
	last := leases[len(leases)-1]
	owner := []idem.Store{a, b}[(len(leases)-1)%2]
	if err := owner.Renew(ctx(s), last); !isErr(err, idem.ErrLeaseLost) {
		s.Errorf("Renew by the quarantined key's last attempt = %v; want ErrLeaseLost: a quarantine is no one's lease", err)
	}
	if err := owner.Forget(ctx(s), last); !isErr(err, idem.ErrLeaseLost) {
		s.Errorf("Forget by the quarantined key's last attempt = %v; want ErrLeaseLost: a quarantine is no one's lease", err)
	}
	if cp, ok := owner.(idem.Checkpointer); ok {
		if err := cp.Checkpoint(ctx(s), last, []byte("x")); !isErr(err, idem.ErrLeaseLost) {
			s.Errorf("Checkpoint by the quarantined key's last attempt = %v; want ErrLeaseLost", err)
		}
	}
	// Still quarantined, a lease later too.
	s.wait(s.afterExpiry(lease))
	s.quarantinedRecord(b, k)
}

// Inspect shows an operator a lapsed claim before anyone takes it over
// (Lookup answers none, the next Claim takes it over): its owner, token,
// when claimed, checkpoint, and how long the store keeps it. It only
// reads: the next Claim is still told of the take-over.
func inspectLapsed(s *suite) {
	a, b := s.openWith(crashOpts("w1", 3)), s.openWith(crashOpts("w2", 3))
	in, ok := a.(idem.Inspector)
	if !ok {
		s.Skipf("%T does not implement idem.Inspector", a)
	}
	k := s.key("k")
	if _, err := in.Inspect(ctx(s), k); !isErr(err, idem.ErrNotFound) {
		s.Errorf("Inspect(%q) of a new key = %v; want ErrNotFound", k, err)
	}
	before := s.now()
	set := s.mark()
	c0 := time.Now()
	c := s.claim(a, k, "fp", idem.Claimed)
	claimTook := time.Since(c0)
	// The lease runs from the claim's return at the latest: a claim slow
	// on a loaded machine starts it late.
	returned := s.mark()
	if cp, ok := a.(idem.Checkpointer); ok {
		if err := cp.Checkpoint(ctx(s), c.Lease, []byte("step-1")); err != nil {
			s.Fatalf("Checkpoint = %v", err)
		}
	}
	if r, err := in.Inspect(ctx(s), k); err != nil || r.Lapsed != nil || r.Token != c.Lease.Token {
		s.Errorf("Inspect(%q) of a live claim = %+v, %v; want it, not Lapsed", k, r, err)
	}
	s.lapse(returned)
	if _, err := a.Lookup(ctx(s), k); !isErr(err, idem.ErrNotFound) {
		s.Errorf("Lookup(%q) of a lapsed claim = %v; want ErrNotFound", k, err)
	}
	t0 := time.Now()
	r, err := in.Inspect(ctx(s), k)
	s.timed(t0)
	s.widen(claimTook) // the expiry counts from the claim, which took claimTook after set
	if err != nil || r.Lapsed == nil {
		s.Fatalf("Inspect(%q) of a lapsed claim = %+v, %v; want the lapsed attempt", k, r, err)
	}
	if r.Lapsed.Owner != "w1" || r.Lapsed.Token != c.Lease.Token || r.Owner != "w1" || r.Token != c.Lease.Token || r.Confirmed || r.Quarantined {
		s.Errorf("Inspect(%q).Lapsed = %+v (owner %q, token %d); want owner w1, token %d", k, r.Lapsed, r.Owner, r.Token, c.Lease.Token)
	}
	tol := realSlack + s.since(before)
	if s.controlled() {
		tol = lag + s.since(before)
	}
	if d := r.Lapsed.Claimed.Sub(before); d < -tol || d > tol {
		s.Errorf("Inspect(%q).Lapsed.Claimed is %v from when the attempt was claimed; want within ±%v", k, d.Round(time.Millisecond), tol)
	}
	var cp []byte
	if _, ok := a.(idem.Checkpointer); ok {
		cp = []byte("step-1")
	}
	if string(r.Checkpoint) != string(cp) {
		s.Errorf("Inspect(%q).Checkpoint = %q; want %q", k, r.Checkpoint, cp)
	}
	s.expires("a lapsed claim, as kept", r.Expires, set, lease+crashOpts("", 0).Retention)
	next := s.claim(b, k, "fp", idem.Claimed)
	checkTakeOver(s, next, c.Lease, before, 1, cp)
}
