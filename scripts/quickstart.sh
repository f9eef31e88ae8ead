#!/usr/bin/env bash
# Runs the main example: two holders, one lock, a cut network, on the
# embedded backend. Needs only a Rust toolchain (cargo).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo >/dev/null || { echo "quickstart: cargo not found; install Rust (rustup)" >&2; exit 1; }
exec cargo run --quiet --example quickstart
