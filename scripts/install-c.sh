#!/usr/bin/env bash
# Builds and installs the C library of dlock into PREFIX:
#   PREFIX/lib/libdlock.so, PREFIX/lib/libdlock.a, PREFIX/include/dlock.h,
#   PREFIX/lib/pkgconfig/dlock.pc
# Usage: scripts/install-c.sh PREFIX      (e.g. /usr/local, or $HOME/.local)
# Then:  PKG_CONFIG_PATH=PREFIX/lib/pkgconfig cc app.c $(pkg-config --cflags --libs dlock)
set -euo pipefail
[[ $# -eq 1 ]] || { echo "usage: $0 PREFIX" >&2; exit 2; }
cd "$(dirname "$0")/.."
mkdir -p "$1"
prefix=$(cd "$1" && pwd)
command -v cargo >/dev/null || { echo "install-c: cargo not found; install Rust (rustup)" >&2; exit 1; }

# DLOCK_C_LIB_DIR: a folder that already holds libdlock.so and libdlock.a
# (scripts/test-c.sh gives the one release build's); else a release build
# here, wherever cargo puts it (CARGO_TARGET_DIR included: cargo says).
lib=${DLOCK_C_LIB_DIR:-}
if [[ -z $lib ]]; then
  cargo build --release --locked -p dlock-ffi
  . scripts/lib.sh
  lib=$(cargo_target_dir)/release
fi
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

install -d "$prefix/lib/pkgconfig" "$prefix/include"
install -m 755 "$lib/libdlock.so" "$prefix/lib/libdlock.so"
install -m 644 "$lib/libdlock.a" "$prefix/lib/libdlock.a"
install -m 644 include/dlock.h "$prefix/include/dlock.h"
# Libs.private: what the Rust standard library needs when linking libdlock.a
# (`cargo rustc -- --print native-static-libs`).
cat >"$prefix/lib/pkgconfig/dlock.pc" <<PC
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: dlock
Description: Distributed locks whose holders stop working before the lock is lost
Version: $version
Libs: -L\${libdir} -ldlock
Libs.private: -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc
Cflags: -I\${includedir}
PC
echo "installed dlock $version into $prefix (lib/libdlock.so, lib/libdlock.a, include/dlock.h, lib/pkgconfig/dlock.pc)"
