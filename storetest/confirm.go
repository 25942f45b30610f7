package storetest

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/idemgo/idem"
)

func init() {
	register(
		check{"Confirm/Duplicate", confirmDuplicate},
		check{"Confirm/FirstStays", confirmFirstStays},
		check{"Confirm/AfterExpiry", confirmAfterExpiry},
		check{"Confirm/AfterTakeOver", confirmAfterTakeOver},
		check{"Confirm/LateObserved", confirmLateObserved},
		check{"Confirm/TooLarge", confirmTooLarge},
		check{"Forget/Own", forgetOwn},
		check{"Forget/NeverAnotherHolder", forgetNeverAnotherHolder},
		check{"Renew/Extends", renewExtends},
		check{"Renew/Lost", renewLost},
	)
}

func confirmDuplicate(s *suite) {
	a, b := s.open("w1"), s.open("w2")
	k := s.key("k")
	c := s.claim(a, k, "fp", idem.Claimed)
	s.wait(lease / 2)
	set := s.mark()
	s.confirm(a, c.Lease, "result")
	s.wait(lease / 4)
	for _, st := range []idem.Store{a, b} {
		d := s.claim(st, k, "fp", idem.Duplicate)
		checkConfirmation(s, d.Record, c.Lease, "result")
		// Retention runs from the confirmation, not from the claim.
		s.expires("confirmation", d.Record.Expires, set, retention)
	}
	if err := a.Renew(ctx(s), c.Lease); !isErr(err, idem.ErrLeaseLost) {
		s.Errorf("Renew after Confirm = %v; want ErrLeaseLost (a confirmed key is no longer leased)", err)
	}
}

func confirmFirstStays(s *suite) {
	// Duplicates may already have been answered with the first result.
	st := s.open("w1")
	k := s.key("k")
	c := s.claim(st, k, "fp", idem.Claimed)
	s.confirm(st, c.Lease, "first")
	s.confirm(st, c.Lease, "second")
	d := s.claim(st, k, "fp", idem.Duplicate)
	checkConfirmation(s, d.Record, c.Lease, "first")
}

func confirmAfterExpiry(s *suite) {
	// The work happened even though the lease ran out: an unrecorded
	// confirmation is how a card gets charged twice.
	st := s.open("w1")
	k := s.key("k")
	c := s.claim(st, k, "fp", idem.Claimed)
	s.wait(lease + slack)
	s.confirm(st, c.Lease, "late")
	d := s.claim(st, k, "fp", idem.Duplicate)
	checkConfirmation(s, d.Record, c.Lease, "late")
}

func confirmAfterTakeOver(s *suite) {
	a, b := s.open("w1"), s.open("w2")
	k := s.key("k")
	first := s.claim(a, k, "fp", idem.Claimed)
	s.wait(lease + slack)
	second := s.claim(b, k, "fp", idem.Claimed)
	// a stalled past its lease but did the work: its confirmation is
	// recorded, and b's lease is over.
	s.confirm(a, first.Lease, "from-a")
	d := s.claim(b, k, "fp", idem.Duplicate)
	checkConfirmation(s, d.Record, first.Lease, "from-a")
	if err := b.Renew(ctx(s), second.Lease); !isErr(err, idem.ErrLeaseLost) {
		s.Errorf("Renew of the overtaken lease = %v; want ErrLeaseLost (its work is already done)", err)
	}
	// b's work was done too, and its result cannot be the one kept: b must
	// be told, or it would answer its caller as if it were.
	if err := b.Confirm(ctx(s), second.Lease, []byte("from-b")); !isErr(err, idem.ErrAlreadyConfirmed) {
		s.Errorf("Confirm of the overtaken lease after the first confirmed = %v; want ErrAlreadyConfirmed", err)
	}
	if err := b.Forget(ctx(s), second.Lease); !isErr(err, idem.ErrLeaseLost) {
		s.Errorf("Forget of the overtaken lease = %v; want ErrLeaseLost, never deleting the confirmation", err)
	}
	d = s.claim(a, k, "fp", idem.Duplicate)
	checkConfirmation(s, d.Record, first.Lease, "from-a")
}

func confirmTooLarge(s *suite) {
	st := s.openWith(idem.Options{Worker: "w1", MaxResultBytes: 64})
	k := s.key("k")
	c := s.claim(st, k, "fp", idem.Claimed)
	if err := st.Confirm(ctx(s), c.Lease, []byte(strings.Repeat("x", 65))); !isErr(err, idem.ErrTooLarge) {
		s.Errorf("Confirm with a 65-byte result and MaxResultBytes 64 = %v; want ErrTooLarge", err)
	}
	// Nothing was lost: the lease is still held and a fitting result records.
	s.claim(st, k, "fp", idem.InProgress)
	s.confirm(st, c.Lease, strings.Repeat("y", 64))
	d := s.claim(st, k, "fp", idem.Duplicate)
	checkConfirmation(s, d.Record, c.Lease, strings.Repeat("y", 64))
}

func forgetOwn(s *suite) {
	a, b := s.open("w1"), s.open("w2")
	k := s.key("k")
	c := s.claim(a, k, "fp", idem.Claimed)
	if err := a.Forget(ctx(s), c.Lease); err != nil {
		s.Fatalf("Forget of a live lease = %v; want nil", err)
	}
	// The work failed and was forgotten: the next delivery does it.
	s.claim(b, k, "fp", idem.Claimed)
	if err := a.Forget(ctx(s), c.Lease); !isErr(err, idem.ErrLeaseLost) {
		s.Errorf("second Forget = %v; want ErrLeaseLost", err)
	}
	s.claim(a, k, "fp", idem.InProgress)
}

func forgetNeverAnotherHolder(s *suite) {
	a, b := s.open("w1"), s.open("w2")
	k := s.key("k")
	first := s.claim(a, k, "fp", idem.Claimed)
	s.wait(lease + slack)
	second := s.claim(b, k, "fp", idem.Claimed)
	if err := a.Forget(ctx(s), first.Lease); !isErr(err, idem.ErrLeaseLost) {
		s.Errorf("Forget of an overtaken lease = %v; want ErrLeaseLost", err)
	}
	c := s.claim(a, k, "fp", idem.InProgress)
	checkHolder(s, c.Record, second.Lease)
	// Same worker, same key, a lease it no longer holds: still not its own.
	forged := s.forge(b, k, second.Lease.Token-1, "w2")
	if err := b.Forget(ctx(s), forged); !isErr(err, idem.ErrLeaseLost) {
		s.Errorf("Forget with another token = %v; want ErrLeaseLost", err)
	}
	s.claim(a, k, "fp", idem.InProgress)
}

func renewExtends(s *suite) {
	a, b := s.open("w1"), s.open("w2")
	k := s.key("k")
	start := s.mark()
	c := s.claim(a, k, "fp", idem.Claimed)
	s.waitUntil(start, lease*2/3)
	set := s.mark()
	s.renew(a, c.Lease, "Renew of a live lease")
	// Past the original lease, within the renewed one.
	s.waitUntil(start, lease*4/3)
	d := s.claim(b, k, "fp", idem.InProgress)
	checkHolderToken(s, d.Record, c.Lease)
	// A lease from now, not from the old expiry (which would make it
	// a third of a lease longer).
	s.expires("renewed lease", d.Record.Expires, set, lease)
	set = s.mark()
	s.renew(a, c.Lease, "second Renew")
	t0 := time.Now()
	r, err := a.Lookup(ctx(s), k)
	s.timed(t0)
	if err != nil {
		s.Fatalf("Lookup(%q) = %v; want the renewed claim", k, err)
	}
	s.expires("lease renewed again", r.Expires, set, lease)
	if s.controlled() {
		// Exactly a lease: live in its last millisecond, gone a
		// millisecond after its end (Redis keeps a key through the
		// millisecond it expires in).
		s.waitUntil(set, lease-time.Millisecond)
		s.claim(b, k, "fp", idem.InProgress)
		s.waitUntil(set, s.afterExpiry(lease))
		s.claim(b, k, "fp", idem.Claimed)
	}
}

func checkHolderToken(s *suite, r *idem.Record, l *idem.Lease) {
	s.Helper()
	if r.Token != l.Token || r.Owner != l.Owner {
		s.Errorf("holder = token %d owner %q; want the renewed lease's token %d owner %q", r.Token, r.Owner, l.Token, l.Owner)
	}
}

func renewLost(s *suite) {
	st := s.open("w1")
	k := s.key("k")
	c := s.claim(st, k, "fp", idem.Claimed)
	s.wait(lease + slack)
	if err := st.Renew(ctx(s), c.Lease); !isErr(err, idem.ErrLeaseLost) {
		s.Errorf("Renew after the lease ran out = %v; want ErrLeaseLost", err)
	}
	// A failed renewal must not resurrect the lease.
	s.claim(st, k, "fp", idem.Claimed)
	forgotten := s.claim(st, s.key("forgotten"), "", idem.Claimed)
	if err := st.Forget(ctx(s), forgotten.Lease); err != nil {
		s.Fatalf("Forget = %v; want nil", err)
	}
	if err := st.Renew(ctx(s), forgotten.Lease); !isErr(err, idem.ErrLeaseLost) {
		s.Errorf("Renew after Forget = %v; want ErrLeaseLost", err)
	}
}

// confirmLateObserved checks that a confirm after the lease ran out is
// reported on the Observer's event (Event.Late), by Confirm and by
// ConfirmBatch alike, and that one on time is not: a late confirm means the
// work may have been done twice, and metrics built on events (the otel
// adapter's late-confirm counter) see nothing else.
func confirmLateObserved(s *suite) {
	rec := &recorder{}
	st := s.openWith(idem.Options{Worker: "w1", Observer: rec})
	b, _ := st.(idem.Batcher)
	onTime := s.claim(st, s.key("on-time"), "", idem.Claimed)
	s.confirm(st, onTime.Lease, "r")
	late := s.claim(st, s.key("late"), "", idem.Claimed)
	var lateBatch *idem.Claim
	if b != nil {
		c := s.claim(st, s.key("late-batch"), "", idem.Claimed)
		lateBatch = &c
	}
	s.wait(lease + slack)
	s.confirm(st, late.Lease, "r")
	if b != nil {
		if err := b.ConfirmBatch(ctx(s), []*idem.Lease{lateBatch.Lease}, nil); err != nil {
			s.Fatalf("ConfirmBatch(lease run out) = %v; want nil (recorded all the same)", err)
		}
	}
	var confirms []bool
	batches := 0
	for _, e := range rec.take() {
		switch e.Op {
		case idem.OpConfirm:
			confirms = append(confirms, e.Late)
		case idem.OpConfirmBatch:
			batches++
			if !e.Late {
				s.Errorf("ConfirmBatch of a lease that ran out: event Late = false; want true (metrics of late confirms would miss it)")
			}
		}
	}
	if len(confirms) == 0 {
		s.Fatalf("no OpConfirm event reached the Observer given to Open; want one per Confirm (Backend.Open must pass Options.Observer to the store)")
	}
	if len(confirms) != 2 || confirms[0] || !confirms[1] {
		s.Errorf("Confirm events' Late (on time, lease run out) = %v; want [false true]", confirms)
	}
	if b != nil && batches != 1 {
		s.Errorf("%d OpConfirmBatch events for one ConfirmBatch; want 1", batches)
	}
}

// recorder is an idem.Observer that keeps the events it is given.
type recorder struct {
	mu sync.Mutex
	es []idem.Event
}

func (r *recorder) Observe(_ context.Context, e idem.Event) {
	r.mu.Lock()
	r.es = append(r.es, e)
	r.mu.Unlock()
}

func (r *recorder) take() []idem.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	es := r.es
	r.es = nil
	return es
}
