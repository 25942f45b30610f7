// Package idem makes work that may be delivered twice happen once.
//
// A retried payment, a redelivered queue message, a replayed webhook: each
// arrives with a key, and the first delivery of that key to Claim it does the
// work. Every other delivery, on any process, finds the claim or the
// confirmation and does not do the work again.
//
// # The model
//
// A caller Claims a key under a lease, does the work, and Confirms it:
//
//	c, err := store.Claim(ctx, key, fingerprint)
//	switch c.Outcome {
//	case idem.Claimed:    // do the work, then store.Confirm(ctx, c.Lease, result)
//	                      // or, if it failed, store.Forget(ctx, c.Lease)
//	case idem.Duplicate:  // done before: answer with c.Record.Result
//	case idem.InProgress: // another caller is at it: retry later
//	}
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
// [github.com/idemgo/idem/sqlstore], keeps them in a table of Postgres or
// SQLite behind the same Store interface, and adds a transactional mode in
// which the record commits in the same transaction as the work: the record
// and the effect are one fact. The storetest package checks that a Store
// keeps the contract; [Core] is what a Store of your own can be built on.
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
// # What is not guaranteed
//
// Redis replicates asynchronously. A failover can lose a claim or a
// confirmation written just before it; the work of a lost confirmation will
// be done again by the next delivery. A Redis that evicts keys forgets work
// the same way, which is why [NewRedisStore] refuses any maxmemory-policy
// but noeviction unless told otherwise.
//
// A lease is a promise kept by time: a worker that stalls (a long GC pause,
// a frozen VM) past its lease without noticing can still be working when
// another takes the key over. KeepAlive cancels the work's context when it
// finds the lease gone; fencing tokens protect the writes that must not
// happen twice.
package idem
