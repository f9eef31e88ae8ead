#!/usr/bin/env bash
# Runs the main example: two holders, one lock, a cut network, on the
# embedded backend. Needs a Rust toolchain (cargo); installs protoc if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_build_tools
exec cargo run --quiet --locked --example quickstart
