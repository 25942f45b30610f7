package bench

// The consumer benchmark's Redis Streams contenders: a stream filled per
// round, read with XREADGROUP and acked with XACK bare, with idem per
// message (consumer.Idempotent) and batched (redisstream.Reader).

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/redisstream"
)

// fillStream adds one entry per key (field id) to a new stream and creates
// its group "g" at its start.
func fillStream(ctx context.Context, r *consumerRun, keys []string) error {
	for i := 0; i < len(keys); i += 1000 {
		p := r.c.Pipeline()
		for _, k := range keys[i:min(len(keys), i+1000)] {
			p.XAdd(ctx, &redis.XAddArgs{Stream: r.name, Values: []any{"id", k, "body", "x"}})
		}
		if _, err := p.Exec(ctx); err != nil {
			return err
		}
	}
	return r.c.XGroupCreateMkStream(ctx, r.name, "g", "0").Err()
}

func (r *consumerRun) read(ctx context.Context) ([]redis.XMessage, error) {
	ss, err := r.c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c",
		Streams: []string{r.name, ">"}, Count: int64(r.batch), Block: time.Second}).Result()
	if err != nil {
		return nil, err
	}
	return ss[0].Messages, nil
}

func (r *consumerRun) ack(ctx context.Context, ms []redis.XMessage) error {
	ids := make([]string, len(ms))
	for i, m := range ms {
		ids[i] = m.ID
	}
	return r.c.XAck(ctx, r.name, "g", ids...).Err()
}

func streamBare(ctx context.Context, r *consumerRun) error {
	for done := 0; done < r.n; {
		ms, err := r.read(ctx)
		if err != nil {
			return err
		}
		for range ms {
			_ = r.handle(ctx)
		}
		if err := r.ack(ctx, ms); err != nil {
			return err
		}
		done += len(ms)
	}
	return nil
}

func streamKey(m redis.XMessage) string { s, _ := m.Values["id"].(string); return s }

// streamPerMessage is the bare loop with each entry handled through
// consumer.Idempotent: a claim and a confirm round trip per entry.
func streamPerMessage(ctx context.Context, r *consumerRun) error {
	h := consumer.Idempotent(r.store, streamKey, func(ctx context.Context, _ redis.XMessage) error { return r.handle(ctx) })
	for done := 0; done < r.n; {
		ms, err := r.read(ctx)
		if err != nil {
			return err
		}
		for _, m := range ms {
			if err := h(ctx, m); err != nil {
				return err
			}
		}
		if err := r.ack(ctx, ms); err != nil {
			return err
		}
		done += len(ms)
	}
	return nil
}

// streamBatched runs the Redis Streams adapter itself until every entry
// is acked. Its time ends with the last ack: stopping the Reader then
// waits out the XREADGROUP it has begun, blocked for up to its Block (1s
// here), since go-redis does not interrupt a blocked read when its
// context ends; counted in, that wait was most of a round's time.
func streamBatched(ctx context.Context, r *consumerRun) error {
	var acked, other atomic.Int64
	all := make(chan struct{})
	var end time.Time
	rd, err := redisstream.NewReader(r.c, r.store, func(ctx context.Context, _ redis.XMessage) error { return r.handle(ctx) },
		redisstream.Options{Stream: r.name, Group: "g", Consumer: "c", KeyField: "id", Count: r.batch,
			Block: time.Second, Logger: quietLogger,
			OnSettle: func(_ *redis.XMessage, s redisstream.Settlement) {
				if s.Action != redisstream.Ack {
					other.Add(1)
				}
				if acked.Add(1) == int64(r.n) {
					end = time.Now()
					close(all)
				}
			}})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- rd.Run(ctx) }()
	select {
	case <-all:
		r.end = end // written before all was closed
	case err := <-done:
		cancel()
		return fmt.Errorf("the reader stopped: %w", err)
	}
	cancel()
	<-done
	if n := other.Load(); n > 0 {
		return fmt.Errorf("%d entries were not acked as done", n)
	}
	return nil
}
