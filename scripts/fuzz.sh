#!/usr/bin/env bash
# Runs every fuzz target in the module for FUZZTIME each (default 30s), one
# after another, then copies what the fuzzer found into each package's
# testdata/fuzz/<Target>/ so that the corpus is committed and every later
# `go test` (make test too) replays it.
#
#   scripts/fuzz.sh                  every target, 30s each
#   FUZZTIME=5m scripts/fuzz.sh      longer
#   scripts/fuzz.sh FuzzStoreSigned  only the targets named
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local
fuzztime=${FUZZTIME:-30s}
parallel=${FUZZ_PARALLEL:-$(nproc)}
cache=$(go env GOCACHE)/fuzz
module=$(go list -m)

mapfile -t targets < <(grep -rHo --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*' . | sed 's/:func /:/' | sort)
ran=0
failed=()
for t in "${targets[@]}"; do
	file=${t%%:*} name=${t##*:}
	pkg=./$(dirname "${file#./}")
	if [[ $# -gt 0 && ! " $* " =~ " $name " ]]; then
		continue
	fi
	echo "== $name ($pkg, $fuzztime)"
	if ! go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" -parallel "$parallel" "$pkg"; then
		failed+=("$name") # its failing input is in $pkg/testdata/fuzz/$name: go test replays it
	fi
	src=$cache/$module/${pkg#./}/$name
	if [[ -d $src ]]; then
		mkdir -p "$pkg/testdata/fuzz/$name"
		cp -n "$src"/* "$pkg/testdata/fuzz/$name/" 2>/dev/null || true
	fi
	ran=$((ran + 1))
done
if [[ $ran -eq 0 ]]; then
	echo "no fuzz target matched: $*" >&2
	exit 2
fi
echo "ran $ran fuzz targets for $fuzztime each"
if [[ ${#failed[@]} -gt 0 ]]; then
	echo "failed: ${failed[*]}" >&2
	exit 1
fi
