package idem

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/idemgo/idem/internal/batch"
)

// ClaimBatch implements Batcher in one round trip on a single Redis (one
// script call per 128 keys, pipelined) and one per master on a cluster (one
// script call per key, pipelined).
func (s *RedisStore) ClaimBatch(ctx context.Context, keys []string, fingerprints [][]byte) (cs []Claim, err error) {
	start := time.Now()
	defer func() {
		s.core.Observe(ctx, Event{Op: OpClaimBatch, Items: len(keys), Err: err}, "", start)
		s.core.LogTakeOvers(ctx, keys, cs, err)
	}()
	if err := s.core.CheckClaimBatch(keys, fingerprints); err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		return []Claim{}, nil
	}
	sent, err := s.contact(ctx, start)
	if err != nil {
		return nil, fmt.Errorf("idem: claim batch: %w", err)
	}
	fp := func(i int) []byte {
		if f := batch.Item(fingerprints, i); f != nil {
			return f
		}
		return []byte{}
	}
	// One attempt id for the batch; item i (from 1) is attempt "id:i", so a
	// key twice in one batch is two attempts, and go-redis's retry of the
	// whole pipeline repeats the same ones.
	attempt := string(s.appendAttempt(nil))
	item := func(i int) []byte { return strconv.AppendInt(append([]byte(attempt), ':'), int64(i+1), 10) }
	// Built in this loop, where item's buffer stays on the stack.
	tails := make([]any, len(keys))
	for i := range keys {
		tails[i] = claimTail(s.core.o.Worker, item(i), s.keep, fp(i))
	}
	form := s.form.Load() // one form for the whole batch
	var calls []scriptCall
	if s.shared() {
		calls = batchCalls(claimBatchScript, len(keys), func(i int) (string, string) { return s.redisKey(keys[i]), s.fieldHash(form, keys[i], false) }, []any{s.claimMs, s.maxTakeOvers},
			func(args []any, i int) []any { return append(args, tails[i]) })
	} else {
		for i, k := range keys {
			calls = append(calls, scriptCall{script: claimScript, keys: callKeys(s.redisKey(k), s.fieldHash(form, k, false)), args: []any{s.claimMs, s.maxTakeOvers, tails[i]}})
		}
	}
	cs = make([]Claim, len(keys))
	var errs []error
	cmds, _ := s.pipeline(ctx, calls)
	each(calls, cmds, nil, func(i int, v any, err, _ error) {
		if err == nil {
			cs[i], err = s.parseClaim(keys[i], fp(i), sent, v)
		} else {
			err = s.fail("claim", keys[i], err)
		}
		errs = batch.Collect(errs, len(keys), i, err)
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
		s.core.Observe(ctx, Event{Op: OpConfirmBatch, Items: len(leases), Late: late, Err: err}, "", start)
	}()
	if err := s.core.CheckConfirmBatch(leases, results); err != nil {
		return err
	}
	if len(leases) == 0 {
		return nil
	}
	if err := s.leaseReady(ctx); err != nil {
		return fmt.Errorf("idem: confirm batch: %w", err)
	}
	form := s.form.Load() // one form for the whole batch
	var calls []scriptCall
	if s.shared() {
		calls = batchCalls(confirmBatchScript, len(leases), func(i int) (string, string) { return s.redisKey(leases[i].Key), s.fieldHash(form, leases[i].Key, true) }, []any{s.retentionMs, s.retentionMs},
			func(args []any, i int) []any {
				return append(args, s.confirmArgs(leases[i], batch.Item(results, i))[sharedArgs:]...)
			})
	} else {
		for i, l := range leases {
			calls = append(calls, scriptCall{script: confirmScript, keys: callKeys(s.redisKey(l.Key), s.fieldHash(form, l.Key, true)),
				args: s.confirmArgs(l, batch.Item(results, i))})
		}
	}
	var errs []error
	cmds, waitErrs := s.pipeline(ctx, calls)
	each(calls, cmds, waitErrs, func(i int, v any, err, waitErr error) {
		if err == nil {
			var l bool
			l, err = s.confirmed(ctx, leases[i], v)
			late = late || l
			if err == nil && waitErr != nil {
				err = fmt.Errorf("idem: confirm of %s: %w", s.core.KeyName(leases[i].Key), waitErr)
			}
		} else {
			err = s.fail("confirm", leases[i].Key, err)
		}
		errs = batch.Collect(errs, len(leases), i, err)
	})
	if errs != nil {
		return &BatchError{Errs: errs}
	}
	return nil
}
