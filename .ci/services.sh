#!/usr/bin/env bash
# Throwaway servers for idem's integration tests (README.md, Getting started).
#
#   services.sh install         install redis-server/redis-tools/postgresql/rabbitmq-server/
#                               mariadb-server if missing (root), then build-servers
#   services.sh build-servers   build Redis 8.0 and Valkey 8.1 from Debian 13's source
#                               packages, and Valkey 9.1 from Debian sid's, if they are
#                               not in the cache yet (see below)
#   services.sh install-tools   install staticcheck into $(go env GOPATH)/bin if missing
#   services.sh start DIR       start Redis, a 3-master Redis Cluster, a Sentinel set, Redis 8.0,
#                               Valkey 8.1, Valkey 9.1 and a 3-master Valkey 9.1 cluster,
#                               Postgres, MariaDB and RabbitMQ, data in DIR;
#                               writes DIR/env with the IDEM_* exports the tests read
#   services.sh stop DIR        stop what `start DIR` started and remove DIR
#
# Everything listens on 127.0.0.1 on non-default ports, so it never collides with a
# developer's own servers on 6379/5432, and below 32768, out of the kernel's range of
# ports for outgoing connections (32768-60999), where any client's connection (or the
# TIME-WAIT it leaves for 60 s) could hold a port a server must bind. A server that
# fails to start is named with its port and what holds that port (ss -tanp). Ports
# can be overridden:
#   IDEM_TEST_REDIS_PORT         standalone Redis                    (default 16379)
#   IDEM_TEST_CLUSTER_PORT       first of 3 consecutive cluster ports (default 17000;
#                                the cluster bus also uses port+10000)
#   IDEM_TEST_POSTGRES_PORT      Postgres                            (default 15432)
#   IDEM_TEST_SENTINEL_PORT      first of 5 consecutive ports of a Sentinel set: master,
#                                replica, 3 sentinels (default 16380)
#   IDEM_TEST_AMQP_PORT          first of 3 consecutive RabbitMQ ports: AMQP, Erlang
#                                distribution, and a private epmd (default 16672; not
#                                25672, a system RabbitMQ's distribution port, nor
#                                15672, its management plugin's)
#   IDEM_TEST_REDIS8_PORT        Redis 8.0                           (default 16390)
#   IDEM_TEST_VALKEY_PORT        Valkey 8.1                          (default 16391)
#   IDEM_TEST_MARIADB_PORT       MariaDB                             (default 13306)
#   IDEM_TEST_VALKEY9_PORT       Valkey 9.1                          (default 16392)
#   IDEM_TEST_VALKEY9_CLUSTER_PORT first of 3 consecutive ports of a Valkey 9.1 cluster
#                                (default 17100; its bus uses port+10000)
#   IDEM_TEST_PG_BIN             Postgres binaries (default /usr/lib/postgresql/15/bin,
#                                else the newest /usr/lib/postgresql/*/bin)
#
# Redis 8.0, Valkey 8.1 and 9.1: Debian 12 ships Redis 7.0 alone, so `build-servers`
# fetches the upstream tarballs of Debian 13 (trixie)'s source packages `redis` and
# `valkey`, and of Debian sid's `valkey` (9.1), through apt (a deb-src list of its own:
# the system's lists stay as they are), builds each server (about 2.5 min of CPU each;
# Valkey 9.1 about 90 s) and keeps the binaries in a cache shared by every checkout on
# the machine, so the build happens once per machine:
#   IDEM_SERVERS_CACHE           the cache (default /var/cache/idem-servers as root,
#                                else ${XDG_CACHE_HOME:-~/.cache}/idem-servers);
#                                delete a server's directory in it to rebuild that server
#   IDEM_TEST_DEBIAN_MIRROR      the Debian mirror (default: the machine's apt mirror,
#                                else http://deb.debian.org/debian)
#
# Safety: stop and the clean-up at the start of `start` only touch processes whose PIDs
# were recorded in that DIR *and* that still look like ours (right binary, working
# directory inside DIR), and only remove a DIR carrying our marker file. A port held by
# anything else makes `start` fail with a message naming the holder; nothing is killed.
set -euo pipefail

readonly STATICCHECK_VERSION=v0.8.2
readonly MARKER=.idem-services # marks a DIR created by `start`; `stop` removes only such DIRs

REDIS_PORT=${IDEM_TEST_REDIS_PORT:-16379}
CLUSTER_PORT=${IDEM_TEST_CLUSTER_PORT:-17000}
PG_PORT=${IDEM_TEST_POSTGRES_PORT:-15432}
SENTINEL_BASE=${IDEM_TEST_SENTINEL_PORT:-16380}
AMQP_PORT=${IDEM_TEST_AMQP_PORT:-16672}
REDIS8_PORT=${IDEM_TEST_REDIS8_PORT:-16390}
VALKEY_PORT=${IDEM_TEST_VALKEY_PORT:-16391}
MARIADB_PORT=${IDEM_TEST_MARIADB_PORT:-13306}
VALKEY9_PORT=${IDEM_TEST_VALKEY9_PORT:-16392}
VALKEY9_CLUSTER_PORT=${IDEM_TEST_VALKEY9_CLUSTER_PORT:-17100}

for _p in "$CLUSTER_PORT" "$VALKEY9_CLUSTER_PORT"; do
	if ! [[ $_p =~ ^[0-9]+$ ]] || ((_p < 1 || _p > 55533)); then
		echo "services: error: bad port '$_p' (need 1..55533: cluster bus ports are port+10000)" >&2
		exit 2
	fi
done
for _p in "$REDIS_PORT" "$PG_PORT" "$SENTINEL_BASE" "$REDIS8_PORT" "$VALKEY_PORT" "$MARIADB_PORT" "$VALKEY9_PORT"; do
	if ! [[ $_p =~ ^[0-9]+$ ]] || ((_p < 1 || _p > 65531)); then
		echo "services: error: bad port '$_p' (need 1..65531)" >&2
		exit 2
	fi
done
if ! [[ $AMQP_PORT =~ ^[0-9]+$ ]] || ((AMQP_PORT < 1 || AMQP_PORT > 65533)); then
	echo "services: error: bad port '$AMQP_PORT' (need 1..65533: RabbitMQ uses 3 consecutive ports)" >&2
	exit 2
fi
# RabbitMQ's Erlang VM needs a distribution port and an epmd (port mapper). A private
# epmd on its own port, rather than the shared one on 4369, is one we can stop without
# touching anybody else's Erlang nodes.
AMQP_DIST_PORT=$((AMQP_PORT + 1))
AMQP_EPMD_PORT=$((AMQP_PORT + 2))
readonly RABBITMQ_BIN=/usr/lib/rabbitmq/bin
# Debian's mariadb-server (10.11 on Debian 12): the server, and the script that
# creates a data directory.
readonly MARIADBD=/usr/sbin/mariadbd
CLUSTER_PORTS=("$CLUSTER_PORT" "$((CLUSTER_PORT + 1))" "$((CLUSTER_PORT + 2))")
VALKEY9_CLUSTER_PORTS=("$VALKEY9_CLUSTER_PORT" "$((VALKEY9_CLUSTER_PORT + 1))" "$((VALKEY9_CLUSTER_PORT + 2))")
SENTINEL_MASTER_PORT=$SENTINEL_BASE
SENTINEL_REPLICA_PORT=$((SENTINEL_BASE + 1))
SENTINEL_PORTS=("$((SENTINEL_BASE + 2))" "$((SENTINEL_BASE + 3))" "$((SENTINEL_BASE + 4))")

log() { printf 'services: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

# Postgres binaries: 15 is what Debian 12 ships; fall back to whatever major is installed.
pg_bin() {
	if [[ -n ${IDEM_TEST_PG_BIN:-} ]]; then
		printf '%s\n' "$IDEM_TEST_PG_BIN"
	elif [[ -x /usr/lib/postgresql/15/bin/initdb ]]; then
		printf '%s\n' /usr/lib/postgresql/15/bin
	else
		local d
		d=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin 2>/dev/null | sort -V | tail -n 1)
		printf '%s\n' "${d:-/usr/lib/postgresql/15/bin}"
	fi
}

# Postgres refuses to run as root, so as root its commands run as the postgres user.
as_pg() {
	if ((EUID == 0)); then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

# ---------------------------------------------------------------------------- install

cmd_install() {
	local pkgs=()
	command -v redis-server >/dev/null || pkgs+=(redis-server)
	command -v redis-cli >/dev/null || pkgs+=(redis-tools)
	[[ -x "$(pg_bin)/initdb" ]] || pkgs+=(postgresql)
	[[ -x $RABBITMQ_BIN/rabbitmq-server ]] || pkgs+=(rabbitmq-server)
	[[ -x $MARIADBD ]] && command -v mariadb-install-db >/dev/null && command -v mariadb-admin >/dev/null ||
		pkgs+=(mariadb-server mariadb-client)
	# promtool tests otel/monitoring's alert rules; Chromium runs the
	# console's browser test (cmd/idem/consoletest).
	command -v promtool >/dev/null || pkgs+=(prometheus)
	command -v chromium >/dev/null || pkgs+=(chromium)
	if ((${#pkgs[@]} > 0)); then
		apt_install "${pkgs[@]}"
		# The Debian packages enable system servers on 6379/5432; we never use those.
		[[ -x "$(pg_bin)/initdb" ]] || die "postgresql installed but no initdb found; set IDEM_TEST_PG_BIN"
	fi
	cmd_build_servers # the common case: a quiet no-op
}

# apt_install PKG...: install Debian packages (root).
apt_install() {
	((EUID == 0)) || die "missing $*; run '$0 install' as root or install them yourself"
	log "installing $*"
	export DEBIAN_FRONTEND=noninteractive
	# Only reached when something is missing; the package lists may be absent or stale
	# (a fresh image has none), so refresh them before installing.
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

cmd_install_tools() {
	command -v go >/dev/null || die "go is not on PATH"
	local gopath bin
	gopath=$(go env GOPATH)
	bin="${gopath%%:*}/bin/staticcheck" # the Makefile runs exactly this path
	# Reinstall when the version differs or it was built by another Go: staticcheck
	# cannot load packages written for a newer Go than the one it was built with.
	if [[ -x $bin ]] &&
		[[ $("$bin" -version 2>/dev/null) == *"(${STATICCHECK_VERSION#v})"* ]] &&
		[[ $(go version "$bin" 2>/dev/null) == *": $(go env GOVERSION)" ]]; then
		return 0
	fi
	log "installing staticcheck $STATICCHECK_VERSION into ${bin%/*}"
	GOBIN="${bin%/*}" go install "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION"
}

# ---------------------------------------------------------------------------- build-servers

# The servers built from Debian's source packages, by name in the cache: the binary,
# the version (major.minor) the build must report, the source package and the suite it
# comes from. trixie is Debian's stable release: its point releases move the patch level
# only. sid (unstable) moves faster; the version check says when it moved past 9.1.
readonly BUILT=(redis valkey valkey9)
declare -rA BUILT_BIN=([redis]=redis-server [valkey]=valkey-server [valkey9]=valkey-server)
declare -rA BUILT_WANT=([redis]=8.0 [valkey]=8.1 [valkey9]=9.1)
declare -rA BUILT_SRC=([redis]=redis [valkey]=valkey [valkey9]=valkey)
declare -rA BUILT_SUITE=([redis]=trixie [valkey]=trixie [valkey9]=sid)

servers_cache() {
	if [[ -n ${IDEM_SERVERS_CACHE:-} ]]; then
		printf '%s\n' "$IDEM_SERVERS_CACHE"
	elif ((EUID == 0)); then
		printf '%s\n' /var/cache/idem-servers
	else
		printf '%s\n' "${XDG_CACHE_HOME:-$HOME/.cache}/idem-servers"
	fi
}

# built_bin PKG: where the cache keeps PKG's server (built or not).
built_bin() { printf '%s/%s/%s\n' "$(servers_cache)" "$1" "${BUILT_BIN[$1]}"; }

# server_version BIN: 8.0.2 of "Redis server v=8.0.2 sha=..." (Valkey's alike).
server_version() {
	local out
	out=$("$1" --version 2>/dev/null) || return 1
	[[ $out =~ v=([0-9]+[.][0-9]+[.][0-9]+) ]] || return 1
	printf '%s\n' "${BASH_REMATCH[1]}"
}

# The machine's Debian mirror (the first main-archive URI of its apt sources, one-line
# or deb822), so that trixie comes from where bookworm does.
debian_mirror() {
	if [[ -n ${IDEM_TEST_DEBIAN_MIRROR:-} ]]; then
		printf '%s\n' "${IDEM_TEST_DEBIAN_MIRROR%/}"
		return
	fi
	local uri
	uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
		grep -v '^[[:space:]]*#' | grep -oE '(https?|file)://[^ ]*/debian/?([[:space:]]|$)' |
		sed -n '1{s/[[:space:]]*$//;s:/$::;p}' || true)
	printf '%s\n' "${uri:-http://deb.debian.org/debian}"
}

# What the build needs: apt for the sources, Debian's archive key (trixie is signed by
# the same keyring as bookworm), a C and C++ compiler (Redis 8 has C++ in its deps),
# and OpenSSL's headers (the servers are built with TLS).
readonly DEBIAN_KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
build_deps() {
	command -v apt-get >/dev/null || die "building Redis 8.0 and Valkey 8.1 and 9.1 needs apt (Debian)"
	local pkgs=()
	command -v dpkg-source >/dev/null || pkgs+=(dpkg-dev)
	[[ -f $DEBIAN_KEYRING ]] || pkgs+=(debian-archive-keyring)
	command -v make >/dev/null && command -v cc >/dev/null && command -v c++ >/dev/null ||
		pkgs+=(make gcc g++ libc6-dev)
	command -v pkg-config >/dev/null || pkgs+=(pkg-config)
	command -v xz >/dev/null || pkgs+=(xz-utils)
	[[ -f /usr/include/openssl/ssl.h ]] || pkgs+=(libssl-dev)
	((${#pkgs[@]} == 0)) || apt_install "${pkgs[@]}"
}

# fetch_sources WORK NAME...: downloads the upstream tarball of each NAME's source
# package, from its suite, into WORK/src/NAME (valkey and valkey9 are one source package
# from two suites). A deb-src list of our own, with lists and caches under WORK, leaves
# the system's apt state (bookworm) untouched.
fetch_sources() {
	local work=$1 mirror name suite suites=()
	shift
	mirror=$(debian_mirror)
	mkdir -p "$work/lists/partial" "$work/cache"
	for name in "$@"; do
		[[ " ${suites[*]-} " == *" ${BUILT_SUITE[$name]} "* ]] || suites+=("${BUILT_SUITE[$name]}")
	done
	for suite in "${suites[@]}"; do
		echo "deb-src [signed-by=$DEBIAN_KEYRING] $mirror $suite main"
	done >"$work/sources.list"
	local apt=(apt-get -q -o Dir::Etc::sourcelist="$work/sources.list" -o Dir::Etc::sourceparts=-
		-o Dir::State::Lists="$work/lists" -o Dir::Cache="$work/cache" -o APT::Get::List-Cleanup=0)
	timeout --foreground 300 "${apt[@]}" update >"$work/apt.log" 2>&1 ||
		fail_with_logs "apt-get update of ${suites[*]}'s sources from $mirror failed" "$work/apt.log"
	# The .dsc and Debian patches of the newest security revision can be missing from a
	# mirror (404) while the upstream tarball, all the build needs, is there: apt's exit
	# status says nothing about it, the tarball's presence does. apt checks each file it
	# keeps against the hashes of the signed Sources index.
	for name in "$@"; do
		mkdir -p "$work/src/$name"
		(cd "$work/src/$name" && timeout --foreground 600 "${apt[@]}" source --download-only \
			"${BUILT_SRC[$name]}/${BUILT_SUITE[$name]}") >>"$work/apt.log" 2>&1 || true
	done
}

# build_server WORK NAME: builds NAME's server from its tarball in WORK/src/NAME with the
# flags of Debian's package (libc malloc, no systemd) and TLS, checks its version, and
# moves it into the cache.
build_server() {
	local work=$1 pkg=$2 t0=$SECONDS tarball bin version dest
	tarball=$(compgen -G "$work/src/$pkg/${BUILT_SRC[$pkg]}_*.orig.tar.*" | head -n 1 || true)
	[[ -n $tarball ]] || fail_with_logs "apt downloaded no upstream tarball of ${BUILT_SUITE[$pkg]}'s source package ${BUILT_SRC[$pkg]}" "$work/apt.log"
	mkdir -p "$work/$pkg"
	tar -xf "$tarball" -C "$work/$pkg" --strip-components=1
	log "building ${BUILT_BIN[$pkg]} from ${tarball##*/} (a few minutes, once per machine)"
	make -C "$work/$pkg" -j"$(nproc)" BUILD_TLS=yes MALLOC=libc USE_SYSTEMD=no >"$work/$pkg.log" 2>&1 ||
		fail_with_logs "building $pkg failed" "$work/$pkg.log"
	bin="$work/$pkg/src/${BUILT_BIN[$pkg]}"
	version=$(server_version "$bin") || fail_with_logs "'$bin --version' says no version" "$work/$pkg.log"
	[[ $version == "${BUILT_WANT[$pkg]}".* ]] ||
		die "${BUILT_SUITE[$pkg]}'s ${BUILT_SRC[$pkg]} built version $version; want ${BUILT_WANT[$pkg]}.x (the versions the tests expect)"
	dest=$(servers_cache)/$pkg
	rm -rf "$dest.new" "$dest"
	mkdir -p "$dest.new"
	cp "$bin" "$dest.new/"
	printf '%s, built from %s with BUILD_TLS=yes MALLOC=libc USE_SYSTEMD=no in %ss\n' \
		"$version" "${tarball##*/}" "$((SECONDS - t0))" >"$dest.new/BUILD"
	mv "$dest.new" "$dest" # the binary appears whole or not at all
	log "built ${BUILT_BIN[$pkg]} $version in $((SECONDS - t0))s: $dest"
}

cmd_build_servers() {
	local pkg missing=() cache work
	for pkg in "${BUILT[@]}"; do
		[[ -x $(built_bin "$pkg") ]] || missing+=("$pkg")
	done
	((${#missing[@]} > 0)) || return 0 # the common case: built on an earlier run

	cache=$(servers_cache)
	mkdir -p "$cache"
	# One build per machine at a time: a second run waits, then finds the servers built.
	exec 9>"$cache/.lock"
	flock 9
	missing=()
	for pkg in "${BUILT[@]}"; do
		[[ -x $(built_bin "$pkg") ]] || missing+=("$pkg")
	done
	((${#missing[@]} > 0)) || return 0

	build_deps
	work=$(mktemp -d "$cache/.build.XXXXXX")
	# The apt downloads run as the _apt user where they can: let it write there.
	chmod 755 "$work"
	trap 'rm -rf "$work"' EXIT
	fetch_sources "$work" "${missing[@]}"
	for pkg in "${missing[@]}"; do
		build_server "$work" "$pkg"
	done
	rm -rf "$work"
	trap - EXIT
	exec 9>&-
}

# ---------------------------------------------------------------------------- helpers
# Commands that could hang are bounded with `timeout --foreground`: plain `timeout`
# moves the command into its own process group, where a Ctrl-C never reaches it.

# is_alive PID: the process exists and is not a zombie. After `start` exits, our Redis
# servers are re-parented to PID 1; once killed they can stay zombies until PID 1
# reaps them, and `kill -0` succeeds on zombies, so look at the state instead.
is_alive() {
	local stat
	stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
	stat=${stat##*) } # the comm field may contain spaces and parens
	[[ ${stat:0:1} != [ZX] ]]
}

# is_ours PID COMM DIR: guards against PID reuse — the process has that name and
# runs inside DIR (redis-server chdirs to --dir, postgres to its data directory).
is_ours() {
	[[ $(cat "/proc/$1/comm" 2>/dev/null) == "$2" ]] &&
		[[ $(readlink "/proc/$1/cwd" 2>/dev/null) == "$3" ]]
}

# wait_gone PID SECONDS
wait_gone() {
	local deadline=$((SECONDS + $2))
	while is_alive "$1"; do
		((SECONDS < deadline)) || return 1
		sleep 0.05
	done
}

port_in_use() {
	if command -v ss >/dev/null; then
		[[ -n $(ss -Hltn "sport = :$1") ]]
	else # minimal images without iproute2: a connect attempt on loopback
		(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
	fi
}

# Fail, naming the holder of each busy port. Never kill it: it may be anybody's.
check_ports_free() {
	local p busy=0 line pid cwd leftovers=() what lo=32768 hi=60999
	read -r lo hi </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || true
	for p in "$REDIS_PORT" "${CLUSTER_PORTS[@]}" "$((CLUSTER_PORT + 10000))" \
		"$((CLUSTER_PORT + 10001))" "$((CLUSTER_PORT + 10002))" "$PG_PORT" \
		"$SENTINEL_MASTER_PORT" "$SENTINEL_REPLICA_PORT" "${SENTINEL_PORTS[@]}" \
		"$AMQP_PORT" "$AMQP_DIST_PORT" "$AMQP_EPMD_PORT" "$REDIS8_PORT" "$VALKEY_PORT" "$MARIADB_PORT" \
		"$VALKEY9_PORT" "${VALKEY9_CLUSTER_PORTS[@]}" "$((VALKEY9_CLUSTER_PORT + 10000))" \
		"$((VALKEY9_CLUSTER_PORT + 10001))" "$((VALKEY9_CLUSTER_PORT + 10002))"; do
		((p < lo || p > hi)) ||
			log "warning: port $p is in the kernel's range for outgoing connections ($lo-$hi): a client's connection, or its TIME-WAIT, may hold it when its server starts"
		port_in_use "$p" || continue
		busy=1
		what=
		((p < CLUSTER_PORT + 10000 || p > CLUSTER_PORT + 10002)) ||
			what=" (cluster bus port of $((p - 10000)), set IDEM_TEST_CLUSTER_PORT to move it)"
		((p < VALKEY9_CLUSTER_PORT + 10000 || p > VALKEY9_CLUSTER_PORT + 10002)) ||
			what=" (cluster bus port of $((p - 10000)), set IDEM_TEST_VALKEY9_CLUSTER_PORT to move it)"
		line=$(ss -Hltnp "sport = :$p" 2>/dev/null | head -n 1 || true)
		log "port $p$what is already in use: ${line:-(no details)}"
		if [[ $line =~ pid=([0-9]+) ]]; then
			pid=${BASH_REMATCH[1]}
			cwd=$(readlink "/proc/$pid/cwd" 2>/dev/null || true)
			# Our servers run in DIR/redis-PORT, DIR/pg/data, DIR/mariadb/data or DIR/rabbitmq:
			# point at DIR.
			if [[ $cwd =~ ^(.*)/(redis-[0-9]+|pg/data|mariadb/data|rabbitmq)$ && -f ${BASH_REMATCH[1]}/$MARKER ]]; then
				[[ " ${leftovers[*]-} " == *" ${BASH_REMATCH[1]} "* ]] || leftovers+=("${BASH_REMATCH[1]}")
			fi
		fi
	done
	for p in ${leftovers[@]+"${leftovers[@]}"}; do
		log "these look like leftovers of '$0 start $p'; to remove them: $0 stop $p"
	done
	((busy == 0)) || die "ports busy (override with IDEM_TEST_*_PORT); nothing was started or killed"
}

# port_holders PORT: each socket on local port PORT now (ss -tanp: listening,
# connected or TIME-WAIT, with its process when ss can tell), or a line saying none is.
port_holders() {
	local lines
	lines=$(ss -Htanp "sport = :$1" 2>/dev/null | head -n 5 || true)
	if [[ -n $lines ]]; then
		printf '%s\n' "$lines"
	else
		echo "no socket on port $1 now"
	fi
}

# fail_service NAME "PORT..." MESSAGE LOGFILE...: the server NAME on PORT... did not
# start: say so, name what holds each of its ports (a bind that failed names no port
# in some servers' logs), then fail_with_logs.
fail_service() {
	local name=$1 ports=$2 msg=$3 p
	shift 3
	log "error: $name on port ${ports// /, } $msg"
	for p in $ports; do
		log "port $p is held by:"
		port_holders "$p" | sed 's/^/    /' >&2
	done
	show_logs "$@"
	exit 1
}

# fail_with_logs MESSAGE LOGFILE...: report, then show the tail of each log.
fail_with_logs() {
	log "error: $1"
	shift
	show_logs "$@"
	exit 1
}

# show_logs LOGFILE...: the last lines of each log that is not empty.
show_logs() {
	local f
	for f in "$@"; do
		[[ -s $f ]] || continue
		log "---- last lines of $f"
		tail -n 20 "$f" >&2
	done
}

abs_dir() {
	[[ -n ${1:-} ]] || die "usage: $0 {start|stop} DIR"
	[[ $1 != *[[:space:]]* ]] || die "DIR must not contain whitespace: '$1'" # pg_ctl -o splits on it
	# Physical path: the ownership check compares it with /proc/PID/cwd, which has
	# symlinks resolved.
	local d=${1%/} parent
	[[ -n $d ]] || die "refusing DIR '/'"
	if [[ -d $d ]]; then
		(cd "$d" && pwd -P)
	elif parent=$(cd "$(dirname "$d")" 2>/dev/null && pwd -P); then
		printf '%s/%s\n' "${parent%/}" "$(basename "$d")"
	else
		case $d in
		/*) printf '%s\n' "$d" ;;
		*) printf '%s/%s\n' "$PWD" "$d" ;;
		esac
	fi
}

# ---------------------------------------------------------------------------- start

start_redis() { # PORT [extra redis-server args...]
	start_server redis-server "$@"
}

start_server() { # BIN PORT [extra server args...]: redis-server, or one that takes its arguments
	local bin=$1 port=$2 d="$DIR/redis-$2"
	shift 2
	mkdir -p "$d"
	# A plain background job (not --daemonize): $! is the server's PID, and its stdio
	# points at a file so it never holds the caller's pipes open (`start | tee` returns).
	"$bin" --port "$port" --bind 127.0.0.1 --daemonize no \
		--save '' --appendonly no --dir "$d" --logfile "$d/log" "$@" \
		</dev/null >>"$d/stdout" 2>&1 &
	echo $! >"$DIR/redis-$port.pid"
}

# server_name PORT: which of the Redis-protocol servers listens on PORT, for errors.
server_name() {
	case " $1 " in
	" $REDIS_PORT ") echo "Redis 7.0" ;;
	" $REDIS8_PORT ") echo "Redis 8.0" ;;
	" $VALKEY_PORT ") echo "Valkey 8.1" ;;
	" $VALKEY9_PORT ") echo "Valkey 9.1" ;;
	" $SENTINEL_MASTER_PORT " | " $SENTINEL_REPLICA_PORT ") echo "Redis 7.0 of the Sentinel set" ;;
	*)
		if [[ " ${CLUSTER_PORTS[*]} " == *" $1 "* ]]; then
			echo "Redis Cluster node"
		elif [[ " ${VALKEY9_CLUSTER_PORTS[*]} " == *" $1 "* ]]; then
			echo "Valkey 9.1 cluster node"
		else
			echo "Redis sentinel"
		fi
		;;
	esac
}

# server_ports PORT: the ports the server on PORT binds: a cluster node's bus too.
server_ports() {
	if [[ " ${CLUSTER_PORTS[*]} ${VALKEY9_CLUSTER_PORTS[*]} " == *" $1 "* ]]; then
		echo "$1 $(($1 + 10000))"
	else
		echo "$1"
	fi
}

wait_redis() { # PORT
	local port=$1 pid deadline=$((SECONDS + 10))
	pid=$(<"$DIR/redis-$port.pid")
	until [[ $(timeout --foreground 5 redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null) == PONG ]]; do
		is_alive "$pid" || fail_service "$(server_name "$port")" "$(server_ports "$port")" "exited" \
			"$DIR/redis-$port/log" "$DIR/redis-$port/stdout"
		((SECONDS < deadline)) || fail_service "$(server_name "$port")" "$(server_ports "$port")" "not ready after 10s" \
			"$DIR/redis-$port/log"
		sleep 0.05
	done
}

# start_sentinel PORT: a sentinel watching the Sentinel set's master as "mymaster".
# Sentinels rewrite their config file, so each gets its own. A master is judged down
# only after 10 s: on a loaded 2-core machine a busy master can miss 1 s of pings,
# and a spurious failover in the middle of a test loses its writes. A test that
# wants a failover asks for one (SENTINEL FAILOVER) or kills the master.
start_sentinel() {
	local port=$1 d="$DIR/redis-$1"
	mkdir -p "$d"
	cat >"$d/sentinel.conf" <<EOF
port $port
bind 127.0.0.1
dir $d
logfile $d/log
sentinel monitor mymaster 127.0.0.1 $SENTINEL_MASTER_PORT 2
sentinel down-after-milliseconds mymaster 10000
sentinel failover-timeout mymaster 5000
EOF
	redis-server "$d/sentinel.conf" --sentinel </dev/null >>"$d/stdout" 2>&1 &
	echo $! >"$DIR/redis-$port.pid"
}

# A failover started before the replica has synced never promotes it: wait for the link.
replica_synced() {
	local info
	info=$(timeout --foreground 5 redis-cli -h 127.0.0.1 -p "$SENTINEL_REPLICA_PORT" info replication 2>/dev/null) || return 1
	[[ $info == *master_link_status:up* ]]
}

cluster_ok() { # PORT... (default: the Redis Cluster's)
	local p info ports=("$@")
	((${#ports[@]} > 0)) || ports=("${CLUSTER_PORTS[@]}")
	for p in "${ports[@]}"; do
		# Captured rather than piped into grep -q: with pipefail an early grep exit
		# can turn into a SIGPIPE failure of redis-cli.
		info=$(timeout --foreground 5 redis-cli -h 127.0.0.1 -p "$p" cluster info 2>/dev/null) || return 1
		[[ $info == *cluster_state:ok* ]] || return 1
	done
}

# Runs in the background, output to DIR/pg/setup.log, so initdb (~1 s) overlaps the
# ~2 s Redis Cluster needs to converge.
start_postgres() {
	local b="$DIR/pg" bin
	bin=$(pg_bin)
	[[ -x $bin/initdb ]] || die "no Postgres at $bin (run '$0 install' or set IDEM_TEST_PG_BIN)"
	mkdir -p "$b"
	if ((EUID == 0)); then
		chown postgres:postgres "$b"
		as_pg test -w "$b" || die "user postgres cannot write $b (is a parent directory private?)"
	fi
	as_pg timeout --foreground 60 "$bin/initdb" -D "$b/data" -U postgres -A trust -E UTF8 \
		--locale=C.UTF-8 --no-sync >/dev/null
	# Durability is pointless for throwaway data: fsync/full_page_writes/sync commit off.
	as_pg "$bin/pg_ctl" -D "$b/data" -l "$b/log" -w -t 30 start -o \
		"-p $PG_PORT -k $b -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
	head -n 1 "$b/data/postmaster.pid" >"$DIR/postgres.pid"
	"$bin/psql" "postgres://postgres@127.0.0.1:$PG_PORT/postgres?sslmode=disable" \
		-v ON_ERROR_STOP=1 -qc 'CREATE DATABASE idem'
}

# MariaDB, like Postgres, runs in the background (mariadb-install-db takes ~2.5 s), as the
# mysql user when we are root (it refuses root without --user), with its data directory,
# socket, PID file and logs in DIR/mariadb and a TCP port on loopback only. Durability is
# off (no flush at commit, no doublewrite, no binary log): the data is thrown away. The
# root user has no password and is reached over TCP from 127.0.0.1.
start_mariadb() {
	local d="$DIR/mariadb" as=() user=() deadline
	[[ -x $MARIADBD ]] || die "no MariaDB at $MARIADBD (run '$0 install')"
	mkdir -p "$d"
	if ((EUID == 0)); then
		chown mysql:mysql "$d"
		as=(runuser -u mysql --)
		user=(--user=mysql)
		"${as[@]}" test -w "$d" || die "user mysql cannot write $d (is a parent directory private?)"
	fi
	${as[@]+"${as[@]}"} timeout --foreground 60 mariadb-install-db --no-defaults --datadir="$d/data" \
		--auth-root-authentication-method=normal --skip-test-db >"$d/install.log" 2>&1 ||
		fail_with_logs "mariadb-install-db failed" "$d/install.log"
	"$MARIADBD" --no-defaults ${user[@]+"${user[@]}"} --datadir="$d/data" --socket="$d/sock" \
		--pid-file="$d/mariadbd.pid" --port="$MARIADB_PORT" --bind-address=127.0.0.1 --skip-name-resolve \
		--log-error="$d/log" --skip-log-bin --innodb-flush-log-at-trx-commit=0 --innodb-doublewrite=0 \
		--innodb-buffer-pool-size=128M --max-connections=500 </dev/null >>"$d/stdout" 2>&1 &
	echo $! >"$DIR/mariadb.pid"
	deadline=$((SECONDS + 30))
	until timeout --foreground 5 mariadb-admin --no-defaults -uroot --socket="$d/sock" ping >/dev/null 2>&1; do
		is_alive "$(<"$DIR/mariadb.pid")" || fail_with_logs "mariadbd exited" "$d/log" "$d/stdout"
		((SECONDS < deadline)) || fail_with_logs "MariaDB not ready after 30s" "$d/log"
		sleep 0.05
	done
	timeout --foreground 10 mariadb --no-defaults -uroot --socket="$d/sock" -e 'CREATE DATABASE idem'
}

# RabbitMQ (ready in ~6-10 s, the slowest of all: started first, waited for last) runs as
# the rabbitmq user with everything private to DIR/rabbitmq: node name, ports, data, logs,
# Erlang cookie (HOME) and epmd. Its working directory is DIR/rabbitmq, which is how
# `stop` recognizes it.
rabbitmq_vars() {
	local d="$DIR/rabbitmq"
	RABBITMQ_VARS=(HOME="$d" RABBITMQ_NODENAME="idemtest-$AMQP_PORT@localhost"
		RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT="$AMQP_PORT"
		RABBITMQ_DIST_PORT="$AMQP_DIST_PORT" ERL_EPMD_PORT="$AMQP_EPMD_PORT" ERL_EPMD_ADDRESS=127.0.0.1
		RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS='-kernel inet_dist_use_interface {127,0,0,1}'
		RABBITMQ_MNESIA_BASE="$d/mnesia" RABBITMQ_LOG_BASE="$d/log" RABBITMQ_PID_FILE="$d/pid"
		RABBITMQ_ENABLED_PLUGINS_FILE="$d/enabled_plugins" RABBITMQ_CONFIG_FILE="$d/rabbitmq"
		RABBITMQ_ADVANCED_CONFIG_FILE="$d/advanced.config" RABBITMQ_CONF_ENV_FILE="$d/rabbitmq-env.conf")
}

start_rabbitmq() {
	local d="$DIR/rabbitmq" as=()
	[[ -x $RABBITMQ_BIN/rabbitmq-server ]] || die "no RabbitMQ at $RABBITMQ_BIN (run '$0 install')"
	mkdir -p "$d"
	if ((EUID == 0)); then
		chown rabbitmq:rabbitmq "$d"
		as=(runuser -u rabbitmq --)
	fi
	rabbitmq_vars
	# A plain background job, as for Redis; the server writes DIR/rabbitmq/pid (the
	# Erlang VM's PID) once it boots. On SIGTERM runuser passes the signal on, and the
	# rabbitmq-server script stops the node.
	(cd "$d" && exec ${as[@]+"${as[@]}"} env "${RABBITMQ_VARS[@]}" "$RABBITMQ_BIN/rabbitmq-server") \
		</dev/null >>"$d/out.log" 2>&1 &
	echo $! >"$DIR/rabbitmq-launcher.pid"
}

# The AMQP listener opens at the end of the broker's boot: an open port means ready.
wait_rabbitmq() {
	local d="$DIR/rabbitmq" launcher deadline=$((SECONDS + 60))
	launcher=$(<"$DIR/rabbitmq-launcher.pid")
	until (exec 3<>"/dev/tcp/127.0.0.1/$AMQP_PORT") 2>/dev/null; do
		is_alive "$launcher" || fail_service RabbitMQ "$AMQP_PORT $AMQP_DIST_PORT $AMQP_EPMD_PORT" "exited" "$d/out.log"
		((SECONDS < deadline)) || fail_service RabbitMQ "$AMQP_PORT $AMQP_DIST_PORT $AMQP_EPMD_PORT" "not ready after 60s" "$d/out.log"
		sleep 0.1
	done
}

# create_cluster NAME PORT...: assigns the slots of a 3-master cluster.
create_cluster() {
	local name=$1
	shift
	timeout --foreground 30 redis-cli --cluster create "${@/#/127.0.0.1:}" \
		--cluster-replicas 0 --cluster-yes >"$DIR/cluster-create-$name.log" 2>&1 ||
		fail_with_logs "redis-cli --cluster create of $name failed" "$DIR/cluster-create-$name.log"
}

# wait_cluster WHAT NAME PORT...: `create` returns once slots are assigned; nodes report
# cluster_state:ok only after gossip has converged (~2 s). Tests that start earlier see
# CLUSTERDOWN.
wait_cluster() {
	local what=$1 name=$2 p deadline=$((SECONDS + 30))
	shift 2
	until cluster_ok "$@"; do
		((SECONDS < deadline)) || {
			for p in "$@"; do
				log "cluster info on $p: $(timeout --foreground 5 redis-cli -h 127.0.0.1 -p "$p" cluster info 2>&1 |
					tr -d '\r' | grep -E '^cluster_(state|slots_assigned|known_nodes)' | tr '\n' ' ')"
			done
			fail_with_logs "$what not cluster_state:ok on all nodes after 30s" \
				"$DIR/cluster-create-$name.log" "$DIR/redis-$1/log"
		}
		sleep 0.1
	done
}

PG_JOB=
MARIADB_JOB=
START_OK=0
# On any failure of `start`: stop what was started, keep DIR (its logs) for inspection.
on_start_exit() {
	((START_OK == 0)) || return 0
	[[ -z $PG_JOB ]] || wait "$PG_JOB" 2>/dev/null || true # bounded by its own timeouts
	[[ -z $MARIADB_JOB ]] || wait "$MARIADB_JOB" 2>/dev/null || true
	log "start failed; stopping what was started (its logs stay in $DIR until stop)"
	stop_processes "$DIR" || true
}

cmd_start() {
	local t0=${EPOCHREALTIME//[!0-9]/} p
	if [[ -e $DIR ]]; then
		if [[ -f $DIR/$MARKER ]]; then
			# Our own earlier run into the same DIR (e.g. services-up twice): clean it up.
			log "$DIR holds services from an earlier start; stopping them first"
			cmd_stop
		elif [[ -n $(ls -A "$DIR") ]]; then
			die "$DIR exists and is not empty; give an empty or new directory"
		fi
	fi
	local pkg
	for pkg in "${BUILT[@]}"; do
		[[ -x $(built_bin "$pkg") ]] || die "no $(built_bin "$pkg"): run '$0 install' (or build-servers) first"
	done
	check_ports_free
	mkdir -p "$DIR"
	chmod 755 "$DIR" # mktemp -d makes it 0700; the postgres user must traverse it
	: >"$DIR/$MARKER"
	trap on_start_exit EXIT

	(
		trap - EXIT
		start_postgres
	) >"$DIR/pg-setup.log" 2>&1 &
	PG_JOB=$!
	(
		trap - EXIT
		start_mariadb
	) >"$DIR/mariadb-setup.log" 2>&1 &
	MARIADB_JOB=$!
	start_rabbitmq

	start_redis "$REDIS_PORT"
	for p in "${CLUSTER_PORTS[@]}"; do
		start_redis "$p" --cluster-enabled yes --cluster-config-file nodes.conf \
			--cluster-node-timeout 5000
	done
	start_redis "$SENTINEL_MASTER_PORT"
	start_redis "$SENTINEL_REPLICA_PORT" --replicaof 127.0.0.1 "$SENTINEL_MASTER_PORT"
	for p in "${SENTINEL_PORTS[@]}"; do
		start_sentinel "$p"
	done
	start_server "$(built_bin redis)" "$REDIS8_PORT"
	start_server "$(built_bin valkey)" "$VALKEY_PORT"
	start_server "$(built_bin valkey9)" "$VALKEY9_PORT"
	for p in "${VALKEY9_CLUSTER_PORTS[@]}"; do
		start_server "$(built_bin valkey9)" "$p" --cluster-enabled yes --cluster-config-file nodes.conf \
			--cluster-node-timeout 5000
	done
	for p in "$REDIS_PORT" "${CLUSTER_PORTS[@]}" "$SENTINEL_MASTER_PORT" "$SENTINEL_REPLICA_PORT" "${SENTINEL_PORTS[@]}" \
		"$REDIS8_PORT" "$VALKEY_PORT" "$VALKEY9_PORT" "${VALKEY9_CLUSTER_PORTS[@]}"; do
		wait_redis "$p"
	done

	# Debian 12's redis-cli creates the Valkey 9.1 cluster too (NOTES-services.md). The
	# two clusters converge side by side.
	create_cluster redis "${CLUSTER_PORTS[@]}"
	create_cluster valkey9 "${VALKEY9_CLUSTER_PORTS[@]}"
	wait_cluster "Redis Cluster" redis "${CLUSTER_PORTS[@]}"
	wait_cluster "Valkey 9.1 cluster" valkey9 "${VALKEY9_CLUSTER_PORTS[@]}"

	local deadline=$((SECONDS + 30))
	until replica_synced; do
		((SECONDS < deadline)) || fail_with_logs "Sentinel set: replica not in sync after 30s" \
			"$DIR/redis-$SENTINEL_REPLICA_PORT/log"
		sleep 0.1
	done

	local pg_status=0
	wait "$PG_JOB" || pg_status=$?
	PG_JOB=
	((pg_status == 0)) || fail_service Postgres "$PG_PORT" "did not start (exit $pg_status)" \
		"$DIR/pg-setup.log" "$DIR/pg/log"

	local mariadb_status=0
	wait "$MARIADB_JOB" || mariadb_status=$?
	MARIADB_JOB=
	((mariadb_status == 0)) || fail_service MariaDB "$MARIADB_PORT" "did not start (exit $mariadb_status)" \
		"$DIR/mariadb-setup.log" "$DIR/mariadb/log"

	wait_rabbitmq

	local cluster_addrs
	cluster_addrs=$(printf '127.0.0.1:%s,' "${CLUSTER_PORTS[@]}")
	cat >"$DIR/env" <<EOF
export IDEM_REDIS_ADDR=127.0.0.1:$REDIS_PORT
export IDEM_REDIS_CLUSTER_ADDRS=${cluster_addrs%,}
export IDEM_REDIS_SENTINEL_ADDRS=$(printf '127.0.0.1:%s,' "${SENTINEL_PORTS[@]}" | sed 's/,$//')
export IDEM_REDIS_SENTINEL_MASTER=mymaster
export IDEM_POSTGRES_DSN='postgres://postgres@127.0.0.1:$PG_PORT/idem?sslmode=disable'
export IDEM_MYSQL_DSN='root@tcp(127.0.0.1:$MARIADB_PORT)/idem'
export IDEM_AMQP_URL=amqp://guest:guest@127.0.0.1:$AMQP_PORT/
export IDEM_REDIS8_ADDR=127.0.0.1:$REDIS8_PORT
export IDEM_REDIS8_SERVER=$(built_bin redis)
export IDEM_VALKEY_ADDR=127.0.0.1:$VALKEY_PORT
export IDEM_VALKEY_SERVER=$(built_bin valkey)
export IDEM_VALKEY9_ADDR=127.0.0.1:$VALKEY9_PORT
export IDEM_VALKEY9_SERVER=$(built_bin valkey9)
export IDEM_VALKEY9_CLUSTER_ADDRS=$(printf '127.0.0.1:%s,' "${VALKEY9_CLUSTER_PORTS[@]}" | sed 's/,$//')
EOF
	log "Redis $(server_version "$(built_bin redis)") on $REDIS8_PORT, Valkey $(server_version "$(built_bin valkey)") on $VALKEY_PORT," \
		"Valkey $(server_version "$(built_bin valkey9)") on $VALKEY9_PORT and ${VALKEY9_CLUSTER_PORTS[*]}," \
		"MariaDB $("$MARIADBD" --version | grep -oE 'Ver [0-9.]+' | cut -c5- || true) on $MARIADB_PORT"
	START_OK=1
	local us=$((${EPOCHREALTIME//[!0-9]/} - t0))
	log "up in $((us / 1000000)).$(printf '%03d' $((us / 1000 % 1000)))s; exports in $DIR/env"
}

# ---------------------------------------------------------------------------- stop

# stop_processes DIR: stop the servers recorded in DIR; tolerant of any already gone.
stop_processes() {
	local dir=$1 f pid port pids=()
	for f in "$dir"/redis-*.pid; do
		[[ -f $f ]] || continue
		pid=$(<"$f")
		port=${f##*/redis-}
		port=${port%.pid}
		if is_alive "$pid" && { is_ours "$pid" redis-server "$dir/redis-$port" ||
			is_ours "$pid" valkey-server "$dir/redis-$port"; }; then
			kill -TERM "$pid" 2>/dev/null || true
			pids+=("$pid")
		fi
	done
	# Signal all first, then wait: the servers shut down in parallel.
	for pid in ${pids[@]+"${pids[@]}"}; do
		wait_gone "$pid" 10 || {
			log "redis-server $pid ignored SIGTERM for 10s; sending SIGKILL"
			kill -KILL "$pid" 2>/dev/null || true
			wait_gone "$pid" 5 || log "warning: redis-server $pid still alive"
		}
	done
	rm -f "$dir"/redis-*.pid

	local data="$dir/pg/data" bin
	bin=$(pg_bin)
	if [[ -f $data/postmaster.pid ]]; then
		# Immediate mode: no checkpoint, the data is thrown away anyway.
		as_pg "$bin/pg_ctl" -D "$data" -m immediate -w -t 30 stop >/dev/null ||
			log "warning: pg_ctl stop failed"
	fi
	# Fallback if pg_ctl could not do it (e.g. postmaster.pid lost): the recorded PID.
	if [[ -f $dir/postgres.pid ]]; then
		pid=$(<"$dir/postgres.pid")
		if is_alive "$pid" && is_ours "$pid" postgres "$data"; then
			kill -QUIT "$pid" 2>/dev/null || true # SIGQUIT = immediate shutdown
			wait_gone "$pid" 10 || log "warning: postgres $pid still alive"
		fi
		pids+=("$pid")
		rm -f "$dir/postgres.pid"
	fi
	stop_mariadb "$dir"
	stop_rabbitmq "$dir"
	wait_reaped ${pids[@]+"${pids[@]}"}
}

# stop_mariadb DIR: SIGTERM is mariadbd's clean shutdown (~1 s with no durability to
# honour); its working directory is its data directory, which is how it is told ours.
stop_mariadb() {
	local dir=$1 pid
	[[ -f $dir/mariadb.pid ]] || return 0
	pid=$(<"$dir/mariadb.pid")
	if is_alive "$pid" && is_ours "$pid" mariadbd "$dir/mariadb/data"; then
		kill -TERM "$pid" 2>/dev/null || true
		wait_gone "$pid" 20 || {
			log "mariadbd $pid ignored SIGTERM for 20s; sending SIGKILL"
			kill -KILL "$pid" 2>/dev/null || true
			wait_gone "$pid" 5 || log "warning: mariadbd $pid still alive"
		}
	fi
	wait_reaped "$pid"
	rm -f "$dir/mariadb.pid"
}

# stop_rabbitmq DIR: the Erlang VM shuts down cleanly on SIGTERM (~2 s; the launcher
# script exits with it), then our private epmd, which outlives the node.
stop_rabbitmq() {
	local dir=$1 pid reap=()
	if [[ -f $dir/rabbitmq/pid ]]; then
		pid=$(<"$dir/rabbitmq/pid")
		if [[ $pid =~ ^[0-9]+$ ]] && is_alive "$pid" && is_ours "$pid" beam.smp "$dir/rabbitmq"; then
			kill -TERM "$pid" 2>/dev/null || true
			wait_gone "$pid" 15 || {
				log "RabbitMQ $pid ignored SIGTERM for 15s; sending SIGKILL"
				kill -KILL "$pid" 2>/dev/null || true
				wait_gone "$pid" 5 || log "warning: RabbitMQ $pid still alive"
			}
		fi
		reap+=("$pid")
	fi
	# The launcher (runuser, or the rabbitmq-server script) exits with the VM. If the VM
	# never wrote its PID (a boot that failed early), SIGTERM to the launcher stops it.
	if [[ -f $dir/rabbitmq-launcher.pid ]]; then
		pid=$(<"$dir/rabbitmq-launcher.pid")
		if is_alive "$pid" && [[ $(readlink "/proc/$pid/cwd" 2>/dev/null) == "$dir/rabbitmq" ]]; then
			wait_gone "$pid" 3 || {
				kill -TERM "$pid" 2>/dev/null || true
				wait_gone "$pid" 15 || log "warning: RabbitMQ launcher $pid still alive"
			}
		fi
		reap+=("$pid")
	fi
	# epmd daemonizes (its parent is PID 1, its cwd /), so it is found by name *and* by
	# the private HOME it inherited from our node: nobody else's epmd has that.
	local f comm
	for f in /proc/[0-9]*/comm; do
		{ read -r comm <"$f"; } 2>/dev/null || continue
		[[ $comm == epmd ]] || continue
		pid=${f#/proc/}
		pid=${pid%/comm}
		if tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ" | grep -qxF "HOME=$dir/rabbitmq"; then
			kill -TERM "$pid" 2>/dev/null || true
			wait_gone "$pid" 5 || log "warning: epmd $pid still alive"
			reap+=("$pid")
		fi
	done
	rm -f "$dir/rabbitmq-launcher.pid"
	wait_reaped ${reap[@]+"${reap[@]}"}
}

# The dead servers are zombies of PID 1 until it reaps them (about 1 s on these
# machines: `start` has exited, so PID 1 inherited them). They hold no ports, but wait a bounded moment so that `ps` right after
# `stop` shows nothing left; a PID 1 that never reaps costs at most 3 s here.
wait_reaped() {
	local pid deadline=$((SECONDS + 3))
	for pid in "$@"; do
		# When a failed `start` cleans up, the servers are still its own children:
		# reap them here (for anyone else's child `wait` just fails at once).
		wait "$pid" 2>/dev/null || true
		while [[ -e /proc/$pid ]] && ! is_alive "$pid" && ((SECONDS < deadline)); do
			sleep 0.05
		done
	done
}

cmd_stop() {
	if [[ ! -e $DIR ]]; then
		log "$DIR does not exist; nothing to stop"
		return 0
	fi
	if [[ ! -f $DIR/$MARKER ]]; then
		# An empty DIR is what a `start` that failed its port check leaves (e.g. from
		# mktemp in test.sh): removing it is harmless. Anything else is not ours.
		rmdir "$DIR" 2>/dev/null && return 0
		die "$DIR was not created by '$0 start'; not touching it"
	fi
	stop_processes "$DIR"
	rm -rf "$DIR"
}

# ---------------------------------------------------------------------------- main

case ${1:-} in
install) cmd_install ;;
build-servers) cmd_build_servers ;;
install-tools) cmd_install_tools ;;
start)
	DIR=$(abs_dir "${2:-}")
	cmd_start
	;;
stop)
	DIR=$(abs_dir "${2:-}")
	cmd_stop
	;;
*)
	echo "usage: $0 {install|install-tools|build-servers|start DIR|stop DIR}" >&2
	exit 2
	;;
esac
