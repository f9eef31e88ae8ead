# Sourced by the C scripts (test-c.sh, test-c-etcd.sh, bench-c.sh): the one
# place for the C tests' compiler, sanitizer, link and valgrind flags.
# Paths are relative to the repository root, where those scripts run.
c_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Strict C11 for every C test and example built by the scripts.
STRICT=(-std=c11 -Wall -Wextra -Werror -pedantic)
# The header as C++.
STRICT_CXX=(-std=c++17 -Wall -Wextra -Werror -pedantic)
# AddressSanitizer + UndefinedBehaviorSanitizer; the first report fails.
SAN=(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all)
# libdlock.so from the one release build (scripts/build-release.sh; where
# cargo put it: release_dir in scripts/lib.sh).
. "$c_root/scripts/lib.sh"
C_LIB_DIR=$(cd "$c_root" && release_dir)
LINK=(-L"$C_LIB_DIR" -ldlock -lpthread "-Wl,-rpath,$C_LIB_DIR")
# libdlock.a and what the Rust standard library needs beside it.
LINK_STATIC=("$C_LIB_DIR/libdlock.a" -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc)
# The shared scenario runner (libdlock_scenarios.so, scenarios/runner) for
# ffi-c/tests/c/scenarios.c; a shared library, so fine beside either link.
LINK_RUNNER=(-ldlock_scenarios)
# valgrind: memory errors and definite leaks fail the run. It runs one
# thread at a time; --fair-sched=yes hands the turn round in order, else
# threads.c's 8 workers spinning on refused permits kept its main thread
# from stopping them for 9 minutes in a CI run (42 s against 5.6 s when
# fair, by hand on the same machine).
VALGRIND=(valgrind --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite --fair-sched=yes)

# san_env_on / san_env_off: the sanitizers' runtime options (leaks checked,
# a non-zero exit on the first report) for the sanitized runs in between.
san_env_on() {
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:exitcode=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
}
san_env_off() { unset ASAN_OPTIONS UBSAN_OPTIONS; }
