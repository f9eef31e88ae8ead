#!/usr/bin/env bash
# Installs the C artifacts of scripts/dist.sh as users do and runs them, and
# checks every native artifact, in empty folders with cargo and protoc
# shadowed on PATH by stubs that fail (so nothing here builds Rust or runs
# protoc):
#   C, C++  the archive unpacked and the .deb extracted (dpkg-deb -x): the C
#           and C++ workers built with pkg-config and with CMake
#           find_package(dlock), shared and static, run, their stories checked
#   checks  highest GLIBC_ version <= the floor (objdump -T) of libdlock.so.0,
#           bin/dlock, the wheel's module and the npm addon; the SONAME; no
#           build-machine path in .pc, CMake files or RPATH/RUNPATH; the
#           wheel's tags and Requires-Python; the platform package's
#           os/cpu/libc and engines
#   bad input  dist.sh without npm, or without zig, says what is missing
#           and how to get it; pip refuses the wheel on Python 3.8; npm
#           --engine-strict refuses the packages on Node 18
# The Python and Node installs and their suites: scripts/test-python.sh and
# scripts/test-node.sh with DLOCK_DIST=DIR (scripts/test.sh sets it after
# running dist.sh once).
# Prints `dist: N passed, N failed` and exits 1 on any failure.
# Usage: scripts/test-dist.sh [LOGFILE]   (DLOCK_DIST, default dist/; runs
#        scripts/dist.sh if there is no dist/)
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/checks.sh
label=dist
glibc=${DLOCK_GLIBC:-2.17}
dist=${DLOCK_DIST:-$root/dist}
[[ $dist = /* ]] || dist=$root/$dist
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
mkdir -p target
work=$(mktemp -d "$root/target/test-dist.XXXXXX") # not /tmp: nothing else cleans it meanwhile
trap 'rm -rf "$work"' EXIT

. scripts/lib.sh
need_debs g++=g++ make=make pkg-config=pkg-config cmake=cmake objdump=binutils >>"$log" 2>&1 ||
  { echo "dist: cannot install its tools" >&2; exit 1; }
need_python >>"$log" 2>&1 || { echo "dist: cannot install python3-venv" >&2; exit 1; }
# dist/ from this tree's scripts/dist.sh; built here when missing (CI).
if [[ ! -d $dist ]]; then
  printf '\n==> dist: no dist/: scripts/dist.sh\n'
  scripts/dist.sh 2>&1 | tee -a "$log"
  ((PIPESTATUS[0] == 0)) || { printf 'dist: scripts/dist.sh failed\n\ndist: 0 passed, 1 failed\n'; exit 1; }
fi
for f in "libdlock-$version-linux-x86_64.tar.gz" "libdlock_${version}_amd64.deb" "npm/dlock-fence-$version.tgz" \
  "npm/dlock-fence-linux-x64-gnu-$version.tgz" "dlock_fence-$version.tar.gz"; do
  [[ -f $dist/$f ]] || { echo "dist: $dist/$f is missing: run scripts/dist.sh first" >&2; exit 1; }
done
wheel=$(ls "$dist"/dlock_fence-"$version"-*.whl 2>/dev/null | head -1)
[[ -n $wheel ]] || { echo "dist: no wheel in $dist: run scripts/dist.sh first" >&2; exit 1; }

# cargo and protoc: stubs that fail, first on PATH; ~/.cargo/bin dropped.
mkdir -p "$work/stubs"
for t in cargo rustc protoc; do
  printf '#!/bin/sh\necho "test-dist: %s was run: the artifacts must not need it" >&2\nexit 127\n' "$t" >"$work/stubs/$t"
  chmod +x "$work/stubs/$t"
done
root_path=$PATH
clean_path=$work/stubs:$(tr : '\n' <<<"$PATH" | grep -v '\.cargo/bin' | paste -sd:)
export PATH=$clean_path
unset CARGO_HOME RUSTUP_HOME CARGO_TARGET_DIR PYTHONPATH NODE_PATH DLOCK_ENDPOINTS LD_LIBRARY_PATH

# highest_glibc FILE: the newest GLIBC_ version FILE's dynamic symbols need.
highest_glibc() { objdump -T "$1" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1; }
at_most_floor() { # FILE...
  local f g rc=0
  for f in "$@"; do
    g=$(highest_glibc "$f")
    echo "${f#"$work"/}: highest GLIBC_$g (floor $glibc)"
    [[ $(printf '%s\n%s\n' "$g" "$glibc" | sort -V | tail -1) = "$glibc" ]] || { echo "  above the floor"; rc=1; }
  done
  return $rc
}

export glibc work
export -f highest_glibc at_most_floor

# worker_story BIN: the C (and C++) worker's story on the embedded backend,
# checked on its JSON lines: holds, commits, the drain, the fence of the
# held token, a clean stop with 0 in flight; no commit after the fence.
worker_story() {
  DLOCK_STORY=json timeout 60 "$1" >"$work/story.out" || { cat "$work/story.out"; return 1; }
  python3 - "$work/story.out" <<'PY'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
def first(name, **kw):
    return next(i for i, e in enumerate(ev) if e["event"] == name and all(e.get(k) == v for k, v in kw.items()))
holds = first("holds", backend="embedded")
token = ev[holds]["token"]
commits = [i for i, e in enumerate(ev) if e["event"] == "commit"]
assert commits and all(ev[i]["token"] == token for i in commits), "commits under the held token"
drain, fence, stop = first("state", to="Draining"), first("fence", token=token), first("stopped")
assert ev[stop]["in_flight"] == 0, "a clean stop"
assert holds < commits[0] < drain < fence < stop, "holds, commits, drain, fence, stop in order"
assert commits[-1] < fence, "no commit after the fence"
print(f"story ok: {len(commits)} commits under token {token}, then the drain, the fence and a clean stop")
PY
}

# --- C and C++: the archive and the .deb ------------------------------------
# c_builds PREFIX NAME: pkg-config (make) and CMake builds of both workers,
# shared and static, and their runs.
c_builds() {
  local prefix=$1 name=$2 w=$work/c-$2 b
  mkdir -p "$w"
  cp -r examples/c examples/cpp "$w/"
  export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
  step "$name: pkg-config: dlock $(pkg-config --modversion dlock 2>&1) builds the C and C++ workers, shared and static" \
    bash -c 'make -s -C "$1/c" worker worker-static CFLAGS="-O2 -Werror" && make -s -C "$1/cpp" worker worker-static CXXFLAGS="-O2 -Werror"' _ "$w"
  step "$name: CMake find_package(dlock) builds the C and C++ workers, shared and static" \
    bash -c 'cmake -S "$1/cpp" -B "$1/build" -DCMAKE_PREFIX_PATH="$2" -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build "$1/build"' _ "$w" "$prefix"
  unset PKG_CONFIG_PATH
  for b in c/worker c/worker-static cpp/worker cpp/worker-static build/worker-c build/worker-c-static build/worker-cpp build/worker-cpp-static; do
    [[ -x $w/$b ]] && step "$name: $b works under permits and stops cleanly at the fence" worker_story "$w/$b"
  done
  step "$name: the shared workers load libdlock.so.0 from $name" bash -c '
    for b in "$1/c/worker" "$1/build/worker-cpp"; do
      got=$(ldd "$b" | awk "/libdlock.so.0/ { print \$3 }")
      echo "${b##*/} loads $got"
      [[ -n $got && $(realpath "$got") = $(realpath "$2/lib/libdlock.so.0") ]] || exit 1
    done' _ "$w" "$prefix"
}

no_build_paths() { # PREFIX: nothing names this machine's build folders
  local prefix=$1 f bad=0
  for f in "$prefix"/lib/pkgconfig/dlock.pc "$prefix"/lib/cmake/dlock/*.cmake; do
    if grep -nE "$root|/tmp/|/home/|/root/" "$f"; then echo "  ^ an absolute path in ${f#"$prefix"/}"; bad=1; fi
  done
  for f in "$prefix/lib/libdlock.so.0" "$prefix/bin/dlock"; do
    if readelf -d "$f" | grep -E 'RPATH|RUNPATH'; then echo "  ^ ${f#"$prefix"/} has an RPATH"; bad=1; fi
  done
  readelf -d "$prefix/lib/libdlock.so.0" | grep 'SONAME' | grep -q '\[libdlock\.so\.0\]' ||
    { echo "libdlock.so.0 has no SONAME libdlock.so.0"; bad=1; }
  [[ $(readlink "$prefix/lib/libdlock.so") = libdlock.so.0 ]] || { echo "lib/libdlock.so is not a link to libdlock.so.0"; bad=1; }
  for f in include/dlock.h include/dlock.hpp lib/libdlock.a share/doc/dlock/LICENSE share/doc/dlock/THIRD-PARTY; do
    [[ -f $prefix/$f ]] || { echo "missing $f"; bad=1; }
  done
  ((bad == 0)) && echo "no build paths, SONAME libdlock.so.0, every file there"
}

mkdir -p "$work/archive/unpacked/anywhere"
tar -C "$work/archive/unpacked/anywhere" -xzf "$dist/libdlock-$version-linux-x86_64.tar.gz"
ar=$work/archive/unpacked/anywhere/libdlock-$version-linux-x86_64
step "archive: SONAME, links, files, no build paths in .pc/CMake/RPATH" no_build_paths "$ar"
step "archive: glibc floor of libdlock.so.0 and bin/dlock" at_most_floor "$ar/lib/libdlock.so.0" "$ar/bin/dlock"
step "archive: bin/dlock runs" bash -c '"$1/bin/dlock" --help >/dev/null' _ "$ar"
c_builds "$ar" archive

step "deb: control, ldconfig in postinst" bash -c '
  dpkg-deb -f "$1" Package Version Architecture Depends && dpkg-deb -e "$1" "$2/deb-control" &&
  grep -q ldconfig "$2/deb-control/postinst" && grep -q ldconfig "$2/deb-control/postrm"' _ "$dist/libdlock_${version}_amd64.deb" "$work"
dpkg-deb -x "$dist/libdlock_${version}_amd64.deb" "$work/deb"
step "deb: SONAME, links, files, no build paths in .pc/CMake/RPATH" no_build_paths "$work/deb/usr"
c_builds "$work/deb/usr" deb
# CI, as root, on a machine of its own: `dpkg -i` for real (postinst's
# ldconfig, /usr found with no settings), then `dpkg -r`. Elsewhere (a
# shared developer machine) the extracted tree above stands in for it.
if [[ ${CI:-} = true && $(id -u) = 0 ]] && ! dpkg -s libdlock >/dev/null 2>&1; then
  trap 'dpkg -r libdlock >/dev/null 2>&1; rm -rf "$work"' EXIT
  step "deb: dpkg -i; ldconfig knows libdlock.so.0; pkg-config finds dlock in /usr" bash -c '
    dpkg -i "$1" && ldconfig -p | grep "libdlock.so.0 " && pkg-config --modversion dlock && command -v dlock' _ "$dist/libdlock_${version}_amd64.deb"
  c_builds /usr deb-installed
  step "deb: dpkg -r removes it (ldconfig in postrm)" bash -c '
    dpkg -r libdlock && [[ ! -e /usr/lib/libdlock.so.0 ]] && ! ldconfig -p | grep -q "libdlock.so.0 "'
fi

# --- the Python module and the Node addon, unpacked (not installed) -----------
# Their installs and suites are scripts/test-python.sh and test-node.sh
# with DLOCK_DIST set (scripts/test.sh): the artifacts are built once.
mkdir -p "$work/wheel" "$work/npm"
python3 -m zipfile -e "$wheel" "$work/wheel"
tar -C "$work/npm" -xzf "$dist/npm/dlock-fence-linux-x64-gnu-$version.tgz"
tar -C "$work/npm" -xzf "$dist/npm/dlock-fence-$version.tgz" --transform 's#^package#main#'
no_rpath() { # FILE...: no RPATH/RUNPATH naming the build machine
  local f bad=0
  for f in "$@"; do
    if readelf -d "$f" | grep -E 'RPATH|RUNPATH'; then echo "  ^ ${f##*/} has an RPATH"; bad=1; fi
  done
  ((bad == 0)) && echo "no RPATH in ${*##*/}"
}
export -f no_rpath
step "wheel: the module's glibc floor, no RPATH" bash -c '
  f=$(ls "$1"/wheel/dlock/_dlock*.so) && at_most_floor "$f" && no_rpath "$f"' _ "$work"
step "wheel: tagged cp39-abi3-manylinux_${glibc/./_}, Requires-Python >=3.9" bash -c '
  w=$(ls -d "$1"/wheel/*.dist-info) && cat "$w/WHEEL" && grep "^Requires-Python" "$w/METADATA" &&
  grep -q "^Tag: cp39-abi3-manylinux_${2/./_}_x86_64$" "$w/WHEEL" && grep -q "^Requires-Python: >=3.9$" "$w/METADATA"' _ "$work" "$glibc"
step "npm platform package: the addon's glibc floor, no RPATH, os/cpu/libc, engines" bash -c '
  at_most_floor "$1/npm/package/dlock.linux-x64-gnu.node" && no_rpath "$1/npm/package/dlock.linux-x64-gnu.node" &&
  node -e "
    const p = require(process.argv[1] + \"/npm/package/package.json\"), m = require(process.argv[1] + \"/npm/main/package.json\");
    const eq = (a, b, what) => { if (JSON.stringify(a) !== JSON.stringify(b)) throw new Error(what + \": \" + JSON.stringify(a)); };
    eq(p.os, [\"linux\"], \"os\"); eq(p.cpu, [\"x64\"], \"cpu\"); eq(p.libc, [\"glibc\"], \"libc\");
    eq(m.optionalDependencies, { [p.name]: p.version }, \"the main package names the platform package\");
    eq([p.engines.node, m.engines.node], [\">=20\", \">=20\"], \"engines\");
    console.log(p.name, p.os, p.cpu, p.libc, \"engines\", m.engines.node);" "$1"' _ "$work"

# --- the alert rules and the dashboard, in every package --------------------------
# Each package carries the same three files (docs/metrics.md); the rules'
# promtool tests pass on the archive's installed copy.
alerts_in_packages() {
  local f where rc=0
  for f in prometheus/dlock-alerts.yml prometheus/dlock-alerts.test.yml grafana/dlock-dashboard.json; do
    for where in "$ar/share/dlock/$f" "$work/deb/usr/share/dlock/$f" "$work/wheel/dlock/data/${f##*/}" "$work/npm/main/data/${f##*/}"; do
      if cmp -s "$where" "$root/packaging/$f"; then echo "${where#"$work"/}: as in packaging/$f"; else echo "${where#"$work"/}: missing or not packaging/$f"; rc=1; fi
    done
  done
  [[ -f $ar/share/doc/dlock/metrics.md ]] || { echo "no share/doc/dlock/metrics.md (the alerts' runbook)"; rc=1; }
  if command -v promtool >/dev/null; then
    (cd "$ar/share/dlock/prometheus" && promtool test rules dlock-alerts.test.yml | tail -1) || rc=1
  fi
  return $rc
}
step "alert rules, their tests and the dashboard in the archive, the .deb, the wheel and the npm package" alerts_in_packages

# --- bad input -------------------------------------------------------------------
# dist.sh from a copy of itself (so no run here can touch dist/), on a PATH
# holding what it needs up to its tool check, less one tool.
fake=$work/fake-repo
mkdir -p "$fake/scripts" "$fake/bin"
cp scripts/dist.sh scripts/build-release.sh scripts/lib.sh "$fake/scripts/"
cp Cargo.toml "$fake/"
for t in env bash dirname uname sed head date mkdir rm cat cargo node npm dpkg-deb objdump readelf md5sum cut; do
  ln -sf "$(PATH=$root_path command -v "$t")" "$fake/bin/$t"
done
ln -sf "$(python3 -c 'import sys; print(sys.executable)')" "$fake/bin/python3" # not pyenv's shim
dist_without() { # TOOL EXPECTED...: dist.sh refuses, naming each EXPECTED
  local tool=$1 out rc e
  shift
  mv "$fake/bin/$tool" "$fake/$tool" 2>/dev/null
  out=$(PATH=$fake/bin XDG_CACHE_HOME=$fake/cache PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 "$fake/scripts/dist.sh" 2>&1)
  rc=$?
  mv "$fake/$tool" "$fake/bin/$tool" 2>/dev/null
  printf '%s\n' "$out" | tail -4
  ((rc == 2)) || { echo "exit $rc, not 2"; return 1; }
  for e in "$@"; do grep -qF -- "$e" <<<"$out" || { echo "no '$e' in what it said"; return 1; }; done
}
step "bad input: dist.sh without npm names it and how to get it" dist_without npm "missing tools" "npm: apt-get install npm"
# No zig: an empty tool venv and no package index (PIP_NO_INDEX) to get ziglang from.
step "bad input: dist.sh without zig (no ziglang to install) names it and how to get it" \
  dist_without - "cannot install the build tools" "zig comes from the Python package ziglang"
# Python 3.8: pip refuses the wheel (its cp39-abi3 tag); the sdist says
# Requires-Python >=3.9, which pip enforces once it has built its metadata.
py38=$(ls "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.8*/bin/python3.8 2>/dev/null | head -1)
if [[ -n $py38 ]]; then
  step "bad input: pip install of the wheel into Python 3.8 ($py38) is refused by pip" bash -c '
    "$1" -m venv "$2/py38" && out=$("$2/py38/bin/pip" install --only-binary=:all: --no-index --find-links "$3" dlock-fence 2>&1); rc=$?
    echo "$out" | tail -2; [[ $rc -ne 0 && ! -e $2/py38/lib/python3.8/site-packages/dlock ]] &&
      grep -q "No matching distribution found for dlock-fence" <<<"$out"' _ "$py38" "$work" "$dist"
else
  step "bad input: pip refuses the wheel for Python 3.8 (--python-version 3.8; no Python 3.8 here)" bash -c '
    out=$(pip3 install --dry-run --no-index --find-links "$1" --python-version 3.8 --only-binary=:all: \
      --target "$2/py38" dlock-fence 2>&1); rc=$?; echo "$out" | tail -2
    [[ $rc -ne 0 ]] && grep -q "No matching distribution found for dlock-fence" <<<"$out"' _ "$dist" "$work"
fi
step "bad input: the sdist says Requires-Python >=3.9" bash -c '
  tar -xzOf "$1" "dlock_fence-$2/PKG-INFO" | grep -x "Requires-Python: >=3.9"' _ "$dist/dlock_fence-$version.tar.gz" "$version"
# Node 18: npm itself run by this Node with process.version set to
# v18.20.0 (npm reads the running Node's version; no Node 18 here).
step "bad input: npm install --engine-strict under Node v18.20.0 is refused by npm (EBADENGINE)" bash -c '
  mkdir -p "$1/node18" && cd "$1/node18" && echo "{ \"private\": true }" >package.json &&
  echo "Object.defineProperty(process, \"version\", { value: \"v18.20.0\" });" >"$1/node18.js" &&
  out=$(node -r "$1/node18.js" "$(realpath "$(command -v npm)")" install --offline --no-audit --no-fund --engine-strict \
    "dlock@file:$2/npm/dlock-fence-$3.tgz" "$2/npm/dlock-fence-linux-x64-gnu-$3.tgz" 2>&1); rc=$?
  grep -E "EBADENGINE|Required|Actual" <<<"$out"
  [[ $rc -ne 0 && ! -e node_modules/dlock ]] && grep -q EBADENGINE <<<"$out" && grep -q "Required: {\"node\":\">=20\"}" <<<"$out"' \
  _ "$work" "$dist" "$version"

summary
