// Package jetstream makes a NATS JetStream consumer
// (github.com/nats-io/nats.go/jetstream) handle each message once, however
// often the stream delivers it: a message published twice outside the
// stream's duplicate window, redelivered after its AckWait ran out, or
// redelivered after a consumer stopped or crashed mid-handler.
//
// A [Handler] wraps a message handler with consumer.Idempotent and settles
// every message itself, by consumer.ActionFor of the wrapper's error:
//
//	outcome                                  action        settlement
//	handler succeeded, or a duplicate        Ack           Ack
//	done but not recorded                    AckAndAlert   Ack, logged as an error
//	  (consumer.ErrNotRecorded)
//	key in progress, handler failed,         Redeliver     NakWithDelay, the delay doubling
//	  store unavailable, context ended                       with each delivery of the message
//	no key, invalid or oversized key,        DeadLetter    TermWithReason: never redelivered,
//	  fingerprint mismatch, damaged record,                  logged: never acked as done
//	  quarantined key (idem.ErrQuarantined)
//	handler panicked                         -             Nak at once, panic re-raised
//
// [Handler.Handle] takes one message at a time (Consume's callback, with
// [Handler.MessageHandler]); [Handler.HandleBatch] takes a fetched batch
// through consumer.Batch, one claim and one confirm round trip per batch.
// With HandleBatch a crash can redo up to one batch: the messages of one
// Fetch are confirmed together once their handlers have returned, so a
// consumer killed in between leaves every effect of the batch unconfirmed,
// and their redeliveries do them again; with Handle the window is the one
// message.
//
// While the handler runs, the Handler sends InProgress every
// Options.ProgressInterval, so that the broker's own lease on the message
// (the consumer's AckWait) is kept alive beside idem's (renewed by
// package consumer): a long handler is not redelivered to another
// consumer meanwhile. If this consumer crashes, both run out: the broker
// redelivers the message after AckWait, and the consumer that gets it
// finds the key in progress (and naks it with a delay) until idem's lease
// runs out too, and then claims it and does the work.
//
// # Keys
//
// A message's key is the value of its Options.KeyHeader header, by default
// Nats-Msg-Id (jetstream.MsgIDHeader), the header JetStream itself
// deduplicates publishes by within the stream's Duplicates window (two
// minutes by default). idem covers what that window does not: a publish
// repeated after the window, and every redelivery of a message to a
// consumer. A message without the header (or with it empty) cannot be told
// from its duplicates; it is terminated, not handled.
//
// The package is named jetstream like nats.go's; import it under another
// name (idemjs) next to it.
package jetstream

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
	"github.com/nats-io/nats.go/jetstream"
)

// Action is how a message was settled.
type Action uint8

// The settlements of a message.
const (
	Ack  Action = iota + 1 // done (now or before): acknowledged
	Nak                    // redelivered, after Settlement.Delay (NakWithDelay)
	Term                   // never redelivered: it can never succeed (TermWithReason)
)

func (a Action) String() string {
	switch a {
	case Ack:
		return "ack"
	case Nak:
		return "nak"
	case Term:
		return "term"
	}
	return "action(" + strconv.Itoa(int(a)) + ")"
}

// Settlement reports how one message was settled, for metrics and tests.
type Settlement struct {
	Action Action
	// Delay is the redelivery delay asked of a Nak; zero otherwise.
	Delay time.Duration
	// Err is the wrapped handler's error; nil for a plain Ack.
	Err error
	// SettleErr is the client's error for the Ack, Nak or Term itself (the
	// connection closed: the broker redelivers the message after AckWait,
	// and a done one is then acked as a duplicate).
	SettleErr error
}

// Options configure NewHandler: one flat literal, passed by value. The zero
// value is valid; a zero field means its default.
type Options struct {
	// KeyHeader names the header whose value is a message's key (see Keys
	// in the package documentation). Default DefaultKeyHeader.
	KeyHeader string
	// Fingerprint returns a fingerprint of a message's content, as
	// consumer.Options.Fingerprint; a mismatch is terminated. Default: none.
	Fingerprint func(m jetstream.Msg) []byte
	// MinDelay is the redelivery delay asked of the first Nak of a message;
	// each further delivery of it doubles it, up to MaxDelay (the delivery
	// count is JetStream's, from the message's metadata), so that a busy
	// key or a failing handler does not spin through the broker. Negative
	// is refused. Default DefaultMinDelay.
	MinDelay time.Duration
	// MaxDelay bounds the redelivery delay. Negative, or less than
	// MinDelay, is refused. Default DefaultMaxDelay (or MinDelay, if more).
	MaxDelay time.Duration
	// ProgressInterval is how often InProgress is sent while the handler
	// runs, resetting the message's AckWait on the broker. Give it at most
	// a third of the consumer's AckWait. Negative is refused. Default
	// DefaultProgressInterval, a third of JetStream's default AckWait (30s).
	ProgressInterval time.Duration
	// Concurrency bounds how many handlers of one HandleBatch run at once,
	// as consumer.Options.Concurrency. Negative is refused. Default
	// consumer.DefaultConcurrency.
	Concurrency int
	// Logger receives terminations, unrecorded work and failed settlements.
	// Keys are logged as their KeyHasher hash, never raw. Default:
	// slog.Default().
	Logger *slog.Logger
	// Hook is told of the wrapped handler's notable outcomes, as
	// consumer.Options.Hook. Default: none.
	Hook consumer.Hook
	// Observer receives one idem.Event per message with a key, as
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
	// OnSettle, when set, is called after each settlement, on the goroutine
	// that called Handle or HandleBatch. It must be quick and safe for concurrent use.
	// Default: none.
	OnSettle func(m jetstream.Msg, s Settlement)
}

// Defaults of Options.
const (
	DefaultKeyHeader        = jetstream.MsgIDHeader // "Nats-Msg-Id"
	DefaultMinDelay         = 50 * time.Millisecond
	DefaultMaxDelay         = 5 * time.Second
	DefaultProgressInterval = 10 * time.Second
)

// Handler handles JetStream messages once per key and settles them. Its
// methods are safe for concurrent use if the wrapped handler is.
type Handler struct {
	o       Options // withDefaults
	wrapped func(context.Context, jetstream.Msg) error
	batch   func(context.Context, []jetstream.Msg) []error
}

// NewHandler returns a Handler that handles each message with h at most
// once per key (see consumer.Idempotent) and then acks, naks or terminates
// it as the package documentation's table says. The messages must come
// from a consumer with an explicit ack policy (AckExplicitPolicy, the
// default of pull consumers). It does no I/O.
//
// NewHandler panics, in the caller's goroutine, when store (or the value
// in it) or h is nil, and returns an error naming the field when a duration
// in o is negative or MaxDelay is less than MinDelay: a mistake found on
// the first message would surface far from where it was made.
func NewHandler(store idem.Store, h func(ctx context.Context, m jetstream.Msg) error, o Options) (*Handler, error) {
	switch {
	case isNil(store):
		panic("jetstream.NewHandler: nil store")
	case h == nil:
		panic("jetstream.NewHandler: nil handler")
	}
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	hd := &Handler{o: o}
	hd.wrapped = consumer.Idempotent(store, hd.key, h, o.consumer())
	hd.batch = consumer.Batch(store, hd.key, h, o.consumer())
	return hd, nil
}

// withDefaults returns o checked, with its defaults filled in.
func (o Options) withDefaults() (Options, error) {
	switch {
	case o.MinDelay < 0:
		return o, fmt.Errorf("jetstream: MinDelay: %v is negative; 0 means the default, %v", o.MinDelay, DefaultMinDelay)
	case o.MaxDelay < 0:
		return o, fmt.Errorf("jetstream: MaxDelay: %v is negative; 0 means the default, %v", o.MaxDelay, DefaultMaxDelay)
	case o.MaxDelay > 0 && o.MaxDelay < o.MinDelay:
		return o, fmt.Errorf("jetstream: MaxDelay: %v is less than MinDelay %v", o.MaxDelay, o.MinDelay)
	case o.ProgressInterval < 0:
		return o, fmt.Errorf("jetstream: ProgressInterval: %v is negative; 0 means the default, %v", o.ProgressInterval, DefaultProgressInterval)
	case o.ConfirmBudget < 0:
		return o, fmt.Errorf("jetstream: ConfirmBudget: %v is negative; 0 means the default, two thirds of the lease's TTL", o.ConfirmBudget)
	case o.Concurrency < 0:
		return o, fmt.Errorf("jetstream: Concurrency: %d is negative; 0 means the default, %d", o.Concurrency, consumer.DefaultConcurrency)
	}
	if o.KeyHeader == "" {
		o.KeyHeader = DefaultKeyHeader
	}
	if o.MinDelay == 0 {
		o.MinDelay = DefaultMinDelay
	}
	if o.MaxDelay == 0 {
		o.MaxDelay = max(DefaultMaxDelay, o.MinDelay)
	}
	if o.ProgressInterval == 0 {
		o.ProgressInterval = DefaultProgressInterval
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}

// consumer returns the options of the wrapped handler.
func (o Options) consumer() consumer.Options[jetstream.Msg] {
	return consumer.Options[jetstream.Msg]{Hook: o.Hook, Observer: o.Observer,
		KeyHasher: o.KeyHasher, ConfirmBudget: o.ConfirmBudget, Fingerprint: o.Fingerprint,
		Concurrency: o.Concurrency}
}

// key is a message's key: its KeyHeader's value.
func (hd *Handler) key(m jetstream.Msg) string { return m.Headers().Get(hd.o.KeyHeader) }

// MessageHandler returns Handle bound to ctx, for Consume:
//
//	cc, err := cons.Consume(h.MessageHandler(ctx))
//
// Consume calls it on one goroutine, one message at a time; to handle
// messages in parallel, run several Consume calls (or consumers of the
// same durable) or call Handle from goroutines of your own.
func (hd *Handler) MessageHandler(ctx context.Context) jetstream.MessageHandler {
	return func(m jetstream.Msg) { hd.Handle(ctx, m) }
}

// Handle handles m with the wrapped handler, sending InProgress every
// ProgressInterval while it runs, and settles m. It returns once m is
// settled (Ack, Nak and Term are sent without waiting for the broker's
// reply). When ctx ends, the handler sees it end: work it finished is
// confirmed and acked, the rest nakked for redelivery.
//
// If the handler panics, m is nakked at once and the panic re-raised.
func (hd *Handler) Handle(ctx context.Context, m jetstream.Msg) {
	k := hd.key(m)
	if k == "" {
		hd.noKey(ctx, m)
		return
	}
	p := hd.progress([]jetstream.Msg{m})
	settled := false
	defer func() {
		if !settled {
			p.stop()
			hd.settle(m, Nak, 0, errPanicked, m.Nak())
		}
	}()
	err := hd.wrapped(ctx, m)
	settled = true
	p.stop()
	hd.outcome(ctx, m, k, err)
}

// HandleBatch handles ms, as fetched together (Consumer.Fetch), with
// consumer.Batch: one claim and one confirm round trip for the whole batch
// on a Redis store, the handlers run up to Options.Concurrency at a time.
// A key repeated in ms is handled by consumer.Batch after its first
// message, so a duplicate within the batch is acked at once instead of
// being found in progress. InProgress is sent for every message not yet
// settled every ProgressInterval, from one timer. Each message is settled
// as Handle settles it, once the batch is done.
//
// If a handler panics, the rest of its round is settled in the store (see
// consumer.Batch), every message of ms is nakked at once, and the panic is
// re-raised.
func (hd *Handler) HandleBatch(ctx context.Context, ms []jetstream.Msg) {
	keys := make([]string, len(ms))
	left := make([]int, 0, len(ms))
	for i, m := range ms {
		if keys[i] = hd.key(m); keys[i] == "" {
			hd.noKey(ctx, m)
		} else {
			left = append(left, i)
		}
	}
	if len(left) == 0 {
		return
	}
	live := make([]jetstream.Msg, len(left))
	for j, i := range left {
		live[j] = ms[i]
	}
	p := hd.progress(live)
	var settled []bool
	defer func() {
		p.stop()
		if settled == nil { // finished
			return
		}
		for _, i := range left {
			if !settled[i] {
				hd.settle(ms[i], Nak, 0, errPanicked, ms[i].Nak())
			}
		}
	}()
	settled = make([]bool, len(ms))
	errs := hd.batch(ctx, live)
	for j, i := range left {
		settled[i] = true
		hd.outcome(ctx, ms[i], keys[i], errs[j])
	}
	settled = nil
}

var errPanicked = errors.New("idem/jetstream: handler panicked")

// noKey terminates m, which has no key.
func (hd *Handler) noKey(ctx context.Context, m jetstream.Msg) {
	// Checked here too, to say why: without a key the message cannot be
	// told from its duplicates, and acking it as one would drop it.
	hd.term(ctx, m, "", fmt.Errorf("%w: message without a %s header cannot be deduplicated", idem.ErrInvalidKey, hd.o.KeyHeader))
}

// outcome settles m, whose key is k, by the wrapped handler's error.
func (hd *Handler) outcome(ctx context.Context, m jetstream.Msg, k string, err error) {
	switch consumer.ActionFor(err) {
	case consumer.Ack:
		hd.settle(m, Ack, 0, nil, m.Ack())
	case consumer.AckAndAlert:
		hd.o.Logger.LogAttrs(ctx, slog.LevelError, "idem/jetstream: work done but not recorded; acked so it is not done again now",
			slog.String("key_hash", hd.o.KeyHasher.Hash(k)), slog.String("subject", m.Subject()), slog.Any("err", err))
		hd.settle(m, Ack, 0, err, m.Ack())
	case consumer.DeadLetter:
		hd.term(ctx, m, k, err)
	default: // consumer.Redeliver
		d := hd.delay(m)
		hd.settle(m, Nak, d, err, m.NakWithDelay(d))
	}
}

// delay is the redelivery delay of m: MinDelay doubled for each delivery
// of m before this one, up to MaxDelay.
func (hd *Handler) delay(m jetstream.Msg) time.Duration {
	n := uint64(1)
	if md, err := m.Metadata(); err == nil && md.NumDelivered > 0 {
		n = md.NumDelivered
	}
	return doubling(hd.o.MinDelay, hd.o.MaxDelay, int(min(n-1, 30)))
}

func (hd *Handler) term(ctx context.Context, m jetstream.Msg, k string, err error) {
	reason := "idem: cannot be deduplicated (no key)"
	switch {
	case errors.Is(err, idem.ErrFingerprintMismatch):
		reason = "idem: fingerprint mismatch"
	case errors.Is(err, idem.ErrTooLarge):
		reason = "idem: too large (a fingerprint or a result)"
	case errors.Is(err, idem.ErrDamaged):
		reason = "idem: damaged record"
	case errors.Is(err, idem.ErrQuarantined):
		reason = "idem: quarantined after repeated crashes; an operator must settle the key (idem resolve)"
	case k != "":
		reason = "idem: invalid key"
	}
	hd.o.Logger.LogAttrs(ctx, slog.LevelError, "idem/jetstream: message terminated: "+reason,
		slog.String("key_hash", hd.o.KeyHasher.Hash(k)), slog.String("subject", m.Subject()), slog.Any("err", err))
	hd.settle(m, Term, 0, err, m.TermWithReason(reason))
}

func (hd *Handler) settle(m jetstream.Msg, act Action, delay time.Duration, err, settleErr error) {
	if settleErr != nil {
		hd.o.Logger.Warn("idem/jetstream: settling a message failed; the broker redelivers it after AckWait",
			slog.String("action", act.String()), slog.Any("err", settleErr))
	}
	if hd.o.OnSettle != nil {
		hd.o.OnSettle(m, Settlement{Action: act, Delay: delay, Err: err, SettleErr: settleErr})
	}
}

// progresser sends InProgress for some messages every ProgressInterval,
// from a timer (no goroutine per message), until stopped.
type progresser struct {
	mu      sync.Mutex
	stopped bool
	t       *time.Timer
}

func (hd *Handler) progress(ms []jetstream.Msg) *progresser {
	p := &progresser{}
	every := hd.o.ProgressInterval
	p.mu.Lock()
	defer p.mu.Unlock()
	p.t = time.AfterFunc(every, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.stopped {
			return
		}
		for _, m := range ms {
			// A message settled meanwhile answers ErrMsgAlreadyAckd: harmless.
			if err := m.InProgress(); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
				hd.o.Logger.Warn("idem/jetstream: sending InProgress failed", slog.Any("err", err))
			}
		}
		p.t.Reset(every)
	})
	return p
}

// stop stops p; no InProgress is sent once it returns.
func (p *progresser) stop() {
	p.mu.Lock()
	p.stopped = true
	p.t.Stop()
	p.mu.Unlock()
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

// doubling is the n-th redelivery delay (n = 0, 1, ...): first doubled n
// times, capped at most (and at most when doubling overflows).
func doubling(first, most time.Duration, n int) time.Duration {
	d := first << min(n, 30)
	if d <= 0 || d > most {
		return most
	}
	return d
}
