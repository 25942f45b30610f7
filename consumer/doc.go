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
// The wrapper's error tells the broker what to do:
//
//	claim outcome   wrapper                                        broker
//	Claimed         run the handler; Confirm on success,           ack on nil,
//	                Forget on error or panic (panic re-raised)     redeliver on error
//	Duplicate       skip the handler, return nil                   ack
//	InProgress      return idem.ErrInProgress                      redeliver later, with a delay
//	store error     return it; nothing was done                    redeliver
//
// Confirm is retried with backoff within the lease on a context detached from
// the caller's cancellation; if it never succeeds the wrapper returns
// [ErrNotRecorded], never success (see its documentation for what the broker
// should do then).
//
// # What "once" means
//
// The store records the work, not the work's effect. A consumer that crashes
// after the effect and before the confirmation leaves a claim that runs out
// after the lease (Options.LeaseTTL), and the redelivery does the work again:
// the effect happens twice exactly when a crash falls in that window. Keep
// the window short (confirm right after the effect), make the effect itself
// idempotent or fenced where it matters (the lease's Token, via [idem.LeaseFrom],
// guards a downstream write), or use the SQL store's transactional mode, in
// which the record and the effect commit together.
//
// # Batches
//
// [Batch] does the same for a whole delivery batch with two store round trips
// (one claim, one confirm) when the store is an [idem.Batcher], and runs the
// claimed messages with bounded concurrency.
//
// # Adapters
//
// Package consumer/amqp settles RabbitMQ deliveries (github.com/rabbitmq/amqp091-go)
// by these rules; the nested module consumer/watermill is a Watermill router
// middleware.
package consumer
