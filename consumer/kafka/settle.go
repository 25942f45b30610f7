package kafka

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/twmb/franz-go/pkg/kgo"
)

// partition handles one partition's records (in offset order) until each
// is settled or ctx ends, marking the offset past the done prefix as it
// grows.
func (c *Consumer) partition(ctx context.Context, rs []*kgo.Record) {
	done := make([]bool, len(rs))
	attempts := make([]int, len(rs))
	failures := make([]int, len(rs))
	prefix := 0 // rs[:prefix] are done and marked
	left := make([]int, len(rs))
	for i := range left {
		left[i] = i
	}
	delay := c.o.MinDelay
	for {
		var retry []int
		var retryErrs []error
		batch := make([]*kgo.Record, len(left))
		for j, i := range left {
			batch[j] = rs[i]
		}
		errs := c.handle(ctx, batch)
		for j, i := range left {
			attempts[i]++
			if c.settle(ctx, rs[i], errs[j], attempts[i], &failures[i]) {
				done[i] = true
			} else {
				retry = append(retry, i)
				retryErrs = append(retryErrs, unwrap(errs[j]))
			}
		}
		for prefix < len(rs) && done[prefix] {
			prefix++
		}
		if prefix > 0 {
			last := rs[prefix-1]
			c.cl.MarkCommitOffsets(map[string]map[int32]kgo.EpochOffset{last.Topic: {last.Partition: {
				Epoch: last.LeaderEpoch, Offset: last.Offset + 1}}})
		}
		if len(retry) == 0 || ctx.Err() != nil {
			return
		}
		if c.o.OnSettle != nil {
			for j, i := range retry {
				c.o.OnSettle(rs[i], Settlement{Action: Retry, Attempt: attempts[i], Delay: delay, Err: retryErrs[j]})
			}
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		delay = min(2*delay, c.o.MaxDelay)
		left = retry
	}
}

// unwrap returns a handler's own error as it returned it.
func unwrap(err error) error {
	var he *handlerError
	if errors.As(err, &he) {
		return he.err
	}
	return err
}

// settle applies the policy to one attempt's result and reports whether
// the record is settled (the offset may pass it).
func (c *Consumer) settle(ctx context.Context, r *kgo.Record, err error, attempt int, failures *int) bool {
	var he *handlerError
	act := Commit
	switch consumer.ActionFor(err) {
	case consumer.Ack:
	case consumer.AckAndAlert:
		c.o.Logger.LogAttrs(ctx, slog.LevelError, "idem/kafka: work done but not recorded; committed so it is not done again now",
			c.where(r), slog.Any("err", err))
	case consumer.DeadLetter:
		act = Skip
		if c.o.DeadLetter != nil {
			if !c.deadLetter(ctx, r, err) {
				return false
			}
			act = DeadLetter
		} else {
			c.o.Logger.LogAttrs(ctx, slog.LevelError, "idem/kafka: record committed past without its work: "+whyDead(err),
				c.where(r), slog.Any("err", err))
		}
	default: // consumer.Redeliver: Kafka's is a retry in place
		if !errors.As(err, &he) {
			return false // in progress, store unavailable, context ended
		}
		// The handler's own failure: retried until MaxAttempts, then
		// dead-lettered if the application gave a DeadLetter.
		err = he.err
		*failures++
		if c.o.DeadLetter == nil || *failures < c.o.MaxAttempts || ctx.Err() != nil {
			return false
		}
		if !c.deadLetter(ctx, r, err) {
			return false
		}
		act = DeadLetter
	}
	if c.o.OnSettle != nil {
		c.o.OnSettle(r, Settlement{Action: act, Attempt: attempt, Err: err})
	}
	return true
}

// deadLetter hands r to DeadLetter and reports whether it took it.
func (c *Consumer) deadLetter(ctx context.Context, r *kgo.Record, err error) bool {
	if derr := c.o.DeadLetter(ctx, r, err); derr != nil {
		c.o.Logger.LogAttrs(ctx, slog.LevelWarn, "idem/kafka: DeadLetter failed; the record is retried in place",
			c.where(r), slog.Any("err", derr))
		return false
	}
	return true
}

func (c *Consumer) where(r *kgo.Record) slog.Attr {
	return slog.Group("record", slog.String("key_hash", c.o.KeyHasher.Hash(c.key(r))),
		slog.String("topic", r.Topic), slog.Int("partition", int(r.Partition)), slog.Int64("offset", r.Offset))
}

// whyDead says why a dead-lettered record cannot be handled: a quarantined
// key waits for an operator, anything else can never succeed.
func whyDead(err error) string {
	if errors.Is(err, idem.ErrQuarantined) {
		return "its key is quarantined after repeated crashes; an operator must settle it (idem resolve)"
	}
	return "it can never succeed"
}
