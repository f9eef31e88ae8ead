#!/usr/bin/env bash
# Benchmark (not a test) of the PostgreSQL backend, core/benches/postgres.rs:
# acquire+release per second beside the same statements sent through
# tokio-postgres directly, in the same run; then 10,000 locks on one
# session (time, RSS per lock) and the server's cost of its keepalives
# (write transactions and WAL bytes per interval, beside the idle server). Starts the test servers of
# scripts/pg-cluster.sh and stops them on exit. Not in CI.
set -euo pipefail
cd "$(dirname "$0")/.."

trap 'scripts/pg-cluster.sh stop' EXIT
scripts/pg-cluster.sh start
# shellcheck disable=SC1091
source "${DLOCK_TEST_PG_DIR:-target/pg}/env"
cargo bench --quiet -p dlock --bench postgres --no-run
cargo bench --quiet -p dlock --bench postgres -- "$@"
