package kafka

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
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
