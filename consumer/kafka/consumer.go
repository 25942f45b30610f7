package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strconv"
	"sync"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/twmb/franz-go/pkg/kgo"
)

// commitTimeout bounds the commit of a revocation or Close.
const commitTimeout = 10 * time.Second

// ErrRunTwice is Run's error when the Consumer has already run: after a
// Run, the client's fetch positions are past records it left undone, so
// only a new Consumer (and a new assignment) may read on.
var ErrRunTwice = errors.New("kafka: Consumer.Run called twice")

type tp struct {
	topic     string
	partition int32
}

// part is an assigned partition: its work's context, cancelled on
// revocation, and the work in flight.
type part struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Consumer consumes a group's partitions and handles each record once per
// key. Run it once; Close it when done.
type Consumer struct {
	cl     *kgo.Client
	o      Options // withDefaults
	handle func(context.Context, []*kgo.Record) []error

	mu      sync.Mutex
	ran     bool
	base    context.Context // Run's context, parent of the partitions'
	parts   map[tp]*part
	revokes uint64        // revocations and losses so far
	gone    map[tp]uint64 // the revocation that last took each partition
}

// NewConsumer returns a Consumer of o.Group's o.Topics that handles each
// record with h, at most once per key (see consumer.Batch), on a franz-go
// client it makes with o.Client (which starts joining the group).
//
// NewConsumer panics, in the caller's goroutine, when store (or the value
// in it) or h is nil, and returns an error naming the field when Group or
// Topics is empty or a number or duration in o is negative: a mistake found
// on the first record would surface far from where it was made. It returns
// kgo.NewClient's error too.
func NewConsumer(store idem.Store, h func(ctx context.Context, r *kgo.Record) error, o Options) (*Consumer, error) {
	switch {
	case isNil(store):
		panic("kafka.NewConsumer: nil store")
	case h == nil:
		panic("kafka.NewConsumer: nil handler")
	}
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Consumer{o: o, parts: map[tp]*part{}, gone: map[tp]uint64{}, base: context.Background()}
	wrapped := func(ctx context.Context, r *kgo.Record) error {
		if err := h(ctx, r); err != nil {
			return &handlerError{err}
		}
		return nil
	}
	c.handle = consumer.Batch(store, c.key, wrapped, o.consumer())
	opts := append(append([]kgo.Opt(nil), o.Client...),
		kgo.ConsumerGroup(o.Group),
		kgo.ConsumeTopics(o.Topics...),
		kgo.AutoCommitMarks(),
		kgo.AutoCommitInterval(o.CommitInterval),
		kgo.OnPartitionsAssigned(c.assigned),
		kgo.OnPartitionsRevoked(c.revoked),
		kgo.OnPartitionsLost(c.lost),
	)
	c.cl, err = kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka.NewConsumer: %w", err)
	}
	return c, nil
}

// handlerError marks the handler's own failure, told apart from the store's.
type handlerError struct{ err error }

func (e *handlerError) Error() string { return e.err.Error() }

func (e *handlerError) Unwrap() error { return e.err }

// key is a record's key: its header's (or record key's) value, else its
// place in the log.
func (c *Consumer) key(r *kgo.Record) string {
	if c.o.UseRecordKey {
		if len(r.Key) > 0 {
			return string(r.Key)
		}
	} else {
		for _, h := range r.Headers {
			if h.Key == c.o.KeyHeader && len(h.Value) > 0 {
				return string(h.Value)
			}
		}
	}
	return r.Topic + "/" + strconv.FormatInt(int64(r.Partition), 10) + "/" + strconv.FormatInt(r.Offset, 10)
}

// Client returns the Consumer's franz-go client, for metrics or admin
// requests. Do not poll, commit or close it: the Consumer does.
func (c *Consumer) Client() *kgo.Client { return c.cl }

// Close leaves the group, after the partitions' work in flight finishes
// or is forgotten and their marked offsets are committed (the revocation
// of every partition), and closes the client. It may be called while Run
// runs, which then returns; it must not be called from a handler's
// goroutine, whose return the revocation waits for.
func (c *Consumer) Close() { c.cl.Close() }

// Run polls and handles records until ctx ends or the Consumer is closed,
// and then returns ctx.Err() (nil after Close). When ctx ends, the
// handlers running see it end; the work they finished is confirmed and
// its offsets committed, the rest is forgotten and left to the
// partition's next owner: Close the Consumer then, which lets the group
// reassign its partitions.
//
// Kafka errors of a fetch are logged; the client retries them. If a
// handler panics, the rest of its partition's batch is settled in the
// store (see consumer.Batch), no offset of it is marked, the other
// partitions of the poll finish, and the panic is re-raised on Run's
// goroutine.
func (c *Consumer) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.ran {
		c.mu.Unlock()
		return ErrRunTwice
	}
	c.ran, c.base = true, ctx
	for _, p := range c.parts { // assigned before Run: rebase on ctx
		p.ctx, p.cancel = context.WithCancel(ctx)
	}
	c.mu.Unlock()
	defer func() { // a revocation after Run starts nothing
		c.mu.Lock()
		c.base = canceled
		c.mu.Unlock()
	}()
	for ctx.Err() == nil {
		c.mu.Lock()
		before := c.revokes
		c.mu.Unlock()
		fs := c.cl.PollRecords(ctx, c.o.MaxPollRecords)
		if fs.IsClientClosed() {
			return nil
		}
		fs.EachError(func(t string, p int32, err error) {
			if ctx.Err() == nil && !errors.Is(err, context.Canceled) {
				c.o.Logger.LogAttrs(ctx, slog.LevelWarn, "idem/kafka: fetch failed; the client retries",
					slog.String("topic", t), slog.Int("partition", int(p)), slog.Any("err", err))
			}
		})
		c.poll(fs, before)
	}
	return ctx.Err()
}

var canceled = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// poll handles one poll's partitions in parallel and returns when they
// are done; it re-raises a handler's panic.
func (c *Consumer) poll(fs kgo.Fetches, before uint64) {
	var wg sync.WaitGroup
	var pmu sync.Mutex
	var panicked any
	fs.EachPartition(func(f kgo.FetchTopicPartition) {
		if len(f.Records) == 0 {
			return
		}
		k := tp{f.Topic, f.Partition}
		c.mu.Lock()
		p := c.parts[k]
		if p == nil || c.gone[k] > before {
			// Revoked while it was fetched: its next owner refetches it.
			c.mu.Unlock()
			return
		}
		p.wg.Add(1)
		pctx := p.ctx
		c.mu.Unlock()
		wg.Go(func() {
			defer p.wg.Done()
			defer func() {
				if v := recover(); v != nil {
					pmu.Lock()
					if panicked == nil {
						panicked = v
					}
					pmu.Unlock()
				}
			}()
			c.partition(pctx, f.Records)
		})
	})
	wg.Wait()
	if panicked != nil {
		panic(panicked)
	}
}

// isNil reports whether v is nil or holds a nil pointer, map, slice,
// channel or function: a (*idem.RedisStore)(nil) given as an idem.Store is
// not == nil, and would panic on first use, far from the mistake.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch r := reflect.ValueOf(v); r.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Chan, reflect.Func, reflect.Interface:
		return r.IsNil()
	}
	return false
}
