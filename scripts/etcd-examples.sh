#!/usr/bin/env bash
# Runs the Rust examples against the etcd test cluster and checks their
# stories on their typed output (core/tests/examples_etcd.rs, a test = false
# target): the quickstart (A behind a relay that is cut: drain, then fence,
# then B acquires with a higher token) and guarded_write (the stale write is
# refused by etcd). Needs the env of scripts/etcd-cluster.sh (sourced or in
# target/etcd/env). Exits non-zero on a failed check.
# Usage: scripts/etcd-examples.sh [LOGFILE]   (cargo test output is appended)
set -euo pipefail
cd "$(dirname "$0")/.."
log=${1:-/dev/null}

if [[ -z ${DLOCK_TEST_ETCD:-} && -f ${DLOCK_TEST_ETCD_DIR:-target/etcd}/env ]]; then
  # shellcheck disable=SC1091
  source "${DLOCK_TEST_ETCD_DIR:-target/etcd}/env"
fi
[[ -n ${DLOCK_TEST_ETCD:-} ]] || { echo "etcd-examples: no cluster (run scripts/etcd-cluster.sh start)" >&2; exit 1; }

. scripts/lib.sh
ws_test --test examples_etcd -- --nocapture 2>&1 | tee -a "$log"
