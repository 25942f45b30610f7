package idem

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Automatic pipelining (on unless RedisOptions.NoAutoPipeline): the single-key calls of
// many goroutines (Claim, Confirm, Renew, Forget, Lookup) go to Redis
// together, one pipeline per connection, while an earlier pipeline is in
// flight. An idle store sends a call at once: there is no timer to wait for.
//
// go-redis v9.23 has an AutoPipeliner of its own (experimental). It is not
// used here because:
//   - it diverts WAIT out of the batch onto another connection, and WAIT only
//     counts the writes of its own connection, so RedisOptions.WaitReplicas
//     could not ride in the same round trip as the confirm it waits for;
//   - a command's context is not honoured once queued (batches run on the
//     pipeliner's context), and a caller must be able to give up at once;
//   - it is one instance per client, shared with the application: the first
//     caller's configuration wins and its Close stops it for every user;
//   - knowing the calls are idem's own scripts, concurrent Claims (and
//     Confirms) on a single Redis are merged into one claim_batch
//     (confirm_batch) script call, which costs Redis far less than one
//     script call each; a generic command pipeliner cannot do that;
//   - its API is marked experimental and may change in any release.

// autoPipeSenders is how many pipelines may be in flight at once, each on a
// connection of its own. Two let Redis work on one pipeline while the
// client reads the other's replies and writes the next; more would split
// the waiting calls into ever smaller pipelines.
const autoPipeSenders = 2

// The life of a pipeCall: queued until a sender takes it (sent) or its
// caller gives up first (abandoned, never sent).
const (
	callQueued int32 = iota
	callSent
	callAbandoned
)

// pipeCall is one store call waiting for, or riding in, a pipeline. A
// call that ends with its reply is reused (pipeCalls): a busy store makes
// two calls a message, and each would otherwise cost a call, a channel and
// a key slice on the heap.
type pipeCall struct {
	scriptCall
	key   [2]string // scriptCall.keys
	arg   [4]any    // scriptCall.args: no script takes more than four
	state atomic.Int32
	// waits is set when the call's caller waits on done rather than sending
	// the call itself; done, buffered, is then signalled once v, err and
	// waitErr are set.
	waits bool
	done  chan struct{}
	v     any
	err   error
	// waitErr is the verdict of the WAIT that followed a confirm (see
	// RedisOptions.WaitReplicas).
	waitErr error
}

var pipeCalls = sync.Pool{New: func() any { return &pipeCall{done: make(chan struct{}, 1)} }}

// newPipeCall returns a queued call of script on key (a Redis key) and
// hash (its field hash, or "") with args.
func newPipeCall(script *luaScript, key, hash string, args []any) *pipeCall {
	c := pipeCalls.Get().(*pipeCall)
	c.key[0], c.key[1] = key, hash
	n := 1
	if hash != "" {
		n = 2
	}
	c.scriptCall = scriptCall{script: script, keys: c.key[:n], args: args}
	if len(args) <= len(c.arg) {
		c.args = c.arg[:copy(c.arg[:], args)]
	}
	c.state.Store(callQueued)
	c.waits = false
	return c
}

// hash returns the call's field hash, or "".
func (c *pipeCall) hash() string { return c.key[1] }

// release returns c, whose reply its caller has taken, for reuse. A call
// abandoned by its caller is never released: a sender may still hold it.
func (c *pipeCall) release() {
	c.scriptCall, c.key, c.arg = scriptCall{}, [2]string{}, [4]any{}
	c.v, c.err, c.waitErr = nil, nil, nil
	pipeCalls.Put(c)
}

// autoPipe collects calls into pipelines. The first caller to find fewer
// than autoPipeSenders pipelines in flight sends at once, taking along every
// call queued so far; calls arriving while the senders are busy queue up,
// and a sender whose pipeline returns sends the queue next.
type autoPipe struct {
	s       *RedisStore
	mu      sync.Mutex
	queue   []*pipeCall
	senders int // pipelines in flight
}

// do runs script on key (a Redis key) and hash (its field hash, or "") with
// args in a pipeline and returns
// its reply and, for a confirm with WaitReplicas, the verdict of its WAIT. A
// call that finds the store idle and nothing queued goes out alone on the
// caller's goroutine and context, exactly as without AutoPipeline.
// Otherwise, when ctx ends first, do returns ctx.Err() at once; the call may
// then have been sent, and may run.
func (p *autoPipe) do(ctx context.Context, script *luaScript, key, hash string, args []any) (v any, waitErr, err error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	c := newPipeCall(script, key, hash, args)
	p.mu.Lock()
	if p.senders >= autoPipeSenders {
		// Set before the call is visible to a sender.
		c.waits = true
		p.queue = append(p.queue, c)
		p.mu.Unlock()
		return p.wait(c, ctx)
	}
	p.senders++
	batch := append(p.queue, c)
	p.queue = nil
	p.mu.Unlock()
	if len(batch) == 1 || ctx.Done() == nil {
		// A lone call, or a caller nothing can cancel: it sends the pipeline
		// itself and costs no goroutine switch. A lone call goes on its own
		// context, as it would without AutoPipeline (go-redis honours a
		// deadline; a bare cancellation only before the command is sent):
		// no other caller's call rides with it. What queues meanwhile is
		// left to a new sender rather than making this caller wait for
		// another round trip.
		sctx := context.Background()
		if len(batch) == 1 {
			sctx = ctx
		}
		p.send(sctx, batch)
		if next := p.next(); next != nil {
			go p.loop(next)
		}
		v, waitErr, err = c.v, c.waitErr, c.err
		c.release()
		if cerr := ctx.Err(); cerr != nil && err != nil {
			return nil, nil, cerr
		}
		return v, waitErr, err
	}
	// A caller that may be cancelled must be able to return at once, while
	// its pipeline (other callers' calls with it) runs to its end.
	c.waits = true
	go p.loop(batch)
	return p.wait(c, ctx)
}

// wait returns c's reply, or ctx.Err() as soon as ctx ends.
func (p *autoPipe) wait(c *pipeCall, ctx context.Context) (any, error, error) {
	select {
	case <-c.done:
		v, waitErr, err := c.v, c.waitErr, c.err
		c.release()
		return v, waitErr, err
	case <-ctx.Done():
		// A call still queued is never sent; one already sent may run, its
		// reply lost to its caller. A Claim so sent may grant a lease that
		// nobody will use: the key would be held for a whole lease, and a
		// client's retry of the request answered "in flight" all along.
		// Its reply is awaited here, and such a lease forgotten.
		if !c.state.CompareAndSwap(callQueued, callAbandoned) && c.script == claimScript {
			go p.forgetOrphan(c)
		}
		return nil, nil, ctx.Err()
	}
}

// forgetOrphan waits for the reply of c, a Claim its caller gave up on
// after it was sent, and forgets the new lease it granted, if any. A
// take-over is left to lapse: forgetting it would drop what the next
// holder must be told (the earlier attempt, its checkpoint).
func (p *autoPipe) forgetOrphan(c *pipeCall) {
	<-c.done
	v, err, key := c.v, c.err, c.keys[0]
	c.release()
	if err != nil {
		return
	}
	var tv any = v
	if a, ok := v.([]any); ok {
		if st, _ := a[0].(string); len(a) < 2 || (st != replyClaimed && st != replyAgain) {
			return
		}
		tv = a[1]
	}
	tok, ok := token(tv)
	if !ok {
		return
	}
	l := &Lease{Token: tok, Owner: p.s.core.o.Worker}
	ctx, cancel := context.WithTimeout(context.Background(), orphanForgetTimeout)
	defer cancel()
	_, _, _ = p.s.runNow(ctx, forgetScript, key, "", []any{heldPrefix(l), strconv.FormatInt(tok, 10), p.s.retentionMs})
}

// orphanForgetTimeout bounds the Forget of a lease nobody took.
const orphanForgetTimeout = 5 * time.Second

// finish wakes c's caller, if it waits. The sender must not touch c after:
// its caller may reuse it at once.
func (c *pipeCall) finish() {
	if c.waits {
		c.done <- struct{}{}
	}
}

// loop sends batch, then whatever queued while it was in flight, until the
// queue is empty.
func (p *autoPipe) loop(batch []*pipeCall) {
	for batch != nil {
		p.send(context.Background(), batch)
		batch = p.next()
	}
}

// next takes the queue for a sender whose pipeline returned, or retires the
// sender when nothing is queued.
func (p *autoPipe) next() []*pipeCall {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.queue) == 0 {
		p.senders--
		return nil
	}
	b := p.queue
	p.queue = nil
	return b
}

// send sends the calls of batch that are still wanted in one pipeline and
// hands each its own reply.
//
// A pipeline of several callers' calls runs on a context of its own (ctx
// is then Background): one caller's cancellation must not fail the calls of
// the others. It is bounded by the client's read and write timeouts, as
// every command is.
func (p *autoPipe) send(ctx context.Context, batch []*pipeCall) {
	live := batch[:0]
	for _, c := range batch {
		if c.state.CompareAndSwap(callQueued, callSent) {
			live = append(live, c)
		}
	}
	if len(live) == 0 {
		return
	}
	if len(live) == 1 {
		// One call alone goes as without AutoPipeline, without a
		// pipeline's bookkeeping.
		c := live[0]
		c.v, c.waitErr, c.err = p.s.runNow(ctx, c.script, c.keys[0], c.hash(), c.args)
		c.finish()
		return
	}
	calls, order := p.s.mergeCalls(live)
	cmds, waitErrs := p.s.pipeline(ctx, calls)
	each(calls, cmds, waitErrs, func(i int, v any, err, waitErr error) {
		order[i].v, order[i].err, order[i].waitErr = v, err, waitErr
	})
	for _, c := range live {
		c.finish()
	}
}

// mergeCalls turns the calls of one pipeline into script calls. On a single
// Redis, two or more Claims become claim_batch calls and two or more
// Confirms confirm_batch calls, as ClaimBatch and ConfirmBatch send them:
// one script call for many keys costs Redis much less than one each. On a
// cluster every call stays its own, for go-redis to route by slot. order
// lists the pipeCall of each item, in the order each() hands items out.
func (s *RedisStore) mergeCalls(live []*pipeCall) ([]scriptCall, []*pipeCall) {
	calls := make([]scriptCall, 0, len(live))
	order := make([]*pipeCall, 0, len(live))
	if !s.shared() {
		for _, c := range live {
			calls = append(calls, c.scriptCall)
			order = append(order, c)
		}
		return calls, order
	}
	var claims, confirms []*pipeCall
	for _, c := range live {
		switch c.script {
		case claimScript:
			claims = append(claims, c)
		case confirmScript:
			confirms = append(confirms, c)
		default:
			calls = append(calls, c.scriptCall)
			order = append(order, c)
		}
	}
	// A lone claim or confirm goes as it is; two or more as their batch
	// form, each item answered in the order of its batch's keys.
	merge := func(cs []*pipeCall, batch *luaScript) {
		switch len(cs) {
		case 0:
			return
		case 1:
			calls = append(calls, cs[0].scriptCall)
			order = append(order, cs[0])
			return
		}
		// A claim's and a confirm's first two arguments are the ones
		// their batch forms take once (see sharedArgs).
		calls = append(calls, batchCalls(batch, len(cs), func(i int) (string, string) { return cs[i].keys[0], cs[i].hash() }, cs[0].args[:sharedArgs],
			func(args []any, i int) []any { return append(args, cs[i].args[sharedArgs:]...) })...)
		order = append(order, cs...)
	}
	merge(claims, claimBatchScript)
	merge(confirms, confirmBatchScript)
	return calls, order
}
