package storetest

import "github.com/idemgo/idem"

func init() {
	register(
		check{"Lease/FromAnotherStore", leaseFromAnotherStore},
		check{"Confirm/AfterOwnForget", confirmAfterOwnForget},
	)
}

func leaseFromAnotherStore(s *suite) {
	// A lease belongs to the store that granted it: given to another
	// store, a Confirm would record a key that was never claimed there.
	st := s.open("w1")
	other, err := idem.NewMemoryStore(idem.Options{Worker: "w1"})
	if err != nil {
		s.Fatalf("NewMemoryStore: %v", err)
	}
	k := s.key("k")
	c, err := other.Claim(ctx(s), k, []byte("fp"))
	if err != nil || c.Outcome != idem.Claimed {
		s.Fatalf("Claim(%q) on a MemoryStore = %v, %v; want claimed", k, c.Outcome, err)
	}
	l := c.Lease
	if err := st.Confirm(ctx(s), l, []byte("r")); !isErr(err, idem.ErrInvalidLease) {
		s.Errorf("Confirm of another store's lease = %v; want ErrInvalidLease", err)
	}
	if err := st.Renew(ctx(s), l); !isErr(err, idem.ErrInvalidLease) {
		s.Errorf("Renew of another store's lease = %v; want ErrInvalidLease", err)
	}
	if b, ok := st.(idem.Batcher); ok {
		own := s.claim(st, s.key("own"), "fp", idem.Claimed)
		err := b.ConfirmBatch(ctx(s), []*idem.Lease{own.Lease, l}, nil)
		if !isErr(err, idem.ErrInvalidLease) {
			s.Errorf("ConfirmBatch with another store's lease = %v; want ErrInvalidLease", err)
		}
		// Refused before any write: the valid item is still only claimed.
		s.claim(st, own.Lease.Key, "fp", idem.InProgress)
	}
	if err := st.Forget(ctx(s), l); !isErr(err, idem.ErrInvalidLease) {
		s.Errorf("Forget of another store's lease = %v; want ErrInvalidLease", err)
	}
	if _, err := st.Lookup(ctx(s), k); !isErr(err, idem.ErrNotFound) {
		s.Errorf("Lookup after another store's lease was given = %v; want ErrNotFound (nothing written)", err)
	}
	// The lease is still good where it was granted.
	if err := other.Confirm(ctx(s), l, []byte("r")); err != nil {
		s.Errorf("Confirm of the lease on its own store = %v; want nil", err)
	}
}

func confirmAfterOwnForget(s *suite) {
	// A forgot: it said the work did not happen. B then claimed the key
	// and is at work. A's later Confirm must not overwrite B's claim (B's
	// renewals would fail and its work be cancelled), and must tell A.
	a, b := s.open("w1"), s.open("w2")
	k := s.key("k")
	first := s.claim(a, k, "fp", idem.Claimed)
	s.forget(a, first.Lease)
	second := s.claim(b, k, "fp", idem.Claimed)
	if err := a.Confirm(ctx(s), first.Lease, []byte("from-a")); !isErr(err, idem.ErrLeaseLost) {
		s.Errorf("Confirm after its own Forget = %v; want ErrLeaseLost", err)
	}
	if err := a.Renew(ctx(s), first.Lease); !isErr(err, idem.ErrLeaseLost) {
		s.Errorf("Renew after its own Forget = %v; want ErrLeaseLost", err)
	}
	if bt, ok := a.(idem.Batcher); ok {
		if err := bt.ConfirmBatch(ctx(s), []*idem.Lease{first.Lease}, [][]byte{[]byte("from-a")}); !isErr(err, idem.ErrLeaseLost) {
			s.Errorf("ConfirmBatch after its own Forget = %v; want ErrLeaseLost", err)
		}
	}
	// A copy of the lease is the same lease.
	cp := *first.Lease
	if err := a.Confirm(ctx(s), &cp, []byte("from-a")); !isErr(err, idem.ErrLeaseLost) {
		s.Errorf("Confirm of a copy of a forgotten lease = %v; want ErrLeaseLost", err)
	}
	r := s.lookup(a, k)
	checkHolderToken(s, r, second.Lease)
	if err := b.Renew(ctx(s), second.Lease); err != nil {
		s.Errorf("Renew of the holder after the forgotten lease's Confirm = %v; want nil", err)
	}
	s.confirm(b, second.Lease, "from-b")
	d := s.claim(a, k, "fp", idem.Duplicate)
	checkConfirmation(s, d.Record, second.Lease, "from-b")
}
