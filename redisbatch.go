package idem

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// batchChunk bounds how many keys one batch script handles: a script blocks
// Redis while it runs, so a huge batch is split into several calls (all in
// the same pipeline, still one round trip).
const batchChunk = 128

// scriptCall is one script invocation of a pipeline.
type scriptCall struct {
	script *redis.Script
	keys   []string
	args   []any
}

// shared reports whether every key can go into one script call: true on a
// single Redis (standalone or Sentinel), false on a cluster, where a script
// may only touch keys of one hash slot.
func (s *RedisStore) shared() bool {
	_, ok := s.c.(*redis.Client)
	return ok
}

// ClaimBatch implements Batcher in one round trip on a single Redis (one
// script call per 128 keys, pipelined) and one per master on a cluster (one
// script call per key, pipelined).
func (s *RedisStore) ClaimBatch(ctx context.Context, keys []string, fingerprints [][]byte) (cs []Claim, err error) {
	start := time.Now()
	defer func() { s.o.observe(ctx, Event{Op: OpClaimBatch, Items: len(keys), Err: err}, "", start) }()
	if err := s.o.checkClaimBatch(keys, fingerprints); err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		return []Claim{}, nil
	}
	fp := func(i int) []byte {
		if f := at(fingerprints, i); f != nil {
			return f
		}
		return []byte{}
	}
	// One attempt id for the batch; item i (from 1) is attempt "id:i", so a
	// key twice in one batch is two attempts, and go-redis's retry of the
	// whole pipeline repeats the same ones.
	attempt := string(s.appendAttempt(nil))
	item := func(i int) []byte { return strconv.AppendInt(append([]byte(attempt), ':'), int64(i+1), 10) }
	var calls []scriptCall
	if s.shared() {
		for lo := 0; lo < len(keys); lo += batchChunk {
			hi := min(lo+batchChunk, len(keys))
			c := scriptCall{script: claimBatchScript, keys: make([]string, 0, hi-lo), args: make([]any, 1, 1+hi-lo)}
			c.args[0] = s.leaseMs
			for i := lo; i < hi; i++ {
				c.keys = append(c.keys, s.redisKey(keys[i]))
				c.args = append(c.args, claimTail(s.o.Worker, item(i), fp(i)))
			}
			calls = append(calls, c)
		}
	} else {
		for i, k := range keys {
			calls = append(calls, scriptCall{script: claimScript, keys: []string{s.redisKey(k)},
				args: []any{s.leaseMs, claimTail(s.o.Worker, item(i), fp(i))}})
		}
	}
	cs = make([]Claim, len(keys))
	var errs []error
	each(calls, s.pipeline(ctx, calls), func(i int, v any, err error) {
		if err == nil {
			cs[i], err = s.parseClaim(keys[i], fp(i), start, v)
		} else {
			err = s.fail(ctx, "claim", keys[i], err)
		}
		errs = collect(errs, len(keys), i, err)
	})
	if errs != nil {
		return cs, &BatchError{Errs: errs}
	}
	return cs, nil
}

// ConfirmBatch implements Batcher in one round trip on a single Redis and
// one per master on a cluster, as ClaimBatch does.
func (s *RedisStore) ConfirmBatch(ctx context.Context, leases []*Lease, results [][]byte) (err error) {
	start := time.Now()
	late := false
	defer func() {
		s.o.observe(ctx, Event{Op: OpConfirmBatch, Items: len(leases), Late: late, Err: err}, "", start)
	}()
	if err := s.o.checkConfirmBatch(leases, results); err != nil {
		return err
	}
	if len(leases) == 0 {
		return nil
	}
	var calls []scriptCall
	if s.shared() {
		for lo := 0; lo < len(leases); lo += batchChunk {
			hi := min(lo+batchChunk, len(leases))
			c := scriptCall{script: confirmBatchScript, keys: make([]string, 0, hi-lo), args: make([]any, 1, 1+2*(hi-lo))}
			c.args[0] = s.retentionMs
			for i := lo; i < hi; i++ {
				c.keys = append(c.keys, s.redisKey(leases[i].Key))
				a := s.confirmArgs(leases[i], at(results, i))
				c.args = append(c.args, a[0], a[2]) // all but the retention, given once
			}
			calls = append(calls, c)
		}
	} else {
		for i, l := range leases {
			calls = append(calls, scriptCall{script: confirmScript, keys: []string{s.redisKey(l.Key)},
				args: s.confirmArgs(l, at(results, i))})
		}
	}
	var errs []error
	each(calls, s.pipeline(ctx, calls), func(i int, v any, err error) {
		if err == nil {
			n, ok := v.(int64)
			if !ok {
				err = s.badReply("confirm", leases[i].Key, v)
			} else {
				var l bool
				l, err = s.confirmed(ctx, leases[i], n)
				late = late || l
			}
		} else {
			err = s.fail(ctx, "confirm", leases[i].Key, err)
		}
		errs = collect(errs, len(leases), i, err)
	})
	if errs != nil {
		return &BatchError{Errs: errs}
	}
	return nil
}

// each hands every item's reply to f, in item order. A batch script's reply
// is an array with one element per key; a single-key script's reply is the
// item's own.
func each(calls []scriptCall, cmds []*redis.Cmd, f func(i int, v any, err error)) {
	i := 0
	for j, c := range calls {
		v, err := cmds[j].Result()
		if c.script != claimBatchScript && c.script != confirmBatchScript {
			f(i, v, err)
			i++
			continue
		}
		a, ok := v.([]any)
		if err == nil && (!ok || len(a) != len(c.keys)) {
			err = fmt.Errorf("idem: batch reply of %d items for %d keys", len(a), len(c.keys))
		}
		for k := range c.keys {
			if err != nil {
				f(i, nil, err)
			} else {
				f(i, a[k], nil)
			}
			i++
		}
	}
}

// pipeline sends the calls in one pipeline and returns their commands, each
// with its own result or error.
//
// A pipelined EVALSHA cannot fall back to EVAL by itself when Redis has lost
// its script cache (SCRIPT FLUSH, a restart, a failover to a replica that
// never saw the script). A NOSCRIPT reply means the command did not run, so
// the commands that got one are sent again as EVAL, which also loads the
// script: after a flush a batch costs one extra round trip, never an error.
func (s *RedisStore) pipeline(ctx context.Context, calls []scriptCall) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(calls))
	// Errors are per command; Exec's own error is the first of them.
	_, _ = s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, c := range calls {
			cmds[i] = c.script.EvalSha(ctx, p, c.keys, c.args...)
		}
		return nil
	})
	var retry []int
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			retry = append(retry, i)
		}
	}
	if len(retry) == 0 {
		return cmds
	}
	_, _ = s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, i := range retry {
			cmds[i] = calls[i].script.Eval(ctx, p, calls[i].keys, calls[i].args...)
		}
		return nil
	})
	return cmds
}
