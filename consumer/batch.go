package consumer

import (
	"bytes"
	"context"
	"errors"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/idemgo/idem"
)

// Batch wraps h for consumers that receive deliveries in batches. The
// returned func handles ms and returns one result per message, errs[i] for
// ms[i], with the meaning Idempotent gives its error: [ActionFor](errs[i])
// says what to do with ms[i] (ack, redeliver later, ack and alert, or
// dead-letter).
//
// When store is an idem.Batcher, the whole batch is claimed in one call
// (one round trip on a single Redis) and the successes are confirmed in one
// call; otherwise each message is claimed and confirmed on its own.
// Claimed messages run under idem.KeepAlive from the moment they are
// claimed, at most Options.Concurrency at a time, each with its lease in
// its context. Failed handlers' claims are forgotten. A success whose
// Confirm finds another delivery's confirmation kept is done (nil), as with
// Idempotent.
//
// A key that appears more than once in one batch is handled in order, as
// if its messages had come one after another, and its work runs once
// however often the batch repeats it. Its first message is claimed, run
// and settled with the messages of other keys. A later one takes, without
// a claim of its own, the outcome a claim would then find: nil (a
// duplicate) once the first is done, the first's idem.ErrInProgress when
// another delivery holds the key, its ErrNotRecorded when the work was
// done but not recorded. After any other outcome (the handler or the store
// failed), or when its fingerprint differs from the first's, it is claimed
// in a round of its own (one more claim call) and run if the key is free,
// as a redelivery would be. Every message is settled; none is held back as
// InProgress by its own batch.
//
// If a handler panics, the rest of its round is still settled (successes
// confirmed, failures forgotten), later rounds are not run (their messages
// were never claimed), and then the first panic is re-raised on the
// caller's goroutine.
//
// A crash can redo up to one batch. The successes of a round are
// confirmed together, once its last handler has returned: a process
// killed (kill -9) after some handlers' effects and before that confirm
// leaves their claims to run out, and the redelivery does all of them
// again, where Idempotent's window is the one message (see "What once
// means" in the package documentation). Smaller batches narrow the window;
// fencing tokens or the SQL store's transactional mode close it.
//
// opts holds at most one Options; Batch panics on the mistakes Idempotent
// panics on.
//
// The returned func is safe for concurrent use if h and key are.
func Batch[M any](store idem.Store, key func(M) string, h func(ctx context.Context, m M) error, opts ...Options[M]) func(ctx context.Context, ms []M) []error {
	c, fp := setup("consumer.Batch", store, key, h, opts)
	w := &wrapper[M]{config: c, store: store, key: key, fingerprint: fp, h: h}
	w.batcher, _ = store.(idem.Batcher)
	return w.batch
}

// batch is Batch's handler. It handles ms in four steps: claim every
// message, run the claimed ones, settle them (forget or confirm), and
// report every message to the Observer; in rounds, when a key repeats. A
// handler's panic is re-raised only after all that.
func (w *wrapper[M]) batch(ctx context.Context, ms []M) []error {
	// One value for the batch: idem.Checkpoint, in a handler, records
	// through the store beside its lease.
	ctx = idem.ContextWithStore(ctx, w.store)
	var ob *batchObs
	if w.observer != nil {
		ob = w.startBatch(ctx, len(ms))
	}
	errs := make([]error, len(ms))
	keys, at, fps := w.keys(ms, errs, ob)
	var first *panicValue
	if repeats(keys) {
		first = w.rounds(ctx, ms, keys, at, fps, errs, ob)
	} else {
		first = w.round(ctx, ms, keys, at, fps, errs, nil, ob)
	}
	if ob != nil {
		w.endBatch(ob)
	}
	if first != nil {
		panic(first.v)
	}
	return errs
}

// round claims, runs and settles the messages ms[at[j]], whose keys
// (keys[j], each once) and fingerprints are given, and returns the first
// panic. fs, when not nil, gets what each message's claim found.
func (w *wrapper[M]) round(ctx context.Context, ms []M, keys []string, at []int, fps [][]byte, errs []error, fs []found, ob *batchObs) *panicValue {
	jobs := w.claim(ctx, keys, at, fps, errs, fs, ob)
	w.run(ctx, jobs, ms)
	return w.settle(ctx, jobs, errs, ob)
}

// errNotRun is the result, for the Observer, of a message that a panic in
// an earlier round of its batch kept from running: it was never claimed.
var errNotRun = errors.New("consumer: not handled: a handler of an earlier round of its batch panicked")

// rounds handles a batch whose keys repeat: round r holds each key's
// (r+1)-th message, so a key's next message is handled only once the
// previous one is settled. Where the previous one's outcome settles it
// (see follow), it takes that outcome without a claim; a round whose
// messages all do so costs no store call.
func (w *wrapper[M]) rounds(ctx context.Context, ms []M, keys []string, at []int, fps [][]byte, errs []error, ob *batchObs) *panicValue {
	seen := make(map[string]int, len(keys)) // key → its messages so far
	var split [][]int                       // split[r]: the indexes j of round r
	prev := make([]int, len(keys))          // prev[j]: the index of key j's previous message, or -1
	last := make(map[string]int, len(keys))
	for j, k := range keys {
		r := seen[k]
		seen[k] = r + 1
		if r == len(split) {
			split = append(split, nil)
		}
		split[r] = append(split[r], j)
		prev[j] = -1
		if p, ok := last[k]; ok {
			prev[j] = p
		}
		last[k] = j
	}
	fs := make([]found, len(ms)) // fs[i]: what message i's claim found
	for r, js := range split {
		if r > 0 {
			kept := js[:0:0]
			for _, j := range js {
				if w.follow(ob.ctx(ctx, at[j]), keys[j], at[j], at[prev[j]], fps, j, prev[j], errs, fs, ob) {
					continue
				}
				kept = append(kept, j)
			}
			if js = kept; len(js) == 0 {
				continue
			}
		}
		rkeys, rat := make([]string, len(js)), make([]int, len(js))
		var rfps [][]byte
		if fps != nil {
			rfps = make([][]byte, len(js))
		}
		for n, j := range js {
			rkeys[n], rat[n] = keys[j], at[j]
			if fps != nil {
				rfps[n] = fps[j]
			}
		}
		if p := w.round(ctx, ms, rkeys, rat, rfps, errs, fs, ob); p != nil {
			for _, later := range split[r+1:] {
				for _, j := range later {
					errs[at[j]] = errNotRun
					ob.set(at[j], keys[j], 0, errNotRun)
				}
			}
			return p
		}
	}
	return nil
}

// follow answers message i (keys[j]) from its key's previous message p
// (keys[q]) of the batch, settled in an earlier round, when that outcome
// is the one its own claim would find, and reports whether it did:
//   - p done (confirmed now, or a Duplicate of an earlier confirmation):
//     the claim would find the key confirmed, so i is a Duplicate (nil,
//     the DuplicateSkipped hook), and costs no claim round trip;
//   - p held by another delivery (idem.ErrInProgress): so is i, redelivered
//     with it;
//   - p done but not recorded (ErrNotRecorded): i gets that answer too; a
//     claim would find the key in progress and have it redelivered, to run
//     the work again once the lease runs out.
//
// Anything else (p failed, the store failed, p's claim was refused) and
// a fingerprint other than p's leave i to be claimed in its round.
func (w *wrapper[M]) follow(ctx context.Context, key string, i, p int, fps [][]byte, j, q int, errs []error, fs []found, ob *batchObs) bool {
	if fps != nil && !bytes.Equal(fps[j], fps[q]) {
		return false
	}
	e := errs[p]
	switch {
	case e == nil:
		fs[i] = found{token: fs[p].token}
		w.emit(ctx, DuplicateSkipped, key, fs[i].token, nil)
		ob.set(i, key, idem.Duplicate, nil)
	case fs[p].held:
		errs[i], fs[i] = e, fs[p]
		w.emit(ctx, InProgress, key, fs[i].token, nil)
		ob.set(i, key, idem.InProgress, e)
	case errors.Is(e, ErrNotRecorded):
		errs[i] = e
		ob.set(i, key, 0, e)
	default:
		return false
	}
	return true
}

// found is what a message's claim found, for the key's later messages in
// the batch (see follow).
type found struct {
	token int64 // the lease's token, or the record's the claim found
	held  bool  // InProgress: another delivery holds the key
}

// repeatSeed seeds the hashes by which repeats looks for a repeated key.
var repeatSeed = maphash.MakeSeed()

// repeats reports whether a key may appear twice in keys: true for every
// repeated key, and, rarely, for two keys of one hash (rounds then makes
// one round). It allocates nothing for batches of up to 256 keys, so a
// batch without repeats costs what it did before they were handled.
func repeats(keys []string) bool {
	if len(keys) < 2 {
		return false
	}
	var buf [256]uint64
	hs := buf[:0]
	if len(keys) > len(buf) {
		hs = make([]uint64, 0, len(keys))
	}
	for _, k := range keys {
		hs = append(hs, maphash.String(repeatSeed, k))
	}
	slices.Sort(hs)
	for i := 1; i < len(hs); i++ {
		if hs[i] == hs[i-1] {
			return true
		}
	}
	return false
}

// claim claims keys, the keys of the messages ms[at[j]], and returns a job
// for each message claimed; the others' results go to errs. fs, when not
// nil, gets what each message's claim found.
func (w *wrapper[M]) claim(ctx context.Context, keys []string, at []int, fps [][]byte, errs []error, fs []found, ob *batchObs) []*job {
	claims, cerrs := claimAll(ctx, w.store, w.batcher, keys, fps)
	var jobs []*job
	for j, cl := range claims {
		i := at[j]
		if fs != nil && (cerrs == nil || cerrs[j] == nil) {
			fs[i] = found{held: cl.Outcome == idem.InProgress}
			switch {
			case cl.Lease != nil:
				fs[i].token = cl.Lease.Token
			case cl.Record != nil:
				fs[i].token = cl.Record.Token
			}
		}
		switch {
		case cerrs != nil && cerrs[j] != nil:
			w.claimFailed(ob.ctx(ctx, i), keys[j], cl, cerrs[j])
			// A fingerprint mismatch comes with its claim's outcome.
			errs[i] = cerrs[j]
			ob.set(i, keys[j], cl.Outcome, errs[i])
		case cl.Outcome != idem.Claimed:
			errs[i] = w.notClaimed(ob.ctx(ctx, i), keys[j], cl)
			ob.set(i, keys[j], cl.Outcome, errs[i])
		default:
			ob.set(i, keys[j], idem.Claimed, nil)
			ob.tookOver(i, cl.TakeOver)
			work, cancel := context.WithCancelCause(w.tookOver(ob.ctx(ctx, i), cl))
			jobs = append(jobs, &job{i: i, lease: cl.Lease, work: work, cancel: cancel})
		}
	}
	return jobs
}

// keys returns the keys of the messages that have one, with at[j] the
// index in ms of keys[j], and their fingerprints (nil: none). An empty
// key's result goes to errs: it is refused before any store call.
func (w *wrapper[M]) keys(ms []M, errs []error, ob *batchObs) (keys []string, at []int, fps [][]byte) {
	keys = make([]string, 0, len(ms))
	at = make([]int, 0, len(ms))
	for i, m := range ms {
		k := w.key(m)
		if k == "" {
			errs[i] = errEmptyKey
			ob.set(i, "", 0, errs[i])
			continue
		}
		keys = append(keys, k)
		at = append(at, i)
		if w.fingerprint != nil {
			fps = append(fps, w.fingerprint(m))
		}
	}
	return keys, at, fps
}

// run runs the jobs' handlers, at most Concurrency at a time, and returns
// once they have all returned and no Renew is in flight.
func (w *wrapper[M]) run(ctx context.Context, jobs []*job, ms []M) {
	// Renewed from the claim on, not from the handler's start: a message
	// waiting for a free slot must not lose its lease.
	stop := keepAll(ctx, w.store, jobs)
	runAll(w.concurrency, jobs, w.h, ms)
	stop()
	for _, j := range jobs {
		j.cancel(context.Canceled) // releases the context; a lost lease's cause stays
	}
}

// settle forgets the claims of the jobs that failed or panicked and
// confirms the others, and returns the first panic.
func (w *wrapper[M]) settle(ctx context.Context, jobs []*job, errs []error, ob *batchObs) *panicValue {
	var done []*job
	var first *panicValue
	for _, j := range jobs {
		mctx := ob.ctx(ctx, j.i)
		lost := w.lost(mctx, j.work, j.lease)
		if j.err != nil || j.panic != nil {
			w.forget(mctx, w.store, j.lease, lost)
			errs[j.i] = j.err
			if first == nil && j.panic != nil {
				first = j.panic
			}
			continue
		}
		j.late = lost
		done = append(done, j)
	}
	w.confirmJobs(ctx, done, errs, ob)
	return first
}

// confirmJobs confirms the jobs whose handlers succeeded, in one call per
// attempt when the store is a Batcher, and sets their results.
func (w *wrapper[M]) confirmJobs(ctx context.Context, done []*job, errs []error, ob *batchObs) {
	leases := make([]*idem.Lease, len(done))
	for n, j := range done {
		leases[n] = j.lease
	}
	for n, err := range w.confirmAll(ctx, w.store, w.batcher, leases) {
		j := done[n]
		if errs[j.i] = w.recorded(ob.ctx(ctx, j.i), j.lease, j.late, err); errs[j.i] != nil {
			ob.set(j.i, j.lease.Key, idem.Claimed, errs[j.i])
		}
	}
}

// job is one claimed message of a batch.
type job struct {
	i        int // index in the batch
	lease    *idem.Lease
	work     context.Context // cancelled with cause idem.ErrLeaseLost by keepAll
	cancel   context.CancelCauseFunc
	finished atomic.Bool // the handler returned: keepAll stops renewing
	err      error
	panic    *panicValue
	late     bool
}

// runAll runs the jobs' handlers on at most n goroutines, each taking the
// next job as it becomes free.
func runAll[M any](n int, jobs []*job, h func(context.Context, M) error, ms []M) {
	run := func(j *job) {
		defer j.finished.Store(true)
		j.panic, j.err = call(idem.ContextWithLease(j.work, j.lease), h, ms[j.i])
	}
	n = min(n, len(jobs))
	if n <= 1 {
		for _, j := range jobs {
			run(j)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for k := next.Add(1) - 1; k < int64(len(jobs)); k = next.Add(1) - 1 {
				run(jobs[k])
			}
		})
	}
	wg.Wait()
}
