#!/usr/bin/env bash
# Lists the modules of the tree at $1 (default: this repository), one per
# line: the module's directory relative to the tree ("." for the root),
# a space, its module path. The root first, then the nested modules in
# path order. A module is a directory with a go.mod, outside directories
# that Go itself ignores (names starting with "." or "_", testdata): so
# .ci/modzip, a tool of the checks, is not one of the published modules.
set -euo pipefail

tree=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)}
cd "$tree"
{
	echo ./go.mod
	find . -mindepth 1 \( -name '.*' -o -name '_*' -o -name testdata \) -prune -o -path './*/go.mod' -print | sort
} | while read -r f; do
	dir=$(dirname "$f")
	dir=${dir#./}
	path=$(awk '$1 == "module" { print $2; exit }' "$f")
	echo "${dir:-.} $path"
done
