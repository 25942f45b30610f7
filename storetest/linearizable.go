package storetest

import (
	"flag"
	"fmt"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/lincheck"
)

var (
	histories = flag.Int("storetest.histories", 10,
		"storetest: `number` of histories the Linearizable check runs (0 skips it)")
	seedFlag = flag.Uint64("storetest.seed", 0,
		"storetest: `seed` of the Linearizable check's first history (0: from the clock)")
)

func init() { register(check{"Linearizable", linearizable}) }

// linLease outlives a history by far: the sequential model has no clock,
// so a lease that ran out mid-history would look like a violation.
const linLease = time.Minute

// linearizable runs short histories of concurrent Claim, Confirm, Forget,
// Renew and Lookup calls (and ClaimBatch, ConfirmBatch), and checks with
// porcupine that one sequential store keeping the Store contract could
// have answered each: this catches what a sequence of single calls does
// not, such as a Renew that extends another owner's claim or a Forget of a
// forgotten claim. -storetest.histories sets how many (0 skips it).
func linearizable(s *suite) {
	n := *histories
	if n <= 0 {
		s.Skip("-storetest.histories=0")
	}
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	// Four clients, pairs of them sharing a worker (a worker's own claim
	// is InProgress to it too).
	var clients []lincheck.Client
	for w := range 2 {
		worker := fmt.Sprintf("lin-w%d", w)
		st := s.openWith(idem.Options{Worker: worker, LeaseTTL: linLease, Retention: linLease})
		clients = append(clients, lincheck.Client{Store: st, Worker: worker}, lincheck.Client{Store: st, Worker: worker})
	}
	start := time.Now()
	tally := lincheck.Verify(s.tb, n, seed, "storetest.seed", func(i int) lincheck.Workload {
		w := lincheck.Workload{Clients: clients, Ops: 10, Batch: 0.2}
		for k := range 3 {
			w.Keys = append(w.Keys, s.key(fmt.Sprintf("h%d/{k%d}\x00", i, k)))
		}
		return w
	})
	s.Logf("%v in %v (seed %d: -storetest.seed=%d -storetest.histories=%d repeats the calls)",
		tally, time.Since(start).Round(time.Millisecond), seed, seed, tally.Histories)
}
