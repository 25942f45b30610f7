package bench

// The consumer benchmark's RabbitMQ contenders: a queue filled per round,
// consumed bare (an Ack per delivery, or a multiple Ack per batch), with
// idem per message (the amqp adapter) and batched (consumer.Batch); and the
// broker's CPU time, read from /proc for its one beam.smp.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idemgo/idem/consumer"
	idemamqp "github.com/idemgo/idem/consumer/amqp"
)

// prefetch bounds each RabbitMQ contender's unacknowledged deliveries:
// two batches, so that the batched contender has the next batch on its way
// while it handles one.
func (r *consumerRun) prefetch() int { return 2 * r.batch }

// fillQueue declares a queue and publishes one message per key (its
// MessageId) to it, then waits until the broker counts them all.
func fillQueue(ctx context.Context, r *consumerRun, keys []string) error {
	ch, err := r.conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare(r.name, false, false, false, false, nil); err != nil {
		return err
	}
	for _, k := range keys {
		if err := ch.PublishWithContext(ctx, "", r.name, false, false, amqp091.Publishing{MessageId: k, Body: []byte("x")}); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(time.Minute)
	for {
		q, err := ch.QueueDeclarePassive(r.name, false, false, false, false, nil)
		if err != nil {
			return err
		}
		if q.Messages == len(keys) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("queue %s holds %d messages a minute after publishing %d", r.name, q.Messages, len(keys))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func deleteQueue(r *consumerRun) error {
	ch, err := r.conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	_, err = ch.QueueDelete(r.name, false, false, false)
	return err
}

// consume opens a channel with the contenders' prefetch, consumes the
// queue and calls f until it returns done or an error.
func consume(ctx context.Context, r *consumerRun, f func(ch *amqp091.Channel, ds <-chan amqp091.Delivery) error) error {
	ch, err := r.conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.Qos(r.prefetch(), 0, false); err != nil {
		return err
	}
	ds, err := ch.ConsumeWithContext(ctx, r.name, "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	return f(ch, ds)
}

func next(ctx context.Context, ds <-chan amqp091.Delivery) (amqp091.Delivery, error) {
	select {
	case d, ok := <-ds:
		if !ok {
			return d, errors.New("the channel closed")
		}
		return d, nil
	case <-ctx.Done():
		return amqp091.Delivery{}, ctx.Err()
	case <-time.After(10 * time.Second):
		return amqp091.Delivery{}, errors.New("no delivery for 10s")
	}
}

func amqpBare(ctx context.Context, r *consumerRun) error {
	return consume(ctx, r, func(_ *amqp091.Channel, ds <-chan amqp091.Delivery) error {
		for range r.n {
			d, err := next(ctx, ds)
			if err != nil {
				return err
			}
			_ = r.handle(ctx)
			if err := d.Ack(false); err != nil {
				return err
			}
		}
		return nil
	})
}

// amqpPerMessage runs the RabbitMQ adapter itself on each delivery.
func amqpPerMessage(ctx context.Context, r *consumerRun) error {
	var other atomic.Int64
	h := idemamqp.Handler(r.store, func(ctx context.Context, _ amqp091.Delivery) error { return r.handle(ctx) },
		idemamqp.Options{Logger: quietLogger, OnSettle: func(_ *amqp091.Delivery, s idemamqp.Settlement) {
			if s.Action != idemamqp.Ack {
				other.Add(1)
			}
		}})
	err := consume(ctx, r, func(_ *amqp091.Channel, ds <-chan amqp091.Delivery) error {
		for range r.n {
			d, err := next(ctx, ds)
			if err != nil {
				return err
			}
			h(ctx, d)
		}
		return nil
	})
	if err == nil && other.Load() > 0 {
		err = fmt.Errorf("%d deliveries were not acked", other.Load())
	}
	return err
}

// batchLinger is how long a RabbitMQ batch waits, after its first
// delivery, for the rest: with a prefetch of two batches, the broker has
// the next batch on its way.
const batchLinger = 5 * time.Millisecond

// amqpBatched handles amqpBatches' batches with consumer.Batch (a claim
// and a confirm round trip per batch): the form a RabbitMQ consumer that
// batches would take (the amqp adapter handles one delivery at a time).
func amqpBatched(ctx context.Context, r *consumerRun) error {
	h := consumer.Batch(r.store, func(d amqp091.Delivery) string { return d.MessageId },
		func(ctx context.Context, _ amqp091.Delivery) error { return r.handle(ctx) })
	return amqpBatches(ctx, r, func(batch []amqp091.Delivery) error {
		for i, err := range h(ctx, batch) {
			if consumer.ActionFor(err) != consumer.Ack {
				return fmt.Errorf("delivery %q: %w", batch[i].MessageId, err)
			}
		}
		return nil
	})
}

// amqpBareBatched is amqpBatched without idem: the same batches, each
// delivery handled, one multiple ack per batch.
func amqpBareBatched(ctx context.Context, r *consumerRun) error {
	return amqpBatches(ctx, r, func(batch []amqp091.Delivery) error {
		for range batch {
			_ = r.handle(ctx)
		}
		return nil
	})
}

// amqpBatches gathers up to a batch of deliveries (waiting up to
// batchLinger after the first), hands them to f and acks them with one
// multiple ack, until r.n deliveries are acked.
func amqpBatches(ctx context.Context, r *consumerRun, f func([]amqp091.Delivery) error) error {
	return consume(ctx, r, func(_ *amqp091.Channel, ds <-chan amqp091.Delivery) error {
		batch := make([]amqp091.Delivery, 0, r.batch)
		for done := 0; done < r.n; {
			d, err := next(ctx, ds)
			if err != nil {
				return err
			}
			batch = append(batch[:0], d)
			// Deliveries arrive one by one: a batch waits up to
			// batchLinger after its first for the rest.
			linger := time.NewTimer(batchLinger)
		gather:
			for len(batch) < r.batch && done+len(batch) < r.n {
				select {
				case d, ok := <-ds:
					if !ok {
						linger.Stop()
						return errors.New("the channel closed")
					}
					batch = append(batch, d)
				case <-linger.C:
					break gather
				}
			}
			linger.Stop()
			if err := f(batch); err != nil {
				return err
			}
			if err := batch[len(batch)-1].Ack(true); err != nil {
				return err
			}
			done += len(batch)
		}
		return nil
	})
}

// findBeam returns the pid of the one beam.smp (RabbitMQ's Erlang VM)
// running, or -1 when there is none or more than one.
func findBeam() int {
	ms, _ := filepath.Glob("/proc/[0-9]*/comm")
	pid := -1
	for _, m := range ms {
		b, err := os.ReadFile(m)
		if err != nil || strings.TrimSpace(string(b)) != "beam.smp" {
			continue
		}
		if pid != -1 {
			return -1
		}
		pid, _ = strconv.Atoi(filepath.Base(filepath.Dir(m)))
	}
	return pid
}

// procStatCPU returns the user and system CPU time of process pid, from
// /proc/PID/stat (in clock ticks, 100 a second on Linux).
func procStatCPU(pid int) (time.Duration, bool) {
	if pid <= 0 {
		return 0, false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name, field 2, is in parentheses and may hold spaces:
	// count fields after its closing one. utime and stime are fields 14
	// and 15.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, false
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(u+st) * 10 * time.Millisecond, true
}
