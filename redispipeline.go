package idem

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/backoff"
)

// The pipeline engine: every call of a RedisStore that sends scripts in a
// pipeline goes through here (ClaimBatch and ConfirmBatch, the automatic
// pipeline of single calls, a single confirm followed by WAIT). It builds the script calls (one per
// 128 keys on a single Redis, one per key on a cluster), sends them in one
// round trip per node, resends what a resharding redirected, loads again
// the scripts a server lost (NOSCRIPT), adds WAIT when WaitReplicas asks,
// and hands each item its reply.

// batchChunk bounds how many keys one batch script handles: a script blocks
// Redis while it runs, so a huge batch is split into several calls (all in
// the same pipeline, still one round trip).
const batchChunk = 128

// scriptCall is one script invocation of a pipeline.
//
// The one-key scripts that have a batch form (claim.lua, confirm.lua) take
// first the argument a batch passes once (the lease, the retention), then
// the key's own; their batch forms take that first argument, then each
// key's own in turn. batchCalls relies on it.
type scriptCall struct {
	script *luaScript
	keys   []string // the record's, then its field hash (if any); a batch's records, then their hashes
	args   []any
	items  int // a batch call's records
}

// callKeys returns the keys of a one-key script's call: key, and hash
// unless it is "".
func callKeys(key, hash string) []string {
	if hash == "" {
		return []string{key}
	}
	return []string{key, hash}
}

// confirms reports whether c confirms: with WaitReplicas, it is followed by
// WAIT.
func (c scriptCall) confirms() bool {
	return c.script == confirmScript || c.script == confirmBatchScript
}

// shared reports whether every key can go into one script call: true on a
// single Redis (standalone or Sentinel), false on a cluster, where a script
// may only touch keys of one hash slot.
func (s *RedisStore) shared() bool {
	_, ok := s.c.(*redis.Client)
	return ok
}

// batchCalls builds the calls of batch (claim_batch.lua, confirm_batch.lua)
// for n items, at most batchChunk keys each, in order: one script call for
// many keys costs Redis much less than one each. Each call takes shared
// once, then every item's own arguments, which item appends (see
// scriptCall); key(i) is item i's Redis key and field hash ("" for none).
// A call's items all have a field hash or none has: where that changes
// (the calls of one pipeline made either side of a form's change), a new
// call begins.
func batchCalls(batch *luaScript, n int, key func(i int) (string, string), shared []any, item func(args []any, i int) []any) []scriptCall {
	calls := make([]scriptCall, 0, (n+batchChunk-1)/batchChunk)
	var bc scriptCall
	var hashes []string
	end := func() {
		if bc.items > 0 {
			bc.keys = append(bc.keys, hashes...)
			calls = append(calls, bc)
		}
	}
	for i := range n {
		k, h := key(i)
		if bc.items == 0 || bc.items == batchChunk || (h != "") != (len(hashes) > 0) {
			end()
			left := min(n-i, batchChunk)
			bc = scriptCall{script: batch, keys: make([]string, 0, left), args: make([]any, 0, len(shared)+2*left)}
			bc.args = append(bc.args, shared...)
			hashes = nil
		}
		bc.keys = append(bc.keys, k)
		if h != "" {
			hashes = append(hashes, h)
		}
		bc.args = item(bc.args, i)
		bc.items++
	}
	end()
	return calls
}

// each hands every item's reply to f, in item order, with the verdict of
// its call's WAIT (waitErrs may be nil: no WAIT). A batch script's reply is
// an array with one element per key; a single-key script's reply is the
// item's own.
func each(calls []scriptCall, cmds []*redis.Cmd, waitErrs []error, f func(i int, v any, err, waitErr error)) {
	i := 0
	for j, c := range calls {
		v, err := cmds[j].Result()
		var waitErr error
		if waitErrs != nil {
			waitErr = waitErrs[j]
		}
		if c.script != claimBatchScript && c.script != confirmBatchScript {
			f(i, v, err, waitErr)
			i++
			continue
		}
		a, ok := v.([]any)
		if err == nil && (!ok || len(a) != c.items) {
			err = fmt.Errorf("idem: batch reply of %d items for %d keys", len(a), c.items)
		}
		for k := range c.items {
			if err != nil {
				f(i, nil, err, waitErr)
			} else {
				f(i, a[k], nil, waitErr)
			}
			i++
		}
	}
}

// pipeline sends the calls in one round trip (one per master on a cluster)
// and returns their commands, each with its own result or error. With
// WaitReplicas, a confirm call (scriptCall.confirms) is followed by WAIT in
// the same pipeline; waitErrs then holds, per call, why its writes are not
// known to be on enough replicas (nil: they are, or no wait was asked).
//
// On a cluster whose store keeps confirmations as fields, every pipeline
// goes by master too: a call names two keys there (a record, its field
// hash), which a slot in migration can hold apart, and Redis then answers
// TRYAGAIN. go-redis's cluster pipeline answers a TRYAGAIN on the first
// command of a node's batch by sending the whole batch again, calls that
// ran included, and a call it also sent elsewhere (MOVED) twice at once.
func (s *RedisStore) pipeline(ctx context.Context, calls []scriptCall) (cmds []*redis.Cmd, waitErrs []error) {
	if s.cluster != nil && s.form.Load() != nil {
		return s.pipelineByMaster(ctx, s.cluster, calls)
	}
	if s.waitReplicas == 0 || !anyWait(calls) {
		cmds, _ = s.pipelineOn(ctx, s.c, calls, false)
		if s.cluster != nil {
			s.resendRedirected(ctx, s.cluster, calls, cmds)
		}
		return cmds, nil
	}
	if s.cluster != nil {
		return s.pipelineByMaster(ctx, s.cluster, calls)
	}
	return s.pipelineOn(ctx, s.c, calls, true)
}

// resendRedirected sends again the calls of a cluster pipeline that were
// answered MOVED or ASK: go-redis follows a pipeline's redirects only
// MaxRedirects times, against a slot map that may lag a resharding in
// progress (#20: a batch claim surfaced "MOVED 391 ..." mid-reshard). A
// redirected command did not run, so sending it again is safe. Each goes
// alone through the cluster client, which follows a redirect to the
// address it names; a few rounds, a moment apart, then what is still
// redirected keeps its error. On a cluster every call is one key's.
func (s *RedisStore) resendRedirected(ctx context.Context, cc *redis.ClusterClient, calls []scriptCall, cmds []*redis.Cmd) {
	wait := backoff.Backoff{First: 20 * time.Millisecond, Most: 60 * time.Millisecond}
	for round := range 3 {
		again := false
		for i, cmd := range cmds {
			if !redirected(cmd.Err()) || calls[i].items > 0 {
				continue
			}
			again = true
			hash := ""
			if len(calls[i].keys) > 1 {
				hash = calls[i].keys[1]
			}
			v, err := s.eval(ctx, calls[i].script, calls[i].keys[0], hash, calls[i].args)
			c := redis.NewCmd(ctx)
			if err != nil {
				c.SetErr(err)
			} else {
				c.SetVal(v)
			}
			cmds[i] = c
		}
		if !again || ctx.Err() != nil {
			return
		}
		if round == 0 {
			cc.ReloadState(ctx)
		}
		if !backoff.Sleep(ctx, wait.Next()) {
			return
		}
	}
}

func anyWait(calls []scriptCall) bool {
	for _, c := range calls {
		if c.confirms() {
			return true
		}
	}
	return false
}

// pipeliner is what a pipeline is sent on: a client, a cluster, or one
// master of a cluster.
type pipeliner interface {
	Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error)
}

// pipelineOn sends the calls in one pipeline on p, followed by WAIT when
// wait is set, and returns their commands and, per confirm call, the
// WAIT's verdict.
//
// A pipelined EVALSHA cannot load its script by itself when Redis has lost
// its script cache (SCRIPT FLUSH, a restart, a failover to a replica that
// never saw the script). A NOSCRIPT reply means the command did not run, so
// the scripts of the commands that got one are loaded again with SCRIPT
// LOAD and those commands sent again: after a flush a batch costs two more
// round trips, never an error. The resent commands get a WAIT of their own.
func (s *RedisStore) pipelineOn(ctx context.Context, p pipeliner, calls []scriptCall, wait bool) ([]*redis.Cmd, []error) {
	cmds := make([]*redis.Cmd, len(calls))
	var waitErrs []error
	if wait {
		waitErrs = make([]error, len(calls))
	}
	for _, c := range calls {
		if c.script.digest() == nil {
			if err := s.loadScript(ctx, c.script); err != nil {
				for i := range cmds {
					cmds[i] = redis.NewCmd(ctx)
					cmds[i].SetErr(err)
				}
				return cmds, waitErrs
			}
		}
	}
	send := func(idx []int) {
		var w *redis.IntCmd
		// Errors are per command; Exec's own error is the first of them.
		_, _ = p.Pipelined(ctx, func(pp redis.Pipeliner) error {
			waits := false
			for _, i := range idx {
				c := calls[i]
				cmds[i] = evalSha(ctx, pp, c.script.digest(), c.keys, c.args)
				waits = waits || c.confirms()
			}
			if wait && waits {
				// Pipeliner has no Wait method; WAIT takes milliseconds.
				w = redis.NewIntCmd(ctx, "wait", s.waitReplicas, roundMs(s.waitTimeout).Milliseconds())
				_ = pp.Process(ctx, w)
			}
			return nil
		})
		if w == nil {
			return
		}
		err := s.replicated(w)
		for _, i := range idx {
			if calls[i].confirms() {
				waitErrs[i] = err
			}
		}
	}
	all := make([]int, len(calls))
	for i := range all {
		all[i] = i
	}
	send(all)
	for range scriptReloads {
		if !s.reloadLost(ctx, calls, cmds, send) {
			break
		}
	}
	for _, cmd := range cmds {
		if unanswered(cmd.Err()) {
			s.reloadSlots(cmd.Err())
			break
		}
	}
	return cmds, waitErrs
}

// reloadLost loads again the scripts of the calls that got NOSCRIPT and
// sends those calls again with send; it reports whether there were any.
func (s *RedisStore) reloadLost(ctx context.Context, calls []scriptCall, cmds []*redis.Cmd, send func(idx []int)) bool {
	var retry []int
	var lost []*luaScript
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			retry = append(retry, i)
			if !slices.Contains(lost, calls[i].script) {
				lost = append(lost, calls[i].script)
			}
		}
	}
	if len(lost) > 0 {
		scriptLosses.Add(1) // the server may have restarted: see recheck
	}
	for _, sc := range lost {
		if err := s.loadScript(ctx, sc); err != nil {
			for _, i := range retry {
				cmds[i].SetErr(err)
			}
			return false
		}
	}
	if len(retry) > 0 {
		send(retry)
	}
	return len(retry) > 0
}

// replicated is the verdict of a WAIT: nil when enough replicas
// acknowledged, else an error wrapping ErrNotReplicated, or the command's
// own error.
func (s *RedisStore) replicated(w *redis.IntCmd) error {
	n, err := w.Result()
	if err != nil {
		return fmt.Errorf("%w: WAIT failed: %w", ErrNotReplicated, err)
	}
	if n < int64(s.waitReplicas) {
		return fmt.Errorf("%w: %d of %d replicas acknowledged within %v", ErrNotReplicated, n, s.waitReplicas, s.waitTimeout)
	}
	return nil
}

// pipelineByMaster is pipeline on a cluster with WAIT, or with field
// hashes (see pipeline): go-redis does not let WAIT into a cluster
// pipeline (it has no key, and WAIT counts only the writes of its own
// connection), so the calls are grouped by the master that owns their slot
// and each group goes, with its WAIT if any, down one pipeline on that
// master: still one round trip per master, in parallel. A call answered
// MOVED, ASK or TRYAGAIN (the slot moved or is moving) is sent again after
// the cluster's slot map is reloaded; after two such attempts it goes alone
// through the cluster client, which follows redirects, and a confirm is
// reported not replicated, since its WAIT could not follow it.
func (s *RedisStore) pipelineByMaster(ctx context.Context, cc *redis.ClusterClient, calls []scriptCall) ([]*redis.Cmd, []error) {
	cmds := make([]*redis.Cmd, len(calls))
	waitErrs := make([]error, len(calls))
	wait := s.waitReplicas > 0
	pending := make([]int, len(calls))
	for i := range pending {
		pending[i] = i
	}
	for attempt := 0; len(pending) > 0; attempt++ {
		if attempt == 2 {
			// One by one through the cluster client, which follows MOVED
			// and ASK and waits out TRYAGAIN for a single call (see eval).
			for _, i := range pending {
				c := calls[i]
				hash := ""
				if len(c.keys) > 1 {
					hash = c.keys[1]
				}
				v, err := s.eval(ctx, c.script, c.keys[0], hash, c.args)
				cmds[i] = redis.NewCmd(ctx)
				if err != nil {
					cmds[i].SetErr(err)
				} else {
					cmds[i].SetVal(v)
				}
				if wait && calls[i].confirms() {
					waitErrs[i] = fmt.Errorf("%w: the slot moved during the confirm; its replication was not checked", ErrNotReplicated)
				}
			}
			break
		}
		if attempt > 0 {
			cc.ReloadState(ctx)
		}
		groups := map[*redis.Client][]int{}
		for _, i := range pending {
			m, err := cc.MasterForKey(ctx, calls[i].keys[0])
			if err != nil {
				s.reloadSlots(err)
				cmds[i] = redis.NewCmd(ctx)
				cmds[i].SetErr(err)
				continue
			}
			groups[m] = append(groups[m], i)
		}
		var wg sync.WaitGroup
		for m, idx := range groups {
			wg.Go(func() {
				sub := make([]scriptCall, len(idx))
				for j, i := range idx {
					sub[j] = calls[i]
				}
				got, werrs := s.pipelineOn(ctx, m, sub, wait)
				for j, i := range idx {
					cmds[i] = got[j]
					if wait {
						waitErrs[i] = werrs[j]
					}
				}
			})
		}
		wg.Wait()
		pending = pending[:0]
		for i, cmd := range cmds {
			if redirected(cmd.Err()) {
				pending = append(pending, i)
			}
		}
	}
	return cmds, waitErrs
}

// runNow runs script on key (a Redis key) and hash (its field hash, or
// "") at once, as one command; a
// confirm with WaitReplicas is followed by WAIT in the same pipeline, and
// waitErr is its verdict.
func (s *RedisStore) runNow(ctx context.Context, script *luaScript, key, hash string, args []any) (v any, waitErr, err error) {
	if s.waitReplicas > 0 && (scriptCall{script: script}).confirms() {
		cmds, waitErrs := s.pipeline(ctx, []scriptCall{{script: script, keys: callKeys(key, hash), args: args}})
		v, err := cmds[0].Result()
		return v, waitErrs[0], err
	}
	v, err = s.eval(ctx, script, key, hash, args)
	return v, nil, err
}
