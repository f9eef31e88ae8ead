#!/usr/bin/env bash
# The C face's checks: release libraries, header drift (cbindgen 0.29.4),
# the C tests compiled strictly and the header as C++, one run under
# -fsanitize=address,undefined and one under valgrind (every flag: in
# scripts/c-flags.sh), the install + pkg-config build of examples/c and the
# worker's story. Installs what it needs (Debian). Prints `c: N passed, N
# failed`; fails on any failure.
# Usage: scripts/test-c.sh [LOGFILE]   (every step's output is appended to it)
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/checks.sh
label=c
with_scratch
. scripts/c-flags.sh

# --- tools (a fresh Debian machine has none of them) -----------------------
. scripts/lib.sh
need_debs gcc=gcc g++=g++ make=make pkg-config=pkg-config valgrind=valgrind \
  /usr/include/postgresql/libpq-fe.h=libpq-dev >>"$log" 2>&1 ||
  { echo "c: cannot install its tools" >&2; exit 1; }

CBINDGEN_VERSION=0.29.4
export PATH="$HOME/.cargo/bin:$PATH"
if ! cbindgen --version 2>/dev/null | grep -qx "cbindgen $CBINDGEN_VERSION"; then
  if command -v cbindgen >/dev/null; then
    # Another version is installed: leave it, use a pinned one of our own.
    cargo install cbindgen --version "$CBINDGEN_VERSION" --locked --root "$HOME/.cache/dlock/cbindgen-$CBINDGEN_VERSION"
    export PATH="$HOME/.cache/dlock/cbindgen-$CBINDGEN_VERSION/bin:$PATH"
  else
    cargo install cbindgen --version "$CBINDGEN_VERSION" --locked
  fi
fi

# --- build --------------------------------------------------------------------
# The one release build (scripts/build-release.sh; a no-op when scripts/dist.sh
# or another face built it): libdlock.so, libdlock.a, libdlock_scenarios.so.
step "the release build (scripts/build-release.sh: libdlock.so, libdlock.a, libdlock_scenarios.so)" \
  scripts/build-release.sh
[[ -f $C_LIB_DIR/libdlock.so && -f $C_LIB_DIR/libdlock.a && -f $C_LIB_DIR/libdlock_scenarios.so ]] || summary
props_bin=$(ws_test --test props --no-run --message-format=json 2>/dev/null | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
step "the lk_ functions by property (ffi-c/tests/props.rs)" env DLOCK_C_LIB="$C_LIB_DIR/libdlock.so" "$props_bin"
step "the same under libasan's allocator" env DLOCK_C_LIB="$C_LIB_DIR/libdlock.so" LD_PRELOAD="$(gcc -print-file-name=libasan.so)" ASAN_OPTIONS=detect_leaks=0:exitcode=1 "$props_bin"

step "include/dlock.h matches a fresh cbindgen $CBINDGEN_VERSION generation" bash -c '
  cbindgen --config ffi-c/cbindgen.toml --crate dlock-ffi --output "$1/dlock.h" ffi-c 2>/dev/null &&
    cmp "$1/dlock.h" include/dlock.h ||
    { echo "include/dlock.h is stale: run cbindgen --config ffi-c/cbindgen.toml --crate dlock-ffi --output include/dlock.h ffi-c"; exit 1; }' _ "$work"

tests=(api callbacks threads fork sessions scenarios metrics election readme bad_input semaphore rwlock)
mkdir -p "$work/asan" "$work/plain"

compile_all() {
  local links
  for t in "${tests[@]}"; do
    links=("${LINK[@]}")
    [[ $t = scenarios ]] && links+=("${LINK_RUNNER[@]}")
    gcc "${STRICT[@]}" -O1 -g "${SAN[@]}" -Iinclude "ffi-c/tests/c/$t.c" -o "$work/asan/$t" "${links[@]}" &&
      gcc "${STRICT[@]}" -O1 -g -Iinclude "ffi-c/tests/c/$t.c" -o "$work/plain/$t" "${links[@]}" ||
      return 1
    echo "compiled $t.c (sanitized and plain)"
  done
  gcc "${STRICT[@]}" -O2 -Iinclude ffi-c/tests/c/bench.c -o "$work/plain/bench" "${LINK[@]}" && echo "compiled bench.c"
}
step "compile the C tests: gcc ${STRICT[*]}" compile_all

header_as_cxx() {
  g++ "${STRICT_CXX[@]}" -x c++ -fsyntax-only include/dlock.h &&
    g++ "${STRICT_CXX[@]}" -x c++ -fsyntax-only -Iinclude ffi-c/tests/c/scenario_runner.h &&
    g++ "${STRICT_CXX[@]}" -Iinclude ffi-c/tests/c/header.cpp -o "$work/header" "${LINK[@]}" &&
    "$work/header"
}
step "header as C++: g++ ${STRICT_CXX[*]}" header_as_cxx

args_of() {
  case $1 in
    scenarios) echo "$root/scenarios" ;;
    metrics) echo "$root/core/tests/fixtures/metric-families.txt" ;;
    bad_input) echo "$root/scenarios/vectors/bad_input.json" ;;
  esac
}

# --- sanitizer run ----------------------------------------------------------
san_env_on
for t in "${tests[@]}"; do
  [[ -x $work/asan/$t ]] || continue
  # shellcheck disable=SC2046
  step "$t under -fsanitize=address,undefined" "$work/asan/$t" $(args_of "$t")
done
san_env_off

# --- valgrind run -----------------------------------------------------------
# Every test under valgrind in the full tier (DLOCK_FULL=1, scripts/test.sh
# --full); api.c alone in the fast tier, the one real case of its kind
# (docs/testing.md).
valgrind_tests=("${tests[@]}")
[[ -n ${DLOCK_FULL:-} ]] || valgrind_tests=(api)
for t in "${valgrind_tests[@]}"; do
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
  DLOCK_C_LIB_DIR=$C_LIB_DIR scripts/install-c.sh "$work/prefix" >/dev/null || return 1
  local f
  for f in lib/libdlock.so lib/libdlock.a include/dlock.h lib/pkgconfig/dlock.pc; do
    [[ -f $work/prefix/$f ]] || { echo "missing $f"; return 1; }
  done
  export PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig"
  echo "pkg-config: dlock $(pkg-config --modversion dlock): $(pkg-config --cflags --libs dlock)"
  cp -r examples/c "$work/example"
  # pg_guard (libpq) is run on PostgreSQL by scripts/test-postgres.sh.
  make -C "$work/example" worker worker-static pg_guard CFLAGS="-O2 -Werror" || return 1
  if command -v cmake >/dev/null; then
    cmake -S "$work/example" -B "$work/cmake" -DCMAKE_BUILD_TYPE=Release >/dev/null &&
      cmake --build "$work/cmake" || return 1
    echo "CMake build: ok"
  else
    echo "CMake build: skipped (cmake not installed)"
  fi
}
step "scripts/install-c.sh PREFIX; make -C examples/c (pkg-config, shared and static; pg_guard with libpq)" install_and_build

# The worker's story on the embedded backend, checked on its typed output
# by core/tests/c_worker.rs (a test = false target): commits, then the drain,
# then the fence, then a clean stop with 0 in flight, no commit after the fence.
worker_story() {
  DLOCK_C_WORKER=$1 ws_test --test c_worker -- --nocapture
}
step "examples/c/worker: works under permits, stops cleanly at the fence" worker_story "$work/example/worker"
step "examples/c/worker-static: the same, linked with libdlock.a" worker_story "$work/example/worker-static"

summary
