#!/usr/bin/env bash
# What `make soak` runs: the long experiments that are too slow for `make test`, one
# after another against one set of throwaway servers (the same ones .ci/test.sh starts),
# stopped on every exit path.
#
# Each experiment is a step: a function step_NAME below, listed in `steps`. To add one,
# define its function and append its NAME. SOAK_STEPS="NAME ..." runs only those.
# Every step runs even when an earlier one failed; the script fails if any did.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
svc="$root/.ci/services.sh"

# The crash soak (internal/testing/soak): 100k messages through the consumer wrapper on Redis
# and through sqlstore.Store.Run on Postgres, with redeliveries, duplicates and SIGKILLed
# worker processes. Without the race detector: it is a test of crashes, at volume.
step_crash() {
	IDEM_SOAK=1 go test -count=1 -timeout 60m -v -run '^TestSoak(Redis|SQL)$' ./internal/testing/soak/
}

# The failover durability experiment (.ci/failover.sh): 20 master kills on a Sentinel set of
# its own, without and then with RedisOptions.WaitReplicas=1, counting confirmed-then-lost
# records.
step_failover() {
	bash "$root/.ci/failover.sh" --kills 20 && bash "$root/.ci/failover.sh" --kills 20 --wait-replicas 1
}

# The same on a 3+3 Redis Cluster of its own (.ci/failover.sh --cluster): 10 kills, each
# shard's master in turn, without and then with WaitReplicas=1, also timing each kill's
# promotion and the last failed call after it.
step_cluster_failover() {
	bash "$root/.ci/failover.sh" --cluster --kills 10 && bash "$root/.ci/failover.sh" --cluster --kills 10 --wait-replicas 1
}

# Live resharding under load, the long form of what `make test` runs
# (internal/testing/reliability/cluster_reshard_test.go), three times, each on 3+3 clusters of
# the tests' own: six redis-cli runs of 400 slots, 12 moves held open until a call met
# ASK and an even rebalance onto a new master under the ledger workload; 1,000 porcupine
# histories, each on a slot of its own moved while it runs.
step_reshard() {
	go test -race -count=3 -timeout 30m -v -run '^(TestClusterResharding|TestLinearizableClusterResharding)$' \
		./internal/testing/reliability/ -args -idem.long -idem.histories=1000
}
steps=(crash failover reshard cluster_failover)
if [[ -n ${SOAK_STEPS:-} ]]; then
	read -r -a steps <<<"$SOAK_STEPS"
fi
for s in "${steps[@]}"; do
	if [[ $(type -t "step_$s") != function ]]; then
		echo "soak: unknown step '$s' (known: $(compgen -A function step_ | sed 's/^step_//' | tr '\n' ' '))" >&2
		exit 2
	fi
done

bash "$svc" install

dir=$(mktemp -d "${TMPDIR:-/tmp}/idem-soak.XXXXXX")
# As in .ci/test.sh: the trap is set before `start`, and INT/TERM become a normal exit
# so that the EXIT trap runs exactly once.
trap 'bash "$svc" stop "$dir"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

bash "$svc" start "$dir"
# shellcheck source=/dev/null
source "$dir/env"
env | grep '^IDEM_' | sort >&2
export CI=true # a missing service fails a step, never skips it

cd "$root"
failed=()
for s in "${steps[@]}"; do
	echo "soak: step $s" >&2
	start=$SECONDS
	if "step_$s"; then
		echo "soak: step $s passed in $((SECONDS - start))s" >&2
	else
		echo "soak: step $s FAILED after $((SECONDS - start))s" >&2
		failed+=("$s")
	fi
done
if ((${#failed[@]} > 0)); then
	echo "soak: failed steps: ${failed[*]}" >&2
	exit 1
fi
echo "soak: all steps passed: ${steps[*]}" >&2
