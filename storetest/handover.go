package storetest

import (
	"fmt"
	"time"

	"github.com/idemgo/idem"
)

// Checks of a key changing hands: after a Forget, after a take-over, after
// a confirmation, and of the leases left behind, whose every call must fail
// without touching the holder's record.

func init() {
	register(
		check{"Claim/AfterForget", claimAfterForget},
		check{"Claim/TokenPastForgotten", claimTokenPastForgotten},
		check{"Forget/TwiceAndStaleRenew", forgetTwiceAndStaleRenew},
		check{"Confirm/AfterTakeOverOtherFingerprint", confirmAfterTakeOverOtherFingerprint},
		check{"Claim/RetryAfterLostReply", claimRetryAfterLostReply},
	)
}

// forget calls Forget and fails the check unless it succeeds.
func (s *suite) forget(st idem.Store, l *idem.Lease) {
	s.Helper()
	if err := st.Forget(ctx(s), l); err != nil {
		s.Fatalf("Forget(%q, token %d) = %v; want nil", l.Key, l.Token, err)
	}
}

// lookup calls Lookup and fails the check unless it finds a record.
func (s *suite) lookup(st idem.Store, key string) *idem.Record {
	s.Helper()
	t0 := time.Now()
	r, err := st.Lookup(ctx(s), key)
	s.timed(t0)
	if err != nil {
		s.Fatalf("Lookup(%q) = %v; want its record", key, err)
	}
	return r
}

// afterExpiry is how long after a lease's start the suite takes it for
// expired: a millisecond after its end where the suite moves the clock (a
// store may keep it through its last millisecond, as Redis keeps a key
// through the millisecond it expires in).
func (s *suite) afterExpiry(d time.Duration) time.Duration {
	if s.controlled() {
		return d + time.Millisecond
	}
	return d + realSlack
}

func claimAfterForget(s *suite) {
	a, b := s.open("w1"), s.open("w2")
	k := s.key("k")
	start := s.mark()
	first := s.claim(a, k, "fp1", idem.Claimed)
	s.waitUntil(start, lease*3/5)
	s.forget(a, first.Lease)
	set := s.mark()
	c := s.claim(b, k, "fp2", idem.Claimed)
	l := c.Lease
	if l.Token <= first.Lease.Token || l.Owner != "w2" || string(l.Fingerprint) != "fp2" {
		s.Errorf("Claim after a Forget = token %d owner %q fingerprint %q; want a token above the forgotten %d, owner w2, fingerprint fp2",
			l.Token, l.Owner, l.Fingerprint, first.Lease.Token)
	}
	// A new claim gets a whole lease, not what was left of the forgotten
	// one: else a second worker takes the key over while this one works.
	s.expires("claim after a Forget", l.Expires, set, lease)
	r := s.lookup(a, k)
	checkHolder(s, r, l)
	s.expires("claim after a Forget (Lookup)", r.Expires, set, lease)
	s.waitUntil(start, s.afterExpiry(lease))
	h := s.claim(a, k, "fp2", idem.InProgress)
	checkHolderToken(s, h.Record, l)
	// Confirmed, it is answered with its own result and fingerprint.
	s.confirm(b, l, "r2")
	d := s.claim(a, k, "fp2", idem.Duplicate)
	checkConfirmation(s, d.Record, l, "r2")
	s.mismatch(a, k, "fp1", idem.Duplicate)
}

func claimTokenPastForgotten(s *suite) {
	if s.b.PlantForgotten == nil {
		s.Skip("Backend.PlantForgotten is nil")
	}
	st := s.open("w1")
	// A token an hour ahead of the clock: a Forget within the same tick,
	// or before the clock stepped back.
	ahead := time.Now().Add(time.Hour).UnixMicro()
	k, kb := s.key("k"), s.key("batch")
	for _, key := range []string{k, kb} {
		if err := s.b.PlantForgotten(key, ahead); err != nil {
			s.Fatalf("PlantForgotten(%q, %d) = %v", key, ahead, err)
		}
		// A forgotten claim reads as no record.
		if _, err := st.Lookup(ctx(s), key); !isErr(err, idem.ErrNotFound) {
			s.Fatalf("Lookup(%q) of a forgotten claim = %v; want ErrNotFound", key, err)
		}
	}
	c := s.claim(st, k, "", idem.Claimed)
	if c.Lease.Token <= ahead {
		s.Errorf("Claim after a Forget of token %d = token %d; want greater (fencing), whatever the clock says", ahead, c.Lease.Token)
	}
	if b, ok := st.(idem.Batcher); ok {
		cs, err := b.ClaimBatch(ctx(s), []string{s.key("fresh"), kb}, nil)
		if err != nil || len(cs) != 2 || cs[1].Outcome != idem.Claimed {
			s.Fatalf("ClaimBatch(new, forgotten) = %v, %v; want both claimed", cs, err)
		}
		if cs[1].Lease.Token <= ahead {
			s.Errorf("ClaimBatch after a Forget of token %d = token %d; want greater", ahead, cs[1].Lease.Token)
		}
	}
}

func forgetTwiceAndStaleRenew(s *suite) {
	a, b := s.open("w1"), s.open("w2")

	// A forgotten lease is lost: forgetting or renewing it again changes
	// nothing.
	k := s.key("forgotten")
	c := s.claim(a, k, "fp", idem.Claimed)
	s.forget(a, c.Lease)
	if err := a.Forget(ctx(s), c.Lease); !isErr(err, idem.ErrLeaseLost) {
		s.Errorf("second Forget = %v; want ErrLeaseLost (there is nothing of this lease's left)", err)
	}
	if err := a.Renew(ctx(s), c.Lease); !isErr(err, idem.ErrLeaseLost) {
		s.Errorf("Renew after Forget = %v; want ErrLeaseLost", err)
	}
	if _, err := a.Lookup(ctx(s), k); !isErr(err, idem.ErrNotFound) {
		s.Errorf("Lookup after Forget, Forget, Renew = %v; want ErrNotFound (nothing resurrected)", err)
	}

	// A lease taken over: neither it nor a lease forged from it and the
	// holder's may renew or forget the holder's claim.
	k = s.key("taken")
	start := s.mark()
	first := s.claim(a, k, "fp", idem.Claimed)
	s.waitUntil(start, s.afterExpiry(lease))
	set := s.mark()
	second := s.claim(b, k, "fp", idem.Claimed)
	s.wait(lease / 4)
	stale := []struct {
		st   idem.Store
		l    *idem.Lease
		what string
	}{
		{a, first.Lease, "the overtaken lease"},
		{a, s.forge(a, k, second.Lease.Token, "w1"), "the holder's token with another owner"},
		{b, s.forge(b, k, first.Lease.Token, "w2"), "the holder's owner with the old token"},
	}
	for _, x := range stale {
		if err := x.st.Renew(ctx(s), x.l); !isErr(err, idem.ErrLeaseLost) {
			s.Errorf("Renew of %s = %v; want ErrLeaseLost", x.what, err)
		}
		if err := x.st.Forget(ctx(s), x.l); !isErr(err, idem.ErrLeaseLost) {
			s.Errorf("Forget of %s = %v; want ErrLeaseLost", x.what, err)
		}
	}
	r := s.lookup(a, k)
	checkHolderToken(s, r, second.Lease)
	s.expires("holder after stale renewals", r.Expires, set, lease)

	// A lease whose key its own confirmation holds is no longer leased:
	// renewing or forgetting it touches neither the result nor retention.
	k = s.key("confirmed")
	c = s.claim(a, k, "fp", idem.Claimed)
	set = s.mark()
	s.confirm(a, c.Lease, "r")
	s.wait(lease / 4)
	if err := a.Renew(ctx(s), c.Lease); !isErr(err, idem.ErrLeaseLost) {
		s.Errorf("Renew of a confirmed lease = %v; want ErrLeaseLost", err)
	}
	if err := a.Forget(ctx(s), c.Lease); !isErr(err, idem.ErrLeaseLost) {
		s.Errorf("Forget of a confirmed lease = %v; want ErrLeaseLost (a confirmation is never forgotten)", err)
	}
	d := s.claim(b, k, "fp", idem.Duplicate)
	checkConfirmation(s, d.Record, c.Lease, "r")
	s.expires("confirmation after Renew and Forget of its lease", d.Record.Expires, set, retention)
}

func confirmAfterTakeOverOtherFingerprint(s *suite) {
	// a stalled past its lease; b took the key over for another request
	// (another fingerprint); a's late confirmation records a's request,
	// or a duplicate of b's request would be answered with a's result.
	a, b := s.open("w1"), s.open("w2")
	k := s.key("k")
	start := s.mark()
	first := s.claim(a, k, "fp-a", idem.Claimed)
	s.waitUntil(start, s.afterExpiry(lease))
	second := s.claim(b, k, "fp-b", idem.Claimed)
	s.confirm(a, first.Lease, "from-a")
	d := s.claim(a, k, "fp-a", idem.Duplicate)
	checkConfirmation(s, d.Record, first.Lease, "from-a")
	m := s.mismatch(b, k, "fp-b", idem.Duplicate)
	checkConfirmation(s, m.Record, first.Lease, "from-a")
	if err := b.Confirm(ctx(s), second.Lease, []byte("from-b")); !isErr(err, idem.ErrAlreadyConfirmed) {
		s.Errorf("Confirm of the overtaken lease = %v; want ErrAlreadyConfirmed", err)
	}
	r := s.lookup(b, k)
	checkConfirmation(s, r, first.Lease, "from-a")
}

// batchSizes cross the Redis store's chunk of 128 keys per script call,
// and stay under a SQL batch's bind limit.
var batchSizes = []int{129, 300}

func init() { register(check{"Batch/Large", batchLarge}) }

func batchLarge(s *suite) {
	// Leases long enough for a slow backend to get through 600 keys.
	o := idem.Options{LeaseTTL: 10 * lease, Retention: 10 * lease}
	o.Worker = "w1"
	st := s.openWith(o)
	o.Worker = "w2"
	other := s.openWith(o)
	b := batcher(s, st)
	for _, n := range batchSizes {
		keys := make([]string, n)
		fps := make([][]byte, n)
		for i := range keys {
			keys[i] = s.key(fmt.Sprintf("%d/%d", n, i))
			fps[i] = fmt.Appendf(nil, "fp%d", i)
		}
		// At the end, past the first chunk: a confirmed key, a forgotten
		// key, a key another worker holds, and a key given twice.
		done, gone, held, twice := n-1, n-2, n-3, n-4
		dl := s.claim(st, keys[done], string(fps[done]), idem.Claimed).Lease
		s.confirm(st, dl, "r-done")
		hl := s.claim(other, keys[held], string(fps[held]), idem.Claimed).Lease
		gl := s.claim(st, keys[gone], string(fps[gone]), idem.Claimed).Lease
		s.forget(st, gl)
		keys[twice], fps[twice] = keys[twice-1], fps[twice-1]

		t0 := time.Now()
		cs, err := b.ClaimBatch(ctx(s), keys, fps)
		s.timed(t0)
		if err != nil || len(cs) != n {
			s.Fatalf("ClaimBatch of %d keys = %d claims, %v; want %d, nil", n, len(cs), err, n)
		}
		var leases []*idem.Lease
		for i, c := range cs {
			want := idem.Claimed
			switch i {
			case done:
				want = idem.Duplicate
			case held, twice:
				want = idem.InProgress
			}
			if c.Outcome != want {
				s.Fatalf("ClaimBatch of %d keys: item %d = %v; want %v", n, i, c.Outcome, want)
			}
			switch i {
			case done:
				checkConfirmation(s, c.Record, dl, "r-done")
			case held:
				checkHolder(s, c.Record, hl)
			case twice:
				checkHolder(s, c.Record, cs[twice-1].Lease)
			default:
				l := c.Lease
				if l.Key != keys[i] || l.Owner != "w1" || l.Token <= 0 || string(l.Fingerprint) != string(fps[i]) {
					s.Fatalf("ClaimBatch of %d keys: item %d lease = %+v; want key %q, owner w1, fingerprint %q", n, i, l, keys[i], fps[i])
				}
				leases = append(leases, l)
			}
		}
		if l := cs[gone].Lease; l.Token <= gl.Token {
			s.Errorf("ClaimBatch of %d keys: token %d after a forgotten %d; want greater", n, l.Token, gl.Token)
		}
		results := make([][]byte, len(leases))
		for i, l := range leases {
			results[i] = []byte("r-" + l.Key)
		}
		if err := b.ConfirmBatch(ctx(s), leases, results); err != nil {
			s.Fatalf("ConfirmBatch of %d leases = %v; want nil", len(leases), err)
		}
		again := make([]string, len(leases))
		for i, l := range leases {
			again[i] = l.Key
		}
		ds, err := b.ClaimBatch(ctx(s), again, nil)
		if err != nil || len(ds) != len(again) {
			s.Fatalf("ClaimBatch of %d confirmed keys = %d claims, %v; want %d, nil", len(again), len(ds), err, len(again))
		}
		for i, d := range ds {
			if d.Outcome != idem.Duplicate {
				s.Fatalf("ClaimBatch of %d confirmed keys: item %d = %v; want Duplicate (every item of the ConfirmBatch recorded)", len(again), i, d.Outcome)
			}
			checkConfirmation(s, d.Record, leases[i], string(results[i]))
		}
		s.claim(st, keys[held], "", idem.InProgress)
	}
}

func claimRetryAfterLostReply(s *suite) {
	if s.b.LoseReply == nil {
		s.Skip("the backend cannot lose a reply (Backend.LoseReply)")
	}
	st := s.open("w1")
	k := s.key("k")
	// A first claim warms the store up (a script loaded, a connection
	// made), so that the reply lost is the claim's own.
	s.claim(st, s.key("warm"), "fp", idem.Claimed)
	set := s.mark()
	// The first execution's reply is lost and half a lease passes on the
	// store's clock before the client's retry, which gets the same lease
	// back: it has half a lease left, and Expires must say no more.
	s.b.LoseReply(k, lease/2)
	if s.controlled() {
		s.mu.Lock()
		s.virtual += lease / 2
		s.mu.Unlock()
	}
	c := s.claim(st, k, "fp", idem.Claimed)
	s.expires("lease of a claim retried after a lost reply", c.Lease.Expires, set, lease)
	checkHolder(s, s.lookup(st, k), c.Lease)
}
