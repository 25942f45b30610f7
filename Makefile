# Test and check targets; the scripts in .ci/ do the work (README.md, Getting started and
# Releasing, says what each target runs).

SHELL := bash
.SHELLFLAGS := -euo pipefail -c

# Where `make services-up` keeps the developer's long-running servers.
SERVICES_DIR ?= /tmp/idem-services
# First GOPATH entry: where `.ci/services.sh install-tools` puts staticcheck.
STATICCHECK = $(firstword $(subst :, ,$(shell go env GOPATH)))/bin/staticcheck

.PHONY: test check bench soak services-up services-down release-prep

# Starts throwaway Redis, Redis Cluster, Sentinel, Redis 8.0, Valkey 8.1, Valkey 9.1 and a
# Valkey 9.1 cluster (built once per machine on first use), Postgres, MariaDB and RabbitMQ,
# runs go test -race
# (root module and nested modules), stops them.
test:
	bash .ci/test.sh

# Starts throwaway Redis, Redis Cluster and Postgres, runs `idem bench --out docs` against
# them (a few minutes: it rewrites docs/BENCHMARKS-results.md and docs/BENCHMARKS-throughput.svg),
# stops them. BENCH_FLAGS replaces the default arguments, e.g.
# make bench BENCH_FLAGS='--groups redis --rounds 3'.
bench:
	bash .ci/bench.sh $(BENCH_FLAGS)

# gofmt, vet and staticcheck in every module (the nested ones, listed by
# .ci/modules.sh, are not part of the root module's ./...), then the
# publication check (.ci/publish-check.sh): every module published at one
# version into a local proxy, each fetched alone and built.
check:
	@unformatted=$$(gofmt -l .); \
	if [[ -n $$unformatted ]]; then \
		echo "gofmt -l: these files are not gofmt-ed:" >&2; echo "$$unformatted" >&2; exit 1; \
	fi
	bash .ci/services.sh install-tools
	for dir in $$(bash .ci/modules.sh | cut -d' ' -f1) .ci/modzip; do \
		(cd "$$dir" && go vet ./... && $(STATICCHECK) ./...); \
	done
	bash .ci/publish-check.sh
	@# A test rig (internal/testing/...) never ships: no package outside
	@# it may import one except from its tests.
	@bad=$$(go list -f '{{.ImportPath}}: {{join .Imports " "}}' ./... | grep -v '^[^:]*/internal/testing/' | grep 'internal/testing/' || true); \
	if [[ -n $$bad ]]; then echo "a shipped package imports a test rig:" >&2; echo "$$bad" >&2; exit 1; fi

# Pins every nested module's requirement of the root module (and of each
# other) to VERSION, so that all the modules are tagged on one commit; see
# README.md, Releasing. Example: make release-prep VERSION=v0.2.0
release-prep:
	bash .ci/release-prep.sh "$(VERSION)"

# For running tests by hand: start the servers once, paste the exports, then
# `go test ./...` as often as you like. Running it again restarts them.
services-up:
	bash .ci/services.sh install
	bash .ci/services.sh start $(SERVICES_DIR)
	@echo "# paste into your shell (or: source $(SERVICES_DIR)/env):"
	@cat $(SERVICES_DIR)/env

services-down:
	bash .ci/services.sh stop $(SERVICES_DIR)

# The long experiments (.ci/soak.sh: the 100k-message crash soak of internal/testing/soak, then the
# Sentinel failover experiment of .ci/failover.sh, live resharding, the Redis Cluster
# failover experiment) against throwaway servers of their own. SOAK_STEPS="..." picks steps.
soak:
	bash .ci/soak.sh
