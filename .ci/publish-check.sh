#!/usr/bin/env bash
# Simulates publication (called by `make check`): every module of the tree,
# with `release-prep` applied at one version, is zipped into a local file
# module proxy as a release would publish it; then, for each module, a user
# module outside the repository `go get`s that module alone from the proxy
# and builds a program importing its package; and no module imports a
# package internal to another (Go's own rule lets them, by import path).
# Nothing of the tree reaches
# the user but the zips: a replace directive, a go.work, an import of
# another module's internal/ or a requirement of a version that was never
# published fails here as it would for a user.
#
# PUBLISH_VERSION: the version to publish at (default v0.999.0-check).
# PUBLISH_SRC: the tree to publish (default this repository, its tracked and
# untracked files, as they are on disk).
# PUBLISH_PREP=0: publish the go.mod files as they are, without release-prep.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
src=$(cd "${PUBLISH_SRC:-$here/..}" && pwd -P)
version=${PUBLISH_VERSION:-v0.999.0-check}

work=$(mktemp -d "${TMPDIR:-/tmp}/idem-publish.XXXXXX")
cleanup() {
	chmod -R u+w "$work" 2>/dev/null || true # the module cache is read-only
	rm -rf "$work"
}
trap cleanup EXIT

# The tree as a release would tag it: the files git knows of, no build output.
mkdir "$work/tree"
git -C "$src" ls-files -z --cached --others --exclude-standard |
	(cd "$src" && xargs -0 sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' _) |
	(cd "$src" && tar --null -T - -cf -) | tar -xf - -C "$work/tree"
if [[ ${PUBLISH_PREP:-1} != 0 ]]; then
	bash "$here/release-prep.sh" "$version" "$work/tree" >/dev/null
fi

(cd "$here/modzip" && go build -o "$work/modzip" .)
mapfile -t mods < <(bash "$here/modules.sh" "$work/tree")
for m in "${mods[@]}"; do
	dir=${m%% *} path=${m#* }
	"$work/modzip" -dir "$work/tree/$dir" -path "$path" -version "$version" -proxy "$work/proxy"
	# The modules' own dependencies come from the local module cache, so
	# that the check runs offline; fetch them there first.
	(cd "$work/tree/$dir" && GOWORK=off GOFLAGS=-mod=mod go mod download)
done

# internal reports the imports, by a module's packages and their tests, of
# a package internal to another module of the tree. Go allows them (its
# rule is by import path, and these paths share a prefix), but they tie a
# module's release to another's private code at the same commit: a later
# release of that module may change it under the published one.
internal() {
	local dir=$1 path=$2 pkg imp owner p
	(cd "$work/tree/$dir" && GOWORK=off GOFLAGS=-mod=mod go list \
		-f '{{.ImportPath}} {{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}' ./...) |
		while read -r pkg rest; do
			for imp in $rest; do
				[[ $imp =~ (^|/)internal(/|$) ]] || continue
				owner=
				for p in "${paths[@]}"; do
					if [[ $imp == "$p" || $imp == "$p"/* ]] && ((${#p} > ${#owner})); then owner=$p; fi
				done
				if [[ -n $owner && $owner != "$path" ]]; then
					echo "$pkg imports $imp, internal to module $owner"
				fi
			done
		done
}

paths=()
for m in "${mods[@]}"; do paths+=("${m#* }"); done
cache=$(go env GOMODCACHE)
ok=0
failed=()
for m in "${mods[@]}"; do
	dir=${m%% *} path=${m#* }
	bad=$(internal "$dir" "$path")
	if [[ -n $bad ]]; then
		echo "publish-check: FAIL $path imports another module's internal packages:" >&2
		sed 's/^/    /' <<<"$bad" | sort -u >&2
	fi
	user="$work/user/${dir//\//-}"
	mkdir -p "$user"
	# The package at the module's root, else its first package.
	pkg=$path
	if ! compgen -G "$work/tree/$dir/*.go" >/dev/null; then
		pkg=$(cd "$work/tree/$dir" && GOWORK=off go list ./... | head -n 1)
	fi
	printf 'package main\n\nimport _ "%s"\n\nfunc main() {}\n' "$pkg" >"$user/main.go"
	if (
		cd "$user" &&
			export GOWORK=off GOFLAGS=-mod=mod GOSUMDB=off GONOSUMDB= GOPRIVATE= GONOPROXY= GOINSECURE= \
				GOTOOLCHAIN=local GOMODCACHE="$work/modcache" \
				GOPROXY="file://$work/proxy,file://$cache/cache/download" &&
			go mod init example.com/user &&
			go get "$path@$version" &&
			go build -trimpath -o /dev/null .
	) >"$work/log" 2>&1; then
		if [[ -z $bad ]]; then
			ok=$((ok + 1))
			echo "publish-check: ok   $path@$version alone"
		else
			failed+=("$path")
		fi
	else
		failed+=("$path")
		echo "publish-check: FAIL $path@$version alone does not build:" >&2
		sed 's/^/    /' "$work/log" | tail -n 15 >&2
	fi
done
echo "publish-check: ${ok} of ${#mods[@]} modules usable alone, as published at $version"
((${#failed[@]} == 0))
