#!/usr/bin/env bash
# The failover durability experiments: many goroutines claim and confirm distinct keys
# while the master is killed (SIGKILL) again and again; afterwards every key whose
# Confirm returned nil is looked up, and the confirmed-then-lost ones are counted. They
# take minutes, so `make test` does not run them.
#   Sentinel (internal/testing/reliability/failover_soak_test.go): a Sentinel set of its own,
#     through redis.NewFailoverClient.
#   --cluster (internal/testing/reliability/cluster_failover_soak_test.go): a 3+3 Redis Cluster
#     of its own, through redis.NewClusterClient, killing each shard's master in turn;
#     it also measures each kill's time from the promotion to the last failed call.
#
# usage: .ci/failover.sh [--cluster] [--kills N] [--wait-replicas N] [--down-after MS] [--workers N]
#   --cluster          the Redis Cluster experiment instead of the Sentinel one
#   --kills N          master kills (default 20; 10 with --cluster)
#   --wait-replicas N  RedisOptions.WaitReplicas (default 0: off)
#   --down-after MS    sentinel down-after-milliseconds (default 2000); not with
#                      --cluster, whose nodes are judged failing after 2 s
#                      (cluster-node-timeout, fixed by the test)
#   --workers N        concurrent claim+confirm loops (default 16)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
usage() {
	sed -n '/^# usage/,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
}
cluster=false kills='' wait=0 down='' workers=16
while (($#)); do
	case $1 in
	--cluster)
		cluster=true
		shift
		continue
		;;
	--kills) kills=$2 ;;
	--wait-replicas) wait=$2 ;;
	--down-after) down=$2 ;;
	--workers) workers=$2 ;;
	*) usage ;;
	esac
	shift 2
done
if $cluster && [[ -n $down ]]; then
	echo "failover.sh: --down-after does not apply to --cluster (its cluster-node-timeout is 2 s)" >&2
	exit 2
fi
if $cluster; then
	kills=${kills:-10} test=TestClusterFailoverDurability
else
	kills=${kills:-20} down=${down:-2000} test=TestFailoverDurability
fi
for v in "$kills" "$wait" ${down:+"$down"} "$workers"; do
	[[ $v =~ ^[0-9]+$ ]] || {
		echo "failover.sh: $v is not a number" >&2
		exit 2
	}
done

command -v redis-server >/dev/null && command -v redis-cli >/dev/null || bash "$root/.ci/services.sh" install
# The cluster's nodes are testenv.RedisServers, which skip (fail under CI=true) unless
# IDEM_REDIS_ADDR says the machine has Redis. The experiment uses no shared server, and
# the binaries are there now, so the script stands alone without `make services-up`.
if $cluster; then
	export IDEM_REDIS_ADDR=${IDEM_REDIS_ADDR:-none}
fi

tags=failover
cd "$root"
# go-redis logs each dial failure and master switch; the experiment's own lines
# say what happened.
IDEM_FAILOVER_KILLS=$kills IDEM_FAILOVER_WAIT_REPLICAS=$wait IDEM_FAILOVER_DOWN_AFTER_MS=${down:-} \
	IDEM_FAILOVER_WORKERS=$workers \
	go test -tags "$tags" -run "^$test\$" -count=1 -v -timeout 60m ./internal/testing/reliability/ 2>&1 |
	grep -v -E '^redis: .* (pool|sentinel)\.go:[0-9]+:'
