#!/usr/bin/env bash
# What `make bench` runs: install missing servers, start throwaway Redis, a 3-master
# Redis Cluster and Postgres (with the rest of .ci/services.sh's set) on loopback, run
# `idem bench` against them, and stop them on every exit path. Arguments are passed to
# `idem bench` (default: --out docs , which rewrites docs/BENCHMARKS-results.md and
# docs/BENCHMARKS-throughput.svg).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
svc="$root/.ci/services.sh"

bash "$svc" install

dir=$(mktemp -d "${TMPDIR:-/tmp}/idem-bench.XXXXXX")
# As in test.sh: the trap is set before `start`, and INT/TERM become a normal exit so
# that the EXIT trap runs exactly once.
trap 'bash "$svc" stop "$dir"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

bash "$svc" start "$dir"
# shellcheck source=/dev/null
source "$dir/env" # IDEM_REDIS_ADDR, IDEM_REDIS_CLUSTER_ADDRS, IDEM_POSTGRES_DSN: idem bench's defaults

cd "$root"
# Built first, so that compiling does not share the machine with the measurement.
go build -o "$dir/idem" ./cmd/idem
full=0
if (($# == 0)); then
	full=1
	set -- --out docs
fi
"$dir/idem" bench "$@"
# The local cache's workloads, side by side in one process (docs/BENCHMARKS.md,
# Local cache): the middleware replay, a consumer with 80% duplicates, Redis
# commands per cached duplicate. Part of the full run only.
if ((full)); then
	go test -run '^$' -bench CacheCompare -benchtime 1s -idem.cacherounds 5 .
fi
