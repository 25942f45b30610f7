#!/usr/bin/env bash
# What `make release-prep VERSION=vX.Y.Z` runs: pins every nested module's
# requirement of the root module, and of any other module of this
# repository, to VERSION, so that all the modules can be tagged at VERSION
# on one commit and each, fetched alone, gets the others at that version.
# The replace directives that point the nested modules at this tree stay:
# they serve development here and are ignored where a module is a
# dependency. README.md (Releasing) says what to do next.
#
# Usage: release-prep.sh VERSION [TREE]   (TREE: default this repository)
set -euo pipefail

version=${1:-}
if [[ ! $version =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$ ]]; then
	echo "release-prep: VERSION \"$version\" is not a semantic version vMAJOR.MINOR.PATCH (e.g. VERSION=v0.2.0)" >&2
	exit 2
fi
if [[ ! $version =~ ^v[01]\. ]]; then
	echo "release-prep: VERSION $version needs module paths ending in /v${version:1:1}; they end in none" >&2
	exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
tree=$(cd "${2:-$here/..}" && pwd -P)

mapfile -t mods < <(bash "$here/modules.sh" "$tree")
paths=()
for m in "${mods[@]}"; do paths+=("${m#* }"); done

for m in "${mods[@]}"; do
	dir=${m%% *}
	[[ $dir == . ]] && continue
	gomod="$tree/$dir/go.mod"
	reqs=$(cd "$tree/$dir" && go mod edit -json | awk -F'"' '/^\t"Require": \[/ { r = 1; next } /^\t\]/ { r = 0 } r && $2 == "Path" { print $4 }')
	for p in "${paths[@]}"; do
		if grep -qxF "$p" <<<"$reqs"; then
			(cd "$tree/$dir" && go mod edit -require="$p@$version")
			echo "release-prep: $dir/go.mod requires $p $version"
		fi
	done
	if ! grep -qxF "${paths[0]}" <<<"$reqs"; then
		echo "release-prep: $gomod does not require the root module ${paths[0]}" >&2
	fi
done

echo
echo "Next: commit, run \`make check\` (it publishes every module at one version"
echo "into a local proxy and builds each alone), then tag that one commit:"
for m in "${mods[@]}"; do
	dir=${m%% *}
	if [[ $dir == . ]]; then echo "  git tag $version"; else echo "  git tag $dir/$version"; fi
done
