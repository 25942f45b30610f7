package storetest

import (
	"fmt"
	"time"

	"github.com/idemgo/idem"
)

func init() {
	register(
		check{"Batch/Mixed", batchMixed},
		check{"Batch/Lengths", batchLengths},
	)
}

func batcher(s *suite, st idem.Store) idem.Batcher {
	s.Helper()
	b, ok := st.(idem.Batcher)
	if !ok {
		s.Skipf("%T does not implement idem.Batcher", st)
	}
	return b
}

func batchMixed(s *suite) {
	st := s.open("w1")
	b := batcher(s, st)
	done, held, fresh := s.key("done"), s.key("held"), s.key("fresh")
	dl := s.claim(st, done, "fp-done", idem.Claimed).Lease
	s.confirm(st, dl, "r-done")
	hl := s.claim(st, held, "fp-held", idem.Claimed).Lease

	keys := []string{fresh, done, held, fresh}
	fps := [][]byte{[]byte("f0"), []byte("fp-done"), []byte("fp-held"), nil}
	cs, err := b.ClaimBatch(ctx(s), keys, fps)
	if err != nil || len(cs) != len(keys) {
		s.Fatalf("ClaimBatch = %d claims, %v; want %d claims, nil", len(cs), err, len(keys))
	}
	want := []idem.Outcome{idem.Claimed, idem.Duplicate, idem.InProgress, idem.InProgress}
	for i, c := range cs {
		if c.Outcome != want[i] {
			s.Fatalf("ClaimBatch item %d (%q) = %v; want %v (a key twice in one batch is claimed once)", i, keys[i], c.Outcome, want[i])
		}
	}
	checkConfirmation(s, cs[1].Record, dl, "r-done")
	checkHolder(s, cs[2].Record, hl)
	checkHolder(s, cs[3].Record, cs[0].Lease)
	if string(cs[0].Lease.Fingerprint) != "f0" {
		s.Errorf("ClaimBatch lease fingerprint = %q; want f0", cs[0].Lease.Fingerprint)
	}

	// Confirm several at once, one of them a repeat of an earlier confirm.
	more, err := b.ClaimBatch(ctx(s), []string{s.key("m0"), s.key("m1")}, nil)
	if err != nil {
		s.Fatalf("ClaimBatch = %v; want nil", err)
	}
	leases := []*idem.Lease{cs[0].Lease, more[0].Lease, more[1].Lease, dl}
	results := make([][]byte, len(leases))
	for i := range results {
		results[i] = fmt.Appendf(nil, "r%d", i)
	}
	if err := b.ConfirmBatch(ctx(s), leases, results); err != nil {
		s.Fatalf("ConfirmBatch = %v; want nil", err)
	}
	for i, l := range leases[:3] {
		d := s.claim(st, l.Key, "", idem.Duplicate)
		checkConfirmation(s, d.Record, l, string(results[i]))
	}
	d := s.claim(st, done, "", idem.Duplicate)
	checkConfirmation(s, d.Record, dl, "r-done")

	// A batch whose first item finds a record and whose later items are new
	// or forgotten: each item still gets its own answer, in order, and a
	// claim after a forgotten one gets a greater token.
	gone, late := s.key("gone"), s.key("late")
	var gl *idem.Lease
	for try := 1; ; try++ {
		gl = s.claim(st, gone, "", idem.Claimed).Lease
		err := st.Forget(ctx(s), gl)
		if err == nil {
			break
		}
		// A machine that stalled past the lease between the two calls
		// leaves a lapsed claim, not a forgotten one: set it up again on
		// a key of its own.
		if !isErr(err, idem.ErrLeaseLost) || time.Now().Before(gl.Expires) || try == 3 {
			s.Fatalf("Forget = %v; want nil", err)
		}
		s.Logf("the lease ran out before its Forget (a stall of %v): again", time.Since(gl.Expires)+gl.TTL)
		gone = s.key(fmt.Sprintf("gone%d", try))
	}
	cs, err = b.ClaimBatch(ctx(s), []string{done, late, gone}, nil)
	if err != nil || len(cs) != 3 {
		s.Fatalf("ClaimBatch(done, new, forgotten) = %d claims, %v; want 3 claims, nil", len(cs), err)
	}
	for i, want := range []idem.Outcome{idem.Duplicate, idem.Claimed, idem.Claimed} {
		if cs[i].Outcome != want {
			s.Fatalf("ClaimBatch(done, new, forgotten) item %d = %v; want %v", i, cs[i].Outcome, want)
		}
	}
	if cs[2].Lease.Token <= gl.Token {
		s.Errorf("ClaimBatch after a forgotten claim: token %d; want more than the forgotten %d", cs[2].Lease.Token, gl.Token)
	}
	// A confirm that finds a record not its lease's (here: a repeat), then
	// leases that are held.
	if err := b.ConfirmBatch(ctx(s), []*idem.Lease{dl, cs[1].Lease, cs[2].Lease}, [][]byte{[]byte("again"), []byte("r-late"), []byte("r-gone")}); err != nil {
		s.Fatalf("ConfirmBatch(repeat, held, held) = %v; want nil", err)
	}
	checkConfirmation(s, s.claim(st, done, "", idem.Duplicate).Record, dl, "r-done")
	checkConfirmation(s, s.claim(st, late, "", idem.Duplicate).Record, cs[1].Lease, "r-late")
	checkConfirmation(s, s.claim(st, gone, "", idem.Duplicate).Record, cs[2].Lease, "r-gone")

	if err := b.ConfirmBatch(ctx(s), nil, nil); err != nil {
		s.Errorf("ConfirmBatch of nothing = %v; want nil", err)
	}
	if cs, err := b.ClaimBatch(ctx(s), nil, nil); err != nil || len(cs) != 0 {
		s.Errorf("ClaimBatch of nothing = %v, %v; want no claims, nil", cs, err)
	}
}

func batchLengths(s *suite) {
	st := s.openWith(idem.Options{Worker: "w1", MaxResultBytes: 8})
	b := batcher(s, st)
	k := s.key("k")
	if _, err := b.ClaimBatch(ctx(s), []string{k}, [][]byte{nil, nil}); err == nil {
		s.Errorf("ClaimBatch with 1 key and 2 fingerprints = nil; want an error")
	}
	l := s.claim(st, k, "", idem.Claimed).Lease
	if err := b.ConfirmBatch(ctx(s), []*idem.Lease{l}, [][]byte{nil, nil}); err == nil {
		s.Errorf("ConfirmBatch with 1 lease and 2 results = nil; want an error")
	}
	if err := b.ConfirmBatch(ctx(s), []*idem.Lease{l}, [][]byte{[]byte("123456789")}); !isErr(err, idem.ErrTooLarge) {
		s.Errorf("ConfirmBatch with a 9-byte result and MaxResultBytes 8 = %v; want ErrTooLarge", err)
	}
	if err := b.ConfirmBatch(ctx(s), []*idem.Lease{nil}, nil); err == nil {
		s.Errorf("ConfirmBatch with a nil lease = nil; want an error")
	}
	// Nothing was recorded by the rejected calls.
	s.claim(st, k, "", idem.InProgress)
}
