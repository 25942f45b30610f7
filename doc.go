// Package idem makes work that may be delivered twice happen once.
//
// A retried payment, a redelivered queue message, a replayed webhook: each
// arrives with a key, and the first delivery of that key to Claim it does the
// work. Every other delivery, on any process, finds the claim or the
// confirmation and does not do the work again.
//
// # Do
//
// [Do] is the one call for the common case: run a function once per key,
// and hand every call of the key its result.
//
//	receipt, err := idem.Do(ctx, store, "charge:"+orderID, charge,
//		idem.DoOptions{Fingerprint: fingerprint})
//
// The first call claims the key, runs charge under [KeepAlive] with the
// lease in its context ([LeaseFrom] gives the fencing token), records its
// result and returns it. A duplicate gets the recorded result without
// running charge; a call that finds the key in flight waits for it
// ([DoOptions].Wait). charge's error forgets the key, so a retry runs it
// again, unless it is marked [Permanent]: then it is recorded and replayed.
// The calls below are what Do is made of, for what it does not cover.
//
// # The model
//
// A caller Claims a key under a lease, does the work, and Confirms it:
//
//	c, err := store.Claim(ctx, key, fingerprint)
//	if err != nil {
//		return err // ErrFingerprintMismatch: another request reuses the key
//	}
//	switch c.Outcome {
//	case idem.Claimed:    // do the work, then store.Confirm(ctx, c.Lease, result)
//	                      // or, if it failed, store.Forget(ctx, c.Lease)
//	case idem.Duplicate:  // done before: answer with c.Record.Result
//	case idem.InProgress: // another caller is at it: retry later
//	}
//
// The fingerprint (a hash of the request's content) makes the raw API safe:
// a Claim whose fingerprint differs from the record's returns an error
// wrapping [ErrFingerprintMismatch], with the Claim still describing the
// record, so a Duplicate's Result is only ever replayed to the request that
// produced it. Confirm tells its caller when another lease's confirmation
// was kept first ([ErrAlreadyConfirmed]): the work was done twice, and the
// first result is the one duplicates get.
//
// A lease binds for [Options.LeaseTTL] (default 30s) unless renewed;
// [KeepAlive] renews it while the work runs, so the lease can be short and a
// crashed worker's key is taken over soon. A confirmation is remembered for
// [Options.Retention] (default 24h): the window in which duplicates are
// expected. A duplicate arriving after it is handled again.
//
// Expiry is judged by the store's clock (Redis TTLs, the database's now()),
// never the caller's, so workers with skewed clocks cannot take over each
// other's live leases. [Lease.Expires] is only a local estimate.
//
// # Stores
//
// [RedisStore] keeps one Redis string per key and runs each operation as one
// Lua script: one round trip, atomic on a single Redis, on Sentinel and on
// Redis Cluster. [MemoryStore] keeps records in one process, for tests and
// local development. Both implement [Batcher], which claims or confirms many
// keys in one round trip. The SQL store, package
// [github.com/idemgo/idem/sqlstore], keeps them in a table of Postgres,
// MySQL 8 / MariaDB 10.11+ or SQLite behind the same Store interface, and
// adds a transactional mode in
// which the record commits in the same transaction as the work: the record
// and the effect are one fact. The storetest package checks that a Store
// keeps the contract; [Core] is what a Store of your own can be built on.
//
// # Local cache
//
// A duplicate costs a round trip to the store. [NewCache] wraps any Store
// in a [Cache] that keeps, in this process, the confirmed records the
// store answered, and answers a Claim or Lookup of such a key from memory:
// Duplicate, with no round trip (ClaimBatch too, for the keys it holds). A
// confirmed record never changes until its retention ends, so the answer
// is the store's: claims in flight always come from the store, a
// fingerprint mismatch is reported as the store reports it, and an entry
// ends [CacheOptions].ClockMargin before its record's retention end. A
// record deleted by hand is still answered for at most
// [CacheOptions].MaxAge (1s by default); memory is bounded in bytes. The
// Cache is a Store and a Batcher: hand it to the middleware, the consumer
// wrapper, Do or the gRPC and Connect interceptors in place of the store.
// None of them builds one by default: a record deleted by hand (an
// operator's way to have the work run again) would still be answered as
// done for up to MaxAge, which the store no longer says, and each process
// would hold up to MaxBytes it was not asked for. What it cannot change is
// safe either way: a quarantined key is never cached (only confirmed
// records are) and an entry ends before its record's retention. Where it
// helps (replays, redelivery storms) it serves ~5× the replays and ~3× the
// 80%-duplicate messages a second of the default RedisStore
// (docs/BENCHMARKS.md).
//
// # Automatic pipelining
//
// By default (unless [RedisOptions].NoAutoPipeline), the Claim, Confirm,
// Renew, Forget, Checkpoint and Lookup calls of concurrent goroutines go to
// Redis together: while a pipeline is in flight, the calls that arrive
// queue up and go in the next one (one pipeline per connection, at most two
// in flight; on a cluster one per master, as go-redis routes it). On a
// single Redis, concurrent Claims and Confirms are also merged into one
// script call each. A call on an idle store is sent at once, on its own
// context: there is no timer, so a lone caller pays no added latency. It is
// the default because it costs a lone caller nothing and serves 2–3× the
// calls of many (docs/BENCHMARKS.md); NoAutoPipeline only rules it out.
//
// Every call keeps its own reply and error: one failing key does not fail
// the others in its pipeline. A call that waits in the queue or shares a
// pipeline returns ctx.Err() as soon as its context ends; if it was already
// sent it may still run with its reply lost, as after a broken connection:
// a Confirm may have recorded, and a Claim's new lease, which nobody will
// use, is forgotten when its reply arrives (a take-over is left to lapse). Such a pipeline runs under the client's read and write
// timeouts, not any one caller's context.
//
// # Waiting for replicas
//
// With [RedisOptions].WaitReplicas, WAIT follows the confirm script down the
// same connection, in the same pipeline, so a Confirm is still one round
// trip (pipelined, one WAIT serves every confirm of a pipeline; on a
// cluster the confirm and its WAIT go to the master owning the key). When
// fewer replicas acknowledge within WaitTimeout, Confirm returns an error
// wrapping [ErrNotReplicated]; WaitTimeout must be shorter than the client's
// ReadTimeout, which bounds reading WAIT's reply.
//
// # Fencing tokens
//
// Each lease carries a Token strictly greater than the token of every
// earlier lease on the same key, including one that expired and was taken
// over, for as long as the store remembers the key. Pass it to a downstream
// write ("... WHERE fence < $token") so that a worker that stalled past its
// lease cannot overwrite its successor's work.
//
// RedisStore and the SQL store derive tokens from the server's clock in
// microseconds (the SQL store also takes the old token + 1 when that is
// greater).
// The guarantee ends where that clock or that memory does: a server clock
// stepped backwards by more than a lease; a failover to a replica whose clock
// is behind, or that never received the earlier claim; a record evicted or
// deleted by hand. A key forgotten and claimed again within one microsecond
// still gets a greater token: the forgotten claim leaves its token behind
// until its lease would have ended.
//
// # After a crash
//
// A worker can die between the effect and its Confirm. Once its lease runs
// out the next Claim takes the key over, and every store says so:
// [Claim].TakeOver, with the attempt taken over ([Attempt]: owner, token,
// when claimed), the take-overs in a row and the last checkpoint a holder
// recorded ([Checkpointer]). The front doors pass it to the work: [Do]
// asks [DoOptions].Reconcile whether the earlier attempt's effect landed
// before running fn again, and fn, a consumer's handler, an HTTP or RPC
// handler find it with [TakeOverFrom] and record progress with
// [Checkpoint]. A key that crashed its workers more than MaxTakeOvers
// times in a row is quarantined ([ErrQuarantined]) until an operator
// settles it ([Resolver], idem resolve) with the result in the form its
// front door replays ([Resolution].Result; the store marks it
// [Record].Resolved), or clears it ([Resolution].Force, a confirmed or
// damaged record too). An operator sees a lapsed attempt before anyone
// takes it over ([Inspector], idem inspect).
//
// # What is not guaranteed
//
// Redis replicates asynchronously. A failover can lose a claim or a
// confirmation written just before it; the work of a lost confirmation will
// be done again by the next delivery. A Redis that evicts keys forgets work
// the same way, which is why a [RedisStore] refuses, on first contact, any
// maxmemory-policy but noeviction unless told otherwise ([ErrEviction]).
//
// A lease is a promise kept by time: a worker that stalls (a long GC pause,
// a frozen VM) past its lease without noticing can still be working when
// another takes the key over. KeepAlive cancels the work's context when it
// finds the lease gone; fencing tokens protect the writes that must not
// happen twice.
package idem
