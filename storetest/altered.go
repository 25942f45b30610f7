package storetest

import (
	"fmt"

	"github.com/idemgo/idem"
)

func init() {
	register(check{"Lease/Altered", leaseAltered})
}

func leaseAltered(s *suite) {
	// A lease is what Claim granted, whole: a copy with its Token, Key or
	// Owner changed is no lease of the store's. Taken for one, a Confirm
	// would record work under a token no Claim gave out (0 fences nothing
	// off) or for a key nobody claimed, and a Renew or Forget would act on
	// a claim its caller never held. Refused before any write, every one.
	a, b := s.open("w1"), s.open("w2")
	altered := []struct {
		what string
		// set alters l, a copy of a lease of worker w1; mine is another
		// lease of w1, theirs one of w2.
		set func(l, mine, theirs *idem.Lease)
	}{
		{"Token 0", func(l, _, _ *idem.Lease) { l.Token = 0 }},
		{"Token+1", func(l, _, _ *idem.Lease) { l.Token++ }},
		{"Token-1", func(l, _, _ *idem.Lease) { l.Token-- }},
		{"a Key never claimed", func(l, _, _ *idem.Lease) { l.Key += "/never" }},
		{"the Key and Token of another lease of its worker", func(l, mine, _ *idem.Lease) {
			l.Key, l.Token = mine.Key, mine.Token
		}},
		{"another Owner", func(l, _, _ *idem.Lease) { l.Owner = "w2" }},
		{"the Key, Token and Owner of another worker's lease", func(l, _, theirs *idem.Lease) {
			l.Key, l.Token, l.Owner = theirs.Key, theirs.Token, theirs.Owner
		}},
	}
	// Each alteration on leases of its own, so that what one does wrong
	// (a Forget that marks the lease it was copied from) cannot hide what
	// the next does.
	for i, x := range altered {
		own := s.claim(a, s.key(fmt.Sprintf("own-%d", i)), "fp", idem.Claimed).Lease
		mine := s.claim(a, s.key(fmt.Sprintf("mine-%d", i)), "fp-mine", idem.Claimed).Lease
		theirs := s.claim(b, s.key(fmt.Sprintf("theirs-%d", i)), "fp-theirs", idem.Claimed).Lease
		cp := *own
		x.set(&cp, mine, theirs)
		if err := a.Confirm(ctx(s), &cp, []byte("forged")); !isErr(err, idem.ErrInvalidLease) {
			s.Errorf("Confirm of a copy of a lease with %s = %v; want ErrInvalidLease", x.what, err)
		}
		if err := a.Renew(ctx(s), &cp); !isErr(err, idem.ErrInvalidLease) {
			s.Errorf("Renew of a copy of a lease with %s = %v; want ErrInvalidLease", x.what, err)
		}
		if bt, ok := a.(idem.Batcher); ok {
			// One bad item refuses the whole batch: the good one stays
			// claimed (checked below).
			err := bt.ConfirmBatch(ctx(s), []*idem.Lease{mine, &cp}, [][]byte{[]byte("r"), []byte("forged")})
			if !isErr(err, idem.ErrInvalidLease) {
				s.Errorf("ConfirmBatch with a copy of a lease with %s = %v; want ErrInvalidLease", x.what, err)
			}
		}
		// Refused, the Forget marks nothing either: the lease it was
		// copied from is still good (checked below).
		if err := a.Forget(ctx(s), &cp); !isErr(err, idem.ErrInvalidLease) {
			s.Errorf("Forget of a copy of a lease with %s = %v; want ErrInvalidLease", x.what, err)
		}

		// Nothing written: each claim still its holder's, the key never
		// claimed still unknown.
		for _, l := range []*idem.Lease{own, mine, theirs} {
			r := s.lookup(a, l.Key)
			if r.Confirmed || r.Token != l.Token || r.Owner != l.Owner {
				s.Errorf("after the copy with %s, Lookup(%q) = confirmed %v, token %d, owner %q; want the claim of token %d, owner %q untouched",
					x.what, l.Key, r.Confirmed, r.Token, r.Owner, l.Token, l.Owner)
			}
		}
		if _, err := a.Lookup(ctx(s), own.Key+"/never"); !isErr(err, idem.ErrNotFound) {
			s.Errorf("after the copy with %s, Lookup of a key never claimed = %v; want ErrNotFound (nothing recorded)", x.what, err)
		}
		// And the leases themselves, whole, are as good as before.
		if err := a.Renew(ctx(s), own); err != nil {
			s.Errorf("after the copy with %s, Renew of the lease it came from = %v; want nil", x.what, err)
		}
		if err := a.Confirm(ctx(s), own, []byte("r")); err != nil {
			s.Errorf("after the copy with %s, Confirm of the lease it came from = %v; want nil", x.what, err)
		}
		if err := a.Forget(ctx(s), mine); err != nil {
			s.Errorf("after the copy with %s, Forget of the worker's other lease = %v; want nil", x.what, err)
		}
		if err := b.Confirm(ctx(s), theirs, []byte("r")); err != nil {
			s.Errorf("after the copy with %s, Confirm of the other worker's lease = %v; want nil", x.what, err)
		}
	}
}
