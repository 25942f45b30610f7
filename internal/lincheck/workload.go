package lincheck

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/regrant"
)

// Client is one caller in a history: a goroutine that calls Store one call
// after another. Clients may share a Store (and so its Worker): a claim held
// by the same worker is still InProgress to another call.
type Client struct {
	Store idem.Store
	// Worker is the Worker of Store's options: the Owner of its leases.
	Worker string
}

// Workload describes one history: every client makes Ops random calls on
// Keys, at once. Keys should be fresh (no record yet) and leases long
// enough to outlive the history.
type Workload struct {
	Clients []Client
	Keys    []string
	// Ops is the number of calls each client makes.
	Ops int
	// Cut is the fraction of calls (0 to 1) given a deadline drawn from
	// [0, MaxCut): short enough to cut some of them off mid-call, so that
	// their outcome is unknown. MaxCut defaults to 2ms.
	Cut    float64
	MaxCut time.Duration
	// Timeout is the deadline of every other call. Default 10s.
	Timeout time.Duration
	// Batch is the fraction of claims and confirms (0 to 1) made, when the
	// client's store is an idem.Batcher, as ClaimBatch or ConfirmBatch of
	// one to three items, on any keys, the same key twice included.
	Batch float64
	// Bare makes every claim without a fingerprint and every confirm
	// without a result, as a consumer's are: the records a Redis store
	// keeps in its short form (and as hash fields, with FieldHashes).
	Bare bool
}

// History is what a workload recorded.
type History struct {
	// Ops are the calls, ready for porcupine. A call whose outcome is
	// unknown returns at math.MaxInt64 and is drawn on a client row of its
	// own, after the workload's clients.
	Ops []porcupine.Operation
	// Unknown counts the calls whose outcome is unknown.
	Unknown int
	// Failures are the errors of calls whose own deadline had not run out:
	// the store failed. They are in Ops as unknown outcomes too.
	Failures []error
}

// pool holds the leases that answers have shown so far, per key: those of
// Claimed and those rebuilt from InProgress records (a lease is a value
// that anyone may present). Stale leases stay, so that calls also present
// leases that were forgotten, confirmed or are another client's.
type pool struct {
	mu     sync.Mutex
	leases map[string][]*idem.Lease
	// origin maps a forged lease to the lease it was copied from: copies
	// share what their store knows of a lease (its Forget), so they share
	// its forget marks here.
	origin  map[*idem.Lease]*idem.Lease
	forgets map[*idem.Lease]*forgetMark
}

// forgetMark is what the workload knows of the Forgets of one lease.
type forgetMark struct{ begun, returned bool }

// holder adds a lease that names the holder of key's live claim (rec, as
// InProgress reported it) but that its holder never gave anyone: a store
// must treat it as the stranger it is. It is one of the client's own leases
// rewritten (a lease made by hand would be refused before the store looked
// at the record), so it shares that lease's forget marks.
func (p *pool) holder(key string, rec *idem.Record, own map[string]*idem.Lease) {
	for _, donor := range own {
		f := regrant.Lease(donor, key, rec.Token, rec.Owner).(*idem.Lease)
		f.Fingerprint = rec.Fingerprint
		p.forged(f, donor)
		p.add(f)
		return
	}
}

// forged records that f was copied from l.
func (p *pool) forged(f, l *idem.Lease) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if o, ok := p.origin[l]; ok {
		l = o
	}
	p.origin[f] = l
}

// mark returns l's forget marks, creating them. The caller holds p.mu.
func (p *pool) mark(l *idem.Lease) *forgetMark {
	if o, ok := p.origin[l]; ok {
		l = o
	}
	m := p.forgets[l]
	if m == nil {
		m = &forgetMark{}
		p.forgets[l] = m
	}
	return m
}

// forgetting runs a Forget of l, marking when it began and returned.
func (p *pool) forgetting(l *idem.Lease, forget func() error) error {
	p.mu.Lock()
	m := p.mark(l)
	m.begun = true
	p.mu.Unlock()
	err := forget()
	p.mu.Lock()
	m.returned = true
	p.mu.Unlock()
	return err
}

// forgot runs call with l and says what it could have known of l's Forget.
func (p *pool) forgot(ls []*idem.Lease, call func()) Forgot {
	p.mu.Lock()
	before := NotForgotten
	for _, l := range ls {
		if p.mark(l).returned {
			before = Forgotten
		}
	}
	p.mu.Unlock()
	call()
	if before == Forgotten {
		return Forgotten
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range ls {
		if p.mark(l).begun {
			return MaybeForgotten
		}
	}
	return NotForgotten
}

func (p *pool) add(l *idem.Lease) {
	p.mu.Lock()
	p.leases[l.Key] = append(p.leases[l.Key], l)
	p.mu.Unlock()
}

func (p *pool) pick(key string, rng *rand.Rand) *idem.Lease {
	p.mu.Lock()
	defer p.mu.Unlock()
	ls := p.leases[key]
	if len(ls) == 0 {
		return nil
	}
	return ls[rng.IntN(len(ls))]
}

// recorder collects the operations of one history.
type recorder struct {
	start   time.Time
	clients int
	mu      sync.Mutex
	h       History
}

// record runs one call and records it. do runs it and describes its answer.
func (r *recorder) record(ctx context.Context, client int, in Input, do func(ctx context.Context) (Output, error)) {
	r.recordBatch(ctx, client, []Input{in}, func(ctx context.Context) ([]Output, error) {
		out, err := do(ctx)
		return []Output{out}, err
	})
}

// recordBatch runs one call that acts on several keys (ClaimBatch,
// ConfirmBatch) and records each item as a call of its own over the
// batch's whole span: the store may take them in any order within it.
func (r *recorder) recordBatch(ctx context.Context, client int, ins []Input, do func(ctx context.Context) ([]Output, error)) {
	call := time.Since(r.start).Nanoseconds()
	outs, err := do(ctx)
	ret := time.Since(r.start).Nanoseconds()
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, in := range ins {
		out, ret, client := outs[i], ret, client
		if out.Err == Unknown {
			// Whether and when it took effect is unknown: it may be
			// placed anywhere after its start. Its own row keeps the
			// client's row readable in the visualization.
			ret = math.MaxInt64
			client = r.clients + r.h.Unknown
			r.h.Unknown++
			if !ran(ctx) {
				r.h.Failures = append(r.h.Failures, fmt.Errorf("%s: %w", describe(in, out), err))
			}
		}
		r.h.Ops = append(r.h.Ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
	}
}

// ran reports whether ctx's deadline has come: ctx.Err(), or the clock
// past the deadline. A call whose connection hit the deadline (go-redis's
// ContextTimeoutEnabled sets it on the socket) can return before ctx's
// own timer has fired, on a loaded machine by some milliseconds: its
// error is the deadline's, not the store's.
func ran(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// Run runs the workload once and returns its history. seed fixes every
// client's choices (not the interleaving, which is the point).
func (w Workload) Run(seed uint64) *History {
	if w.MaxCut <= 0 {
		w.MaxCut = 2 * time.Millisecond
	}
	if w.Timeout <= 0 {
		w.Timeout = 10 * time.Second
	}
	r := &recorder{start: time.Now(), clients: len(w.Clients)}
	p := &pool{leases: map[string][]*idem.Lease{}, origin: map[*idem.Lease]*idem.Lease{},
		forgets: map[*idem.Lease]*forgetMark{}}
	var wg sync.WaitGroup
	for i, c := range w.Clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			own := map[string]*idem.Lease{}
			for range w.Ops {
				w.call(r, p, i, c, rng, own)
			}
		})
	}
	wg.Wait()
	return &r.h
}

// call makes one random call: mostly claims and lookups, and confirms,
// forgets and renews with the client's own latest lease, someone else's, a
// stale one or a forged one.
func (w Workload) call(r *recorder, p *pool, i int, c Client, rng *rand.Rand, own map[string]*idem.Lease) {
	key := w.Keys[rng.IntN(len(w.Keys))]
	timeout := w.Timeout
	if rng.Float64() < w.Cut {
		timeout = time.Duration(rng.Int64N(int64(w.MaxCut)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()

	n := rng.IntN(100)
	var l *idem.Lease
	if n >= 30 && n < 70 {
		l = own[key]
		if l == nil || rng.IntN(10) < 4 {
			l = p.pick(key, rng)
		}
		if l != nil && rng.IntN(10) == 0 {
			f := forge(l, rng)
			p.forged(f, l)
			l = f
		}
		if l == nil {
			n = 0 // nothing to present yet: claim instead
		}
	}
	b, batcher := c.Store.(idem.Batcher)
	checkpointer, _ := c.Store.(idem.Checkpointer)
	batch := batcher && rng.Float64() < w.Batch
	switch {
	case n < 30 && batch:
		w.claimBatch(ctx, r, p, i, c, b, rng, own)
	case n < 30:
		fp := w.fingerprint(rng, i)
		in := Input{Kind: Claim, Key: key, Worker: c.Worker, Fingerprint: string(fp)}
		r.record(ctx, i, in, func(ctx context.Context) (Output, error) {
			cl, err := c.Store.Claim(ctx, key, fp)
			switch {
			case err != nil:
			case cl.Outcome == idem.Claimed && cl.Lease != nil:
				own[key] = cl.Lease
				p.add(cl.Lease)
			case cl.Outcome == idem.InProgress && cl.Record != nil:
				p.holder(key, cl.Record, own)
			}
			return claimOutput(cl, err), err
		})
	case n < 45 && batch:
		w.confirmBatch(ctx, r, p, i, b, rng, l)
	case n < 45:
		result := w.result(rng)
		ins := []Input{{Kind: Confirm, Key: key, Lease: ref(l), Result: string(result)}}
		r.recordBatch(ctx, i, ins, func(ctx context.Context) ([]Output, error) {
			var err error
			ins[0].Forgot = p.forgot([]*idem.Lease{l}, func() { err = c.Store.Confirm(ctx, l, result) })
			return []Output{errOutput(err)}, err
		})
	case n < 58:
		r.record(ctx, i, Input{Kind: Forget, Key: key, Lease: ref(l)}, func(ctx context.Context) (Output, error) {
			err := p.forgetting(l, func() error { return c.Store.Forget(ctx, l) })
			return errOutput(err), err
		})
	case n < 64 && checkpointer != nil:
		data := string(randomResult(rng))
		ins := []Input{{Kind: Checkpoint, Key: key, Lease: ref(l), Result: data}}
		r.recordBatch(ctx, i, ins, func(ctx context.Context) ([]Output, error) {
			var err error
			ins[0].Forgot = p.forgot([]*idem.Lease{l}, func() { err = checkpointer.Checkpoint(ctx, l, []byte(data)) })
			return []Output{errOutput(err)}, err
		})
	case n < 70:
		ins := []Input{{Kind: Renew, Key: key, Lease: ref(l)}}
		r.recordBatch(ctx, i, ins, func(ctx context.Context) ([]Output, error) {
			var err error
			ins[0].Forgot = p.forgot([]*idem.Lease{l}, func() { err = c.Store.Renew(ctx, l) })
			return []Output{errOutput(err)}, err
		})
	default:
		r.record(ctx, i, Input{Kind: Lookup, Key: key}, func(ctx context.Context) (Output, error) {
			rec, err := c.Store.Lookup(ctx, key)
			if err != nil {
				return errOutput(err), err
			}
			return recordOutput(rec), nil
		})
	}
}

// claimBatch claims one to three keys in one ClaimBatch.
func (w Workload) claimBatch(ctx context.Context, r *recorder, p *pool, i int, c Client, b idem.Batcher, rng *rand.Rand, own map[string]*idem.Lease) {
	n := 1 + rng.IntN(3)
	keys := make([]string, n)
	fps := make([][]byte, n)
	ins := make([]Input, n)
	for j := range keys {
		keys[j] = w.Keys[rng.IntN(len(w.Keys))]
		fps[j] = w.fingerprint(rng, i)
		ins[j] = Input{Kind: Claim, Key: keys[j], Worker: c.Worker, Fingerprint: string(fps[j])}
	}
	r.recordBatch(ctx, i, ins, func(ctx context.Context) ([]Output, error) {
		cs, err := b.ClaimBatch(ctx, keys, fps)
		errs := itemErrors(err, n)
		outs := make([]Output, n)
		for j := range outs {
			outs[j] = Output{Malformed: fmt.Sprintf("ClaimBatch of %d keys answered %d claims", n, len(cs))}
		}
		for j, cl := range cs[:min(len(cs), n)] {
			if errs[j] == nil || errors.Is(errs[j], idem.ErrFingerprintMismatch) {
				outs[j] = claimOutput(cl, errs[j])
				switch {
				case cl.Outcome == idem.Claimed && cl.Lease != nil:
					own[keys[j]] = cl.Lease
					p.add(cl.Lease)
				case cl.Outcome == idem.InProgress && cl.Record != nil:
					p.holder(keys[j], cl.Record, own)
				}
			}
		}
		for j, e := range errs {
			if e != nil && !errors.Is(e, idem.ErrFingerprintMismatch) {
				outs[j] = errOutput(e)
			}
		}
		return outs, err
	})
}

// confirmBatch confirms l and up to two more leases of any keys in one
// ConfirmBatch.
func (w Workload) confirmBatch(ctx context.Context, r *recorder, p *pool, i int, b idem.Batcher, rng *rand.Rand, l *idem.Lease) {
	leases := []*idem.Lease{l}
	for range rng.IntN(3) {
		if m := p.pick(w.Keys[rng.IntN(len(w.Keys))], rng); m != nil {
			leases = append(leases, m)
		}
	}
	results := make([][]byte, len(leases))
	ins := make([]Input, len(leases))
	for j, m := range leases {
		results[j] = w.result(rng)
		ins[j] = Input{Kind: Confirm, Key: m.Key, Lease: ref(m), Result: string(results[j])}
	}
	r.recordBatch(ctx, i, ins, func(ctx context.Context) ([]Output, error) {
		var err error
		// A forgotten lease fails the whole batch before any I/O, so each
		// item may see the Forget of any lease of the batch.
		forgot := p.forgot(leases, func() { err = b.ConfirmBatch(ctx, leases, results) })
		for j := range ins {
			ins[j].Forgot = forgot
		}
		errs := itemErrors(err, len(leases))
		outs := make([]Output, len(leases))
		for j, e := range errs {
			outs[j] = errOutput(e)
		}
		return outs, err
	})
}

// itemErrors spreads a batch call's error over its n items: a *BatchError
// of n items names each item's; any other error is every item's.
func itemErrors(err error, n int) []error {
	errs := make([]error, n)
	var be *idem.BatchError
	switch {
	case err == nil:
	case errors.As(err, &be) && len(be.Errs) == n:
		copy(errs, be.Errs)
	default:
		for j := range errs {
			errs[j] = err
		}
	}
	return errs
}

func randomResult(rng *rand.Rand) []byte {
	result := make([]byte, rng.IntN(12))
	for j := range result {
		result[j] = byte(rng.Uint32())
	}
	return result
}

func ref(l *idem.Lease) LeaseRef {
	return LeaseRef{Token: l.Token, Owner: l.Owner, Fingerprint: string(l.Fingerprint)}
}

// forge returns a lease that differs from l in its owner or its token,
// regranted so (a plain copy so changed is refused before any I/O): a
// store must never take it for l.
func forge(l *idem.Lease, rng *rand.Rand) *idem.Lease {
	owner, token := l.Owner, l.Token
	if rng.IntN(2) == 0 {
		owner += "-forged"
	} else {
		token++
	}
	return regrant.Lease(l, l.Key, token, owner).(*idem.Lease)
}

// fingerprint draws a fingerprint: none, one of a few shared ones (so that
// retries and reuses of a key look alike), or one of this client's own,
// bytes that are not text included.
// fingerprint is a claim's fingerprint: none when w is Bare.
func (w Workload) fingerprint(rng *rand.Rand, client int) []byte {
	if w.Bare {
		return nil
	}
	return fingerprint(rng, client)
}

// result is a confirm's result: none when w is Bare.
func (w Workload) result(rng *rand.Rand) []byte {
	if w.Bare {
		return nil
	}
	return randomResult(rng)
}

func fingerprint(rng *rand.Rand, client int) []byte {
	switch rng.IntN(5) {
	case 0:
		return nil
	case 1:
		return []byte("fp-a")
	case 2:
		return []byte{0, 0xff, '{', '}', ':'}
	}
	return fmt.Appendf(nil, "fp-%d-%d", client, rng.IntN(4))
}
