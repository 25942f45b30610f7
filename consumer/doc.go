// Package consumer makes a message handler behind an at-least-once broker do
// each message's work once, however often the message is delivered, across
// any number of consumer processes that share an [idem.Store].
//
// # The model
//
// [Idempotent] wraps a handler func(ctx, M) error. For each delivery it
// claims the message's key in the store, and only the delivery that gets the
// claim runs the handler, under a lease that [idem.KeepAlive] renews while it
// runs. Success confirms the key, so later deliveries are duplicates; failure
// (an error or a panic) forgets the claim, so the next delivery does the work.
//
// # What the broker does
//
// The wrapper's error says what the broker should do with the delivery.
// [ActionFor] maps it to one of four [Action]s, and every adapter below
// settles by it, in its broker's terms:
//
//	what happened                               wrapper returns          action
//	Claimed; the handler succeeded, confirmed   nil                      Ack
//	Duplicate: confirmed before; handler        nil                      Ack
//	  not run
//	Claimed; the handler succeeded, but no      ErrNotRecorded           AckAndAlert
//	  Confirm did within ConfirmBudget
//	Claimed; the handler failed or panicked     its error (a panic is    Redeliver
//	  (the claim is forgotten)                    re-raised)
//	InProgress: another delivery holds the key  idem.ErrInProgress       Redeliver, after a delay
//	the store failed: nothing was done          the store's error        Redeliver
//	an empty, invalid or oversized key; a       idem.ErrInvalidKey,      DeadLetter
//	  fingerprint mismatch; a damaged record      ErrTooLarge,
//	                                              ErrFingerprintMismatch,
//	                                              ErrDamaged
//	quarantined: the key's deliveries crashed   idem.ErrQuarantined      DeadLetter
//	  more than MaxTakeOvers times in a row
//
// Done but not recorded is acked, never redelivered: the work happened, and
// a redelivery would claim the key once the lease runs out and do it a
// second time; the ack risks that only if yet another duplicate arrives.
// Report it at error level (the adapters log it, the Hook hears
// ConfirmFailed, the Observer gets ErrNotRecorded).
//
// Confirm is retried with backoff within the lease on a context detached from
// the caller's cancellation; only if it never succeeds does the wrapper
// return [ErrNotRecorded], never success. A Confirm that finds another
// delivery's confirmation kept (idem.ErrAlreadyConfirmed: this lease ran out
// and another delivery did the work too) is success: the key is recorded as
// done, and the message is.
//
// # What "once" means
//
// The store records the work, not the work's effect. A consumer that crashes
// after the effect and before the confirmation leaves a claim that runs out
// after the lease (Options.LeaseTTL), and the redelivery does the work again:
// the effect happens twice exactly when a crash falls in that window,
// unless the redelivery's handler, told of the take-over
// ([idem.TakeOverFrom], see After a crash), asks the downstream system
// whether the effect landed first. Keep the window short (confirm right
// after the effect), make the effect itself idempotent or fenced where it
// matters (the lease's Token, via [idem.LeaseFrom], guards a downstream
// write), or use the SQL store's transactional mode, in which the record
// and the effect commit together.
//
// # After a crash
//
// When a delivery's claim takes the key over from an earlier delivery
// whose lease ran out unconfirmed (its consumer crashed, maybe after the
// effect), the handler's context carries the take-over: [idem.TakeOverFrom]
// gives the earlier attempt (owner, fencing token, when claimed), the
// take-overs in a row and the last checkpoint, so the handler can ask the
// downstream system whether the effect landed before doing it again, and
// resume after the last completed step. [idem.Checkpoint](ctx, data)
// records progress for the next holder, under the handler's lease. The
// Hook hears TakeOver, the Observer's event has TakeOver set.
//
// A message that crashes whoever handles it is stopped by the store: after
// MaxTakeOvers take-overs in a row its key is quarantined, the wrapper
// returns idem.ErrQuarantined without running the handler, and
// [ActionFor] says DeadLetter; the Hook hears Quarantined. An operator
// settles the key (idem resolve KEY --forget or --confirm RESULT), after
// which the dead letter can be replayed.
//
// # Options
//
// Both wrappers take at most one [Options], a flat literal typed by the
// message, so that a fingerprint func for another message type does not
// compile:
//
//	charge := consumer.Idempotent(store, orderKey, chargeOrder, consumer.Options[Order]{
//		Fingerprint: func(o Order) []byte { return orderHash(o) },
//		Hook:        alertOnLeaseTrouble,
//		Observer:    obs,
//	})
//
// A mistake in building a wrapper (a nil store, a typed nil included, a
// nil key func or handler, more than one Options, a negative field) panics
// at once, in the caller's goroutine, naming the argument or field; the
// adapters' constructors do the same. Found on the first message instead,
// it would surface far from where it was made.
//
// Options.ConfirmBudget defaults to two thirds of the lease's TTL: that is
// what a lease kept alive by [idem.KeepAlive] surely has left when the
// handler returns, and retrying past the lease would let another delivery
// claim the key and do the work again while this one still tries to record
// it.
//
// # Observing
//
// With Options.Observer, each message is one [idem.Event] with Op
// idem.OpMessage, reported once it is settled: Outcome is its claim's
// outcome (zero when the claim failed; for a fingerprint mismatch, the
// Duplicate or InProgress that Claim found), Took the whole message, handler
// included, and KeyHash the keyed hash of its key (Options.KeyHasher). Err
// is the idempotency layer's answer, not the handler's: nil when it did its
// part, even if the handler failed or panicked (the claim was then
// forgotten) or another delivery's confirmation was kept first (the work
// is recorded; the Hook hears of it as AlreadyConfirmed); an error
// matching idem.ErrInProgress or idem.ErrFingerprintMismatch (Class
// conflict); [ErrNotRecorded] joined with the store's error; the Claim's
// error; idem.ErrInvalidKey for an empty key.
//
// When the Observer is an [idem.Starter], it is started for each message
// before its claim, and its context is the one the handler, the message's
// own store calls and its event get, so that spans nest ([Batch]'s
// ClaimBatch and ConfirmBatch serve many messages and run on the batch's
// context). Give the store the same Observer to see its operations too.
// With no Observer nothing is measured and nothing is allocated for it.
//
// The [Hook] hears of the notable outcomes between success and failure
// (see [Kind]): a duplicate skipped, a lost lease, a late confirmation, work
// done twice because another delivery confirmed the key first.
//
// # Batches
//
// [Batch] does the same for a whole delivery batch with two store round trips
// (one claim, one confirm) when the store is an [idem.Batcher], and runs the
// claimed messages with bounded concurrency.
//
// # Redeliveries
//
// After a rebalance or a redelivery storm most messages are duplicates of
// keys already done. An idem.Cache around the store
// (idem.NewCache(store, idem.CacheOptions{}), given to Idempotent or Batch
// as the store) answers those from the process's memory without a store
// round trip; a message in flight elsewhere is always asked of the store.
// It is off unless wrapped: a record deleted by hand is still taken as done
// for up to the cache's MaxAge (1s by default), and safe by default comes
// before fast. With 80% duplicates it handles ~3× the messages a second on
// Redis (docs/BENCHMARKS.md).
//
// # Adapters
//
// Each adapter settles by [ActionFor]:
//
//	adapter                Ack / AckAndAlert   Redeliver                  DeadLetter
//	consumer/amqp          Ack                 Nack with requeue,         Reject without requeue
//	                                             after a growing delay
//	consumer/redisstream   XACK                left pending, reclaimed    XACK without the work
//	                                             with XAUTOCLAIM
//	consumer/jetstream     Ack                 NakWithDelay               TermWithReason
//	consumer/kafka         commit              retried in place           Options.DeadLetter, then
//	                                                                        commit; else skipped
//	consumer/watermill     nil (ack)           the error (nack)           the error: route it to a
//	                                                                        poison queue
//
// Every one logs AckAndAlert at error level, and DeadLetter too unless it
// hands the message to a dead-letter destination of yours (kafka's
// Options.DeadLetter). Package
// consumer/amqp is for RabbitMQ (github.com/rabbitmq/amqp091-go);
// consumer/redisstream reads a Redis Streams consumer group (XREADGROUP,
// XACK, XAUTOCLAIM); the nested modules consumer/jetstream (NATS
// JetStream messages; it sends InProgress while the handler runs),
// consumer/kafka (a franz-go consumer group) and consumer/watermill (a
// Watermill router middleware) keep their brokers' dependencies out of the
// root module.
package consumer
