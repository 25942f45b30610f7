package main

import (
	"fmt"
	"io"
	"slices"
	"sync"
	"time"
)

// ledger is the demo's effect: what a handler does to the world, once per
// message if idem does its job. It also keeps what it needs to explain every
// double effect: the crashes between an effect and its confirm.
//
// Writes are fenced by the lease's token (a write with a token not greater
// than the last accepted one is refused), as DESIGN 3.3 advises for any
// downstream write: a worker that stalled past its lease cannot apply the
// effect over its successor.
type ledger struct {
	mu   sync.Mutex
	msgs []msgState
	counts
}

type msgState struct {
	runs      int   // handler runs, crashed or not
	applied   int   // effects applied
	fence     int64 // token of the last accepted effect
	lastToken int64 // token of the last run's lease
	// tokens are the tokens of its runs; crashedTokens those that
	// crashed; takenOver those a later run was told it took over.
	tokens, crashedTokens, takenOver []int64
	unrecorded                       bool // the last delivery was acked done but not recorded (consumer.ErrNotRecorded)
	crashBefore                      int
	crashAfter                       int
	deadLettered                     bool // its key was quarantined: the delivery was dead-lettered
}

// counts are the run's totals, read by the progress line and the report.
type counts struct {
	deliveries   int
	acked        int
	duplicates   int // skipped: the key was confirmed
	inProgress   int // redelivered later: another delivery held the key
	storeErrors  int // redelivered later: the store failed, or the handler lost its lease
	notRecorded  int // the work was done but could not be confirmed
	leaseLost    int // a handler's lease ran out while it ran
	takeOvers    int // a run that claimed a key whose last run crashed
	stalls       int // a run told of a take-over of a run that had not crashed: its lease ran out while it worked or confirmed
	seen         int // runs whose handler was told of a take-over (idem.TakeOverFrom)
	misreported  int // runs told of a take-over of no open claim, or not told after a crash
	reconciled   int // take-overs that found the effect in the ledger and did not redo it
	deadLetters  int // deliveries dead-lettered: their key was quarantined
	crashBefore  int
	crashAfter   int
	effects      int
	fenced       int // effects refused by the fence
	staleTokens  int // a lease whose token was not above its predecessor's
	messagesDone int // messages with at least one effect
}

func newLedger(messages int) *ledger { return &ledger{msgs: make([]msgState, messages)} }

// count applies f to the totals under the ledger's lock.
func (l *ledger) count(f func(c *counts)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f(&l.counts)
}

// snapshot returns the totals as they are now.
func (l *ledger) snapshot() counts {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.counts
}

// begin records the start of a handler run of message m under a lease with
// token, told of a take-over of the run with token prior or not told, and
// returns the run's index (from 0).
//
// A report of a take-over is right when prior is an earlier run of m not
// taken over before: one that crashed, or one that stalled past its lease
// on a loaded machine (its handler or its confirm still running when the
// lease ran out; its confirm may even land after this claim, as a late
// confirm). Which of the two the ledger cannot see from the order of its
// own events, which follow the store's only loosely; it counts a take-over
// of a crashed run as one after a crash, and the others as stalls. Not
// told is wrong when a crashed run is there to take over.
func (l *ledger) begin(m int, token int64, toldTakeOver bool, prior int64) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := &l.msgs[m]
	if toldTakeOver {
		l.seen++
		switch {
		case !slices.Contains(s.tokens, prior) || slices.Contains(s.takenOver, prior):
			l.misreported++
		case slices.Contains(s.crashedTokens, prior):
			l.takeOvers++
		default:
			l.stalls++
		}
		s.takenOver = append(s.takenOver, prior)
	} else {
		for _, t := range s.crashedTokens {
			if !slices.Contains(s.takenOver, t) {
				l.takeOvers++
				l.misreported++
				s.takenOver = append(s.takenOver, t)
			}
		}
	}
	s.tokens = append(s.tokens, token)
	if s.runs > 0 && token <= s.lastToken {
		l.staleTokens++
	}
	s.lastToken = token
	s.runs++
	return s.runs - 1
}

// settled records how a run of message m ended, as the worker saw it: its
// claim confirmed (done), forgotten (failed), or left to run out with its
// work done but not recorded.
func (l *ledger) settled(m int, how settlement) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch how {
	case settledDone:
		l.msgs[m].unrecorded = false
	case settledUnrecorded:
		l.msgs[m].unrecorded = true
	}
}

// unrecorded reports whether message m's last delivery was acked as done
// but not recorded.
func (l *ledger) unrecorded(m int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.msgs[m].unrecorded
}

// settlement is how a delivery's claim ended (see ledger.settled).
type settlement int

const (
	settledDone settlement = iota
	settledFailed
	settledUnrecorded
)

// applyUnlessLanded is what a take-over does when reconciling: in one step,
// it records a reconciled effect when message m's effect landed already,
// else applies it under token (see apply).
func (l *ledger) applyUnlessLanded(m int, token int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.msgs[m].applied > 0 {
		l.reconciled++
		return
	}
	l.applyLocked(m, token)
}

// apply applies message m's effect under token, unless the fence refuses it.
func (l *ledger) apply(m int, token int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.applyLocked(m, token)
}

func (l *ledger) applyLocked(m int, token int64) {
	s := &l.msgs[m]
	if token <= s.fence {
		l.fenced++
		return
	}
	s.fence = token
	s.applied++
	l.effects++
	if s.applied == 1 {
		l.messagesDone++
	}
}

// deadLetter records that a delivery of message m was dead-lettered.
func (l *ledger) deadLetter(m int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.deadLetters++
	l.msgs[m].deadLettered = true
}

// crashed records that message m's run with token crashed at k.
func (l *ledger) crashed(m int, token int64, k crashKind) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := &l.msgs[m]
	s.crashedTokens = append(s.crashedTokens, token)
	if k == crashAfter {
		s.crashAfter++
		l.crashAfter++
	} else {
		s.crashBefore++
		l.crashBefore++
	}
}

// verdict is the ledger checked against idem's guarantees.
type verdict struct {
	neverApplied []int // ordinary messages without an effect
	doubles      int   // effects beyond the first, all messages
	explained    int   // doubles that follow a crash between effect and confirm, without reconciling
	unexplained  int   // doubles with no such crash: a broken guarantee
	unconfirmed  int   // ordinary keys without a confirmed record at the end
	alerted      int   // of those, keys whose work was done once, acked and alerted as not recorded
	lookupErrors int
	// quarantined are the poison messages quarantined as they must be:
	// dead-lettered after exactly MaxTakeOvers + 1 runs, each crashed, and
	// their record quarantined with MaxTakeOvers take-overs.
	quarantined []int
	// poisonWrong are the poison messages that were not (or a message
	// that was quarantined wrongly); wrongDead ordinary messages
	// dead-lettered.
	poisonWrong []int
	wrongDead   int
}

func (v *verdict) ok(c counts) bool {
	return len(v.neverApplied) == 0 && v.unexplained == 0 && v.unconfirmed == 0 &&
		v.lookupErrors == 0 && c.staleTokens == 0 && c.takeOvers == c.crashBefore+c.crashAfter-len(v.quarantined)-len(v.poisonWrong) &&
		c.seen == c.takeOvers+c.stalls && c.misreported == 0 && len(v.poisonWrong) == 0 && v.wrongDead == 0
}

// check compares every message's effects with its crashes. Reconciling,
// no message may take effect twice: a take-over asks the ledger first.
// Without it, the only allowed cause of a double effect is a crash after
// the effect and before the confirm: the store never learned that the
// work was done, so the take-over does it again. A message may then be
// doubled at most once per such crash. A poison message must be run
// exactly maxRuns times, never take effect, and be dead-lettered.
func (l *ledger) check(p *plan, reconcile bool, maxRuns int) *verdict {
	l.mu.Lock()
	defer l.mu.Unlock()
	v := &verdict{}
	for m, s := range l.msgs {
		if p.poison(m) {
			if s.runs == maxRuns && s.applied == 0 && s.deadLettered {
				v.quarantined = append(v.quarantined, m)
			} else {
				v.poisonWrong = append(v.poisonWrong, m)
			}
			continue
		}
		if s.deadLettered {
			v.wrongDead++
		}
		if s.applied == 0 {
			v.neverApplied = append(v.neverApplied, m)
			continue
		}
		extra := s.applied - 1
		v.doubles += extra
		allowed := 0
		if !reconcile {
			allowed = min(extra, s.crashAfter)
		}
		v.explained += allowed
		v.unexplained += extra - allowed
	}
	return v
}

// report writes the run's report and the verdict.
func report(w io.Writer, d *demoRun, c counts, v *verdict, elapsed time.Duration) {
	secs := elapsed.Seconds()
	crashes := c.crashBefore + c.crashAfter
	row := func(name string, format string, args ...any) {
		fmt.Fprintf(w, "  %-26s %s\n", name, fmt.Sprintf(format, args...))
	}
	fmt.Fprintf(w, "\nidem demo report (%s, seed %d, run %s)\n", d.store, d.seed, d.runID)
	row("messages", "%d", d.messages)
	row("deliveries", "%d (%d initial, %d redeliveries)", c.deliveries, len(d.plan.order), c.deliveries-len(d.plan.order))
	row("duplicates skipped", "%d (the key was confirmed: the handler did not run)", c.duplicates)
	row("in-progress redeliveries", "%d (another worker held the key: redelivered after %v)", c.inProgress, d.retryDelay)
	row("crashes", "%d (%d before the effect, %d after the effect and before the confirm)", crashes, c.crashBefore, c.crashAfter)
	row("take-overs after crashes", "%d (after the crashed worker's lease of %v ran out)", c.takeOvers, d.lease)
	row("take-overs seen", "%d (handlers told of a take-over by idem.TakeOverFrom; %d told wrongly)", c.seen, c.misreported)
	if c.stalls > 0 {
		row("stalled leases taken over", "%d (a worker slowed past its lease: the next delivery took the key over and was told; a stale effect is refused by the fencing token)", c.stalls)
	}
	if d.reconcile {
		row("effects reconciled", "%d (a take-over found the effect in the ledger: confirmed, not applied again)", c.reconciled)
	} else {
		row("effects reconciled", "0 (off: --no-reconcile; every take-over applies the effect)")
	}
	row("effects applied", "%d", c.effects)
	row("double effects", "%d (%d after a crash between effect and confirm, %d unexplained)", v.doubles, v.explained, v.unexplained)
	row("never applied", "%d", len(v.neverApplied))
	row("records confirmed", "%d of %d", d.messages-v.unconfirmed-v.alerted-v.lookupErrors, d.messages)
	if v.alerted > 0 {
		row("", "%d not: work done once, acked and alerted as done but not recorded (consumer.ErrNotRecorded)", v.alerted)
	}
	if d.poison > 0 {
		row("poison quarantined", "%d of %d (each crashed its worker %d times: its first run and MaxTakeOvers %d take-overs; then dead-lettered, %d deliveries)",
			len(v.quarantined), d.poison, d.maxTakeOvers+1, d.maxTakeOvers, c.deadLetters)
		for i, m := range v.quarantined {
			if i == 10 {
				fmt.Fprintf(w, "  %-26s ... %d more\n", "", len(v.quarantined)-i)
				break
			}
			if d.embedded {
				fmt.Fprintf(w, "  %-26s %s\n", "", d.key(m))
			} else {
				fmt.Fprintf(w, "  %-26s %s (idem inspect / idem resolve %s --forget)\n", "", d.key(m), d.key(m))
			}
		}
		if d.embedded && len(v.quarantined) > 0 {
			// The embedded Redis ends with the demo: a command run after
			// it would find no such key.
			fmt.Fprintf(w, "  %-26s (the embedded store ends with the demo: to inspect and resolve them with idem inspect and idem resolve, run the demo on a store of your own: --redis, --postgres, --mysql or --sqlite FILE)\n", "")
		}
	}
	if c.fenced > 0 || c.leaseLost > 0 {
		row("leases lost while running", "%d (stale effects refused by the fencing token: %d)", c.leaseLost, c.fenced)
	}
	if c.storeErrors > 0 || c.notRecorded > 0 {
		row("errors", "%d (store errors or lost leases: redelivered), %d done but not recorded", c.storeErrors, c.notRecorded)
	}
	if c.staleTokens > 0 {
		row("fencing violations", "%d (a lease's token was not above its predecessor's)", c.staleTokens)
	}
	row("throughput", "%.0f messages/s, %.0f deliveries/s (%v, %d workers)",
		float64(d.messages)/secs, float64(c.deliveries)/secs, elapsed.Round(time.Millisecond), d.workers)
	if d.interrupted != nil {
		fmt.Fprintf(w, "\nFAILED: the run did not finish (%v); the counts above are partial.\n", d.interrupted)
		return
	}
	if v.ok(c) && d.reconcile {
		fmt.Fprintf(w, "\nOK: every message took effect once: 0 double effects. Each of the %d take-overs was reported to its handler, which asked the ledger first (%d effects had landed before a crash and were not applied again).\n",
			c.seen, c.reconciled)
		return
	}
	if v.ok(c) {
		fmt.Fprintf(w, "\nOK: every message took effect; each of the %d double effects follows a crash between effect and confirm (%d such crashes). Without --no-reconcile the take-overs ask the ledger first, and there are none.\n",
			v.doubles, c.crashAfter)
		return
	}
	fmt.Fprintf(w, "\nFAILED: the ledger disagrees with idem's guarantees:\n")
	if n := len(v.neverApplied); n > 0 {
		fmt.Fprintf(w, "  %d messages never took effect (first: %s)\n", n, d.key(v.neverApplied[0]))
	}
	if v.unexplained > 0 && d.reconcile {
		fmt.Fprintf(w, "  %d double effects, though every take-over asked the ledger first\n", v.unexplained)
	} else if v.unexplained > 0 {
		fmt.Fprintf(w, "  %d double effects without a crash between effect and confirm to explain them\n", v.unexplained)
	}
	if c.seen != c.takeOvers+c.stalls || c.misreported > 0 {
		fmt.Fprintf(w, "  %d take-overs reported to handlers for %d take-overs after crashes and %d of stalled leases (%d reported wrongly)\n", c.seen, c.takeOvers, c.stalls, c.misreported)
	}
	if n := len(v.poisonWrong); n > 0 {
		fmt.Fprintf(w, "  %d poison messages not quarantined after exactly %d crashed runs (first: %s)\n", n, d.maxTakeOvers+1, d.key(v.poisonWrong[0]))
	}
	if v.wrongDead > 0 {
		fmt.Fprintf(w, "  %d ordinary messages dead-lettered\n", v.wrongDead)
	}
	if v.unconfirmed > 0 || v.lookupErrors > 0 {
		fmt.Fprintf(w, "  %d keys without a confirmed record, %d lookups failed\n", v.unconfirmed, v.lookupErrors)
	}
	if c.leaseLost > 0 {
		fmt.Fprintf(w, "  %d leases ran out while their handler ran (a stalled worker: is the machine too loaded for a %v lease? try a longer --lease)\n", c.leaseLost, d.lease)
	}
	if c.staleTokens > 0 {
		fmt.Fprintf(w, "  %d leases whose fencing token did not increase\n", c.staleTokens)
	}
	if want := crashes - d.poison; c.takeOvers != want {
		fmt.Fprintf(w, "  %d take-overs for %d crashes that left a claim to take over\n", c.takeOvers, want)
	}
}
