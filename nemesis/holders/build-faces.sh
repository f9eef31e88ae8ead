#!/usr/bin/env bash
# Builds the holders of every face of the nemesis and prints their
# `--holder-cmds` list (one holder command per face, `;`-separated) on
# stdout; everything else goes to stderr. Used by scripts/test-nemesis.sh
# and scripts/nemesis.sh --all-faces.
#
#   rust                                  the nemesis binary's own holder
#   target/nemesis/c-holder               examples/nemesis/holder.c on the release libdlock.so
#   target/py-venv/bin/python holder.py   `import dlock` (the wheel, installed into target/py-venv)
#   node holder.js                        `require` of the built bindings/node
#   python run_holder.py --dlock PATH     `dlock run` (the release build's); its command run_child.py
#
# The Python and Node builds are those of scripts/test-python.sh and
# test-node.sh (which scripts/test.sh runs first: then they are cheap);
# with DLOCK_DIST=DIR (scripts/test.sh) none: the wheel and the npm
# tarballs of scripts/dist.sh are installed instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
. scripts/lib.sh
{
  need_build_tools
  need_python
  need_debs gcc=gcc node=nodejs npm=npm /usr/include/postgresql/libpq-fe.h=libpq-dev
  # The one release build (libdlock.so, the `dlock` command).
  scripts/build-release.sh
  . scripts/c-flags.sh
  mkdir -p target/nemesis
  # libpq: the C holder's guarded transactions on PostgreSQL.
  gcc "${STRICT[@]}" -O2 -Iinclude -I/usr/include/postgresql examples/nemesis/holder.c -o target/nemesis/c-holder "${LINK[@]}" -lpq
  venv=$root/target/py-venv
  [[ -x $venv/bin/python ]] || python3 -m venv "$venv"
  if [[ -n ${DLOCK_DIST:-} ]]; then
    # scripts/test.sh: the artifacts of scripts/dist.sh, built once.
    "$venv/bin/python" -m pip install -q --force-reinstall --no-deps "$DLOCK_DIST"/dlock_fence-*.whl
    rm -rf target/nemesis/node && mkdir -p target/nemesis/node
    (cd target/nemesis/node && echo '{ "private": true }' >package.json &&
      npm install --offline --no-audit --no-fund --silent "dlock@file:$(ls "$DLOCK_DIST"/npm/dlock-fence-[0-9]*.tgz)" \
        "$(ls "$DLOCK_DIST"/npm/dlock-fence-linux-*.tgz)")
  else
    "$venv/bin/python" -c 'import maturin' 2>/dev/null || "$venv/bin/python" -m pip install -q maturin
    rm -rf target/nemesis/py-wheel
    "$venv/bin/maturin" build --release --locked -m bindings/python/Cargo.toml -o target/nemesis/py-wheel --quiet
    "$venv/bin/python" -m pip install -q --force-reinstall --no-deps target/nemesis/py-wheel/dlock_fence-*.whl
    [[ -d bindings/node/node_modules ]] || (cd bindings/node && npm ci --no-audit --no-fund --silent)
    (cd bindings/node && npm run --silent build >/dev/null)
  fi
} >&2
node=$(command -v node)
# holder.js requires DLOCK_NODE_PACKAGE when set: the installed package.
[[ -n ${DLOCK_DIST:-} ]] && node="$(command -v env) DLOCK_NODE_PACKAGE=$root/target/nemesis/node/node_modules/dlock $node"
printf '%s' "rust;$root/target/nemesis/c-holder"
printf '%s' ";$root/target/py-venv/bin/python $root/nemesis/holders/holder.py"
printf '%s' ";$node $root/nemesis/holders/holder.js"
printf '%s\n' ";$root/target/py-venv/bin/python $root/nemesis/holders/run_holder.py --dlock $(release_dir)/dlock"
