#!/usr/bin/env bash
# Benchmark (not a test): lk_permit + lk_permit_end in a C timing loop beside
# a bare clock_gettime(CLOCK_BOOTTIME) loop in the same program, release
# library, gcc -O2 (flags and links: scripts/c-flags.sh). Prints the medians
# over the rounds and their ratio (target <= 1.5). Usage: scripts/bench-c.sh [ITERATIONS_PER_ROUND [ROUNDS]]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/c-flags.sh
cargo build --release --locked --quiet -p dlock-ffi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for link in shared static; do
  if [[ $link = shared ]]; then
    gcc "${STRICT[@]}" -O2 -Iinclude ffi-c/tests/c/bench.c -o "$out/bench" "${LINK[@]}"
  else
    gcc "${STRICT[@]}" -O2 -Iinclude ffi-c/tests/c/bench.c -o "$out/bench" "${LINK_STATIC[@]}"
  fi
  echo "libdlock ($link):"
  "$out/bench" "$@"
done
