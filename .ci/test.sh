#!/usr/bin/env bash
# What `make test` runs (README.md, Getting started): install missing servers (Redis 8.0,
# Valkey 8.1 and 9.1 are built from source once per machine, see services.sh), start
# throwaway Redis / Redis Cluster / Sentinel / Redis 8.0 / Valkey 8.1 / Valkey 9.1 / a
# Valkey 9.1 cluster / Postgres / MariaDB / RabbitMQ on loopback, run the whole test suite
# (and the nested modules') against them with the race detector, and stop them on every
# exit path. The store's conformance suite, its linearizability histories and the Redis
# fault tests run once per server (subtests redis7, redis8.0, valkey8.1, valkey9.1), and
# on each cluster (redis7, valkey9.1).
#
# It always starts its own servers, even when IDEM_* are already set: the suite then
# runs against known, empty servers, and a green run means they were exercised.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
svc="$root/.ci/services.sh"

bash "$svc" install

dir=$(mktemp -d "${TMPDIR:-/tmp}/idem-test.XXXXXX")
# The trap is set before `start`, so a start that fails halfway is cleaned up too.
# INT/TERM turn into a normal exit so that the EXIT trap runs exactly once.
trap 'bash "$svc" stop "$dir"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

bash "$svc" start "$dir"
# shellcheck source=/dev/null
source "$dir/env" # export lines: IDEM_REDIS_ADDR, IDEM_REDIS8_ADDR, IDEM_VALKEY_ADDR, IDEM_POSTGRES_DSN, IDEM_MYSQL_DSN, ...
env | grep '^IDEM_' | sort >&2

cd "$root"
status=0
# The conformance suite's checks run in parallel and mostly wait for leases
# to lapse (real servers' clocks cannot be moved): at the default -parallel
# (GOMAXPROCS, 2 here) the root package waited out its checks two at a
# time and ran past 10 minutes; 6 at a time it keeps to a few.
go test -race -count=1 -parallel 6 -timeout 25m ./... || status=$?
# Allocation counts hold only without the race detector: the tests that pin
# them (skipped or lenient under -race) run once more without it.
go test -count=1 -run 'ObserverAllocations|KeyHasher|RedisKeyName' . ./consumer ./middleware || status=$?
# The store hashes nothing on the client: its conformance suite on the real
# servers passes in a FIPS-only program, where SHA-1 panics.
GODEBUG=fips140=only go test -count=1 -parallel 6 -run 'TestRedisStoreConformance$|TestMemoryStoreConformance' . || status=$?
# Nested modules (kept apart for their heavy dependency trees; README.md,
# Releasing) are not part of ./...
for mod in $(bash "$root/.ci/modules.sh" | cut -d' ' -f1); do
	[[ $mod == . ]] && continue
	(cd "$root/$mod" && go test -race -count=1 ./...) || status=$?
done
exit "$status"
