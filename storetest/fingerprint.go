package storetest

import (
	"errors"
	"time"

	"github.com/idemgo/idem"
)

func init() {
	register(
		check{"Fingerprint/MismatchDone", fingerprintMismatchDone},
		check{"Fingerprint/MismatchInFlight", fingerprintMismatchInFlight},
		check{"Fingerprint/EmptyUnchecked", fingerprintEmptyUnchecked},
		check{"Fingerprint/MismatchInBatch", fingerprintMismatchInBatch},
		check{"Confirm/NotKeptInBatch", confirmNotKeptInBatch},
		check{"Lease/NotFromClaim", leaseNotFromClaim},
	)
}

// mismatch calls Claim with fp and checks that it reports
// ErrFingerprintMismatch together with the claim found (want).
func (s *suite) mismatch(st idem.Store, key, fp string, want idem.Outcome) idem.Claim {
	s.Helper()
	t0 := time.Now()
	c, err := st.Claim(ctx(s), key, []byte(fp))
	s.timed(t0)
	if !isErr(err, idem.ErrFingerprintMismatch) {
		s.Fatalf("Claim(%q, %q) = %v, %v; want ErrFingerprintMismatch (another request reuses the key)", key, fp, c.Outcome, err)
	}
	if c.Outcome != want || c.Record == nil || c.Lease != nil {
		s.Fatalf("Claim(%q, %q) = %v with lease %v and record %v; want %v with the record, so a caller can tell done from in flight",
			key, fp, c.Outcome, c.Lease, c.Record, want)
	}
	return c
}

func fingerprintMismatchDone(s *suite) {
	// Replaying Duplicate's result to a request with another body would
	// answer B with A's receipt.
	a, b := s.open("w1"), s.open("w2")
	k := s.key("k")
	c := s.claim(a, k, "fp-a", idem.Claimed)
	s.confirm(a, c.Lease, "result-a")
	for _, st := range []idem.Store{a, b} {
		d := s.mismatch(st, k, "fp-b", idem.Duplicate)
		checkConfirmation(s, d.Record, c.Lease, "result-a")
	}
	// The same request again is still a plain duplicate.
	s.claim(b, k, "fp-a", idem.Duplicate)
}

func fingerprintMismatchInFlight(s *suite) {
	a, b := s.open("w1"), s.open("w2")
	k := s.key("k")
	first := s.claim(a, k, "fp-a", idem.Claimed)
	d := s.mismatch(b, k, "fp-b", idem.InProgress)
	checkHolder(s, d.Record, first.Lease)
	// Nothing changed: the holder still holds it and can confirm.
	if err := a.Renew(ctx(s), first.Lease); err != nil {
		s.Errorf("Renew of the holder after a mismatched Claim = %v; want nil", err)
	}
	s.confirm(a, first.Lease, "r")
}

func fingerprintEmptyUnchecked(s *suite) {
	st := s.open("w1")
	withFp, without := s.key("with"), s.key("without")
	c := s.claim(st, withFp, "fp", idem.Claimed)
	s.claim(st, withFp, "", idem.InProgress)
	s.confirm(st, c.Lease, "r")
	s.claim(st, withFp, "", idem.Duplicate)

	c = s.claim(st, without, "", idem.Claimed)
	s.claim(st, without, "fp", idem.InProgress)
	s.confirm(st, c.Lease, "r")
	s.claim(st, without, "fp", idem.Duplicate)
}

func fingerprintMismatchInBatch(s *suite) {
	st := s.open("w1")
	b := batcher(s, st)
	done, fresh := s.key("done"), s.key("fresh")
	dl := s.claim(st, done, "fp-done", idem.Claimed).Lease
	s.confirm(st, dl, "r-done")
	cs, err := b.ClaimBatch(ctx(s), []string{fresh, done}, [][]byte{[]byte("f"), []byte("other")})
	var be *idem.BatchError
	if !errors.As(err, &be) || len(be.Errs) != 2 || be.Errs[0] != nil || !isErr(be.Errs[1], idem.ErrFingerprintMismatch) {
		s.Fatalf("ClaimBatch(fresh, done with another fingerprint) = %v; want a *BatchError with item 1 ErrFingerprintMismatch only", err)
	}
	if len(cs) != 2 || cs[0].Outcome != idem.Claimed || cs[1].Outcome != idem.Duplicate || cs[1].Record == nil {
		s.Fatalf("ClaimBatch claims = %+v; want item 0 Claimed and item 1 Duplicate with its record", cs)
	}
	checkConfirmation(s, cs[1].Record, dl, "r-done")
	s.confirm(st, cs[0].Lease, "r")
}

func confirmNotKeptInBatch(s *suite) {
	a, b := s.open("w1"), s.open("w2")
	bb := batcher(s, b)
	k, other := s.key("k"), s.key("other")
	first := s.claim(a, k, "fp", idem.Claimed)
	s.wait(lease + slack)
	second := s.claim(b, k, "fp", idem.Claimed)
	s.confirm(a, first.Lease, "from-a")
	ol := s.claim(b, other, "fp", idem.Claimed).Lease
	err := bb.ConfirmBatch(ctx(s), []*idem.Lease{second.Lease, ol}, [][]byte{[]byte("from-b"), []byte("r")})
	var be *idem.BatchError
	if !errors.As(err, &be) || len(be.Errs) != 2 || !isErr(be.Errs[0], idem.ErrAlreadyConfirmed) || be.Errs[1] != nil {
		s.Fatalf("ConfirmBatch(overtaken lease, held lease) = %v; want a *BatchError with item 0 ErrAlreadyConfirmed only", err)
	}
	d := s.claim(b, k, "fp", idem.Duplicate)
	checkConfirmation(s, d.Record, first.Lease, "from-a")
	d = s.claim(a, other, "fp", idem.Duplicate)
	checkConfirmation(s, d.Record, ol, "r")
}

func leaseNotFromClaim(s *suite) {
	// A Lease no Claim returned must not record work nobody claimed.
	st := s.open("w1")
	k := s.key("k")
	forged := []*idem.Lease{nil, {Key: k, Owner: "w1"}, {Key: k, Token: 1}}
	for _, l := range forged {
		if err := st.Confirm(ctx(s), l, []byte("r")); !isErr(err, idem.ErrInvalidLease) {
			s.Errorf("Confirm(%+v) = %v; want ErrInvalidLease", l, err)
		}
		if err := st.Renew(ctx(s), l); !isErr(err, idem.ErrInvalidLease) {
			s.Errorf("Renew(%+v) = %v; want ErrInvalidLease", l, err)
		}
		if err := st.Forget(ctx(s), l); !isErr(err, idem.ErrInvalidLease) {
			s.Errorf("Forget(%+v) = %v; want ErrInvalidLease", l, err)
		}
	}
	if _, err := st.Lookup(ctx(s), k); !isErr(err, idem.ErrNotFound) {
		s.Errorf("Lookup after forged leases = %v; want ErrNotFound (nothing recorded)", err)
	}
}
