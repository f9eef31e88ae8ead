// `npm run build`: builds the addon with plain `cargo build -p dlock-node`
// into the workspace's own target/release (no `--target`, so no second
// tree of every dependency, see docs/node.md), copies the cdylib to
// dlock.<platform>.node, writes native.d.ts from napi-derive's type
// definitions through @napi-rs/cli's own generateTypeDef, then runs tsc
// (index.ts → index.js + index.d.ts).
//
//   node build.mjs [--debug] [--features F] [--out FILE] [--addon-only] [--zig TYPEDEFS]
//
// --zig TYPEDEFS (scripts/dist.sh): no cargo here; the addon is the one
// dist.sh built with zig for its glibc floor (`cargo zigbuild --target
// <arch>-unknown-linux-gnu.2.17`, target/<arch>-unknown-linux-gnu/release,
// with NAPI_TYPE_DEF_TMP_FOLDER=TYPEDEFS), the build the packages ship.
//
// --debug --workspace --out test/scenarios.node --addon-only (`npm run
// build:test`) builds the test suite's addon (with the scenario runner
// export) beside the real one: the workspace's debug build with
// --all-features, the build the Rust tests use (scripts/test.sh), so
// nothing compiles a second time for it.

import { spawnSync } from 'node:child_process';
import { copyFileSync, mkdirSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { generateTypeDef } from '@napi-rs/cli';

const here = dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const flag = (name) => args.includes(name);
const value = (name) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : undefined;
};
const profile = flag('--debug') ? 'debug' : 'release';
const features = value('--features');
const zigTypeDefs = value('--zig');
const rustArch = { x64: 'x86_64', arm64: 'aarch64' }[process.arch];
const zigTriple = zigTypeDefs && `${rustArch}-unknown-linux-gnu`;
if (zigTypeDefs && (process.platform !== 'linux' || !rustArch)) {
  console.error(`build.mjs: --zig builds for Linux x64 or arm64 only, not ${process.platform}-${process.arch}`);
  process.exit(2);
}

function run(cmd, argv, env = process.env) {
  const r = spawnSync(cmd, argv, { cwd: here, env, stdio: 'inherit' });
  if (r.status !== 0) {
    console.error(`build.mjs: ${cmd} ${argv.join(' ')} failed`);
    process.exit(r.status ?? 1);
  }
}

const meta = spawnSync('cargo', ['metadata', '--format-version', '1', '--no-deps'], {
  cwd: here,
  encoding: 'utf8',
  maxBuffer: 64 << 20,
});
if (meta.status !== 0) {
  console.error(meta.stderr);
  process.exit(1);
}
const targetDir = JSON.parse(meta.stdout).target_directory;

// One folder per profile and feature set: napi-derive writes the type
// definitions of the crate into it whenever the crate is compiled.
const typeDefDir = zigTypeDefs
  ? resolve(zigTypeDefs)
  : join(targetDir, 'napi-typedefs', `${profile}-${features ?? 'default'}`);
mkdirSync(typeDefDir, { recursive: true });
const workspace = flag('--workspace');
const cargoArgs = workspace
  ? ['build', '--locked', '--workspace', '--all-features']
  : ['build', '--locked', '-p', 'dlock-node'];
if (profile === 'release') cargoArgs.push('--release');
if (features && !workspace) cargoArgs.push('--features', features);
// Without definitions on disk (a fresh folder) the crate must be compiled
// again to write them: a changed variable makes cargo do that. An
// --addon-only build needs none, and leaves the environment as the other
// builds of the workspace have it (a changed variable rebuilds the crate).
// `npm run` adds its own variables and node_modules/.bin folders to PATH;
// build scripts that watch them (pyo3's finds Python on PATH) would rerun,
// and the workspace's crates compile again: cargo gets the caller's own.
const callerEnv = Object.fromEntries(
  Object.entries(process.env)
    .filter(([k]) => !/^npm_/i.test(k) && !['INIT_CWD', 'NODE', 'COLOR', 'EDITOR'].includes(k))
    .map(([k, v]) =>
      k === 'PATH'
        ? [k, v.split(':').filter((d) => !/node_modules[/]\.bin$|node-gyp-bin$/.test(d)).join(':')]
        : [k, v],
    ),
);
const env = flag('--addon-only') ? callerEnv : { ...callerEnv, NAPI_TYPE_DEF_TMP_FOLDER: typeDefDir };
if (!flag('--addon-only') && readdirSync(typeDefDir).length === 0) env.NAPI_FORCE_BUILD_DLOCK_NODE = String(Date.now());
if (!zigTypeDefs) run('cargo', cargoArgs, env);

const platform = (() => {
  const base = `${process.platform}-${process.arch}`;
  if (process.platform !== 'linux') return base;
  const glibc = process.report?.getReport()?.header?.glibcVersionRuntime;
  return `${base}-${glibc ? 'gnu' : 'musl'}`;
})();
const lib = { linux: 'libdlock_node.so', darwin: 'libdlock_node.dylib', win32: 'dlock_node.dll' }[
  process.platform
];
const out = resolve(here, value('--out') ?? `dlock.${platform}.node`);
mkdirSync(dirname(out), { recursive: true });
// Copy to a new file then rename, so a running process keeps its mapping.
const tmp = `${out}.tmp`;
copyFileSync(join(targetDir, ...(zigTriple ? [zigTriple] : []), profile, lib), tmp);
rmSync(out, { force: true });
copyFileSync(tmp, out);
rmSync(tmp);
console.log(`build.mjs: ${out}`);

if (!flag('--addon-only')) {
  const { dts } = await generateTypeDef({ typeDefDir, cwd: here });
  writeFileSync(join(here, 'native.d.ts'), dts);
  run(process.execPath, [join(here, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', 'tsconfig.json']);
  console.log('build.mjs: native.d.ts, index.js, index.d.ts');
}
