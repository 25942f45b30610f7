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
