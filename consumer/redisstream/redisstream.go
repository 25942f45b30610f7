// Package redisstream makes a Redis Streams consumer-group reader
// (github.com/redis/go-redis/v9) handle each entry once, however often the
// stream delivers it: an entry re-added by its producer, reclaimed from a
// consumer that crashed, or redelivered after a failure.
//
// A [Reader] reads its group with XREADGROUP, hands each batch read to
// consumer.Batch (one claim and one confirm round trip per batch on a
// Redis store) and settles every entry itself, by consumer.ActionFor of its
// result:
//
//	outcome                                  action        settlement
//	handler succeeded, or a duplicate        Ack           XACK
//	done but not recorded                    AckAndAlert   XACK, logged as an error
//	  (consumer.ErrNotRecorded)
//	handler failed, key in progress,         Redeliver     left pending: reclaimed with
//	  store unavailable, consumer stopped                    XAUTOCLAIM once idle for
//	                                                         Options.MinIdle
//	invalid or oversized key, fingerprint    DeadLetter    XACK without the work (a stream
//	  mismatch, damaged record, quarantined                  has no dead-letter), logged as
//	  key (idem.ErrQuarantined)                              an error
//
// Pending entries of every consumer of the group, this one's included, are
// reclaimed with XAUTOCLAIM once they have been idle for Options.MinIdle,
// so the entries of a consumer that crashed or was stopped mid-handler are
// handled by the others. A reclaimed entry whose work another consumer still
// holds is found in progress and left pending again; one whose work was done
// is a duplicate and acked: reclaiming never does the work twice, only a
// crash between the effect and its confirmation can (see package consumer,
// "What once means").
//
// A crash can redo up to one batch: the entries of one read (up to
// Options.Count) are confirmed together once their handlers have returned,
// so a reader killed in between leaves every effect of the batch
// unconfirmed, and the reclaim does them again. Lower Count to narrow the
// window; fence the effects where a second one matters.
//
// # Keys
//
// An entry's key is the value of its Options.KeyField. Without a KeyField,
// or for an entry without that field (or with it empty), the key is the
// stream's name and the entry ID ("orders/1700000000000-0"): that
// deduplicates redeliveries and reclaims of the entry, but not the same
// message added twice by a producer, which gets a new entry ID each time.
// Producers that may add a message twice (a retried XADD) should give it an
// id field and the reader its name.
//
// The stream may be on the store's Redis or another, a Redis Cluster
// included: a stream and its groups are one key, on one slot.
package redisstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/internal/backoff"
	"github.com/idemgo/idem/internal/badopt"
	"github.com/idemgo/idem/internal/nilcheck"
	"github.com/redis/go-redis/v9"
)

// Client is what a Reader needs of a go-redis client; *redis.Client,
// *redis.ClusterClient and every redis.Cmdable have it.
type Client interface {
	XGroupCreateMkStream(ctx context.Context, stream, group, start string) *redis.StatusCmd
	XReadGroup(ctx context.Context, a *redis.XReadGroupArgs) *redis.XStreamSliceCmd
	XAutoClaim(ctx context.Context, a *redis.XAutoClaimArgs) *redis.XAutoClaimCmd
	XAck(ctx context.Context, stream, group string, ids ...string) *redis.IntCmd
}

// Action is how an entry was settled.
type Action uint8

// The settlements of an entry.
const (
	Ack     Action = iota + 1 // done (now or before): XACKed
	Pending                   // not acked: reclaimed with XAUTOCLAIM after Options.MinIdle
	Reject                    // XACKed without its work: it can never succeed (logged)
)

func (a Action) String() string {
	switch a {
	case Ack:
		return "ack"
	case Pending:
		return "pending"
	case Reject:
		return "reject"
	}
	return "action(" + strconv.Itoa(int(a)) + ")"
}

// Settlement reports how one entry was settled, for metrics and tests.
type Settlement struct {
	Action Action
	// Reclaimed is whether the entry came from XAUTOCLAIM rather than a
	// first read.
	Reclaimed bool
	// Err is the wrapped handler's error; nil for a plain Ack.
	Err error
	// SettleErr is Redis's error for the XACK; with it, the entry stays
	// pending and is reclaimed as a duplicate.
	SettleErr error
}

// Options configure NewReader: one flat literal, passed by value. Stream,
// Group and Consumer are required; for every other field, zero means its
// default.
type Options struct {
	// Stream is the stream's key. Required.
	Stream string
	// Group is the consumer group. Run creates it, and the stream, if
	// missing, reading from the stream's first entry (XGROUP CREATE ... 0
	// MKSTREAM); create it yourself at $ to skip the history. Required.
	Group string
	// Consumer is this reader's name in the group, unique among the
	// group's live readers (a host name and process id). Required.
	Consumer string
	// KeyField names the entry field whose value is its key (see Keys in
	// the package documentation). Default: none, the key is the stream and
	// entry ID.
	KeyField string
	// Fingerprint returns a fingerprint of an entry's content, as
	// consumer.Options.Fingerprint; a mismatch is rejected. Default: none.
	Fingerprint func(m *redis.XMessage) []byte
	// Count bounds the entries of one XREADGROUP or XAUTOCLAIM, which are
	// claimed and confirmed as one batch: what a crash can make the group
	// redo (see the package documentation). Negative is refused. Default
	// DefaultCount.
	Count int
	// Block is how long one XREADGROUP waits for new entries; Run notices
	// its context's end within about this long. Negative is refused.
	// Default DefaultBlock.
	Block time.Duration
	// MinIdle is how long an entry stays pending (unacked, not delivered
	// again) before any reader of the group reclaims it with XAUTOCLAIM:
	// the retry delay of a failed or in-progress entry, and how soon a
	// crashed consumer's entries are taken over. Give it at least the
	// store's lease TTL, or reclaims find the crashed consumer's claim held
	// and leave the entry pending again. Readers look for idle entries
	// every MinIdle/2. Negative is refused. Default DefaultMinIdle.
	MinIdle time.Duration
	// Concurrency bounds how many handlers of one batch run at once, as
	// consumer.Options.Concurrency. Negative is refused. Default
	// consumer.DefaultConcurrency.
	Concurrency int
	// Logger receives rejections, unrecorded work and Redis errors. Keys
	// are logged as their KeyHasher hash, never raw. Default:
	// slog.Default().
	Logger *slog.Logger
	// Hook is told of the wrapped handler's notable outcomes, as
	// consumer.Options.Hook. Default: none.
	Hook consumer.Hook
	// Observer receives one idem.Event per entry, as
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
	// OnSettle, when set, is called after each settlement, on Run's
	// goroutine. It must be quick. Default: none.
	OnSettle func(m *redis.XMessage, s Settlement)
}

// Defaults of Options.
const (
	DefaultCount   = 100
	DefaultBlock   = time.Second
	DefaultMinIdle = 30 * time.Second
)

// ackTimeout bounds an XACK, sent on a context detached from Run's so that
// work done before a shutdown is still acked.
const ackTimeout = 5 * time.Second

// Reader reads a stream's consumer group and handles each entry once per
// key. Its methods are safe for concurrent use, but one Reader is meant to
// be Run once at a time; run several (with distinct Consumer names) to read
// in parallel.
type Reader struct {
	c       Client
	o       Options // withDefaults
	handle  func(context.Context, []redis.XMessage) []error
	claimed string // XAUTOCLAIM's cursor
}

// NewReader returns a Reader that handles the entries of o.Stream read as
// o.Consumer of o.Group with h, at most once per key (see consumer.Batch).
// It does no I/O.
//
// NewReader panics, in the caller's goroutine, when c, store (or the value
// in them) or h is nil, and returns an error naming the field when Stream,
// Group or Consumer is empty or a number or duration in o is negative: a
// mistake found on the first entry would surface far from where it was
// made.
func NewReader(c Client, store idem.Store, h func(ctx context.Context, m redis.XMessage) error, o Options) (*Reader, error) {
	switch {
	case nilcheck.Nil(c):
		panic("redisstream.NewReader: nil client")
	case nilcheck.Nil(store):
		panic("redisstream.NewReader: nil store")
	case h == nil:
		panic("redisstream.NewReader: nil handler")
	}
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	r := &Reader{c: c, o: o, claimed: "0-0"}
	r.handle = consumer.Batch(store, r.key, h, o.consumer())
	return r, nil
}

// withDefaults returns o checked, with its defaults filled in.
func (o Options) withDefaults() (Options, error) {
	switch {
	case o.Stream == "":
		return o, badopt.Error("redisstream", "Stream", o.Stream, "is empty; set the stream to read")
	case o.Group == "":
		return o, badopt.Error("redisstream", "Group", o.Group, "is empty; set the consumer group to read as")
	case o.Consumer == "":
		return o, badopt.Error("redisstream", "Consumer", o.Consumer, "is empty; name this reader, unique in its group")
	case o.Count < 0:
		return o, badopt.Default("redisstream", "Count", o.Count, DefaultCount, "is negative")
	case o.Block < 0:
		return o, badopt.Default("redisstream", "Block", o.Block, DefaultBlock, "is negative")
	case o.MinIdle < 0:
		return o, badopt.Default("redisstream", "MinIdle", o.MinIdle, DefaultMinIdle, "is negative")
	case o.Concurrency < 0:
		return o, badopt.Default("redisstream", "Concurrency", o.Concurrency, consumer.DefaultConcurrency, "is negative")
	case o.ConfirmBudget < 0:
		return o, badopt.Default("redisstream", "ConfirmBudget", o.ConfirmBudget, "two thirds of the lease's TTL", "is negative")
	}
	if o.Count == 0 {
		o.Count = DefaultCount
	}
	if o.Block == 0 {
		o.Block = DefaultBlock
	}
	if o.MinIdle == 0 {
		o.MinIdle = DefaultMinIdle
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}

// consumer returns the options of the wrapped handler.
func (o Options) consumer() consumer.Options[redis.XMessage] {
	co := consumer.Options[redis.XMessage]{Hook: o.Hook, Observer: o.Observer,
		KeyHasher: o.KeyHasher, ConfirmBudget: o.ConfirmBudget, Concurrency: o.Concurrency}
	if fp := o.Fingerprint; fp != nil {
		co.Fingerprint = func(m redis.XMessage) []byte { return fp(&m) }
	}
	return co
}

// key is an entry's key: its KeyField's value, else the stream and entry ID.
func (r *Reader) key(m redis.XMessage) string {
	if r.o.KeyField != "" {
		switch v := m.Values[r.o.KeyField].(type) {
		case string:
			if v != "" {
				return v
			}
		case nil:
		default:
			if s := fmt.Sprint(v); s != "" {
				return s
			}
		}
	}
	return r.o.Stream + "/" + m.ID
}

// Run reads and handles entries until ctx ends, and then returns
// ctx.Err(). It first creates the group if it is missing: a Redis that
// cannot be reached yet (a service starting before its Redis) is waited
// for, retried as a mid-run outage is, while a refusal from Redis (the
// key holds no stream, a user without XGROUP) is returned. Entries read
// first go to the handler as they come; every MinIdle/2, entries of the
// group idle for MinIdle are reclaimed and handled too. When ctx ends, the
// handlers running see it end; the work they finished is confirmed and
// acked, the rest left pending for another reader to reclaim.
//
// Redis errors other than a missing group are logged and retried after a
// growing pause: doubling from 10ms up to Block, jittered by half, so that
// the readers of a group do not come back in step after an outage. If a
// handler panics, the rest of its batch is settled in the store (see
// consumer.Batch), nothing of it is acked, and the panic is re-raised: the
// batch's entries stay pending and are reclaimed, the done ones as
// duplicates.
func (r *Reader) Run(ctx context.Context) error {
	pause := backoff.Backoff{First: min(10*time.Millisecond, r.o.Block), Most: r.o.Block}
	if err := r.createGroup(ctx, &pause); err != nil {
		return err
	}
	var lastClaim time.Time
	for ctx.Err() == nil {
		var err error
		if time.Since(lastClaim) >= r.o.MinIdle/2 {
			lastClaim = time.Now()
			err = r.reclaim(ctx)
		}
		if err == nil {
			err = r.read(ctx)
		}
		if err == nil || ctx.Err() != nil {
			pause.Reset()
			continue
		}
		if isNoGroup(err) {
			return fmt.Errorf("redisstream: group %q of stream %q: %w", r.o.Group, r.o.Stream, err)
		}
		d := pause.Next()
		r.o.Logger.LogAttrs(ctx, slog.LevelWarn, "idem/redisstream: reading the stream failed; retrying",
			slog.String("stream", r.o.Stream), slog.Duration("pause", d), slog.Any("err", err))
		backoff.Sleep(ctx, d)
	}
	return ctx.Err()
}

// createGroup creates the group (and the stream) unless it exists,
// retrying with pause while Redis cannot be reached.
func (r *Reader) createGroup(ctx context.Context, pause *backoff.Backoff) error {
	for {
		err := r.c.XGroupCreateMkStream(ctx, r.o.Stream, r.o.Group, "0").Err()
		var refused redis.Error
		switch {
		case err == nil || isBusyGroup(err):
			pause.Reset()
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.As(err, &refused) && !isTransient(err):
			return fmt.Errorf("redisstream: creating group %q of stream %q: %w", r.o.Group, r.o.Stream, err)
		}
		d := pause.Next()
		r.o.Logger.LogAttrs(ctx, slog.LevelWarn, "idem/redisstream: creating the group failed; retrying",
			slog.String("stream", r.o.Stream), slog.String("group", r.o.Group), slog.Duration("pause", d), slog.Any("err", err))
		backoff.Sleep(ctx, d)
	}
}

// isTransient reports Redis's answers that say "not now" rather than
// "never": a server loading its data, a cluster mid-failover.
func isTransient(err error) bool {
	for _, code := range []string{"LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY"} {
		if hasCode(err, code) {
			return true
		}
	}
	return false
}

// read reads new entries once (waiting up to Block) and handles them.
func (r *Reader) read(ctx context.Context) error {
	streams, err := r.c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: r.o.Group, Consumer: r.o.Consumer,
		Streams: []string{r.o.Stream, ">"}, Count: int64(r.o.Count), Block: r.o.Block}).Result()
	if errors.Is(err, redis.Nil) {
		return nil // nothing new within Block
	}
	if err != nil {
		return err
	}
	for _, s := range streams {
		r.settle(ctx, s.Messages, false)
	}
	return nil
}

// reclaim takes over the group's entries idle for MinIdle, a batch of up
// to Count at a time, and handles them, until XAUTOCLAIM's cursor has gone
// round the pending list once.
func (r *Reader) reclaim(ctx context.Context) error {
	for ctx.Err() == nil {
		ms, next, err := r.c.XAutoClaim(ctx, &redis.XAutoClaimArgs{Stream: r.o.Stream, Group: r.o.Group,
			Consumer: r.o.Consumer, MinIdle: r.o.MinIdle, Start: r.claimed, Count: int64(r.o.Count)}).Result()
		if err != nil {
			return err
		}
		r.claimed = next
		r.settle(ctx, ms, true)
		if next == "0-0" {
			return nil
		}
	}
	return nil
}

// settle handles ms as one batch and acks, in one XACK, the entries done
// or rejected.
func (r *Reader) settle(ctx context.Context, ms []redis.XMessage, reclaimed bool) {
	if len(ms) == 0 {
		return
	}
	errs := r.handle(ctx, ms)
	acts := make([]Action, len(ms))
	alerts := make([]bool, len(ms))
	ids := make([]string, 0, len(ms))
	for i, err := range errs {
		switch consumer.ActionFor(err) {
		case consumer.Ack:
			acts[i] = Ack
		case consumer.AckAndAlert:
			acts[i], alerts[i] = Ack, true
		case consumer.DeadLetter:
			acts[i] = Reject
		default: // consumer.Redeliver
			acts[i] = Pending
		}
		if acts[i] != Pending {
			ids = append(ids, ms[i].ID)
		}
	}
	var ackErr error
	if len(ids) > 0 {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackTimeout)
		ackErr = r.c.XAck(actx, r.o.Stream, r.o.Group, ids...).Err()
		cancel()
		if ackErr != nil {
			r.o.Logger.LogAttrs(ctx, slog.LevelWarn, "idem/redisstream: XACK failed; the entries stay pending and are reclaimed as duplicates",
				slog.String("stream", r.o.Stream), slog.Int("entries", len(ids)), slog.Any("err", ackErr))
		}
	}
	// Logged once the XACK's verdict is known: the log says "acked" only
	// of what Redis acked.
	for i, err := range errs {
		var msg string
		switch {
		case alerts[i] && ackErr == nil:
			msg = "idem/redisstream: work done but not recorded; acked so it is not done again now"
		case alerts[i]:
			msg = "idem/redisstream: work done but not recorded; its XACK failed too: it stays pending, and a reclaim after its lease runs out does it again"
		case acts[i] == Reject && ackErr == nil:
			// A stream has no dead-letter: the log is where an operator finds it.
			msg = "idem/redisstream: entry acked without its work: " + whyDead(err)
		case acts[i] == Reject:
			msg = "idem/redisstream: entry not acked, its XACK failed: it stays pending, and is reclaimed and refused again: " + whyDead(err)
		default:
			continue
		}
		r.o.Logger.LogAttrs(ctx, slog.LevelError, msg,
			slog.String("key_hash", r.o.KeyHasher.Hash(r.key(ms[i]))), slog.String("entry", ms[i].ID), slog.Any("err", err))
	}
	if r.o.OnSettle == nil {
		return
	}
	for i := range ms {
		s := Settlement{Action: acts[i], Reclaimed: reclaimed, Err: errs[i]}
		if acts[i] != Pending {
			s.SettleErr = ackErr
		}
		r.o.OnSettle(&ms[i], s)
	}
}

// isBusyGroup reports Redis's answer to creating a group that exists.
func isBusyGroup(err error) bool { return hasCode(err, "BUSYGROUP") }

// isNoGroup reports Redis's answer to reading a group (or stream) that is
// gone: deleted under the reader, which no retry mends.
func isNoGroup(err error) bool { return hasCode(err, "NOGROUP") }

func hasCode(err error, code string) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), code+" ")
}

// whyDead says why a dead-lettered entry cannot be handled: a quarantined
// key waits for an operator, anything else can never succeed.
func whyDead(err error) string {
	if errors.Is(err, idem.ErrQuarantined) {
		return "its key is quarantined after repeated crashes; an operator must settle it (idem resolve), then add it again"
	}
	return "it can never succeed"
}
