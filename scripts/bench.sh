#!/usr/bin/env bash
# Benchmarks (not tests): permit() + drop beside a bare read of the same
# clock; prints the criterion medians and their ratio (target: <= 1.5).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench --quiet -p dlock --bench permit -- --noplot "$@" >/dev/null
python3 - <<'PY'
import json
def median(name):
    with open(f"target/criterion/permit/{name}/new/estimates.json") as f:
        return json.load(f)["median"]["point_estimate"]
clock = median("clock_now")
print(f"clock_now          median {clock:6.2f} ns")
for name in ("permit_drop", "permit_owned_drop"):
    m = median(name)
    print(f"{name:<18} median {m:6.2f} ns  ratio {m / clock:.2f}x")
PY
