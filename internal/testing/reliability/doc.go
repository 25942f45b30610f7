// Package reliability holds the reliability tests of the idem stores, run
// against the real services of internal/testing/testenv (and the embedded stores):
//
//   - faults_test.go, faults_ledger_test.go, faults_redis_test.go: the
//     fault-proxy tests (internal/faultproxy between the store and Redis or
//     Postgres: latency, lost replies, resets, blackholes, SCRIPT FLUSH, a
//     Redis kill -9) and the ledger that checks each run;
//   - linearizability_test.go: porcupine histories of every store, checked
//     by internal/lincheck (longer with -idem.histories N, -idem.ops N,
//     -idem.cut F, -idem.seed S);
//   - sqltx_crash_test.go: sqlstore.Store.Run whose connection or process dies
//     mid-transaction;
//   - crashpoints_test.go: a holder killed at each point of a two-step job
//     (before the effect, between effect and checkpoint, after the
//     checkpoint, between effect and confirm), through Do and the consumer
//     wrapper: what the next holder is told, and each step once;
//   - cluster_test.go, cluster_reshard_test.go: Redis Cluster in motion, on
//     3 + 3 clusters of the tests' own under the ledger workload: a master
//     failover; live resharding (redis-cli runs, slot moves held open until
//     a call met ASK, a new master rebalanced onto); porcupine histories on
//     slots moved while they run (-idem.long: the long form, which
//     make soak runs);
//   - failover_soak_test.go (build tag failover): the Sentinel failover
//     durability experiment, run by .ci/failover.sh;
//   - cluster_failover_soak_test.go (build tag failover): the same on a
//     Redis Cluster, killing each shard's master in turn, run by
//     .ci/failover.sh --cluster.
//
// The package has no non-test code. `make test` runs it with the rest; by
// hand, with the services' variables exported (make services-up):
//
//	CI=true go test -race -run 'TestFaults|TestLinearizable|TestRun|TestCluster' -v ./internal/testing/reliability/
//	go test -run 'Resharding' ./internal/testing/reliability/ -args -idem.long -idem.histories=1000
//	go test -run TestLinearizable -idem.histories 3000 ./internal/testing/reliability/
//	bash .ci/failover.sh --kills 20
//	bash .ci/failover.sh --cluster --kills 10
//
// See docs/RELIABILITY.md for what the runs showed.
package reliability
