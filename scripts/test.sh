#!/usr/bin/env bash
# Runs every test: formatting, clippy -D warnings, build, unit / property /
# scenario / driver tests, doc tests, and the examples' stories (checked on
# their typed output by core/tests/examples.rs, part of `cargo test`).
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
cargo clippy -p dlock --test etcd --test etcd_faults --test etcd_parity --test etcd_sessions --test examples_etcd --test c_worker --test c_worker_etcd \
  --locked -- -D warnings # test = false targets

step "cargo test (PROPTEST_CASES=${PROPTEST_CASES:=10000})"
export PROPTEST_CASES
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace --locked 2>&1 | tee "$log"
./scripts/test-c.sh "$log" # the C face (issue 4): its own `c: N passed, N failed` line
./scripts/test-etcd.sh "$log" # a real etcd cluster: Rust, C and examples; appends to the log
# The other faces (issues 10-12), each with its own script that builds what it
# needs, starts its own etcd cluster for its etcd tests, appends cargo output
# to the log and prints its own `<face>: N passed, N failed` line.
for face in python node cli nemesis; do
  if [[ -e scripts/test-$face.sh ]]; then ./scripts/test-$face.sh "$log"; fi
done

step "cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet
# One closing line for the whole run: the counts of every cargo test binary.
awk '/^test result:/ { p += $4; f += $6 } END { printf "all: %d passed, %d failed\n", p, f }' "$log"
