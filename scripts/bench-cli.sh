#!/usr/bin/env bash
# Figures, not a test: the cost of one `dlock run NAME -- true` (connect,
# acquire, start, release, exit) beside `etcdctl lock NAME true` measured
# in the same run on the same throwaway cluster, medians over N runs.
#
# usage: scripts/bench-cli.sh [N]   (default 30; honours DLOCK_TEST_PORT_BASE)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-30}
[[ $n =~ ^[1-9][0-9]*$ ]] || { echo "usage: scripts/bench-cli.sh [N]" >&2; exit 2; }

. scripts/lib.sh
need_build_tools
trap 'scripts/etcd-cluster.sh stop >/dev/null 2>&1' EXIT
cargo build --release --locked -p dlock-cli --quiet
scripts/etcd-cluster.sh start
# shellcheck disable=SC1091
source target/etcd/env
export DLOCK_ENDPOINTS=$DLOCK_TEST_MEMBERS ETCDCTL_API=3

# median_ms CMD...: runs CMD n times, prints the median wall time in ms.
median_ms() {
  local i t0 t1 times=()
  for ((i = 0; i < n; i++)); do
    t0=$(date +%s%N)
    "$@" >/dev/null || true # `dlock show` of a free lock exits 1
    t1=$(date +%s%N)
    times+=($(((t1 - t0) / 1000)))
  done
  printf '%s\n' "${times[@]}" | sort -n | awk '{ a[NR] = $1 } END { m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2; printf "%.1f", m / 1000 }'
}

name=bench-cli-$$
base=$(median_ms etcdctl --endpoints "$DLOCK_ENDPOINTS" lock "$name" true)
run=$(median_ms target/release/dlock run "$name" -- true)
try=$(median_ms target/release/dlock run --try "$name" -- true)
show=$(median_ms target/release/dlock show "$name" --json)
ratio() { awk -v a="$1" -v b="$base" 'BEGIN { printf "%.2f", a / b }'; }
printf '\ncli bench: medians over %d runs, ms (3-member loopback cluster)\n' "$n"
printf '%-40s %8s %8s\n' "command" "ms" "ratio"
printf '%-40s %8s %8s\n' "etcdctl lock NAME true (baseline)" "$base" "1.00"
printf '%-40s %8s %8s\n' "dlock run NAME -- true" "$run" "$(ratio "$run")"
printf '%-40s %8s %8s\n' "dlock run --try NAME -- true" "$try" "$(ratio "$try")"
printf '%-40s %8s %8s\n' "dlock show NAME --json" "$show" "$(ratio "$show")"
