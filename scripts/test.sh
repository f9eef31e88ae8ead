#!/usr/bin/env bash
# Runs every test: formatting, clippy -D warnings, build, unit / property /
# scenario / driver tests, doc tests, and the quickstart's story.
# Installs what it needs; safe to run on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

. scripts/lib.sh
need_build_tools
for c in rustfmt clippy; do
  if ! cargo "${c/rustfmt/fmt}" --version >/dev/null 2>&1; then
    step "installing $c"
    rustup component add "$c"
  fi
done

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo clippy -p dlock --test etcd --test etcd_faults --locked -- -D warnings # test = false targets

step "cargo test (PROPTEST_CASES=${PROPTEST_CASES:=10000})"
export PROPTEST_CASES
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace --locked 2>&1 | tee "$log"
./scripts/test-c.sh "$log" # the C face (issue 4): its own `c: N passed, N failed` line
./scripts/test-etcd.sh "$log" # a real etcd cluster: Rust, C and examples; appends to the log

step "quickstart: A drains, fences before B acquires with a higher token"
out=$(cargo run --quiet --locked --example quickstart)
echo "$out"
fence=$(grep -n 'FENCED token 1' <<<"$out" | head -1 | cut -d: -f1)
drain=$(grep -n 'A  Holding -> Draining' <<<"$out" | head -1 | cut -d: -f1)
b=$(grep -n 'B  holds the lock, token 2' <<<"$out" | head -1 | cut -d: -f1)
if [[ -z "$fence" || -z "$drain" || -z "$b" ]] || ! (( drain < fence && fence < b )); then
  echo "quickstart: expected drain, then fence, then B with token 2" >&2
  exit 1
fi
echo "quickstart: ok"

step "fence_gate example: the stale write is refused"
out=$(cargo run --quiet --locked --example fence_gate)
echo "$out"
grep -q 'A: the store refused the write: stale token 1' <<<"$out"
grep -q 'store holds: "written by B"' <<<"$out"

step "cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet
# One closing line for the whole run: the counts of every cargo test binary.
awk '/^test result:/ { p += $4; f += $6 } END { printf "all: %d passed, %d failed\n", p, f }' "$log"
