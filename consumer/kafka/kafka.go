// Package kafka makes a Kafka consumer group (github.com/twmb/franz-go)
// handle each record once, however often the log holds it or the group
// delivers it: a record produced twice by a retrying producer, or fetched
// again by the partition's next owner after a rebalance or a crash.
//
// A [Consumer] polls its group, hands each fetched partition's records to
// consumer.Batch (one claim and one confirm round trip per partition and
// poll on a Redis store; partitions run in parallel) and commits a
// partition's offset only past records that are done: an offset is marked
// only when every record before it was confirmed, found a duplicate, or
// settled by the error policy. Kafka has no per-record requeue, so a record
// that is not done is retried in place, holding back the partition behind
// it. Each record is settled by consumer.ActionFor of its result:
//
//	outcome                               action        settlement
//	handler succeeded, or a duplicate     Ack           Commit: the offset may pass it
//	done but not recorded                 AckAndAlert   Commit, logged as an error
//	  (consumer.ErrNotRecorded)
//	key in progress (held by another      Redeliver     Retry in place after a delay that
//	  consumer, e.g. the partition's                      doubles from MinDelay to MaxDelay,
//	  previous owner), store unavailable                  until done or taken over
//	handler failed                        Redeliver     without DeadLetter: Retry in place;
//	                                                      with it: after MaxAttempts failures,
//	                                                      DeadLetter, then Commit
//	invalid or oversized key,             DeadLetter    DeadLetter if set, else Skip (logged):
//	  fingerprint mismatch, damaged                       it can never succeed, or not until
//	  record, quarantined key                             an operator settles its key
//	  (idem.ErrQuarantined)
//
// A record in progress is held by a consumer that still runs its handler
// (often the partition's previous owner, finishing before its revocation
// completes) or that crashed; retried in place, it is found done once the
// holder confirms it (a duplicate: committed without running again) or
// claimed once the holder's lease expires (taken over).
//
// A crash can redo up to one batch: a partition's records of one poll (up
// to Options.MaxPollRecords) are confirmed together once their handlers
// have returned, so a consumer killed in between leaves every effect of
// the batch unconfirmed, and the partition's next owner, fetching from the
// committed offset, does them again once their leases run out. Lower
// MaxPollRecords to narrow the window.
//
// Run polls again only when every partition of the last poll is settled
// (or its work ended by a revocation): a partition retrying in place holds
// the others back too, for as long as its delay. Give DeadLetter to bound
// how long a failing handler can do so.
//
// # Rebalances
//
// When the group revokes or loses a partition, the Consumer cancels the
// context of the partition's work before the partition goes: the handlers
// running see their context end, work they finished is confirmed, the
// rest is forgotten in the store, retries in place stop, and (on a
// revocation, not a loss) the offsets marked so far are committed. Records
// of a partition that was revoked while they were being fetched are
// dropped unhandled; its next owner fetches them from the committed offset.
//
// # Keys
//
// A record's key is the value of its header Options.KeyHeader (default
// "Idempotency-Key"), or, with Options.UseRecordKey, its record key. A
// record without one (header missing or empty, or a null record key) is
// keyed by its place in the log, "topic/partition/offset": that
// deduplicates refetches of the record after a rebalance or crash, but not
// the same message produced twice, which gets a new offset each time.
// Producers that may produce a message twice should give it the header. A
// record key is often a partitioning key (a user or account id) that many
// messages share: use it as the idempotency key only when it names one
// message.
//
// # Testing
//
// The package is tested against kfake (github.com/twmb/franz-go/pkg/kfake),
// franz-go's in-process fake Kafka cluster that speaks the Kafka protocol,
// and the real Redis store: no Kafka broker can be installed where idem is
// developed, so no test runs against a real Kafka broker.
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

// Action is how a record was settled, or one attempt at it.
type Action uint8

// The settlements of a record.
const (
	Commit     Action = iota + 1 // done (now or before): the committed offset may pass it
	Retry                        // not done: retried in place after Settlement.Delay
	DeadLetter                   // handed to Options.DeadLetter, which accepted it: committed past
	Skip                         // can never succeed, no DeadLetter: committed past without its work (logged)
)

func (a Action) String() string {
	switch a {
	case Commit:
		return "commit"
	case Retry:
		return "retry"
	case DeadLetter:
		return "dead_letter"
	case Skip:
		return "skip"
	}
	return "action(" + strconv.Itoa(int(a)) + ")"
}

// Settlement reports how one record was settled, or one attempt at it
// retried, for metrics and tests.
type Settlement struct {
	Action Action
	// Attempt counts the attempts at the record by this Consumer in this
	// assignment of its partition, from 1.
	Attempt int
	// Delay is the wait before a Retry; zero otherwise.
	Delay time.Duration
	// Err is the wrapped handler's error (for a handler failure, the
	// handler's own); nil for a plain Commit.
	Err error
}

// Options configure NewConsumer: one flat literal, passed by value. Group
// and Topics are required; for every other field, zero means its default.
type Options struct {
	// Group is the consumer group. Required.
	Group string
	// Topics are the topics the group consumes. Required.
	Topics []string
	// Client are the franz-go client's options: kgo.SeedBrokers at least,
	// plus any dialer, SASL or fetch tuning. The Consumer's own go after
	// them and override theirs: the group, the topics, committing
	// (kgo.AutoCommitMarks at CommitInterval) and the partition callbacks
	// (OnPartitionsAssigned, Revoked and Lost), which are the Consumer's.
	Client []kgo.Opt
	// KeyHeader names the record header whose value is its key (see Keys
	// in the package documentation). Default DefaultKeyHeader.
	KeyHeader string
	// UseRecordKey keys records by their record key instead of a header.
	// Default false.
	UseRecordKey bool
	// Fingerprint returns a fingerprint of a record's content, as
	// consumer.Options.Fingerprint; a mismatch can never succeed. Default:
	// none.
	Fingerprint func(r *kgo.Record) []byte
	// DeadLetter, when set, receives a record whose handler failed
	// MaxAttempts times in a row, with the handler's last error, and a
	// record that can never succeed (invalid key, fingerprint mismatch),
	// with the reason. It may produce the record to a dead-letter topic;
	// when it returns nil the record is settled and the offset may pass
	// it, when it returns an error the record is retried in place. It is
	// called on the partition's goroutine, never twice at once for one
	// partition. Default: none; a failed handler is retried in place until
	// it succeeds, and a record that can never succeed is skipped (logged).
	DeadLetter func(ctx context.Context, r *kgo.Record, err error) error
	// MaxAttempts is how many handler failures in a row send a record to
	// DeadLetter. Without DeadLetter it is not used. Negative is refused.
	// Default DefaultMaxAttempts.
	MaxAttempts int
	// MaxPollRecords bounds the records of one poll, all partitions
	// together. Negative is refused. Default DefaultMaxPollRecords.
	MaxPollRecords int
	// MinDelay is the first wait before a record not done is retried in
	// place; each retry of the same records doubles it, up to MaxDelay.
	// Negative is refused. Default DefaultMinDelay.
	MinDelay time.Duration
	// MaxDelay bounds the retry delay. Negative, or below MinDelay, is
	// refused. Default DefaultMaxDelay.
	MaxDelay time.Duration
	// CommitInterval is how often marked offsets are committed; a
	// revocation and Close commit at once. Negative is refused. Default
	// DefaultCommitInterval. Below MinCommitInterval is refused.
	CommitInterval time.Duration
	// Concurrency bounds how many handlers of one partition's batch run at
	// once, as consumer.Options.Concurrency. Negative is refused. Default
	// consumer.DefaultConcurrency.
	Concurrency int
	// Logger receives skipped records, unrecorded work and Kafka errors.
	// Keys are logged as their KeyHasher hash, never raw. Default:
	// slog.Default().
	Logger *slog.Logger
	// Hook is told of the wrapped handler's notable outcomes, as
	// consumer.Options.Hook. Default: none.
	Hook consumer.Hook
	// Observer receives one idem.Event per record attempt, as
	// consumer.Options.Observer. Default: none.
	Observer idem.Observer
	// KeyHasher hashes keys for the Logger, the Hook, the Observer and
	// errors. Give it the store's (idem.Options.KeyHasher) so that they
	// correlate. Default: the process's (idem.KeyHash).
	KeyHasher *idem.KeyHasher
	// ConfirmBudget bounds how long Confirm is retried after the handler
	// succeeded, as consumer.Options.ConfirmBudget. Negative is refused.
	// Default: two thirds of the lease's TTL.
	ConfirmBudget time.Duration
	// OnSettle, when set, is called after each settlement and each retried
	// attempt, on the partition's goroutine. It must be quick and safe for
	// concurrent use. Default: none.
	OnSettle func(r *kgo.Record, s Settlement)
}

// Defaults of Options.
const (
	DefaultKeyHeader      = "Idempotency-Key"
	DefaultMaxAttempts    = 3
	DefaultMaxPollRecords = 500
	DefaultMinDelay       = 50 * time.Millisecond
	DefaultMaxDelay       = 5 * time.Second
	DefaultCommitInterval = time.Second
	MinCommitInterval     = 100 * time.Millisecond // franz-go's minimum autocommit interval
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

// withDefaults returns o checked, with its defaults filled in.
func (o Options) withDefaults() (Options, error) {
	switch {
	case o.Group == "":
		return o, fmt.Errorf("kafka: Group: %q is empty; set the consumer group", o.Group)
	case len(o.Topics) == 0:
		return o, fmt.Errorf("kafka: Topics: %v is empty; list the topics to consume", o.Topics)
	case o.MaxAttempts < 0:
		return o, fmt.Errorf("kafka: MaxAttempts: %d is negative; 0 means the default, %d", o.MaxAttempts, DefaultMaxAttempts)
	case o.MaxPollRecords < 0:
		return o, fmt.Errorf("kafka: MaxPollRecords: %d is negative; 0 means the default, %d", o.MaxPollRecords, DefaultMaxPollRecords)
	case o.MinDelay < 0:
		return o, fmt.Errorf("kafka: MinDelay: %v is negative; 0 means the default, %v", o.MinDelay, DefaultMinDelay)
	case o.MaxDelay < 0:
		return o, fmt.Errorf("kafka: MaxDelay: %v is negative; 0 means the default, %v", o.MaxDelay, DefaultMaxDelay)
	case o.CommitInterval < 0:
		return o, fmt.Errorf("kafka: CommitInterval: %v is negative; 0 means the default, %v", o.CommitInterval, DefaultCommitInterval)
	case o.CommitInterval > 0 && o.CommitInterval < MinCommitInterval:
		return o, fmt.Errorf("kafka: CommitInterval: %v is under %v, franz-go's minimum; 0 means the default, %v", o.CommitInterval, MinCommitInterval, DefaultCommitInterval)
	case o.Concurrency < 0:
		return o, fmt.Errorf("kafka: Concurrency: %d is negative; 0 means the default, %d", o.Concurrency, consumer.DefaultConcurrency)
	case o.ConfirmBudget < 0:
		return o, fmt.Errorf("kafka: ConfirmBudget: %v is negative; 0 means the default, two thirds of the lease's TTL", o.ConfirmBudget)
	}
	for i, t := range o.Topics {
		if t == "" {
			return o, fmt.Errorf("kafka: Topics[%d]: %q is empty; name a topic", i, t)
		}
	}
	if o.KeyHeader == "" {
		o.KeyHeader = DefaultKeyHeader
	}
	if o.MaxAttempts == 0 {
		o.MaxAttempts = DefaultMaxAttempts
	}
	if o.MaxPollRecords == 0 {
		o.MaxPollRecords = DefaultMaxPollRecords
	}
	if o.MinDelay == 0 {
		o.MinDelay = DefaultMinDelay
	}
	if o.MaxDelay == 0 {
		o.MaxDelay = max(DefaultMaxDelay, o.MinDelay)
	}
	if o.MaxDelay < o.MinDelay {
		return o, fmt.Errorf("kafka: MaxDelay: %v is less than MinDelay %v", o.MaxDelay, o.MinDelay)
	}
	if o.CommitInterval == 0 {
		o.CommitInterval = DefaultCommitInterval
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}

// consumer returns the options of the wrapped handler.
func (o Options) consumer() consumer.Options[*kgo.Record] {
	return consumer.Options[*kgo.Record]{Hook: o.Hook, Observer: o.Observer, KeyHasher: o.KeyHasher,
		ConfirmBudget: o.ConfirmBudget, Concurrency: o.Concurrency, Fingerprint: o.Fingerprint}
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

// assigned starts the work contexts of newly assigned partitions.
func (c *Consumer) assigned(_ context.Context, _ *kgo.Client, ps map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for t, parts := range ps {
		for _, n := range parts {
			ctx, cancel := context.WithCancel(c.base)
			c.parts[tp{t, n}] = &part{ctx: ctx, cancel: cancel}
		}
	}
}

// revoked ends the revoked partitions' work, waits for it, and commits
// their marked offsets, before the group hands the partitions on.
func (c *Consumer) revoked(ctx context.Context, cl *kgo.Client, ps map[string][]int32) {
	c.drop(ps)
	cctx, cancel := context.WithTimeout(ctx, commitTimeout)
	defer cancel()
	if err := cl.CommitMarkedOffsets(cctx); err != nil {
		c.o.Logger.LogAttrs(ctx, slog.LevelWarn, "idem/kafka: committing the revoked partitions' offsets failed; their next owner refetches the records as duplicates",
			slog.Any("err", err))
	}
}

// lost ends the lost partitions' work and waits for it; their offsets
// cannot be committed any more.
func (c *Consumer) lost(_ context.Context, _ *kgo.Client, ps map[string][]int32) { c.drop(ps) }

// drop cancels the partitions' work, forgets them, and waits for their
// work in flight to return.
func (c *Consumer) drop(ps map[string][]int32) {
	c.mu.Lock()
	c.revokes++
	var gone []*part
	for t, parts := range ps {
		for _, n := range parts {
			k := tp{t, n}
			c.gone[k] = c.revokes
			if p := c.parts[k]; p != nil {
				p.cancel()
				gone = append(gone, p)
				delete(c.parts, k)
			}
		}
	}
	c.mu.Unlock()
	for _, p := range gone {
		p.wg.Wait()
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

// whyDead says why a dead-lettered record cannot be handled: a quarantined
// key waits for an operator, anything else can never succeed.
func whyDead(err error) string {
	if errors.Is(err, idem.ErrQuarantined) {
		return "its key is quarantined after repeated crashes; an operator must settle it (idem resolve)"
	}
	return "it can never succeed"
}
