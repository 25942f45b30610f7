# Test and check targets; the scripts in .ci/ do the work (see DESIGN.md section 8).

SHELL := bash
.SHELLFLAGS := -euo pipefail -c

# Where `make services-up` keeps the developer's long-running servers.
SERVICES_DIR ?= /tmp/idem-services
# First GOPATH entry: where `.ci/services.sh install-tools` puts staticcheck.
STATICCHECK = $(firstword $(subst :, ,$(shell go env GOPATH)))/bin/staticcheck

.PHONY: test check bench soak services-up services-down

# Starts throwaway Redis, Redis Cluster, Sentinel, Redis 8.0, Valkey 8.1 (built once per
# machine on first use), Postgres and RabbitMQ, runs go test -race
# (root module and nested modules), stops them.
test:
	bash .ci/test.sh

# Starts throwaway Redis, Redis Cluster and Postgres, runs `idem bench --out docs` against
# them (a few minutes: it rewrites docs/BENCHMARKS-results.md and docs/BENCHMARKS-throughput.svg),
# stops them. BENCH_FLAGS replaces the default arguments, e.g.
# make bench BENCH_FLAGS='--groups redis --rounds 3'.
bench:
	bash .ci/bench.sh $(BENCH_FLAGS)

# gofmt, vet and staticcheck; vet and staticcheck also in the nested modules
# (consumer/watermill, consumer/kafka, otel, grpc), which the root module's ./... does not include.
check:
	@unformatted=$$(gofmt -l .); \
	if [[ -n $$unformatted ]]; then \
		echo "gofmt -l: these files are not gofmt-ed:" >&2; echo "$$unformatted" >&2; exit 1; \
	fi
	go vet ./...
	bash .ci/services.sh install-tools
	$(STATICCHECK) ./...
	cd consumer/watermill && go vet ./... && $(STATICCHECK) ./...
	cd consumer/kafka && go vet ./... && $(STATICCHECK) ./...
	cd otel && go vet ./... && $(STATICCHECK) ./...
	cd grpc && go vet ./... && $(STATICCHECK) ./...

# For running tests by hand: start the servers once, paste the exports, then
# `go test ./...` as often as you like. Running it again restarts them.
services-up:
	bash .ci/services.sh install
	bash .ci/services.sh start $(SERVICES_DIR)
	@echo "# paste into your shell (or: source $(SERVICES_DIR)/env):"
	@cat $(SERVICES_DIR)/env

services-down:
	bash .ci/services.sh stop $(SERVICES_DIR)

# The long experiments (.ci/soak.sh: the 100k-message crash soak of internal/soak, then the
# Sentinel failover experiment of .ci/failover.sh, live resharding, the Redis Cluster
# failover experiment) against throwaway servers of their own. SOAK_STEPS="..." picks steps.
soak:
	bash .ci/soak.sh
