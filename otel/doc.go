// Package idemotel reports idem's operations to OpenTelemetry: metrics
// through a MeterProvider, spans through a TracerProvider.
//
// [New] returns an [Observer], which is an idem.Observer and an
// idem.Starter. Give the same one to the store (idem.Options.Observer), to
// the HTTP middleware (middleware.Options.Observer) and to the consumer
// wrapper (consumer.Options.Observer):
//
//	obs, err := idemotel.New(idemotel.Options{})
//	store, err := idem.NewRedisStore(client, idem.RedisOptions{Observer: obs})
//	mw, err := middleware.New(middleware.Options{Store: store, Scope: tenant, Observer: obs})
//	handle := consumer.Idempotent(store, key, h, consumer.Options[Order]{Observer: obs})
//
// # Metrics
//
// Instruments, with their names as a Prometheus exporter shows them:
//
//	idem.operations           counter    idem_operations_total
//	idem.operation.duration   histogram  idem_operation_duration_seconds (_bucket, _sum, _count)
//	idem.takeovers            counter    idem_takeovers_total
//	idem.late_confirms        counter    idem_late_confirms_total
//	idem.quarantines          counter    idem_quarantines_total
//	idem.cache.keys           counter    idem_cache_keys_total
//
// idem.operations counts every operation, with the attributes op (claim,
// renew, confirm, forget, lookup, claim_batch, confirm_batch, run, request,
// message, checkpoint, resolve), outcome (claimed, duplicate, in_progress;
// absent for operations without one) and error_class (lease_lost,
// not_found, invalid, conflict, canceled, damaged, store, quarantined;
// absent on success). A batch counts
// once. idem.operation.duration is each operation's duration in seconds,
// with the attribute op, in buckets from 100µs to 10s. idem.takeovers
// counts claims that replaced an expired claim (a worker that died or
// stalled), idem.late_confirms confirmations recorded after their lease was
// lost (the work may have been done twice), and idem.quarantines the
// operations refused because their key is quarantined after repeated
// crashes (idem.ErrQuarantined: a Claim, and the request or message that
// made it), which wait for an operator (idem resolve); all three have the
// attribute op.
// idem.cache.keys counts the keys of Claim, Lookup and ClaimBatch calls
// made through an idem.Cache (give the Cache the same Observer), with the
// attributes op and result: hit, answered from memory, or miss, passed on
// to the store; hits ÷ (hits + misses) is the cache's hit ratio. Each such
// operation is counted once in idem.operations too: a hit by the Cache's
// event, a miss by the store's.
//
// The module's monitoring/ directory holds Prometheus alerting rules for
// what an operator must act on (alerts.yml: a key quarantined, take-overs
// rising, the store failing, leases lost; tested with promtool by
// alerts_test.yml) and a Grafana dashboard of these metrics
// (grafana-dashboard.json); the module's tests check both against the
// names a real export has.
//
// The key hash is never a metric attribute: one series per key would grow
// without bound.
//
// # Spans
//
// A request through the middleware and a message through the consumer
// wrapper are a span each ("idem.request", "idem.message"), opened when
// the wrapper starts them and ended with their event; the handler runs
// inside it, so its own spans are children. The store operations a request
// or message makes are child spans ("idem.claim", "idem.confirm", ...),
// created when the operation ends with its start time set back by its
// duration. A store operation outside any request or message becomes a
// span only when its context already carries a recording span (the
// caller's own trace); otherwise it is counted in metrics only, so that a
// store used without tracing does not produce one root span per call.
//
// Span attributes: idem.op, idem.outcome, idem.key_hash (the keyed hash
// of idem.KeyHasher, never the key), idem.items for batches, idem.take_over
// and idem.late when set, idem.cache (hit or miss) on the operations of
// an idem.Cache, and error.type (the error class) on failure. A
// span's status is Error for the classes store and damaged, which need an
// operator; lease_lost, conflict and the like are answers, not faults.
package idemotel
