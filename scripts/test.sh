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
cargo clippy -p dlock --test etcd --test etcd_faults --test etcd_parity --test etcd_sessions --test etcd_election --test etcd_metrics --test examples_etcd --test c_worker --test c_worker_etcd \
  --locked -- -D warnings # test = false targets
cargo clippy -p dlock-ffi --test props --test exit_etcd --locked -- -D warnings
cargo clippy -p dlock --test soak --locked -- -D warnings # the soak (scripts/soak.sh; test = false)
cargo clippy -p dlock --features prometheus --all-targets --locked -- -D warnings # the collector (issue 22)

step "cargo test (PROPTEST_CASES=${PROPTEST_CASES:=10000})"
export PROPTEST_CASES
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace --locked 2>&1 | tee "$log"
# The `prometheus` feature (off by default): its collector's test.
cargo test -p dlock --features prometheus --test metrics --locked 2>&1 | tee -a "$log"
# Each slow fault case once in CI; the repetitions are for hand runs
# (the scripts' own default, DLOCK_FAULT_RUNS=3, and the benchmarks).
export DLOCK_FAULT_RUNS=${DLOCK_FAULT_RUNS:-1}
./scripts/test-c.sh "$log" # the C face (issue 4): its own `c: N passed, N failed` line
./scripts/test-etcd.sh "$log" # a real etcd cluster: Rust, C and examples; appends to the log
./scripts/test-postgres.sh "$log" # a real PostgreSQL primary and synchronous standby (issue 19)
# The packages users install (issue 21), built once by scripts/dist.sh (it
# fails on a native file above the glibc floor or a missing SONAME), then
# scripts/test-dist.sh: the C archive and .deb installed and used, checks
# on every native artifact, bad input. The Python and Node face scripts
# (and the nemesis's holders) install the wheel and the npm tarballs from
# dist/ (DLOCK_DIST) instead of building their own.
step "scripts/dist.sh (every artifact, built once)"
scripts/dist.sh 2>&1 | tee -a "$log"
export DLOCK_DIST=$PWD/dist
./scripts/test-dist.sh "$log"
# The other faces (issues 10-12), each with its own script that builds what it
# needs, starts its own etcd cluster for its etcd tests, appends cargo output
# to the log and prints its own `<face>: N passed, N failed` line.
for face in cpp python node cli nemesis; do
  if [[ -e scripts/test-$face.sh ]]; then ./scripts/test-$face.sh "$log"; fi
done

step "cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet
# One closing line for the whole run: the counts of every cargo test binary.
awk '/^test result:/ { p += $4; f += $6 } END { printf "all: %d passed, %d failed\n", p, f }' "$log"
