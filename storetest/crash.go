package storetest

import (
	"bytes"
	"fmt"
	"strings"
	"time"

	"github.com/idemgo/idem"
)

// After a crash (DESIGN 3.6): the next holder is told it takes over, with
// the earlier attempt and its last checkpoint, and a crash loop stops.

func init() {
	register(
		check{"TakeOver/Reported", takeOverReported},
		check{"TakeOver/NotAfterForgetOrRetention", takeOverNotAfterForgetOrRetention},
		check{"TakeOver/LapsedClaimNotHeld", takeOverLapsedNotHeld},
		check{"TakeOver/AbandonedToldWhy", takeOverAbandoned},
		check{"Checkpoint/CarriedAcrossTakeOvers", checkpointCarried},
		check{"Checkpoint/OnlyByTheLiveLease", checkpointOnlyLiveLease},
		check{"Quarantine/AfterMaxTakeOvers", quarantineAfterMax},
		check{"Quarantine/ResolvedByAnOperator", quarantineResolved},
	)
}

// crashOpts are the options of the stores of a crash check: a retention
// long enough that what a store remembers of a lapsed claim (its
// Retention) outlasts every wait of the check.
func crashOpts(worker string, maxTakeOvers int) idem.Options {
	return idem.Options{Worker: worker, Retention: 20 * time.Second, MaxTakeOvers: maxTakeOvers}
}

// lapse lets the lease of a claim that returned at set run out. From the
// claim's return, not its start: a claim slow to run on a busy machine
// starts its lease late.
func (s *suite) lapse(set time.Duration) { s.waitUntil(set, s.afterExpiry(lease)) }

// crashAndTakeOver claims k on from, lets the lease run out unconfirmed (the
// holder "crashed"), and returns the next claim, made on to, which must be a
// take-over.
func (s *suite) crashAndTakeOver(from, to idem.Store, k string) (first, next idem.Claim) {
	s.Helper()
	first = s.claim(from, k, "fp", idem.Claimed)
	s.lapse(s.mark())
	next = s.claim(to, k, "fp", idem.Claimed)
	return first, next
}

// checkTakeOver checks that c reports taking over l, the n-th take-over
// in a row, with checkpoint cp.
func checkTakeOver(s *suite, c idem.Claim, l *idem.Lease, claimedAt time.Time, n int, cp []byte) {
	s.Helper()
	if !c.TakeOver {
		s.Fatalf("Claim(%q) after the lease of token %d ran out unconfirmed: TakeOver false; want true: the next holder must be told an earlier attempt may have done part of the work",
			l.Key, l.Token)
	}
	if c.Prior == nil {
		s.Fatalf("Claim(%q).Prior = nil with TakeOver; want the attempt taken over", l.Key)
	}
	if c.Prior.Owner != l.Owner || c.Prior.Token != l.Token {
		s.Errorf("Claim(%q).Prior = owner %q token %d; want the lapsed lease's owner %q token %d",
			l.Key, c.Prior.Owner, c.Prior.Token, l.Owner, l.Token)
	}
	// When it was claimed, by the store's clock: within the time from
	// claimedAt to the end of the claim call that followed it, and the
	// slack of a clock the suite does not move.
	tol := realSlack + s.since(claimedAt)
	if s.controlled() {
		tol = lag + s.since(claimedAt)
	}
	if d := c.Prior.Claimed.Sub(claimedAt); d < -tol || d > tol {
		s.Errorf("Claim(%q).Prior.Claimed is %v from when the attempt was claimed; want within ±%v",
			l.Key, d.Round(time.Millisecond), tol)
	}
	if c.TakeOvers != n {
		s.Errorf("Claim(%q).TakeOvers = %d; want %d (take-overs in a row, this one included)", l.Key, c.TakeOvers, n)
	}
	if !bytes.Equal(c.Checkpoint, cp) {
		s.Errorf("Claim(%q).Checkpoint = %q; want %q, the last checkpoint recorded", l.Key, c.Checkpoint, cp)
	}
	if c.Lease.Token <= l.Token {
		s.Errorf("take-over token %d <= lapsed lease's %d; want strictly greater (fencing)", c.Lease.Token, l.Token)
	}
}

// noTakeOver checks that c is not reported as a take-over.
func noTakeOver(s *suite, c idem.Claim, why string) {
	s.Helper()
	if c.TakeOver || c.Prior != nil || c.TakeOvers != 0 || c.Checkpoint != nil {
		s.Errorf("Claim(%q) %s: TakeOver %v, Prior %+v, TakeOvers %d, Checkpoint %q; want none of them",
			c.Lease.Key, why, c.TakeOver, c.Prior, c.TakeOvers, c.Checkpoint)
	}
}

func takeOverReported(s *suite) {
	a, b := s.openWith(crashOpts("w1", 0)), s.openWith(crashOpts("w2", 0))
	k := s.key("k")
	fresh := s.claim(a, k+"-fresh", "fp", idem.Claimed)
	noTakeOver(s, fresh, "of a new key")
	at := s.now()
	first, second := s.crashAndTakeOver(a, b, k)
	checkTakeOver(s, second, first.Lease, at, 1, nil)
	// The live claim after a take-over says so to Lookup too.
	r := s.lookup(b, k)
	if r.TakeOvers != 1 || r.Prior == nil || r.Prior.Token != first.Lease.Token {
		s.Errorf("Lookup(%q) after a take-over: TakeOvers %d, Prior %+v; want 1 and the attempt taken over (token %d)",
			k, r.TakeOvers, r.Prior, first.Lease.Token)
	}
	s.confirm(b, second.Lease, "r")
	if r := s.lookup(a, k); !r.Confirmed || r.Quarantined {
		s.Errorf("Lookup(%q) after the take-over's Confirm = %+v; want the confirmation", k, r)
	}
}

func takeOverNotAfterForgetOrRetention(s *suite) {
	a, b := s.openWith(crashOpts("w1", 0)), s.openWith(crashOpts("w2", 0))
	k := s.key("forgotten")
	// A Forget says the work failed; it did not crash.
	first := s.claim(a, k, "fp", idem.Claimed)
	s.forget(a, first.Lease)
	noTakeOver(s, s.claim(b, k, "fp", idem.Claimed), "after the holder's Forget")

	// A confirmation whose retention ended is a new key.
	shortA, shortB := s.open("w3"), s.open("w4")
	k2 := s.key("retained")
	c := s.claim(shortA, k2, "fp", idem.Claimed)
	s.confirm(shortA, c.Lease, "r")
	s.wait(retention + slack)
	noTakeOver(s, s.claim(shortB, k2, "fp", idem.Claimed), "after a confirmation's retention ended")
}

func takeOverLapsedNotHeld(s *suite) {
	a, b := s.openWith(crashOpts("w1", 0)), s.openWith(crashOpts("w2", 0))
	k := s.key("k")
	first := s.claim(a, k, "fp", idem.Claimed)
	s.lapse(s.mark())
	// Remembered for the take-over, the lapsed claim is no longer held.
	if r, err := b.Lookup(ctx(s), k); !isErr(err, idem.ErrNotFound) {
		s.Errorf("Lookup(%q) of a lapsed claim = %+v, %v; want ErrNotFound: its lease ran out", k, r, err)
	}
	if err := a.Renew(ctx(s), first.Lease); !isErr(err, idem.ErrLeaseLost) {
		s.Errorf("Renew of a lapsed lease = %v; want ErrLeaseLost", err)
	}
	if cp, ok := a.(idem.Checkpointer); ok {
		if err := cp.Checkpoint(ctx(s), first.Lease, []byte("late")); !isErr(err, idem.ErrLeaseLost) {
			s.Errorf("Checkpoint of a lapsed lease = %v; want ErrLeaseLost", err)
		}
	}
	second := s.claim(b, k, "fp", idem.Claimed)
	if !second.TakeOver || second.Checkpoint != nil {
		s.Errorf("Claim(%q) after the lapse = TakeOver %v, Checkpoint %q; want a take-over without checkpoint (the lapsed lease's was refused)",
			k, second.TakeOver, second.Checkpoint)
	}
	s.claim(a, k, "fp", idem.InProgress)
}

// takeOverAbandoned: a holder that gives its key up saying why
// (Abandoner) is taken over as after a crash, and the next holder and an
// operator are told why; an attempt that said nothing is told as a lapse,
// and a reason is never carried past the attempt that gave it.
func takeOverAbandoned(s *suite) {
	a, b, c := s.openWith(crashOpts("w1", 0)), s.openWith(crashOpts("w2", 0)), s.openWith(crashOpts("w3", 0))
	ab, ok := a.(idem.Abandoner)
	if !ok {
		s.Skipf("%T does not implement idem.Abandoner", a)
	}
	k := s.key("k")
	const why = "Reconcile failed: the bank did not answer"
	first := s.claim(a, k, "fp", idem.Claimed)
	set := s.mark()
	// Bad input is refused before anything is written.
	for _, bad := range []struct {
		reason string
		want   string
	}{{"", "empty"}, {strings.Repeat("x", idem.MaxReasonBytes+1), "MaxReasonBytes"}, {"bad \xff", "UTF-8"}} {
		if err := ab.Abandon(ctx(s), first.Lease, bad.reason); err == nil || !strings.Contains(err.Error(), bad.want) {
			s.Errorf("Abandon with a reason of %d bytes = %v; want an error naming %q", len(bad.reason), err, bad.want)
		}
	}
	if err := ab.Abandon(ctx(s), first.Lease, why); err != nil {
		s.Fatalf("Abandon(%q, token %d) = %v; want nil", k, first.Lease.Token, err)
	}
	// Nothing else changes: the claim is still held, by the same lease.
	if r := s.lookup(b, k); r.Confirmed || r.Token != first.Lease.Token || r.Ended != why {
		s.Errorf("Lookup(%q) after Abandon = token %d, confirmed %v, Ended %q; want the live claim (token %d), Ended %q",
			k, r.Token, r.Confirmed, r.Ended, first.Lease.Token, why)
	}
	s.claim(b, k, "fp", idem.InProgress)
	s.lapse(set)
	if in, ok := a.(idem.Inspector); ok {
		r, err := in.Inspect(ctx(s), k)
		if err != nil || r.Lapsed == nil || r.Lapsed.Ended != why || r.Ended != why {
			s.Errorf("Inspect(%q) of the abandoned attempt once lapsed = %+v, %v; want Lapsed with Ended %q", k, r, err, why)
		}
	}
	if err := ab.Abandon(ctx(s), first.Lease, why); !isErr(err, idem.ErrLeaseLost) {
		s.Errorf("Abandon of a lapsed lease = %v; want ErrLeaseLost", err)
	}
	second := s.claim(b, k, "fp", idem.Claimed)
	set = s.mark()
	if !second.TakeOver || second.Prior == nil || second.Prior.Token != first.Lease.Token || second.Prior.Ended != why {
		s.Fatalf("Claim(%q) after an Abandon = TakeOver %v, Prior %+v; want the take-over of token %d, Prior.Ended %q",
			k, second.TakeOver, second.Prior, first.Lease.Token, why)
	}
	if t := idem.TakeOverOf(second); t.Prior.Ended != why {
		s.Errorf("TakeOverOf(claim).Prior.Ended = %q; want %q", t.Prior.Ended, why)
	}
	// The new holder's own attempt has said nothing; the earlier one's
	// reason is not its own.
	if r := s.lookup(b, k); r.Ended != "" || (r.Prior != nil && r.Prior.Ended != "") {
		s.Errorf("Lookup(%q) of the holder after the take-over = Ended %q, Prior %+v; want no reason: its attempt gave none", k, r.Ended, r.Prior)
	}
	// The second holder crashes, saying nothing: the third is told a
	// lapse, not the first holder's reason.
	s.lapse(set)
	third := s.claim(c, k, "fp", idem.Claimed)
	if third.Prior == nil || third.Prior.Token != second.Lease.Token || third.Prior.Ended != "" {
		s.Errorf("Claim(%q) after a crash that said nothing = Prior %+v; want token %d and no Ended", k, third.Prior, second.Lease.Token)
	}
	s.confirm(c, third.Lease, "r")
	if err := ab.Abandon(ctx(s), third.Lease, why); !isErr(err, idem.ErrLeaseLost) {
		s.Errorf("Abandon after the lease's Confirm = %v; want ErrLeaseLost", err)
	}
	if r := s.lookup(a, k); !r.Confirmed || r.Ended != "" {
		s.Errorf("Lookup(%q) after the Confirm = confirmed %v, Ended %q; want the confirmation, no reason", k, r.Confirmed, r.Ended)
	}

	// A key quarantined at an attempt that said why keeps the reason.
	q1, q2 := s.openWith(crashOpts("w1", 1)), s.openWith(crashOpts("w2", 1))
	kq := s.key("poison")
	var leases []*idem.Lease
	for i, st := range []idem.Store{q1, q2} {
		cl := s.claim(st, kq, "fp", idem.Claimed)
		set := s.mark()
		leases = append(leases, cl.Lease)
		if err := st.(idem.Abandoner).Abandon(ctx(s), cl.Lease, fmt.Sprintf("attempt %d gave up", i+1)); err != nil {
			s.Fatalf("Abandon(%q, attempt %d) = %v; want nil", kq, i+1, err)
		}
		s.lapse(set)
	}
	cl, err := q1.Claim(ctx(s), kq, []byte("fp"))
	if !isErr(err, idem.ErrQuarantined) || cl.Record == nil || cl.Record.Token != leases[1].Token ||
		cl.Record.Ended != "attempt 2 gave up" || !strings.Contains(err.Error(), "attempt 2 gave up") {
		s.Errorf("Claim(%q) quarantined after abandoned attempts = %+v, %v; want ErrQuarantined naming the last attempt's reason %q",
			kq, cl.Record, err, "attempt 2 gave up")
	}
	if r := s.lookup(q2, kq); !r.Quarantined || r.Ended != "attempt 2 gave up" {
		s.Errorf("Lookup(%q) of the quarantined key = %+v; want Quarantined, Ended %q", kq, r, "attempt 2 gave up")
	}
}

// checkpointer returns st as a Checkpointer, or skips the check.
func checkpointer(s *suite, st idem.Store) idem.Checkpointer {
	s.Helper()
	cp, ok := st.(idem.Checkpointer)
	if !ok {
		s.Skipf("%T does not implement idem.Checkpointer", st)
	}
	return cp
}

func (s *suite) checkpoint(st idem.Store, l *idem.Lease, data string) {
	s.Helper()
	if err := checkpointer(s, st).Checkpoint(ctx(s), l, []byte(data)); err != nil {
		s.Fatalf("Checkpoint(%q, token %d, %q) = %v; want nil", l.Key, l.Token, data, err)
	}
}

func checkpointCarried(s *suite) {
	a, b, c := s.openWith(crashOpts("w1", 0)), s.openWith(crashOpts("w2", 0)), s.openWith(crashOpts("w3", 0))
	k := s.key("k")
	at := s.now()
	first := s.claim(a, k, "fp", idem.Claimed)
	set := s.mark()
	s.checkpoint(a, first.Lease, "step 1")
	s.checkpoint(a, first.Lease, "step 2")
	s.lapse(set)
	at2 := s.now()
	second := s.claim(b, k, "fp", idem.Claimed)
	set = s.mark()
	checkTakeOver(s, second, first.Lease, at, 1, []byte("step 2"))
	// The second holder crashes before a checkpoint of its own: the
	// third still resumes after step 2.
	s.lapse(set)
	third := s.claim(c, k, "fp", idem.Claimed)
	checkTakeOver(s, third, second.Lease, at2, 2, []byte("step 2"))
	s.checkpoint(c, third.Lease, "")
	if r := s.lookup(c, k); r.Checkpoint != nil {
		s.Errorf("Lookup(%q).Checkpoint after an empty Checkpoint = %q; want nil (cleared)", k, r.Checkpoint)
	}
	// Bounded: a checkpoint is a note of progress, not the work's data.
	big := make([]byte, idem.MaxCheckpointBytes+1)
	if err := checkpointer(s, c).Checkpoint(ctx(s), third.Lease, big); !isErr(err, idem.ErrTooLarge) {
		s.Errorf("Checkpoint of %d bytes = %v; want ErrTooLarge", len(big), err)
	}
}

func checkpointOnlyLiveLease(s *suite) {
	a, b, c := s.openWith(crashOpts("w1", 0)), s.openWith(crashOpts("w2", 0)), s.openWith(crashOpts("w3", 0))
	k := s.key("k")
	first, second := s.crashAndTakeOver(a, b, k)
	// The stalled first holder wakes up: its progress must not overwrite
	// its successor's.
	if err := checkpointer(s, a).Checkpoint(ctx(s), first.Lease, []byte("stale")); !isErr(err, idem.ErrLeaseLost) {
		s.Errorf("Checkpoint by a lease taken over = %v; want ErrLeaseLost", err)
	}
	s.checkpoint(b, second.Lease, "b's step")
	s.lapse(s.mark())
	third := s.claim(c, k, "fp", idem.Claimed)
	if string(third.Checkpoint) != "b's step" {
		s.Errorf("Claim(%q).Checkpoint = %q; want %q, the live holder's, not the stale one's", k, third.Checkpoint, "b's step")
	}
	s.confirm(c, third.Lease, "r")
	if err := checkpointer(s, c).Checkpoint(ctx(s), third.Lease, []byte("after")); !isErr(err, idem.ErrLeaseLost) {
		s.Errorf("Checkpoint after the lease's Confirm = %v; want ErrLeaseLost", err)
	}
}

// quarantine drives k through max take-overs that all lapse, and returns
// the leases of its attempts, in order.
func (s *suite) quarantine(stores []idem.Store, k string, max int) []*idem.Lease {
	s.Helper()
	var leases []*idem.Lease
	for i := 0; i <= max; i++ {
		c := s.claim(stores[i%len(stores)], k, "fp", idem.Claimed)
		set := s.mark()
		if i > 0 && c.TakeOvers != i {
			s.Errorf("Claim(%q) attempt %d: TakeOvers %d; want %d", k, i+1, c.TakeOvers, i)
		}
		leases = append(leases, c.Lease)
		s.lapse(set)
	}
	return leases
}

// quarantined claims k and checks that the store refuses it as quarantined
// after the attempts of leases.
func (s *suite) quarantined(st idem.Store, k string, leases []*idem.Lease) {
	s.Helper()
	c, err := st.Claim(ctx(s), k, []byte("fp"))
	if !isErr(err, idem.ErrQuarantined) {
		s.Fatalf("Claim(%q) after %d take-overs that all lapsed = %v, %v; want ErrQuarantined: a crash loop must stop",
			k, len(leases)-1, c.Outcome, err)
	}
	if c.Lease != nil || c.Record == nil || !c.Record.Quarantined {
		s.Fatalf("Claim(%q) quarantined: lease %v, record %+v; want no lease and the quarantined record", k, c.Lease, c.Record)
	}
	last, prev := leases[len(leases)-1], leases[len(leases)-2]
	r := c.Record
	if r.Ended != "" {
		s.Errorf("quarantined record's Ended = %q; want none: its last attempt said nothing, its lease ran out", r.Ended)
	}
	if r.Token != last.Token || r.Owner != last.Owner || r.TakeOvers != len(leases)-1 ||
		r.Prior == nil || r.Prior.Token != prev.Token || r.Prior.Owner != prev.Owner {
		s.Errorf("quarantined record = token %d owner %q take-overs %d prior %+v; want the last attempt (token %d, %q), %d take-overs, prior token %d",
			r.Token, r.Owner, r.TakeOvers, r.Prior, last.Token, last.Owner, len(leases)-1, prev.Token)
	}
}

func quarantineAfterMax(s *suite) {
	const max = 2
	a, b := s.openWith(crashOpts("w1", max)), s.openWith(crashOpts("w2", max))
	k := s.key("poison")
	leases := s.quarantine([]idem.Store{a, b}, k, max)
	s.quarantined(b, k, leases)
	// It stays so, for everyone, until an operator settles it.
	s.wait(s.afterExpiry(lease))
	s.quarantined(a, k, leases)
	if r := s.lookup(a, k); !r.Quarantined {
		s.Errorf("Lookup(%q) of a quarantined key = %+v; want Quarantined", k, r)
	}
	if rs, ok := a.(idem.Resolver); ok {
		qs, err := rs.Quarantined(ctx(s), 0)
		switch {
		case err != nil && strings.Contains(err.Error(), "NOPERM"):
			// An operator's listing, which a store's least-privileged
			// Redis user may not make (SCAN): said, not failed.
			s.Logf("Quarantined() = %v: this user may not list quarantined keys; an operator's user can", err)
		case err != nil || len(qs) != 1 || qs[0].Key != k || !qs[0].Quarantined:
			s.Errorf("Quarantined() = %d records, %v; want the one key quarantined", len(qs), err)
		}
	}
	// A late Confirm by the last attempt settles it: its work happened.
	last := leases[len(leases)-1]
	if err := a.Confirm(ctx(s), last, []byte("late")); err != nil {
		s.Errorf("late Confirm of the quarantined key's last attempt = %v; want nil, recorded", err)
	}
	if c := s.claim(b, k, "fp", idem.Duplicate); string(c.Record.Result) != "late" {
		s.Errorf("Claim(%q) after the late Confirm = result %q; want %q", k, c.Record.Result, "late")
	}
}

func quarantineResolved(s *suite) {
	const max = 1
	a, b := s.openWith(crashOpts("w1", max)), s.openWith(crashOpts("w2", max))
	rs, ok := a.(idem.Resolver)
	if !ok {
		s.Skipf("%T does not implement idem.Resolver", a)
	}
	k := s.key("confirm")
	if err := rs.Resolve(ctx(s), k, idem.Resolution{Confirm: true, Result: []byte("r")}); !isErr(err, idem.ErrNotFound) {
		s.Errorf("Resolve of a key that is not quarantined = %v; want ErrNotFound, nothing written", err)
	}
	leases := s.quarantine([]idem.Store{a, b}, k, max)
	s.quarantined(b, k, leases)
	if err := rs.Resolve(ctx(s), k, idem.Resolution{Confirm: true, Result: []byte("settled")}); err != nil {
		s.Fatalf("Resolve(%q, Confirm) = %v; want nil", k, err)
	}
	if c := s.claim(b, k, "fp", idem.Duplicate); string(c.Record.Result) != "settled" {
		s.Errorf("Claim(%q) after Resolve(Confirm) = result %q; want %q", k, c.Record.Result, "settled")
	}
	// The stalled last attempt's Confirm does not replace the operator's.
	if err := b.Confirm(ctx(s), leases[len(leases)-1], []byte("late")); !isErr(err, idem.ErrAlreadyConfirmed) {
		s.Errorf("late Confirm after Resolve(Confirm) = %v; want ErrAlreadyConfirmed, the operator's result kept", err)
	}

	k2 := s.key("forget")
	leases = s.quarantine([]idem.Store{a, b}, k2, max)
	s.quarantined(a, k2, leases)
	if err := rs.Resolve(ctx(s), k2, idem.Resolution{}); err != nil {
		s.Fatalf("Resolve(%q, forget) = %v; want nil", k2, err)
	}
	again := s.claim(b, k2, "fp", idem.Claimed)
	noTakeOver(s, again, "after an operator's Resolve (forget)")
	if again.Lease.Token <= leases[len(leases)-1].Token {
		s.Errorf("token after Resolve %d <= last attempt's %d; want strictly greater (fencing)", again.Lease.Token, leases[len(leases)-1].Token)
	}
}
