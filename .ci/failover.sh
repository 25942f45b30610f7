#!/usr/bin/env bash
# The failover durability experiment (internal/reliability/failover_soak_test.go):
# on a Sentinel set of its own, many goroutines claim and confirm distinct keys
# through redis.NewFailoverClient while the master is killed (SIGKILL) again and again;
# afterwards every key whose Confirm returned nil is looked up, and the
# confirmed-then-lost ones are counted. It takes minutes, so `make test` does
# not run it.
#
# usage: .ci/failover.sh [--kills N] [--wait-replicas N] [--down-after MS] [--workers N]
#   --kills N          master kills (default 20)
#   --wait-replicas N  RedisOptions.WaitReplicas (default 0: off)
#   --down-after MS    sentinel down-after-milliseconds (default 2000)
#   --workers N        concurrent claim+confirm loops (default 16)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
kills=20 wait=0 down=2000 workers=16
while (($#)); do
	case $1 in
	--kills) kills=$2 ;;
	--wait-replicas) wait=$2 ;;
	--down-after) down=$2 ;;
	--workers) workers=$2 ;;
	*)
		sed -n '/^# usage/,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
		exit 2
		;;
	esac
	shift 2
done
for v in "$kills" "$wait" "$down" "$workers"; do
	[[ $v =~ ^[0-9]+$ ]] || {
		echo "failover.sh: $v is not a number" >&2
		exit 2
	}
done

command -v redis-server >/dev/null || bash "$root/.ci/services.sh" install

tags=failover
cd "$root"
# go-redis logs each dial failure and master switch; the experiment's own lines
# say what happened.
IDEM_FAILOVER_KILLS=$kills IDEM_FAILOVER_WAIT_REPLICAS=$wait IDEM_FAILOVER_DOWN_AFTER_MS=$down \
	IDEM_FAILOVER_WORKERS=$workers \
	go test -tags "$tags" -run '^TestFailoverDurability$' -count=1 -v -timeout 60m ./internal/reliability/ 2>&1 |
	grep -v -E '^redis: .* (pool|sentinel)\.go:[0-9]+:'
