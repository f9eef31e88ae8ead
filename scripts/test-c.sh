#!/usr/bin/env bash
# The C face's checks: release libraries, header drift (cbindgen 0.29.4),
# the C tests compiled strictly (gcc -std=c11 -Wall -Wextra -Werror
# -pedantic) and the header as C++, one run under -fsanitize=address,undefined
# and one under valgrind, the install + pkg-config build of examples/c and the
# worker's story. Installs what it needs (Debian). Prints `c: N passed, N
# failed`; fails on any failure.
# Usage: scripts/test-c.sh [LOGFILE]   (every step's output is appended to it)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
log=${1:-/dev/null}
[[ $log = /* || $log = /dev/null ]] || log="$root/$log"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
label=c
. scripts/checks.sh

# --- tools (a fresh Debian machine has none of them) -----------------------
. scripts/lib.sh
need_debs gcc=gcc g++=g++ make=make pkg-config=pkg-config valgrind=valgrind /usr/include/cjson/cJSON.h=libcjson-dev >>"$log" 2>&1 ||
  { echo "c: cannot install its tools" >&2; exit 1; }

CBINDGEN_VERSION=0.29.4
export PATH="$HOME/.cargo/bin:$PATH"
if ! cbindgen --version 2>/dev/null | grep -qx "cbindgen $CBINDGEN_VERSION"; then
  if command -v cbindgen >/dev/null; then
    # Another version is installed: leave it, use a pinned one of our own.
    cargo install cbindgen --version "$CBINDGEN_VERSION" --locked --root "$root/target/cbindgen"
    export PATH="$root/target/cbindgen/bin:$PATH"
  else
    cargo install cbindgen --version "$CBINDGEN_VERSION" --locked
  fi
fi

# --- build --------------------------------------------------------------------
step "cargo build --release -p dlock-ffi (libdlock.so, libdlock.a)" \
  cargo build --release --locked -p dlock-ffi
[[ -f target/release/libdlock.so && -f target/release/libdlock.a ]] || summary

step "include/dlock.h matches a fresh cbindgen $CBINDGEN_VERSION generation" bash -c '
  cbindgen --config ffi-c/cbindgen.toml --crate dlock-ffi --output "$1/dlock.h" ffi-c 2>/dev/null &&
    cmp "$1/dlock.h" include/dlock.h ||
    { echo "include/dlock.h is stale: run cbindgen --config ffi-c/cbindgen.toml --crate dlock-ffi --output include/dlock.h ffi-c"; exit 1; }' _ "$work"

tests=(api callbacks threads fork scenarios)
STRICT=(-std=c11 -Wall -Wextra -Werror -pedantic)
LINK=(-Ltarget/release -ldlock -lcjson -lpthread "-Wl,-rpath,$root/target/release")
SAN=(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all)
mkdir -p "$work/asan" "$work/plain"

compile_all() {
  for t in "${tests[@]}"; do
    gcc "${STRICT[@]}" -O1 -g "${SAN[@]}" -Iinclude "ffi-c/tests/c/$t.c" -o "$work/asan/$t" "${LINK[@]}" &&
      gcc "${STRICT[@]}" -O1 -g -Iinclude "ffi-c/tests/c/$t.c" -o "$work/plain/$t" "${LINK[@]}" ||
      return 1
    echo "compiled $t.c (sanitized and plain)"
  done
  gcc "${STRICT[@]}" -O2 -Iinclude ffi-c/tests/c/bench.c -o "$work/plain/bench" "${LINK[@]}" && echo "compiled bench.c"
}
step "compile the C tests: gcc ${STRICT[*]}" compile_all

step "header as C++: g++ -std=c++17 -Wall -Wextra -Werror -pedantic" bash -c '
  g++ -std=c++17 -Wall -Wextra -Werror -pedantic -x c++ -fsyntax-only include/dlock.h &&
    g++ -std=c++17 -Wall -Wextra -Werror -pedantic -Iinclude ffi-c/tests/c/header.cpp \
      -o "$1/header" -Ltarget/release -ldlock "-Wl,-rpath,$2/target/release" && "$1/header"' _ "$work" "$root"

args_of() { [[ $1 = scenarios ]] && echo "$root/scenarios"; }

# --- sanitizer run ----------------------------------------------------------
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:exitcode=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
for t in "${tests[@]}"; do
  [[ -x $work/asan/$t ]] || continue
  # shellcheck disable=SC2046
  step "$t under -fsanitize=address,undefined" "$work/asan/$t" $(args_of "$t")
done
unset ASAN_OPTIONS UBSAN_OPTIONS

# --- valgrind run -----------------------------------------------------------
VALGRIND=(valgrind --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite)
for t in "${tests[@]}"; do
  [[ -x $work/plain/$t ]] || continue
  # shellcheck disable=SC2046
  extra=()
  # See ffi-c/tests/c/fork.supp: the fork child cannot see the parent's
  # threads, which alone point to their bookkeeping.
  [[ $t = fork ]] && extra=(--suppressions=ffi-c/tests/c/fork.supp)
  step "$t under valgrind" env DLOCK_SCENARIO_SLACK_MS=300 \
    "${VALGRIND[@]}" "${extra[@]}" "$work/plain/$t" $(args_of "$t")
done

# --- install, pkg-config, the example -----------------------------------------
install_and_build() {
  scripts/install-c.sh "$work/prefix" >/dev/null || return 1
  local f
  for f in lib/libdlock.so lib/libdlock.a include/dlock.h lib/pkgconfig/dlock.pc; do
    [[ -f $work/prefix/$f ]] || { echo "missing $f"; return 1; }
  done
  export PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig"
  echo "pkg-config: dlock $(pkg-config --modversion dlock): $(pkg-config --cflags --libs dlock)"
  cp -r examples/c "$work/example"
  make -C "$work/example" worker worker-static CFLAGS="-O2 -Werror" || return 1
  if command -v cmake >/dev/null; then
    cmake -S "$work/example" -B "$work/cmake" -DCMAKE_BUILD_TYPE=Release >/dev/null &&
      cmake --build "$work/cmake" || return 1
    echo "CMake build: ok"
  else
    echo "CMake build: skipped (cmake not installed)"
  fi
}
step "scripts/install-c.sh PREFIX; make -C examples/c (pkg-config, shared and static)" install_and_build

# The worker's story on the embedded backend, checked on its typed output
# by core/tests/c_worker.rs (a test = false target): commits, then the drain,
# then the fence, then a clean stop with 0 in flight, no commit after the fence.
worker_story() {
  DLOCK_C_WORKER=$1 cargo test -p dlock --locked --test c_worker -- --nocapture
}
step "examples/c/worker: works under permits, stops cleanly at the fence" worker_story "$work/example/worker"
step "examples/c/worker-static: the same, linked with libdlock.a" worker_story "$work/example/worker-static"

summary
