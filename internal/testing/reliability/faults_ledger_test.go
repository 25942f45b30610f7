package reliability_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
)

// The fault workload: several workers take deliveries of a set of messages
// from one queue (each message is delivered twice to begin with), and for
// each delivery Claim → apply the message's effect to a ledger → Confirm,
// Forget when the handler fails, redelivering after an error, an
// InProgress, a failed handler or a crash, until every message is confirmed.
// The ledger sees every lease, effect, error and outcome, and afterwards
// checks the guarantees that must hold whatever the network does:
//
//   - no message lost: every message's record is confirmed, and names an
//     effect that really happened;
//   - no two leases on one key live at once: a Claim answered Claimed while
//     an earlier lease on the key was surely live (its local expiry
//     estimate, which is earlier than the store's, still ahead) is a
//     violation, and so is a Claimed after a Confirm that returned nil;
//   - an unknown-outcome claim (the caller got an error, the store kept the
//     claim) blocks its key until the lease expires, and only until then;
//   - every double effect follows a worker that applied the effect and then
//     crashed, or gave up confirming after errors (an unknown outcome):
//     the store was never told the work was done;
//   - every reply the proxy lost reached the caller as an error.

// fingerprint and result markers: a request carrying them is a Claim or
// Confirm of the workload, which is how the proxy picks requests to hurt.
var (
	faultFingerprint = []byte("fx-fp")
	faultDoneMarker  = "fx-done:"
)

// workload sets the shape of one fault run.
type workload struct {
	messages, workers int
	lease             time.Duration
	opTimeout         time.Duration // each store call's context
	crashRate         float64       // a claimed delivery applies the effect, then its worker "crashes"
	failRate          float64       // a claimed delivery's handler fails: Forget
	spread            time.Duration // the messages arrive evenly over this long
	limit             time.Duration // the run fails if messages are still unconfirmed by then
	// lossy says a failover may lose acknowledged writes (Redis replicates
	// asynchronously): a confirmation lost is counted (report.lost) and
	// explains a double effect, instead of failing the run.
	lossy bool
	// rush says the messages not yet arrived when chaos returns arrive at
	// once: with a spread longer than the chaos may take, the faults meet
	// the workload's traffic however long they last, and the run does not
	// wait out the rest of the spread.
	rush bool
}

// fate is how a lease ended, as its worker saw it.
type fate uint8

const (
	open         fate = iota
	forgotten         // Forget returned nil
	confirmed         // Confirm returned nil while the lease was held
	lateOK            // Confirm returned nil, late: the lease had run out
	crashed           // the worker applied the effect and stopped
	abandoned         // the worker applied the effect, Confirm kept failing, it gave up at the lease's end
	forgetUnsure      // Forget returned an error: it may have deleted the claim (its reply lost) or not
)

type leaseInfo struct {
	token     int64
	expires   time.Time // the lease's local, conservative expiry estimate
	sent, got time.Time // the Claim's send and reply times
	fate      fate
	endSent   time.Time // when the Forget or Confirm that returned nil was sent
	endAt     time.Time // ... and when it returned
	errs      int       // Confirm errors before the fate
}

type keyLedger struct {
	leases   []*leaseInfo // in the order their Claims returned
	effects  []int64      // tokens of the leases that applied the effect
	inflight int
	holders  map[int64]time.Time // InProgress holders seen: token -> latest expiry estimate
}

// ledger records a fault run. All methods are safe for concurrent use.
type ledger struct {
	mu   sync.Mutex
	keys map[string]*keyLedger

	deliveries, claimErrs, confirmErrs, forgetErrs, inProgress atomic.Int64
	maxInflight                                                int
	firstErrs                                                  []string // the first few errors' texts
}

// failed counts err in n and keeps its text if it is among the first few.
func (l *ledger) failed(n *atomic.Int64, op string, err error) {
	n.Add(1)
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.firstErrs) < 4 {
		l.firstErrs = append(l.firstErrs, op+": "+err.Error())
	}
}

func newLedger(keys []string) *ledger {
	l := &ledger{keys: make(map[string]*keyLedger, len(keys))}
	for _, k := range keys {
		l.keys[k] = &keyLedger{holders: make(map[int64]time.Time)}
	}
	return l
}

// claimed records a new lease. The checks against the key's other leases
// wait for the end of the run, when every lease's fate is known: an earlier
// holder's Forget may still be on its way back when this claim is answered.
func (l *ledger) claimed(key string, le *idem.Lease, sent, got time.Time) *leaseInfo {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.keys[key]
	info := &leaseInfo{token: le.Token, expires: le.Expires, sent: sent, got: got}
	k.leases = append(k.leases, info)
	k.inflight++
	l.maxInflight = max(l.maxInflight, k.inflight)
	return info
}

// checkLeases finds, among one key's leases, a Claimed answered while an
// earlier lease was surely live, and a Claimed after a Confirm that
// returned nil: a confirmation lost, which only a lossy run accepts, and
// reports whether it found one.
func checkLeases(t *testing.T, key string, leases []*leaseInfo, lossy bool) (lost bool) {
	t.Helper()
	leases = slices.Clone(leases)
	slices.SortFunc(leases, func(a, b *leaseInfo) int { return cmp.Compare(a.token, b.token) })
	for j, q := range leases {
		for _, p := range leases[:j] {
			if p.token == q.token {
				t.Errorf("key %q: two leases with token %d; want a new token for each lease", key, q.token)
			}
			// The confirmation was lost.
			if (p.fate == confirmed || p.fate == lateOK) && p.endAt.Before(q.sent) && lossy {
				lost = true
			} else if (p.fate == confirmed || p.fate == lateOK) && p.endAt.Before(q.sent) {
				t.Errorf("confirmation lost: key %q: token %d claimed at %v after token %d's Confirm returned nil at %v",
					key, q.token, stamp(q.sent), p.token, stamp(p.endAt))
			}
			// p was live for the whole of q's claim: nothing of p's that
			// could end it was sent before q's reply, and p's expiry, a
			// conservative estimate, lies after that reply.
			// A Forget whose reply was lost may have deleted the claim as
			// soon as it was sent.
			ended := (p.fate == forgotten || p.fate == forgetUnsure || p.fate == confirmed || p.fate == lateOK) &&
				!p.endSent.After(q.got)
			if !ended && q.got.Before(p.expires) {
				t.Errorf("two live leases on one key: key %q: token %d claimed at %v while token %d (%v) was live until at least %v",
					key, q.token, stamp(q.got), p.token, p.fate, stamp(p.expires))
			}
		}
	}
	return lost
}

func stamp(t time.Time) string { return t.Format("15:04:05.000") }

func (l *ledger) effect(key string, info *leaseInfo) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.keys[key]
	k.effects = append(k.effects, info.token)
}

func (l *ledger) end(key string, info *leaseInfo, f fate, sent, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	info.fate, info.endSent, info.endAt = f, sent, at
	l.keys[key].inflight--
}

// holder records an InProgress answer's holder.
func (l *ledger) holder(key string, rec *idem.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.keys[key].holders
	if rec.Expires.After(h[rec.Token]) {
		h[rec.Token] = rec.Expires
	}
}

// report is what a run counted.
type report struct {
	messages, deliveries, effects      int
	claimErrs, confirmErrs, forgetErrs int
	inProgress                         int
	crashes, abandoned                 int
	doubles                            int
	doublesCrash, doublesUnknown       int
	lost, doublesLost                  int // confirmed, then lost in a failover (lossy runs)
	orphans, recovered                 int
	maxInflight                        int
	firstErrs                          []string
	took                               time.Duration
}

func (r report) errors() int { return r.claimErrs + r.confirmErrs + r.forgetErrs }

func (r report) String() string {
	return fmt.Sprintf("messages %d, deliveries %d, effects %d; errors seen %d (claim %d, confirm %d, forget %d); "+
		"in-progress %d; crashes %d, confirms given up %d; double effects %d (%d after a crash, %d after an unknown confirm outcome); "+
		"unknown-outcome claims %d, recovered by lease expiry %d; confirmed then lost %d (%d double effects after); "+
		"max workers in flight on one key %d; %v",
		r.messages, r.deliveries, r.effects, r.errors(), r.claimErrs, r.confirmErrs, r.forgetErrs,
		r.inProgress, r.crashes, r.abandoned, r.doubles, r.doublesCrash, r.doublesUnknown,
		r.orphans, r.recovered, r.lost, r.doublesLost, r.maxInflight, r.took.Round(time.Millisecond))
}

// check verifies the ledger against direct, a store on the same data that
// bypasses the faults, and returns the counts.
func (l *ledger) check(t *testing.T, direct idem.Store, lossy bool) report {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	r := report{messages: len(l.keys), maxInflight: l.maxInflight, firstErrs: l.firstErrs,
		deliveries: int(l.deliveries.Load()), claimErrs: int(l.claimErrs.Load()),
		confirmErrs: int(l.confirmErrs.Load()), forgetErrs: int(l.forgetErrs.Load()),
		inProgress: int(l.inProgress.Load())}
	keys := make([]string, 0, len(l.keys))
	for key := range l.keys {
		keys = append(keys, key)
	}
	slices.Sort(keys)
	for _, key := range keys {
		k := l.keys[key]
		lost := checkLeases(t, key, k.leases, lossy)
		byToken := make(map[int64]*leaseInfo, len(k.leases))
		for _, p := range k.leases {
			byToken[p.token] = p
			switch p.fate {
			case crashed:
				r.crashes++
			case abandoned:
				r.abandoned++
			}
		}
		r.effects += len(k.effects)
		slices.Sort(k.effects) // token order: the order of the leases

		rec, err := direct.Lookup(context.Background(), key)
		if lossy && errors.Is(err, idem.ErrNotFound) && slices.ContainsFunc(k.leases, func(p *leaseInfo) bool {
			return p.fate == confirmed || p.fate == lateOK
		}) {
			r.lost++
			continue
		}
		if lost {
			r.lost++
		}
		if err != nil || !rec.Confirmed {
			t.Errorf("message %q lost: Lookup = %+v, %v; want a confirmed record", key, rec, err)
			continue
		}
		if !slices.Contains(k.effects, rec.Token) || string(rec.Result) != faultDoneMarker+strconv.FormatInt(rec.Token, 10) {
			t.Errorf("message %q: the record names token %d, result %q; effects were applied by tokens %v",
				key, rec.Token, rec.Result, k.effects)
		}

		// Each effect after the first needs a reason in the one before it:
		// that lease applied the effect and its confirmation never reached
		// the store before the next claim.
		for i := 1; i < len(k.effects); i++ {
			r.doubles++
			prev := byToken[k.effects[i-1]]
			switch {
			case prev.fate == crashed:
				r.doublesCrash++
			case prev.fate == abandoned, prev.fate == lateOK && prev.errs > 0:
				r.doublesUnknown++
			case lost && (prev.fate == confirmed || prev.fate == lateOK):
				r.doublesLost++
			default:
				t.Errorf("message %q: effect by token %d follows token %d's effect, whose lease ended %v after %d confirm errors: "+
					"an unexplained double effect", key, k.effects[i], prev.token, prev.fate, prev.errs)
			}
		}

		// A holder no worker knows of is a claim whose caller got an
		// error: it must block the key until it expires, then give way.
		for tok, exp := range k.holders {
			if byToken[tok] != nil {
				continue
			}
			r.orphans++
			recovered := false
			for _, p := range k.leases {
				if p.token <= tok {
					continue
				}
				recovered = true
				if p.got.Before(exp) {
					t.Errorf("message %q: token %d claimed at %v, before the unknown-outcome claim %d expired (not before %v)",
						key, p.token, stamp(p.got), tok, stamp(exp))
				}
			}
			if recovered {
				r.recovered++
			}
		}
	}
	if r.doubles != r.doublesCrash+r.doublesUnknown+r.doublesLost {
		t.Errorf("double effects %d; explained %d (crash %d, unknown outcome %d, confirmation lost %d)", r.doubles,
			r.doublesCrash+r.doublesUnknown+r.doublesLost, r.doublesCrash, r.doublesUnknown, r.doublesLost)
	}
	if r.recovered != r.orphans {
		t.Errorf("unknown-outcome claims %d, of which %d were taken over after expiry; want all", r.orphans, r.recovered)
	}
	return r
}

func (f fate) String() string {
	return [...]string{"open", "forgotten", "confirmed", "confirmed late", "crashed", "abandoned", "forget unsure"}[f]
}

// lateObserver remembers whether its store's last Confirm was late. Each
// worker has a store of its own, so it is only ever called from one
// goroutine.
type lateObserver struct{ late bool }

func (o *lateObserver) Observe(_ context.Context, e idem.Event) {
	if e.Op == idem.OpConfirm {
		o.late = e.Late
	}
}

// runWorkload runs w over a fresh set of messages. open returns worker i's
// store, built with the given options (lease, worker name, observer).
// chaos runs beside the workers until they are done; it may read the
// ledger (confirmedBefore).
func runWorkload(t *testing.T, w workload, open func(i int, o idem.Options) idem.Store,
	direct idem.Store, chaos func(ctx context.Context, led *ledger)) report {
	t.Helper()
	start := time.Now()
	keys := make([]string, w.messages)
	run := strconv.FormatUint(rand.Uint64(), 36)
	for i := range keys {
		keys[i] = "fault:" + run + ":" + strconv.Itoa(i)
	}
	led := newLedger(keys)
	queue := make(chan string, 2*len(keys))
	var remaining atomic.Int64
	remaining.Store(int64(2 * len(keys)))
	ctx, cancel := context.WithTimeout(context.Background(), w.limit)
	defer cancel()
	chaosReturned := make(chan struct{})
	arrival := ctx
	if w.rush {
		var stop context.CancelFunc
		arrival, stop = context.WithCancel(ctx)
		defer stop()
		go func() {
			select {
			case <-chaosReturned:
				stop()
			case <-ctx.Done():
			}
		}()
	}
	// The messages arrive over the spread, each delivered twice at once,
	// so that the faults meet traffic for as long as they last.
	go func() {
		for i, k := range keys {
			if !sleepCtx(arrival, time.Until(start.Add(time.Duration(i)*w.spread/time.Duration(len(keys))))) && ctx.Err() != nil {
				return
			}
			queue <- k
			queue <- k
		}
	}()
	done := make(chan struct{})
	var once sync.Once
	finish := func() { once.Do(func() { close(done) }) }

	stores := make([]idem.Store, w.workers)
	observers := make([]*lateObserver, w.workers)
	for i := range stores {
		observers[i] = &lateObserver{}
		stores[i] = open(i, idem.Options{LeaseTTL: w.lease, Retention: 10 * time.Minute,
			Worker: "fault-worker-" + strconv.Itoa(i), Observer: observers[i]})
	}

	chaosCtx, stopChaos := context.WithCancel(ctx)
	var chaosDone sync.WaitGroup
	chaosDone.Add(1)
	go func() {
		defer chaosDone.Done()
		defer close(chaosReturned)
		chaos(chaosCtx, led)
	}()

	var wg sync.WaitGroup
	for i := range w.workers {
		s, obs := stores[i], observers[i]
		rng := rand.New(rand.NewPCG(uint64(i), rand.Uint64()))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				case <-ctx.Done():
					return
				case key := <-queue:
					led.deliveries.Add(1)
					if deliver(ctx, w, led, s, obs, rng, key) {
						if remaining.Add(-1) == 0 {
							finish()
						}
						continue
					}
					// Redeliver after a short delay, as a broker would.
					time.AfterFunc(10*time.Millisecond, func() { queue <- key })
				}
			}
		}()
	}
	select {
	case <-done:
	case <-ctx.Done():
		t.Errorf("after %v, %d of %d deliveries were still not done", w.limit, remaining.Load(), 2*len(keys))
	}
	finish()
	wg.Wait()
	stopChaos()
	chaosDone.Wait()
	r := led.check(t, direct, w.lossy)
	r.took = time.Since(start)
	return r
}

// deliver handles one delivery of key and reports whether it is done (the
// message is confirmed, by this delivery or another).
func deliver(ctx context.Context, w workload, led *ledger, s idem.Store, obs *lateObserver, rng *rand.Rand, key string) bool {
	call := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, w.opTimeout) }
	cctx, cancel := call()
	sent := time.Now()
	c, err := s.Claim(cctx, key, faultFingerprint)
	cancel()
	got := time.Now()
	if err != nil {
		led.failed(&led.claimErrs, "claim", err)
		return false
	}
	switch c.Outcome {
	case idem.Duplicate:
		return true
	case idem.InProgress:
		led.inProgress.Add(1)
		led.holder(key, c.Record)
		return false
	}
	info := led.claimed(key, c.Lease, sent, got)
	if rng.Float64() < w.failRate {
		cctx, cancel := call()
		sent := time.Now()
		err := s.Forget(cctx, c.Lease)
		cancel()
		if err != nil {
			// The claim may stay until its lease expires, or may have been
			// deleted by a Forget that ran and lost its reply.
			led.failed(&led.forgetErrs, "forget", err)
			led.end(key, info, forgetUnsure, sent, time.Time{})
		} else {
			led.end(key, info, forgotten, sent, time.Now())
		}
		return false
	}
	led.effect(key, info)
	if rng.Float64() < w.crashRate {
		led.end(key, info, crashed, time.Time{}, time.Time{})
		return false
	}
	result := []byte(faultDoneMarker + strconv.FormatInt(c.Lease.Token, 10))
	for {
		cctx, cancel := call()
		sent := time.Now()
		err := s.Confirm(cctx, c.Lease, result)
		cancel()
		if err == nil || errors.Is(err, idem.ErrAlreadyConfirmed) {
			// Another lease's confirmation kept is done too, as the
			// wrappers take it: this lease's effect is a double one.
			f := confirmed
			if obs.late || err != nil {
				f = lateOK
			}
			led.end(key, info, f, sent, time.Now())
			return true
		}
		led.failed(&led.confirmErrs, "confirm", err)
		info.errs++
		// Retry within the lease, as the consumer wrapper does; past it,
		// give up: the outcome is unknown, and the lease's expiry hands
		// the key to the next delivery unless a Confirm did land.
		if time.Now().Add(20 * time.Millisecond).After(c.Lease.Expires) {
			led.end(key, info, abandoned, time.Time{}, time.Time{})
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// confirmedBefore returns the messages whose Confirm returned nil before t.
func (l *ledger) confirmedBefore(t time.Time) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var keys []string
	for key, k := range l.keys {
		for _, p := range k.leases {
			if (p.fate == confirmed || p.fate == lateOK) && p.endAt.Before(t) {
				keys = append(keys, key)
				break
			}
		}
	}
	return keys
}
